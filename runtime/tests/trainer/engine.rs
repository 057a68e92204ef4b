//! The engine and actor: gradient accumulation does not depend on the micro-batch size, the
//! engine's checkpoint restores an identical continuation, and the reference is the actor's
//! initial policy.

use tch::{Device, Kind, Tensor};
use verlc_runtime::algo::{KlEstimator, LossAggMode, PolicyLossConfig, PolicyLossMode};
use verlc_runtime::engine::{
    Batch, Engine, EngineSettings, OptimSettings, SchedulerSettings, SingleEngine,
};
use verlc_runtime::model::{CausalLm, Dtype};
use verlc_runtime::optim::sched::{VerlSchedule, VerlSchedulerConfig};
use verlc_runtime::optim::{AdamWConfig, InnerConfig, SgdConfig};
use verlc_runtime::rollout::{SamplingParams, StopTokens};
use verlc_runtime::workers::actor::{Actor, ActorSettings};
use verlc_runtime::workers::reference::Reference;

use crate::support::scratch;

const MODEL: &str = "builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=1";

fn engine(trainable: bool) -> SingleEngine<CausalLm> {
    engine_with(trainable, InnerConfig::AdamW(AdamWConfig::default()))
}

fn engine_with(trainable: bool, inner: InnerConfig) -> SingleEngine<CausalLm> {
    let cosine = VerlSchedule::Cosine {
        min_lr_ratio: 0.1,
        num_cycles: 0.5,
    };
    engine_scheduled(trainable, inner, cosine)
}

fn engine_scheduled(
    trainable: bool,
    inner: InnerConfig,
    schedule: VerlSchedule,
) -> SingleEngine<CausalLm> {
    let optim = OptimSettings {
        freeze_vision_tower: false,
        inner,
        lr: 1e-2,
        weight_decay: 0.01,
        clip_grad: 1.0,
        offload: false,
        offload_fraction: 0.0,
        schedule: SchedulerSettings::Verl(VerlSchedulerConfig {
            schedule,
            lr_warmup_steps: 0,
            lr_warmup_steps_ratio: 0.0,
            total_training_steps: 10,
            zero_indexed_step: true,
        }),
    };
    SingleEngine::new(EngineSettings {
        model_path: MODEL.into(),
        device: Device::Cpu,
        param_dtype: Dtype::Fp32,
        main_dtype: Dtype::Fp32,
        seed: 7,
        optim: trainable.then_some(optim),
        loss_scale_factor: None,
        loss_scaling: verlc_runtime::optim::LossScaling::LINKED,
        lora: None,
        config_overrides: Default::default(),
        remove_padding: false,
    })
    .expect("engine")
}

fn settings(micro: usize, mode: LossAggMode) -> ActorSettings {
    ActorSettings {
        ppo_mini_batch_size: 8,
        ppo_micro_batch_size: micro,
        log_prob_micro_batch_size: 3,
        ppo_max_token_len: None,
        log_prob_max_token_len: None,
        bypass: None,
        ppo_epochs: 2,
        epochs_per_mini_batch: false,
        shuffle: true,
        data_loader_seed: 1,
        loss_mode: PolicyLossMode::Vanilla,
        policy_loss: PolicyLossConfig::default(),
        loss_agg_mode: mode,
        entropy_coeff: 0.01,
        calculate_entropy: true,
        calculate_sum_pi_squared: false,
        use_kl_loss: true,
        kl_loss_coef: 0.1,
        kl_loss_type: "k3+".parse::<KlEstimator>().expect("k3+"),
        temperature: 1.0,
        distillation: None,
    }
}

/// A generated batch of 16 responses with random advantages.
fn batch(actor: &mut Actor<SingleEngine<CausalLm>>) -> Batch {
    let mut worker = verlc_runtime::workers::rollout::RolloutWorker::new(
        actor.engine.model_config(),
        Dtype::Fp32,
        Device::Cpu,
    )
    .expect("rollout");
    worker
        .update_weights(&actor.engine.per_tensor_params().expect("params"))
        .expect("sync");
    let prompts: Vec<Vec<i64>> = (0..4).map(|i| vec![1, 5 + i, 6, 7 + i, 8]).collect();
    let params = SamplingParams {
        n: 4,
        max_new_tokens: 6,
        seed: 3,
        ..SamplingParams::default()
    };
    let out = worker
        .generate(
            &prompts,
            &params,
            &StopTokens {
                eos: vec![2],
                pad: 0,
            },
        )
        .expect("generate");
    let mut b = Batch::new();
    b.insert("input_ids", out.input_ids).expect("insert");
    b.insert("attention_mask", out.attention_mask)
        .expect("insert");
    b.insert("position_ids", out.position_ids).expect("insert");
    b.insert("responses", out.responses).expect("insert");
    b.insert("response_mask", out.response_mask.to_kind(Kind::Float))
        .expect("insert");
    let old = actor.compute_log_prob(&b).expect("log probs").log_probs;
    b.insert("ref_log_prob", (&old - 0.05).detach())
        .expect("insert");
    b.insert("old_log_probs", old).expect("insert");
    let adv = Tensor::from_slice(
        &(0..16 * 6)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0)
            .collect::<Vec<_>>(),
    )
    .view([16, 6]);
    b.insert("advantages", adv * b.get("response_mask").expect("mask"))
        .expect("insert");
    b
}

fn params_of(e: &SingleEngine<CausalLm>) -> Vec<(String, Tensor)> {
    e.per_tensor_params().expect("params")
}

fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    a.iter()
        .zip(b)
        .map(|((_, x), (_, y))| (x - y).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

/// verl's separate_async updates one mini-batch at a time, each through its `ppo_epochs`:
/// with `epochs_per_mini_batch` one update of a two-mini-batch batch equals two updates of
/// one mini-batch each (a constant learning rate, which verlc requires there), and differs
/// from the epoch-major order of the synchronous update.
#[test]
fn epochs_per_mini_batch_equal_one_update_per_mini_batch() {
    let actor = |per_mini_batch: bool| {
        let adam = InnerConfig::AdamW(AdamWConfig::default());
        let mut s = settings(4, LossAggMode::TokenMean);
        s.epochs_per_mini_batch = per_mini_batch;
        Actor::new(engine_scheduled(true, adam, VerlSchedule::Constant), s).expect("actor")
    };
    let mut mini_batch_major = actor(true);
    let b = batch(&mut mini_batch_major);
    let minis = b.split(8).expect("split");
    assert_eq!(minis.len(), 2);
    mini_batch_major.update_policy(&b, 1).expect("update");
    let mut one_at_a_time = actor(false);
    for mini in &minis {
        one_at_a_time.update_policy(mini, 1).expect("update");
    }
    let d = max_diff(
        &params_of(&mini_batch_major.engine),
        &params_of(&one_at_a_time.engine),
    );
    assert!(
        d < 1e-6,
        "mini-batch-major vs one update per mini-batch: {d}"
    );
    let mut epoch_major = actor(false);
    epoch_major.update_policy(&b, 1).expect("update");
    let d = max_diff(
        &params_of(&mini_batch_major.engine),
        &params_of(&epoch_major.engine),
    );
    assert!(d > 1e-5, "the two orders gave the same weights ({d})");
}

#[test]
fn micro_batch_size_does_not_change_the_update() {
    for mode in [
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenMean,
        LossAggMode::SeqMeanTokenSumNorm,
    ] {
        let mut results = Vec::new();
        for micro in [8, 3, 1] {
            // Plain SGD: Adam's normalisation would magnify rounding noise in near-zero grads.
            let sgd = InnerConfig::Sgd(SgdConfig {
                momentum: 0.0,
                dampening: 0.0,
                nesterov: false,
            });
            let mut actor =
                Actor::new(engine_with(true, sgd), settings(micro, mode)).expect("actor");
            let b = batch(&mut actor);
            let m = actor.update_policy(&b, 1).expect("update");
            results.push((params_of(&actor.engine), m));
        }
        for (p, m) in &results[1..] {
            let d = max_diff(&results[0].0, p);
            assert!(
                d < 1e-6,
                "{mode}: parameters differ by {d} across micro-batch sizes"
            );
            for key in [
                "actor/pg_loss",
                "actor/kl_loss",
                "actor/grad_norm",
                "actor/entropy_loss",
            ] {
                let (a, b) = (results[0].1[key], m[key]);
                assert!(
                    (a - b).abs() < 1e-5 * (1.0 + a.abs()),
                    "{mode}: {key} {a} vs {b}"
                );
            }
        }
        let m = &results[0].1;
        assert!(
            m["actor/lr"] > 0.0
                && m.contains_key("actor/pg_clipfrac")
                && m.contains_key("actor/kl_coef")
        );
    }
}

/// Dynamic batch size cuts the mini-batches by token counts (verl's balanced parts, in verl's
/// order): the same update and metrics as fixed micro-batches, and the old log-probs come back
/// in the batch's row order.
#[test]
fn dynamic_batch_size_gives_the_fixed_micro_batch_update() {
    let sgd = || {
        InnerConfig::Sgd(SgdConfig {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
        })
    };
    for mode in [LossAggMode::TokenMean, LossAggMode::SeqMeanTokenMean] {
        let mut fixed = Actor::new(engine_with(true, sgd()), settings(2, mode)).expect("actor");
        let b = batch(&mut fixed);
        let mut dynamic_settings = settings(2, mode);
        // Rows are 5 prompt tokens plus up to 6 response tokens, padded to 11: a budget of 30
        // tokens gives 3-5 rows per micro-batch, unevenly.
        dynamic_settings.ppo_max_token_len = Some(30);
        dynamic_settings.log_prob_max_token_len = Some(24);
        let mut dynamic = Actor::new(engine_with(true, sgd()), dynamic_settings).expect("actor");
        let out = fixed.compute_log_prob(&b).expect("log probs");
        let (lp_fixed, ent_fixed) = (out.log_probs, out.entropy.expect("entropy"));
        let out = dynamic.compute_log_prob(&b).expect("log probs");
        let (lp_dyn, ent_dyn) = (out.log_probs, out.entropy.expect("entropy"));
        assert!((&lp_fixed - &lp_dyn).abs().max().double_value(&[]) < 1e-6);
        assert!((&ent_fixed - &ent_dyn).abs().max().double_value(&[]) < 1e-6);
        let m_fixed = fixed.update_policy(&b, 1).expect("update");
        let m_dyn = dynamic.update_policy(&b, 1).expect("update");
        let d = max_diff(&params_of(&fixed.engine), &params_of(&dynamic.engine));
        assert!(d < 1e-6, "{mode}: parameters differ by {d}");
        for key in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm"] {
            let (a, c) = (m_fixed[key], m_dyn[key]);
            assert!(
                (a - c).abs() < 1e-5 * (1.0 + a.abs()),
                "{mode}: {key} {a} vs {c}"
            );
        }
    }
}

#[test]
fn engine_checkpoint_restores_an_identical_continuation() {
    let dir = scratch("engine_ckpt");
    let mut a = Actor::new(engine(true), settings(4, LossAggMode::TokenMean)).expect("actor");
    let b = batch(&mut a);
    a.update_policy(&b, 1).expect("update");
    a.engine.save_checkpoint(&dir).expect("save");
    let mut restored =
        Actor::new(engine(true), settings(4, LossAggMode::TokenMean)).expect("actor");
    restored.engine.load_checkpoint(&dir).expect("load");
    assert_eq!(
        max_diff(&params_of(&a.engine), &params_of(&restored.engine)),
        0.0
    );
    assert_eq!(a.engine.lr(), restored.engine.lr());
    let m1 = a.update_policy(&b, 2).expect("update");
    let m2 = restored.update_policy(&b, 2).expect("update");
    assert_eq!(
        max_diff(&params_of(&a.engine), &params_of(&restored.engine)),
        0.0,
        "bitwise-equal continuation"
    );
    assert_eq!(m1, m2);
}

/// With `calculate_sum_pi_squared`, the old-log-prob pass returns `Σ_v π_v²` of the policy's
/// softmax at every response position (computed here from the model's full logits), for fixed
/// and token-budget micro-batches; without it, none.
#[test]
fn old_log_prob_pass_returns_the_squared_probabilities() {
    let mut s = settings(8, LossAggMode::TokenMean);
    let mut plain = Actor::new(engine(true), s.clone()).expect("actor");
    let b = batch(&mut plain);
    assert!(
        plain
            .compute_log_prob(&b)
            .expect("log probs")
            .sum_pi_squared
            .is_none()
    );
    s.calculate_sum_pi_squared = true;
    for budget in [None, Some(24)] {
        s.log_prob_max_token_len = budget;
        let mut actor = Actor::new(engine(true), s.clone()).expect("actor");
        let out = actor.compute_log_prob(&b).expect("log probs");
        let got = out.sum_pi_squared.expect("sum_pi_squared");
        let ids = b.get("input_ids").expect("ids");
        let (t, r) = (
            ids.size()[1],
            b.get("responses").expect("responses").size()[1],
        );
        let logits = tch::no_grad(|| {
            actor.engine.module().forward(
                ids,
                b.get("position_ids").expect("positions"),
                Some(b.get("attention_mask").expect("mask")),
                None,
            )
        });
        let p = logits.narrow(1, t - r - 1, r).softmax(-1, Kind::Float);
        let want = (&p * &p).sum_dim_intlist(-1, false, Kind::Float);
        let d = (&got - &want).abs().max().double_value(&[]);
        assert!(d < 1e-5, "budget {budget:?}: sum_pi_squared differs by {d}");
        let (lo, hi) = (got.min().double_value(&[]), got.max().double_value(&[]));
        assert!(
            lo > 0.0 && hi <= 1.0,
            "a sum of squared probabilities is in (0, 1]"
        );
    }
}

#[test]
fn reference_is_the_initial_policy() {
    let mut actor = Actor::new(engine(true), settings(8, LossAggMode::TokenMean)).expect("actor");
    let b = batch(&mut actor);
    let initial = actor.compute_log_prob(&b).expect("log probs").log_probs;
    let mut reference = Reference::new(engine(false), 5, 1.0).expect("reference");
    let ref_lp = reference.compute_ref_log_prob(&b).expect("ref");
    assert_eq!((&ref_lp - &initial).abs().max().double_value(&[]), 0.0);
    actor.update_policy(&b, 1).expect("update");
    let after = actor.compute_log_prob(&b).expect("log probs").log_probs;
    assert!(
        (&after - &initial).abs().max().double_value(&[]) > 1e-4,
        "the actor moved"
    );
    let ref_after = reference.compute_ref_log_prob(&b).expect("ref");
    assert_eq!(
        (&ref_after - &ref_lp).abs().max().double_value(&[]),
        0.0,
        "the reference did not"
    );
    assert!(
        reference
            .engine
            .per_tensor_params()
            .expect("p")
            .iter()
            .all(|(_, t)| !t.requires_grad())
    );
}

/// The hybrid engine's rollout holds weights only while it generates: bound without a copy
/// when dtypes match (it reads the actor's storage), converted when they differ, dropped by
/// `release` (nothing left, and generating then is an error); a reload after an update
/// generates from the updated weights.
#[test]
fn rollout_binds_weights_without_a_copy_and_releases_them() {
    use verlc_runtime::workers::rollout::RolloutWorker;
    let actor = engine(true);
    let params = params_of(&actor);
    let cfg = actor.model_config();
    let mut fp32 = RolloutWorker::new(cfg, Dtype::Fp32, Device::Cpu).expect("rollout");
    assert_eq!(fp32.weight_bytes(), 0, "a new rollout holds no weights");
    fp32.update_weights(&params).expect("bind");
    let numel: i64 = params.iter().map(|(_, t)| t.numel() as i64).sum();
    assert_eq!(fp32.weight_bytes(), 4 * numel);
    let head = fp32
        .model()
        .expect("a whole model")
        .head_weight()
        .data_ptr();
    assert!(
        params.iter().any(|(_, t)| t.data_ptr() == head),
        "the fp32 rollout reads the fp32 actor's storage"
    );

    let prompts = vec![vec![1i64, 5, 6, 7]];
    let sp = SamplingParams {
        n: 2,
        max_new_tokens: 4,
        seed: 3,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let first = fp32.generate(&prompts, &sp, &stop).expect("generate");
    fp32.release().expect("release");
    assert_eq!(fp32.weight_bytes(), 0);
    assert!(
        fp32.generate(&prompts, &sp, &stop).is_err(),
        "no weights, no generation"
    );
    fp32.update_weights(&params).expect("rebind");
    let again = fp32.generate(&prompts, &sp, &stop).expect("generate");
    assert!(
        first.responses.equal(&again.responses),
        "the same weights generate the same responses"
    );

    let mut bf16 = RolloutWorker::new(cfg, Dtype::Bf16, Device::Cpu).expect("rollout");
    bf16.update_weights(&params).expect("bind");
    assert_eq!(
        bf16.weight_bytes(),
        2 * numel,
        "bf16 rollout holds a converted copy while loaded"
    );
    bf16.release().expect("release");
    assert_eq!(bf16.weight_bytes(), 0);
}

/// Rollout correction in a run: the rollout returns its log-probs, the trainer weights and
/// rejects against them before the advantages and logs verl's `rollout_corr/*` metrics. The
/// rollout and the trainer compute in the same precision here, so the ratios are near 1 and a
/// tight rejection band still keeps most tokens.
#[test]
fn rollout_correction_runs_in_the_trainer() {
    let dir = scratch("rollout_corr");
    let spec = crate::support::small_grpo(
        &dir,
        2,
        &[
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold=2.0",
            "algorithm.rollout_correction.rollout_rs=token",
            "algorithm.rollout_correction.rollout_rs_threshold=1.5",
        ],
    );
    assert!(spec.algorithm.rollout_correction.is_some());
    let summary = verlc_runtime::trainer::run(&spec, &crate::support::quiet()).expect("run");
    let mean = crate::support::series(&summary.history, "rollout_corr/rollout_is_mean");
    let rejected =
        crate::support::series(&summary.history, "rollout_corr/rollout_rs_masked_fraction");
    assert_eq!((mean.len(), rejected.len()), (2, 2));
    assert!(mean.iter().all(|m| (m - 1.0).abs() < 0.2), "{mean:?}");
    assert!(
        rejected.iter().all(|r| (0.0..0.5).contains(r)),
        "{rejected:?}"
    );

    // Bypass mode: no old-log-prob pass (no actor/entropy), the correction per micro-batch.
    let spec = crate::support::small_grpo(
        &dir.join("bypass"),
        2,
        &[
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "algorithm.rollout_correction.bypass_mode=true",
            "algorithm.rollout_correction.loss_type=reinforce",
            "algorithm.rollout_correction.rollout_is=token",
        ],
    );
    assert!(spec.actor.update.bypass.is_some());
    let summary = verlc_runtime::trainer::run(&spec, &crate::support::quiet()).expect("bypass run");
    let last = &summary.history.last().expect("a step").1;
    assert!(!last.contains_key("actor/entropy"));
    assert!(
        last.get("rollout_corr/rollout_is_mean")
            .is_some_and(|m| m.is_finite()),
        "{last:?}"
    );
    assert!(last.get("actor/pg_loss").is_some_and(|m| m.is_finite()));

    // IcePop (verl 0.8+'s `"lower_upper"`): weights outside the band are zeroed, verl 0.8's
    // metrics (its out-of-band ratio and per-sequence statistics) are logged, 0.7's veto's not.
    let spec = crate::support::small_grpo(
        &dir.join("icepop"),
        2,
        &[
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold='0.9_1.1'",
        ],
    );
    let c = spec
        .algorithm
        .rollout_correction
        .as_ref()
        .expect("correction");
    assert_eq!((c.is_threshold, c.is_threshold_lower), (1.1, Some(0.9)));
    let summary = verlc_runtime::trainer::run(&spec, &crate::support::quiet()).expect("IcePop run");
    let last = &summary.history.last().expect("a step").1;
    assert!(
        last.get("rollout_corr/rollout_is_oob_ratio")
            .is_some_and(|r| (0.0..0.5).contains(r)),
        "{last:?}"
    );
    assert!(last.contains_key("rollout_corr/rollout_is_seq_mean"));
    assert!(!last.contains_key("rollout_corr/rollout_is_veto_fraction"));
}

/// `model.override_config` reaches the model before it is built, and a value the model cannot
/// take is an error naming the model.
#[test]
fn config_overrides_reach_the_model() {
    let settings = |overrides: serde_json::Value| EngineSettings {
        model_path: MODEL.into(),
        device: Device::Cpu,
        param_dtype: Dtype::Fp32,
        main_dtype: Dtype::Fp32,
        seed: 7,
        optim: None,
        loss_scale_factor: None,
        loss_scaling: verlc_runtime::optim::LossScaling::LINKED,
        lora: None,
        config_overrides: overrides.as_object().cloned().unwrap_or_default(),
        remove_padding: false,
    };
    let e: SingleEngine<CausalLm> = SingleEngine::new(settings(
        serde_json::json!({"max_position_embeddings": 999, "rope_theta": 5e5}),
    ))
    .expect("engine");
    assert_eq!(e.model_config().max_position_embeddings, 999);
    assert_eq!(e.model_config().rope_theta, 5e5);
    let err = SingleEngine::<CausalLm>::new(settings(
        serde_json::json!({"max_position_embeddings": "long"}),
    ))
    .expect_err("not a number")
    .to_string();
    assert!(err.contains("model `builtin://tiny"), "{err}");
}

/// The asynchronous loop's rollout thread generates with the copy of the weights published to
/// it (the policy changing in place afterwards changes nothing it generates), hands a batch back
/// with the version it was generated with, and reports a batch it cannot generate as an error
/// rather than hanging; after that, queueing more is an error too.
#[test]
fn background_rollout_generates_with_its_published_copy() {
    use verlc_runtime::trainer::background::{BackgroundRollout, Job};
    use verlc_runtime::workers::rollout::RolloutWorker;
    let actor = engine(true);
    let cfg = actor.model_config();
    let params = params_of(&actor);
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let sampling = SamplingParams {
        n: 2,
        max_new_tokens: 5,
        seed: 7,
        ..SamplingParams::default()
    };
    let prompts: Vec<Vec<i64>> = (0..3).map(|i| vec![1, 5 + i, 6, 7]).collect();
    let mut plain = RolloutWorker::new(cfg, Dtype::Fp32, Device::Cpu).expect("rollout");
    plain.update_weights(&params).expect("bind");
    let want = plain
        .generate(&prompts, &sampling, &stop)
        .expect("generate")
        .responses;
    plain.release().expect("release");

    let worker = RolloutWorker::new(cfg, Dtype::Fp32, Device::Cpu).expect("rollout");
    let mut thread =
        BackgroundRollout::start(worker, stop.clone(), None, (None, true)).expect("start");
    let item = |ids: Vec<i64>| {
        let row = serde_json::json!({
            "prompt": [{"role": "user", "content": "x"}],
            "data_source": "t",
            "reward_model": {"ground_truth": "1", "style": "rule"},
        });
        let row = row.as_object().cloned().unwrap_or_default();
        verlc_runtime::data::PromptItem {
            sample: verlc_runtime::data::Sample::from_row(row, "prompt", "data_source", 0)
                .expect("row"),
            input_ids: ids,
            source: "test".into(),
            row: 0,
            images: Vec::new().into(),
            index: 0,
        }
    };
    let items: Vec<_> = prompts.iter().cloned().map(item).collect();
    thread.publish(3, &params).expect("publish");
    tch::no_grad(|| {
        for (_, t) in &params {
            let _ = t.shallow_clone().fill_(0.0);
        }
    });
    thread
        .submit(Job {
            id: 0,
            prompts: items.clone(),
            params: sampling.clone(),
        })
        .expect("queue");
    let g = thread.take_generated().expect("generated");
    assert_eq!((g.id, g.version), (0, 3));
    assert!(g.output.responses.equal(&want), "generated with its copy");

    thread
        .submit(Job {
            id: 1,
            prompts: vec![item(vec![1, 1 << 40])],
            params: sampling.clone(),
        })
        .expect("queue");
    let err = thread
        .take_generated()
        .expect_err("an id beyond the vocabulary");
    assert!(err.to_string().contains("background rollout"), "{err}");
    assert!(
        thread
            .submit(Job {
                id: 2,
                prompts: items,
                params: sampling,
            })
            .is_err()
    );
}

//! The Megatron engine behind verl's actor and critic workers: PPO updates with TP=2 (with
//! and without SP), PP=2 and DP=2 (2 Gloo ranks) give the single-process engine's metrics,
//! log-probs, values and weights; its checkpoint restores an identical continuation, and its
//! weights load at another layout (pipeline parallel 2, one process).
use tch::{Device, Kind, Tensor};
use verlc_front::load::compose::LoadRequest;
use verlc_runtime::algo::{KlEstimator, LossAggMode, PolicyLossConfig, PolicyLossMode};
use verlc_runtime::engine::megatron::{
    GroupPolicy, MegatronEngine, MegatronSettings, ParallelSettings,
};
use verlc_runtime::engine::{
    Batch, Engine, EngineSettings, OptimSettings, SchedulerSettings, SingleEngine,
};
use verlc_runtime::model::{CausalLm, Dtype, ValueModel};
use verlc_runtime::optim::distrib::LayoutOptions;
use verlc_runtime::optim::sched::{VerlSchedule, VerlSchedulerConfig};
use verlc_runtime::optim::{AdamWConfig, InnerConfig};
use verlc_runtime::parallel::dist::ProcessGroup;
use verlc_runtime::parallel::layout::{ProcessGroups, RankLayout};
use verlc_runtime::rollout::{RolloutLayout, SamplingParams, StopTokens};
use verlc_runtime::workers::actor::{Actor, ActorSettings};
use verlc_runtime::workers::critic::{Critic, CriticSettings};
use verlc_runtime::workers::rollout::RolloutWorker;

use crate::rank_test;

const MODEL: &str = "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&intermediate=48";
const ROWS: i64 = 16;

pub(crate) fn engine_settings() -> EngineSettings {
    EngineSettings {
        model_path: MODEL.into(),
        device: Device::Cpu,
        param_dtype: Dtype::Fp32,
        main_dtype: Dtype::Fp32,
        seed: 7,
        optim: Some(OptimSettings {
            freeze_vision_tower: false,
            inner: InnerConfig::AdamW(AdamWConfig::default()),
            lr: 1e-2,
            weight_decay: 0.01,
            clip_grad: 1.0,
            offload: false,
            offload_fraction: 0.0,
            schedule: SchedulerSettings::Verl(VerlSchedulerConfig {
                schedule: VerlSchedule::Cosine {
                    min_lr_ratio: 0.1,
                    num_cycles: 0.5,
                },
                lr_warmup_steps: 0,
                lr_warmup_steps_ratio: 0.0,
                total_training_steps: 10,
                zero_indexed_step: true,
            }),
        }),
        loss_scale_factor: None,
        loss_scaling: verlc_runtime::optim::LossScaling::LINKED,
        lora: None,
        // The single engine's embedding follows transformers' `padding_idx` (no gradient to the
        // pad token's lookups, as verl's FSDP models); Megatron's, as mcore's, has none. Without
        // a pad_token_id both are plain lookups and the engines compare exactly.
        config_overrides: [("pad_token_id".to_owned(), serde_json::Value::Null)]
            .into_iter()
            .collect(),
        remove_padding: false,
    }
}

fn actor_settings(mini: usize) -> ActorSettings {
    ActorSettings {
        ppo_mini_batch_size: mini,
        ppo_micro_batch_size: 4,
        log_prob_micro_batch_size: 4,
        ppo_max_token_len: None,
        log_prob_max_token_len: None,
        bypass: None,
        ppo_epochs: 2,
        epochs_per_mini_batch: false,
        shuffle: false,
        data_loader_seed: 1,
        loss_mode: PolicyLossMode::Vanilla,
        policy_loss: PolicyLossConfig::default(),
        loss_agg_mode: LossAggMode::TokenMean,
        entropy_coeff: 0.01,
        calculate_entropy: true,
        calculate_sum_pi_squared: true,
        use_kl_loss: true,
        kl_loss_coef: 0.1,
        kl_loss_type: "k3+".parse::<KlEstimator>().unwrap(),
        temperature: 1.0,
        distillation: None,
    }
}

fn megatron_engine(
    world: &ProcessGroup,
    dims: (usize, usize, usize),
    sequence_parallel: bool,
) -> MegatronEngine<CausalLm> {
    megatron_engine_with(world, dims, sequence_parallel, false, engine_settings())
}

fn megatron_engine_with(
    world: &ProcessGroup,
    dims: (usize, usize, usize),
    sequence_parallel: bool,
    offload: bool,
    engine: EngineSettings,
) -> MegatronEngine<CausalLm> {
    let settings = megatron_settings(Some(world), dims, sequence_parallel, offload);
    MegatronEngine::new(engine, settings).unwrap()
}

/// The Megatron settings of these tests: `(tp, pp, dp)` over `world` (`None`: one process;
/// context parallel over the ranks left),
/// the distributed optimizer, one parameter group (as the single engine), parameter and
/// gradient offload both on or both off.
pub(crate) fn megatron_settings(
    world: Option<&ProcessGroup>,
    (tp, pp, dp): (usize, usize, usize),
    sequence_parallel: bool,
    offload: bool,
) -> MegatronSettings {
    let groups = world.map(|w| {
        // The ranks `tp * pp * dp` leave over split sequences (context parallelism).
        let cp = w.size() / (tp * pp * dp);
        let layout = RankLayout::megatron(tp, cp, pp, dp).unwrap();
        ProcessGroups::new(w, &layout).unwrap()
    });
    MegatronSettings {
        groups,
        parallel: ParallelSettings {
            use_distributed_optimizer: true,
            layout: LayoutOptions::default(),
        },
        param_groups: GroupPolicy::Single,
        sequence_parallel,
        param_offload: offload,
        grad_offload: offload,
        expert_parallel: 1,
        experts_split_over_tp: true,
        router: Default::default(),
    }
}

/// 16 generated responses with old/ref log-probs and advantages (from the single engine).
fn batch(single: &mut Actor<SingleEngine<CausalLm>>) -> Batch {
    let cfg = single.engine.model_config().clone();
    let mut worker = RolloutWorker::new(&cfg, Dtype::Fp32, Device::Cpu).unwrap();
    worker
        .update_weights(&single.engine.per_tensor_params().unwrap())
        .unwrap();
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
        .unwrap();
    let mut b = Batch::new();
    b.insert("input_ids", out.input_ids).unwrap();
    b.insert("attention_mask", out.attention_mask).unwrap();
    b.insert("position_ids", out.position_ids).unwrap();
    b.insert("responses", out.responses).unwrap();
    b.insert("response_mask", out.response_mask.to_kind(Kind::Float))
        .unwrap();
    let old = single.compute_log_prob(&b).unwrap().log_probs;
    b.insert("ref_log_prob", (&old - 0.05).detach()).unwrap();
    b.insert("old_log_probs", old).unwrap();
    let r = b.get("responses").unwrap().size()[1];
    let adv: Vec<f32> = (0..ROWS * r)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0)
        .collect();
    let adv = Tensor::from_slice(&adv).view([ROWS, r]);
    b.insert("advantages", adv * b.get("response_mask").unwrap())
        .unwrap();
    b
}

fn max_param_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    let mut worst: f64 = 0.0;
    for (name, x) in a {
        let (_, y) = b
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("missing {name}"));
        worst = worst.max((x - y).abs().max().double_value(&[]));
    }
    assert_eq!(a.len(), b.len());
    worst
}

/// Runs 3 PPO updates on the single engine and on the Megatron engine (this rank's share of
/// the batch when DP > 1) and compares.
fn compare_with_single(
    world: &ProcessGroup,
    dims: (usize, usize, usize),
    sequence_parallel: bool,
) -> Actor<MegatronEngine<CausalLm>> {
    compare_with_single_on(world, dims, sequence_parallel, engine_settings())
}

/// [`compare_with_single`] for the model and settings of `engine`.
fn compare_with_single_on(
    world: &ProcessGroup,
    dims: (usize, usize, usize),
    sequence_parallel: bool,
    engine: EngineSettings,
) -> Actor<MegatronEngine<CausalLm>> {
    let dp = dims.2;
    let mut single = Actor::new(
        SingleEngine::new(engine.clone()).unwrap(),
        actor_settings(16),
    )
    .unwrap();
    let full = batch(&mut single);
    let mut mega = Actor::new(
        megatron_engine_with(world, dims, sequence_parallel, false, engine),
        actor_settings(16 / dp),
    )
    .unwrap();
    let dp_rank = mega.engine.dp_rank() as i64;
    let rank_rows = |b: &Batch| {
        let n = ROWS / dp as i64;
        b.narrow(dp_rank * n, n).unwrap()
    };
    let local = rank_rows(&full);
    // Forward-only log-probs, entropy and Σπ² (the broadcast path under PP; Σπ² reduced over
    // the vocabulary split under TP).
    let out = single.compute_log_prob(&full).unwrap();
    let (lp_s, ent_s) = (out.log_probs, out.entropy.expect("entropy"));
    let sq_s = out.sum_pi_squared.expect("sum_pi_squared");
    let out = mega.compute_log_prob(&local).unwrap();
    let (lp_m, ent_m) = (out.log_probs, out.entropy.expect("entropy"));
    let sq_m = out.sum_pi_squared.expect("sum_pi_squared");
    let (lp_s, ent_s, sq_s) = (
        rank_rows(&Batch::new().with("a", lp_s).unwrap()),
        rank_rows(&Batch::new().with("a", ent_s).unwrap()),
        rank_rows(&Batch::new().with("a", sq_s).unwrap()),
    );
    let q = (sq_s.get("a").unwrap() - &sq_m)
        .abs()
        .max()
        .double_value(&[]);
    assert!(q < 1e-5, "sum_pi_squared differs by {q}");
    let d = (lp_s.get("a").unwrap() - &lp_m)
        .abs()
        .max()
        .double_value(&[]);
    let e = (ent_s.get("a").unwrap() - &ent_m)
        .abs()
        .max()
        .double_value(&[]);
    assert!(
        d < 1e-5 && e < 1e-5,
        "log-probs differ by {d}, entropy by {e}"
    );
    for step in 1..=3 {
        let ms = single.update_policy(&full, step).unwrap();
        let mm = mega.update_policy(&local, step).unwrap();
        for key in ["actor/grad_norm", "actor/lr"] {
            let (a, b) = (ms[key], mm[key]);
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                "step {step}: {key} {a} vs {b}"
            );
        }
        if dp == 1 {
            // Loss metrics are this rank's shares of the batch loss: equal without DP.
            for key in ["actor/pg_loss", "actor/kl_loss", "actor/entropy_loss"] {
                let (a, b) = (ms[key], mm[key]);
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "step {step}: {key} {a} vs {b}"
                );
            }
        }
        take_single_weights(
            &single.engine,
            &mut mega.engine,
            &format!("{dims:?} step {step}"),
        );
    }
    let pm = mega.engine.per_tensor_params().unwrap();
    assert_sharded_rollout_matches(&mut mega.engine, &pm);
    mega
}

/// The engine's rollout (this rank's shards, decoded with its TP/PP peers) generates what the
/// whole model `full` generates: the same tokens, the same log-probs.
fn assert_sharded_rollout_matches(mega: &mut MegatronEngine<CausalLm>, full: &[(String, Tensor)]) {
    assert_rollout_matches(mega, full, None);
}

/// [`assert_sharded_rollout_matches`] with the rollout at tensor parallel `rollout_tp` (`None`:
/// the engine's own). Each data-parallel rank has its own prompts and sampling seed, as in the
/// trainer, and compares with the whole model generating them alone.
pub(crate) fn assert_rollout_matches(
    mega: &mut MegatronEngine<CausalLm>,
    full: &[(String, Tensor)],
    rollout_tp: Option<usize>,
) {
    let mut whole = RolloutWorker::new(mega.model_config(), Dtype::Fp32, Device::Cpu).unwrap();
    whole.update_weights(full).unwrap();
    let layout = mega.rollout_layout(rollout_tp).unwrap();
    let mut sharded = RolloutWorker::for_layout(&layout, Dtype::Fp32, Device::Cpu).unwrap();
    assert!(sharded.is_sharded());
    sharded
        .update_weights(&mega.rollout_weights().unwrap())
        .unwrap();
    let dp = mega.dp_rank() as i64;
    let prompts: Vec<Vec<i64>> = [vec![1, 5, 6], vec![3, 9, 4, 11, 8], vec![7]]
        .into_iter()
        .map(|p| p.into_iter().map(|t| t + 10 * dp).collect())
        .collect();
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    for params in [
        SamplingParams {
            n: 3,
            max_new_tokens: 7,
            seed: 11 + dp as u64,
            ..SamplingParams::default()
        },
        SamplingParams {
            do_sample: false,
            max_new_tokens: 5,
            ..SamplingParams::default()
        },
    ] {
        let want = whole.generate(&prompts, &params, &stop).unwrap();
        let got = sharded.generate(&prompts, &params, &stop).unwrap();
        assert_eq!(
            Vec::<i64>::try_from(want.responses.flatten(0, -1)).unwrap(),
            Vec::<i64>::try_from(got.responses.flatten(0, -1)).unwrap(),
            "sharded rollout tokens (rollout TP {rollout_tp:?})"
        );
        for (a, b) in [
            (&want.input_ids, &got.input_ids),
            (&want.attention_mask, &got.attention_mask),
            (&want.position_ids, &got.position_ids),
        ] {
            assert_eq!(a.size(), b.size());
            assert_eq!(a.ne_tensor(b).sum(Kind::Int64).int64_value(&[]), 0);
        }
        assert_eq!(want.prompt_index, got.prompt_index);
        assert_eq!(want.response_lengths, got.response_lengths);
        assert_eq!(want.finished, got.finished);
        let d = (&want.rollout_log_probs - &got.rollout_log_probs)
            .abs()
            .max()
            .double_value(&[]);
        assert!(d < 1e-5, "sharded rollout log-probs differ by {d}");
    }
    let model_parallel = match &layout {
        RolloutLayout::Sharded(l) => l.tp.is_some() || l.pp.is_some(),
        RolloutLayout::Full(_) => panic!("a Megatron engine's rollout is sharded"),
    };
    if model_parallel {
        assert!(sharded.weight_bytes() < whole.weight_bytes());
    } else {
        assert_eq!(sharded.weight_bytes(), whole.weight_bytes());
    }
    sharded.release().unwrap();
    assert_eq!(sharded.weight_bytes(), 0);
}

rank_test!(actor_tp2_matches_single_engine, 2, |world| {
    let mut mega = compare_with_single(&world, (2, 1, 1), false);
    // Checkpoint: a fresh engine restored from it continues identically.
    let port = std::env::var("MASTER_PORT").unwrap();
    let dir = std::env::temp_dir().join(format!("verlc-megatron-engine-ckpt-{port}"));
    mega.engine.save_checkpoint(&dir).unwrap();
    let saved = mega.engine.per_tensor_params().unwrap();
    let mut restored = Actor::new(
        megatron_engine(&world, (2, 1, 1), false),
        actor_settings(16),
    )
    .unwrap();
    restored.engine.load_checkpoint(&dir).unwrap();
    assert_eq!(
        max_param_diff(
            &mega.engine.per_tensor_params().unwrap(),
            &restored.engine.per_tensor_params().unwrap()
        ),
        0.0
    );
    assert_eq!(mega.engine.lr(), restored.engine.lr());
    let mut single = Actor::new(
        SingleEngine::new(engine_settings()).unwrap(),
        actor_settings(16),
    )
    .unwrap();
    let b = batch(&mut single);
    let m1 = mega.update_policy(&b, 4).unwrap();
    let m2 = restored.update_policy(&b, 4).unwrap();
    assert_eq!(m1, m2, "identical continuation");
    assert_eq!(
        max_param_diff(
            &mega.engine.per_tensor_params().unwrap(),
            &restored.engine.per_tensor_params().unwrap()
        ),
        0.0
    );
    // The weights load at another layout: pipeline parallel 2, and one process. (`saved` holds
    // copies: the update above does not move them.)
    let from_checkpoint = EngineSettings {
        model_path: dir.join("huggingface").display().to_string(),
        ..engine_settings()
    };
    let pp2 = MegatronEngine::<CausalLm>::new(
        from_checkpoint.clone(),
        megatron_settings(Some(&world), (1, 2, 1), false, false),
    )
    .unwrap();
    let got = pp2.per_tensor_params().unwrap();
    assert_eq!(max_param_diff(&saved, &got), 0.0);
    let one = SingleEngine::<CausalLm>::new(from_checkpoint).unwrap();
    assert_eq!(
        max_param_diff(&saved, &one.per_tensor_params().unwrap()),
        0.0
    );
    world.barrier().unwrap();
    if world.rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
});

// Qwen3-MoE's experts split over TP (every expert's gate/up by columns, down by rows; the
// router replicated): log-probs, PPO updates and the sharded rollout, which decodes the MoE
// layers through the TP group, equal the single engine; with and without sequence parallelism.
rank_test!(actor_tp2_moe_matches_single_engine, 2, |world| {
    const MOE_MODEL: &str = "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&arch=qwen3_moe&experts=4&experts_per_tok=3&moe_intermediate=16";
    for sequence_parallel in [false, true] {
        let engine = EngineSettings {
            model_path: MOE_MODEL.into(),
            ..engine_settings()
        };
        compare_with_single_on(&world, (2, 1, 1), sequence_parallel, engine);
    }
});

// Qwen3.5 (Gated DeltaNet layers 0-2, gated attention layer 3) over two pipeline stages,
// then over two tensor ranks: log-probs, PPO updates and the sharded rollout, whose stages
// (or tensor ranks, each with its heads' share) carry the DeltaNet layers' recurrent and
// convolution states, equal the single engine.
rank_test!(actor_qwen3_5_pp2_and_tp2_match_single_engine, 2, |world| {
    let engine = EngineSettings {
        model_path: "builtin://tiny?layers=4&hidden=32&heads=2&kv_heads=2&arch=qwen3_5".into(),
        ..engine_settings()
    };
    compare_with_single_on(&world, (1, 2, 1), false, engine.clone());
    let mut tp2 = compare_with_single_on(&world, (2, 1, 1), false, engine.clone());
    // The rollout at tensor parallel 1 joins both ranks' parts of every fused q/k/v section;
    // from data parallel 2 at rollout tensor parallel 2, each rank cuts its part of them.
    let full = tp2.engine.per_tensor_params().unwrap();
    assert_rollout_matches(&mut tp2.engine, &full, Some(1));
    let mut dp2 = compare_with_single_on(&world, (1, 1, 2), false, engine);
    let full = dp2.engine.per_tensor_params().unwrap();
    assert_rollout_matches(&mut dp2.engine, &full, Some(2));
});

rank_test!(actor_pp2_matches_single_engine, 2, |world| {
    compare_with_single(&world, (1, 2, 1), false);
});

rank_test!(actor_cp2_matches_single_engine, 2, |world| {
    // Context parallel 2 (the two ranks split each sequence).
    let mega = compare_with_single(&world, (1, 1, 1), false);
    assert!(
        mega.engine
            .megatron_module()
            .model
            .context_parallel()
            .is_some()
    );
});

rank_test!(actor_dp2_matches_single_engine, 2, |world| {
    compare_with_single(&world, (1, 1, 2), false);
});

rank_test!(
    actor_tp2_sequence_parallel_matches_single_engine,
    2,
    |world| {
        // Sequences of 11 tokens: padded to 12 for the 2-way sequence split.
        compare_with_single(&world, (2, 1, 1), true);
    }
);

rank_test!(settings_from_the_quickstart_megatron_config, 2, |world| {
    let req = LoadRequest {
        config_file: Some(repo().join("examples/quickstart_megatron.yaml")),
        overrides: vec![
            "trainer.n_gpus_per_node=2".into(),
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2".into(),
        ],
        cwd: repo(),
        builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
        ..LoadRequest::default()
    };
    let spec = match verlc_front::compile::lower_request(&req) {
        verlc_front::compile::SpecOutcome::Ok { spec, .. } => *spec,
        verlc_front::compile::SpecOutcome::Errors(_) => panic!("verlc build rejects the example"),
    };
    let verlc_spec::trainer::EngineSpec::Megatron(m) = spec.actor.engine else {
        panic!("not a Megatron spec")
    };
    let engine = engine_settings();
    let s = MegatronSettings::from_spec(Some(&world), &m).unwrap();
    let g = s.groups.as_ref().unwrap();
    assert_eq!((g.tp.size(), g.pp.size(), g.dp.size()), (2, 1, 1));
    assert!(s.parallel.use_distributed_optimizer);
    // A layout the world cannot hold is an error, not a hang (the compiler reports it first).
    let mut bad = m;
    bad.pipeline_parallel = 2;
    assert!(MegatronSettings::from_spec(Some(&world), &bad).is_err());
    // The engine builds from it.
    let mega = MegatronEngine::<CausalLm>::new(engine, s).unwrap();
    assert_eq!(mega.dp_size(), 1);
});

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(crate) fn critic_settings() -> CriticSettings {
    CriticSettings {
        ppo_mini_batch_size: 8,
        ppo_micro_batch_size: 4,
        forward_micro_batch_size: 4,
        ppo_max_token_len: None,
        forward_max_token_len: None,
        ppo_epochs: 2,
        shuffle: true,
        data_loader_seed: 1,
        cliprange_value: 0.05,
        loss_agg_mode: LossAggMode::TokenMean,
        loss_scale_factor: None,
        release: Default::default(),
    }
}

fn critic_engine(
    world: &ProcessGroup,
    (tp, pp, dp): (usize, usize, usize),
    sequence_parallel: bool,
) -> MegatronEngine<ValueModel> {
    let settings = megatron_settings(Some(world), (tp, pp, dp), sequence_parallel, false);
    MegatronEngine::new(engine_settings(), settings).unwrap()
}

/// The critic (value head on the last stage, replicated over TP): its values, 2 value
/// updates (2 epochs × 2 shuffled mini-batches × 2 micro-batches, clipped value loss) and
/// the final weights against the single engine.
fn critic_matches_single(world: &ProcessGroup, dims: (usize, usize, usize), sp: bool) {
    let mut actor = Actor::new(
        SingleEngine::new(engine_settings()).unwrap(),
        actor_settings(16),
    )
    .unwrap();
    let b = batch(&mut actor);
    let mut single = Critic::new(
        SingleEngine::<ValueModel>::new(engine_settings()).unwrap(),
        critic_settings(),
    )
    .unwrap();
    let mut mega = Critic::new(critic_engine(world, dims, sp), critic_settings()).unwrap();
    // Values of the value pass (under SP the 11-token sequences are padded to 12).
    let vs = single.compute_values(&b).unwrap();
    let vm = mega.compute_values(&b).unwrap();
    let d = (&vs - &vm).abs().max().double_value(&[]);
    assert!(d < 1e-5, "{dims:?} sp={sp}: values differ by {d}");
    critic_updates_match(&mut single, &mut mega, b, vs, &format!("{dims:?} sp={sp}"));
}

/// Two value updates of `single` and `mega` on `b` with the values `vs` (2 epochs of shuffled
/// micro-batches, clipped value loss, the clipped branch taken): their metrics agree, and the
/// weights after each update, which `mega` then takes from `single`.
pub(crate) fn critic_updates_match<A: Engine<Head = ValueModel>, B: Engine<Head = ValueModel>>(
    single: &mut Critic<A>,
    mega: &mut Critic<B>,
    mut b: Batch,
    vs: Tensor,
    what: &str,
) {
    // Returns off the values at every response token. Where `returns == values` (a zero
    // advantage) the single engine's first residual is exactly 0 (its predictions are
    // bit-identical to the values it computed) while TP's all-reduced sums leave ~1e-8:
    // embedding rows of tokens seen only there get gradients of 0 against ~1e-10, which
    // Adam's first step (eps 1e-8) turns into updates of 0 against ~lr/20, amplified
    // rounding rather than a difference of the engines.
    let mask = b.get("response_mask").unwrap().shallow_clone();
    let returns = &vs + (b.get("advantages").unwrap() + 0.1) * &mask;
    b.insert("values", vs).unwrap();
    b.insert("returns", returns).unwrap();
    for step in 1..=2 {
        let ms = single.update_critic(&b, step).unwrap();
        let mm = mega.update_critic(&b, step).unwrap();
        for key in [
            "critic/vf_loss",
            "critic/grad_norm",
            "critic/vf_clipfrac",
            "critic/lr",
        ] {
            let (a, c) = (ms[key], mm[key]);
            assert!(
                (a - c).abs() <= 1e-4 * (1.0 + a.abs()),
                "{what} step {step}: {key} {a} vs {c}"
            );
        }
        if step == 2 {
            // The clipped branch is exercised.
            assert!(ms["critic/vf_clipfrac"] > 0.0, "{what}: {ms:?}");
        }
        take_single_weights(
            &single.engine,
            &mut mega.engine,
            &format!("{what} critic step {step}"),
        );
    }
}

/// Lockstep between updates: the Megatron engine's weights after an update equal the single
/// engine's within 1e-4, then it takes them, so the next update starts from the same weights
/// and rounding cannot compound over updates (the kernels a CPU picks decide nothing).
pub(crate) fn take_single_weights<A: Engine, B: Engine>(single: &A, mega: &mut B, what: &str) {
    let (ps, pm) = (
        single.per_tensor_params().unwrap(),
        mega.per_tensor_params().unwrap(),
    );
    let d = max_param_diff(&ps, &pm);
    assert!(d < 1e-4, "{what}: weights differ by {d} after the update");
    mega.load_params(&ps).unwrap();
}

rank_test!(critic_tp2_sp_and_pp2_match_single_engine, 2, |world| {
    critic_matches_single(&world, (2, 1, 1), false);
    // Sequences of 11 tokens: the hidden states carry one token of right padding.
    critic_matches_single(&world, (2, 1, 1), true);
    critic_matches_single(&world, (1, 2, 1), false);
});

/// verl's `megatron.param_offload` + `grad_offload`: between phases the parameters (with the
/// distributed optimizer's param buffer, which its fp32 pieces view) and the gradient buffers
/// leave device storage for host memory, and the run computes exactly what it computes
/// without offload: log-probs, update metrics, weights, generated tokens.
fn offload_keeps_the_trajectory(world: &ProcessGroup, dims: (usize, usize, usize), dtype: Dtype) {
    let settings = EngineSettings {
        param_dtype: dtype,
        main_dtype: Dtype::Fp32,
        ..engine_settings()
    };
    let mut single = Actor::new(
        SingleEngine::new(engine_settings()).unwrap(),
        actor_settings(16),
    )
    .unwrap();
    let full = batch(&mut single);
    let dp = dims.2;
    let mut plain = Actor::new(
        megatron_engine_with(world, dims, false, false, settings.clone()),
        actor_settings(16 / dp),
    )
    .unwrap();
    let mut off = Actor::new(
        megatron_engine_with(world, dims, false, true, settings),
        actor_settings(16 / dp),
    )
    .unwrap();
    let n = ROWS / dp as i64;
    let local = full.narrow(plain.engine.dp_rank() as i64 * n, n).unwrap();
    let parked = |e: &MegatronEngine<CausalLm>, phase: &str| {
        let r = e.residency();
        assert_eq!(r.device_params, 0, "{phase}: parameters on the device");
        assert_eq!(r.device_grads, 0, "{phase}: gradients on the device");
        assert!(r.host > 0, "{phase}: nothing in host memory");
        r.host
    };
    let at_start = parked(&off.engine, "after construction");
    let resident = plain.engine.residency();
    assert_eq!(resident.host, 0);
    assert_eq!(
        resident.device_params + resident.device_grads,
        at_start,
        "the parameters and gradient buffers moved, all of them"
    );
    for step in 0..3 {
        let a = plain.compute_log_prob(&local).unwrap().log_probs;
        let b = off.compute_log_prob(&local).unwrap().log_probs;
        assert!(a.equal(&b), "step {step}: log-probs");
        parked(&off.engine, "after the log-prob pass");
        let ma = plain.update_policy(&local, step).unwrap();
        let mb = off.update_policy(&local, step).unwrap();
        assert_eq!(ma, mb, "step {step}: update metrics");
        let after = parked(&off.engine, "after the update");
        assert!(
            after >= at_start,
            "everything parked at the start is parked again"
        );
    }
    let (pa, pb) = (
        plain.engine.per_tensor_params().unwrap(),
        off.engine.per_tensor_params().unwrap(),
    );
    assert_eq!(max_param_diff(&pa, &pb), 0.0);
    parked(&off.engine, "after gathering the weights");
    // The rollout holds its own copy of the shards while the parameters stay parked.
    let mut rollout = RolloutWorker::for_layout(
        &off.engine.rollout_layout(None).unwrap(),
        dtype,
        Device::Cpu,
    )
    .unwrap();
    rollout
        .update_weights(&off.engine.rollout_weights().unwrap())
        .unwrap();
    parked(&off.engine, "while the rollout generates");
    let mut reference = RolloutWorker::for_layout(
        &plain.engine.rollout_layout(None).unwrap(),
        dtype,
        Device::Cpu,
    )
    .unwrap();
    reference
        .update_weights(&plain.engine.rollout_weights().unwrap())
        .unwrap();
    let prompts: Vec<Vec<i64>> = vec![vec![1, 5, 6], vec![3, 9, 4]];
    let params = SamplingParams {
        n: 2,
        max_new_tokens: 5,
        seed: 4,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let want = reference.generate(&prompts, &params, &stop).unwrap();
    let got = rollout.generate(&prompts, &params, &stop).unwrap();
    assert!(want.responses.equal(&got.responses));
    assert!(want.rollout_log_probs.equal(&got.rollout_log_probs));
    drop(rollout);
    // A checkpoint written while parked (the optimizer's fp32 pieces view the param buffer)
    // restores into a fresh offloading engine that continues exactly as the plain one.
    let port = std::env::var("MASTER_PORT").unwrap();
    let dir = std::env::temp_dir().join(format!("verlc-megatron-offload-ckpt-{port}"));
    off.engine.save_checkpoint(&dir).unwrap();
    parked(&off.engine, "after saving");
    let mut restored = Actor::new(
        megatron_engine_with(
            world,
            dims,
            false,
            true,
            EngineSettings {
                param_dtype: dtype,
                main_dtype: Dtype::Fp32,
                ..engine_settings()
            },
        ),
        actor_settings(16 / dp),
    )
    .unwrap();
    restored.engine.load_checkpoint(&dir).unwrap();
    parked(&restored.engine, "after loading");
    let ma = plain.update_policy(&local, 3).unwrap();
    let mb = restored.update_policy(&local, 3).unwrap();
    assert_eq!(ma, mb, "after the restore: update metrics");
    assert_eq!(
        max_param_diff(
            &plain.engine.per_tensor_params().unwrap(),
            &restored.engine.per_tensor_params().unwrap()
        ),
        0.0
    );
    world.barrier().unwrap();
    if world.rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

rank_test!(
    offload_tp2_moves_weights_and_grads_without_changing_the_run,
    2,
    |world| {
        offload_keeps_the_trajectory(&world, (2, 1, 1), Dtype::Fp32);
    }
);

rank_test!(
    offload_pp2_bf16_moves_weights_and_grads_without_changing_the_run,
    2,
    |world| {
        offload_keeps_the_trajectory(&world, (1, 2, 1), Dtype::Bf16);
    }
);

rank_test!(
    offload_dp2_moves_weights_and_grads_without_changing_the_run,
    2,
    |world| {
        offload_keeps_the_trajectory(&world, (1, 1, 2), Dtype::Fp32);
    }
);

/// On-policy distillation's top-k forward KL through the Megatron engine against the single
/// engine, at tensor parallel 2 (the vocabulary split: each rank's top candidates gathered,
/// the student's log-probs at the teacher's ids summed from their owners), context parallel 2
/// (the teacher's lists split with the sequence) and pipeline parallel 2 (the teacher's
/// top-k broadcast from the last stage): the teacher's top-k (a Megatron reference engine
/// of its own weights), then 3 PPO updates with the term beside the task's loss give the same
/// loss metrics, gradient norms and weights.
fn compare_topk_distillation(world: &ProcessGroup, dims: (usize, usize, usize)) {
    use verlc_runtime::algo::distillation::{DistillationLossSpec, DistillationMode};
    use verlc_runtime::logits::topk::{TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS};
    use verlc_runtime::workers::reference::Reference;
    const K: i64 = 5;
    let mut settings = actor_settings(16);
    settings.distillation = Some(DistillationLossSpec {
        mode: DistillationMode::ForwardKlTopk {
            topk: K,
            log_prob_min_clamp: Some(-10.0),
        },
        use_task_rewards: true,
        coef: 0.5,
        loss_max_clamp: Some(10.0),
        use_policy_gradient: false,
        clip_ratio_low: 0.2,
        clip_ratio_high: 0.2,
    });
    let mut single = Actor::new(
        SingleEngine::new(engine_settings()).unwrap(),
        settings.clone(),
    )
    .unwrap();
    let mut full = batch(&mut single);
    let teacher_settings = EngineSettings {
        seed: 99,
        optim: None,
        ..engine_settings()
    };
    let mut teacher = Reference::new(
        SingleEngine::<CausalLm>::new(teacher_settings.clone()).unwrap(),
        4,
        1.0,
    )
    .unwrap();
    let want = teacher.compute_topk(&full, K).unwrap();
    let mut mega_teacher = Reference::new(
        megatron_engine_with(world, dims, false, false, teacher_settings),
        4,
        1.0,
    )
    .unwrap();
    let got = mega_teacher.compute_topk(&full, K).unwrap();
    let mask = full
        .get("response_mask")
        .unwrap()
        .to_kind(Kind::Bool)
        .unsqueeze(-1);
    assert!(
        got.ids
            .masked_select(&mask)
            .equal(&want.ids.masked_select(&mask)),
        "{dims:?}: the teacher's top-k ids differ"
    );
    let d = ((&got.log_probs - &want.log_probs) * &mask)
        .abs()
        .max()
        .double_value(&[]);
    assert!(
        d < 1e-5,
        "{dims:?}: the teacher's top-k log-probs differ by {d}"
    );
    full.insert(TEACHER_TOPK_IDS, want.ids).unwrap();
    full.insert(TEACHER_TOPK_LOG_PROBS, want.log_probs).unwrap();
    let mut mega = Actor::new(megatron_engine(world, dims, false), settings).unwrap();
    for step in 1..=3 {
        let ms = single.update_policy(&full, step).unwrap();
        let mm = mega.update_policy(&full, step).unwrap();
        for key in [
            "actor/grad_norm",
            "actor/pg_loss",
            "actor/distillation/loss",
            "actor/distillation/loss_max",
            "actor/distillation/overlap_ratio",
            "actor/distillation/teacher_mass",
        ] {
            let (a, b) = (ms[key], mm[key]);
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                "{dims:?} step {step}: {key} {a} vs {b}"
            );
        }
        assert!(ms["actor/distillation/loss"] > 0.0);
        take_single_weights(
            &single.engine,
            &mut mega.engine,
            &format!("{dims:?} step {step}"),
        );
    }
}

rank_test!(actor_topk_distillation_matches_single_engine, 2, |world| {
    // Tensor, context (the ranks left over), then pipeline parallel 2.
    for dims in [(2, 1, 1), (1, 1, 1), (1, 2, 1)] {
        compare_topk_distillation(&world, dims);
    }
});

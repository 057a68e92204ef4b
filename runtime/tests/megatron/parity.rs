//! TP=2 (also with sequence parallelism, on Qwen3's per-head q/k norms and on Qwen3-MoE's
//! experts), PP=2 and DP=2
//! training on 2 Gloo ranks against the single-process model and optimizer: 10 steps of
//! next-token cross-entropy on a fixed batch, in lockstep (support.rs' `lockstep`: each step
//! from the same weights, its loss, grad norm and updated weights must match).
use tch::{Device, Kind, Tensor};
use verlc_runtime::engine::megatron::{HeadKind, MegatronModule, MicroBatch, ParallelSettings};
use verlc_runtime::model::ModelConfig;
use verlc_runtime::model::save::{SaveOptions, save_named};
use verlc_runtime::optim::LossScaling;
use verlc_runtime::optim::distrib::LayoutOptions;
use verlc_runtime::parallel::dist::{ProcessGroup, ReduceOp};
use verlc_runtime::parallel::layout::{ProcessGroups, RankLayout};

use crate::rank_test;
use crate::support::*;

pub(crate) const STEPS: usize = 20;
/// Steps of a [`lockstep`] comparison: each is checked from the same weights, so a few cover
/// what many would (Adam's moments building up, the clipping of every step).
pub(crate) const LOCKSTEP_STEPS: usize = 10;
pub(crate) const ROWS: i64 = 8;
pub(crate) const LEN: i64 = 10;

/// Tensor, context, pipeline and data parallel sizes.
#[derive(Clone, Copy)]
struct Grid {
    tp: usize,
    cp: usize,
    pp: usize,
    dp: usize,
}

const fn grid(tp: usize, pp: usize, dp: usize) -> Grid {
    Grid { tp, cp: 1, pp, dp }
}

struct Run {
    weights: Vec<(String, Tensor)>,
    module: MegatronModule,
}

/// The module over `g` with the reference's starting weights and its optimizer.
fn parallel_module(
    world: &ProcessGroup,
    Grid { tp, cp, pp, dp }: Grid,
    cfg: &ModelConfig,
    sequence_parallel: bool,
    settings: ParallelSettings,
    setup: &Setup,
) -> MegatronModule {
    let layout = RankLayout::megatron(tp, cp, pp, dp).unwrap();
    let groups = ProcessGroups::new(world, &layout).unwrap();
    let mut m = MegatronModule::with_sequence_parallel(
        cfg,
        HeadKind::CausalLm,
        Some(groups),
        Device::Cpu,
        setup.kind,
        sequence_parallel,
    )
    .unwrap();
    let (vs, _) = reference_model(cfg, setup.kind);
    m.load_full(&full_weights(&vs)).unwrap();
    m.build_optimizer(setup.optim, make_groups, settings, LossScaling::LINKED)
        .unwrap();
    m
}

/// A Megatron module training on this rank's share of the fixed batch in `num_mb`
/// micro-batches (the global mean loss), as one side of a [`lockstep`].
pub(crate) struct Parallel<'a> {
    world: &'a ProcessGroup,
    pub(crate) module: &'a mut MegatronModule,
    mbs: Vec<MicroBatch>,
    n: f64,
    /// How many ranks compute each loss (the TP and CP ranks of a data-parallel rank).
    copies: usize,
}

impl<'a> Parallel<'a> {
    pub(crate) fn new(
        world: &'a ProcessGroup,
        module: &'a mut MegatronModule,
        cfg: &ModelConfig,
        copies: usize,
        num_mb: i64,
    ) -> Parallel<'a> {
        let (ids, mask, pos) = batch(cfg, ROWS, LEN);
        let n = token_count(&mask);
        let (dp_rank, dp_size) = module.dp_rank_size();
        let local = ROWS / dp_size as i64;
        let rows = |t: &Tensor| t.narrow(0, dp_rank as i64 * local, local);
        let (ids, mask, pos) = (rows(&ids), rows(&mask), rows(&pos));
        let per_mb = local / num_mb;
        let mbs = (0..num_mb)
            .map(|i| MicroBatch {
                input_ids: ids.narrow(0, i * per_mb, per_mb),
                position_ids: pos.narrow(0, i * per_mb, per_mb),
                attention_mask: Some(mask.narrow(0, i * per_mb, per_mb)),
                images: None,
            })
            .collect();
        Parallel::on(world, module, mbs, n, copies)
    }

    /// The module training on this rank's micro-batches `mbs`, the global loss being a mean
    /// over `n` tokens.
    pub(crate) fn on(
        world: &'a ProcessGroup,
        module: &'a mut MegatronModule,
        mbs: Vec<MicroBatch>,
        n: f64,
        copies: usize,
    ) -> Parallel<'a> {
        Parallel {
            world,
            module,
            mbs,
            n,
            copies,
        }
    }
}

impl Stepper for Parallel<'_> {
    fn step(&mut self) -> (f64, f64) {
        let (_, dp_size) = self.module.dp_rank_size();
        let (mbs, n) = (&self.mbs, self.n);
        self.module.zero_grad().unwrap();
        let mut acc = 0.0;
        self.module
            .forward_backward(mbs, &mut |mb, model, tape, hidden| {
                let sum = log_prob_sum(model, tape, hidden, &mbs[mb])?;
                acc += sum.double_value(&[]);
                // The micro-batch's share of the global mean, times DP (gradients are averaged).
                Ok(sum * (dp_size as f64 / n))
            })
            .unwrap();
        // Global loss: the last stage's sums over DP (TP and CP ranks hold copies).
        let last = self.module.model.stage.is_last();
        let t = Tensor::from_slice(&[if last { acc } else { 0.0 }]);
        self.world.all_reduce(&t, ReduceOp::Sum).unwrap();
        let loss = t.double_value(&[0]) / self.copies as f64 / n;
        let out = self.module.step().unwrap();
        assert!(out.update_successful);
        assert!(out.grad_norm.is_some_and(f64::is_finite));
        (loss, out.grad_norm.unwrap_or(f64::NAN))
    }

    fn weights(&self) -> Vec<(String, Tensor)> {
        self.module.full_params().unwrap()
    }

    fn load(&mut self, weights: &[(String, Tensor)]) {
        self.module.load_full(weights).unwrap();
    }
}

/// [`STEPS`] free-running steps (no reference beside them): every step's loss and grad norm.
pub(crate) fn train_steps(
    world: &ProcessGroup,
    m: &mut MegatronModule,
    cfg: &ModelConfig,
    copies: usize,
    num_mb: i64,
) -> (Vec<f64>, Vec<f64>) {
    let mut p = Parallel::new(world, m, cfg, copies, num_mb);
    (0..STEPS).map(|_| p.step()).unzip()
}

/// The distributed optimizer with the default layout.
fn distributed_optimizer() -> ParallelSettings {
    ParallelSettings {
        use_distributed_optimizer: true,
        layout: LayoutOptions::default(),
    }
}

/// The module over `g` in fp32, in [`lockstep`] with the single-process model for
/// [`STEPS`] steps (which must learn); the module's final weights (the reference's).
fn fp32_matches(
    world: &ProcessGroup,
    g: Grid,
    cfg: &ModelConfig,
    sequence_parallel: bool,
    settings: ParallelSettings,
    num_mb: i64,
) -> Run {
    let setup = Setup::fp32();
    let mut module = parallel_module(world, g, cfg, sequence_parallel, settings, &setup);
    let mut reference = Reference::new(cfg, ROWS, LEN, &setup);
    let mut parallel = Parallel::new(world, &mut module, cfg, g.tp * g.cp, num_mb);
    let want = lockstep(&mut reference, &mut parallel, LOCKSTEP_STEPS, 1e-5).losses;
    assert!(
        want[LOCKSTEP_STEPS - 1] < want[0] * 0.9,
        "the reference does not learn: {want:?}"
    );
    let weights = module.full_params().unwrap();
    Run { weights, module }
}

rank_test!(tp2_matches_single_process, 2, |world| {
    // Replicated optimizer (grad norm over the TP group, duplicates counted once), untied
    // output layer; then export to HF format and load it back sharded.
    let cfg = tiny_config(false);
    let run = fp32_matches(
        &world,
        grid(2, 1, 1),
        &cfg,
        false,
        ParallelSettings::default(),
        2,
    );
    // One directory for both ranks (their process ids differ; the rendezvous port does not).
    let port = std::env::var("MASTER_PORT").unwrap();
    let dir = std::env::temp_dir().join(format!("verlc-megatron-tp2-export-{port}"));
    if world.rank() == 0 {
        let cfg = tiny_config(false);
        save_named(
            &run.weights,
            &cfg,
            "Qwen2ForCausalLM",
            &dir,
            &SaveOptions::default(),
        )
        .unwrap();
    }
    world.barrier().unwrap();
    let groups = ProcessGroups::new(&world, &RankLayout::megatron(2, 1, 1, 1).unwrap()).unwrap();
    let mut fresh = MegatronModule::new(
        &tiny_config(false),
        HeadKind::CausalLm,
        Some(groups),
        Device::Cpu,
        Kind::Float,
    )
    .unwrap();
    fresh.load_pretrained(&dir, &[]).unwrap();
    for ((n, a), (m, b)) in fresh.full_params().unwrap().iter().zip(&run.weights) {
        assert_eq!(n, m);
        assert_eq!(max_diff(a, b), 0.0, "{n}");
    }
    let local = run.module.model.params();
    assert!(
        local
            .iter()
            .any(|p| p.name == "lm_head.weight" && p.tensor.size() == vec![19, 32])
    );
});

rank_test!(tp2_moe_matches_single_process, 2, |world| {
    // Qwen3-MoE under TP=2: every expert's gate/up split by columns and down by rows (expert
    // tensor parallelism = TP, as Megatron's default), the router replicated with its
    // gradient summed over TP; without and with sequence parallelism.
    let cfg = tiny_moe_config();
    for sequence_parallel in [false, true] {
        let run = fp32_matches(
            &world,
            grid(2, 1, 1),
            &cfg,
            sequence_parallel,
            ParallelSettings::default(),
            2,
        );
        let local = run.module.model.params();
        let expert = local
            .iter()
            .find(|p| p.name == "model.layers.0.mlp.experts.3.down_proj.weight")
            .expect("expert 3 on every TP rank");
        assert_eq!(
            expert.tensor.size(),
            vec![32, 8],
            "half of its intermediate size"
        );
        assert!(
            local
                .iter()
                .any(|p| p.name == "model.layers.1.mlp.gate.weight" && p.grad_partial_over_tp)
        );
    }
});

rank_test!(pp2_matches_single_process, 2, |world| {
    // Tied embeddings across stages (shared embedding summed over the embedding group),
    // 1F1B over 4 micro-batches, distributed optimizer with one DP rank.
    let settings = distributed_optimizer();
    let cfg = tiny_config(true);
    let run = fp32_matches(&world, grid(1, 2, 1), &cfg, false, settings, 4);
    assert_eq!(
        run.module.model.stage.layers,
        world.rank()..world.rank() + 1
    );
});

rank_test!(dp2_matches_single_process, 2, |world| {
    // Distributed optimizer over 2 DP ranks, several buckets.
    let settings = ParallelSettings {
        use_distributed_optimizer: true,
        layout: LayoutOptions {
            bucket_size: Some(3000),
            ..Default::default()
        },
    };
    let cfg = tiny_config(true);
    let run = fp32_matches(&world, grid(1, 1, 2), &cfg, false, settings, 2);
    let (opt, total) = distributed_state(&run.module);
    assert!(opt.layout().buckets.len() > 1);
    assert!(opt.owned_numel() < total, "state is not sharded");
});

rank_test!(dp2_bf16_offload_tracks_single_process, 2, |world| {
    // bf16 params with fp32 main params; half of the optimizer (by elements, greedy over this
    // rank's pieces) on the host. Compared with the single-process bf16 run: rounding of the
    // bf16 forward differs with the micro-batch split, so the tolerance is bf16's.
    let settings = distributed_optimizer();
    let setup = Setup::bf16_offload();
    let cfg = tiny_config(true);
    let mut module = parallel_module(&world, grid(1, 1, 2), &cfg, false, settings, &setup);
    let (losses, _) = train_steps(&world, &mut module, &cfg, 1, 2);
    let inner = module.inner_optimizer().unwrap();
    assert!(inner.offloaded_numel() > 0, "nothing offloaded");
    let weights = module.full_params().unwrap();
    assert!(weights.iter().all(|(_, t)| t.kind() == Kind::BFloat16));
    // Adam moves weights whose gradients are rounding noise (k_proj biases) by up to lr per
    // step in either direction, so bf16 weights are compared by the relative norm of the whole
    // difference, not element-wise. For scale: the single-process bf16 run itself, with the
    // batch in 4 micro-batches instead of 1, ends 1.0e-2 away (relative norm) from itself.
    let (ref_losses, ref_weights) = reference_run(&cfg, STEPS, ROWS, LEN, &setup);
    assert!(ref_losses[STEPS - 1] < ref_losses[0] * 0.9);
    for (i, (a, b)) in losses.iter().zip(&ref_losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-2 * b,
            "step {i}: loss {a} vs single-process {b}"
        );
    }
    let (mut diff, mut norm) = (0.0, 0.0);
    for (name, w) in &ref_weights {
        let (_, got) = weights.iter().find(|(n, _)| n == name).unwrap();
        let (got, w) = (got.to_kind(Kind::Double), w.to_kind(Kind::Double));
        diff += (&got - &w).square().sum(Kind::Double).double_value(&[]);
        norm += w.square().sum(Kind::Double).double_value(&[]);
    }
    let rel = (diff / norm).sqrt();
    assert!(rel < 3e-2, "weights differ by {rel} (relative norm)");
});

rank_test!(
    gemma_families_and_seed_oss_match_single_process,
    2,
    |world| {
        // Gemma: the scaled embedding looked up by vocabulary halves (TP) or on the first stage
        // only with the tied output layer on the last (PP), (1 + w) norms, tanh-GELU gates split
        // by columns. Seed-OSS: q/k/v biases split with their heads, the output projection's and
        // the MLP's row-split biases added once.
        let gemma = tiny_family_config("gemma", true, &[]);
        assert!(gemma.embedding_scale().is_some() && gemma.hidden_act == "gelu_pytorch_tanh");
        let bias = serde_json::Value::Bool(true);
        let mut seed = tiny_family_config("seed_oss", false, &[("attention_out_bias", bias)]);
        seed.mlp_bias = true;
        assert!(seed.qkv_bias() && seed.o_bias());
        let settings = ParallelSettings::default();
        fp32_matches(&world, grid(2, 1, 1), &gemma, false, settings, 2);
        fp32_matches(&world, grid(1, 2, 1), &gemma, false, settings, 4);
        fp32_matches(&world, grid(2, 1, 1), &seed, true, settings, 2);
        // Gemma 2 under TP 2 with sequence parallelism: the norms after attention and MLP on
        // each rank's half of the sequence (their gradients summed over TP), scores capped on
        // this rank's heads, logits capped on its vocabulary half; caps, window and query scale
        // set where they change this tiny model's numbers.
        let gemma2 = tiny_family_config(
            "gemma2",
            true,
            &[
                ("attn_logit_softcapping", serde_json::json!(1.0)),
                ("final_logit_softcapping", serde_json::json!(2.0)),
                ("query_pre_attn_scalar", serde_json::json!(6)),
                ("sliding_window", serde_json::json!(3)),
            ],
        );
        assert!(gemma2.sandwich_norms() && gemma2.query_scale().is_some());
        assert_eq!(gemma2.attention_window(0), Some(3));
        let run = fp32_matches(&world, grid(2, 1, 1), &gemma2, true, settings, 2);
        assert!(run.module.model.params().iter().any(
            |p| p.grad_partial_over_tp && p.name.ends_with("post_feedforward_layernorm.weight")
        ));
    }
);

rank_test!(
    tp2_sequence_parallel_qwen3_matches_single_process,
    2,
    |world| {
        // Qwen3: q/k norms see only this rank's heads, so their gradients are summed over TP;
        // sequence parallelism: norms and the residual stream on half the sequence each.
        let mut cfg = tiny_config(true);
        cfg.model_type = "qwen3".into();
        let settings = distributed_optimizer();
        let run = fp32_matches(&world, grid(2, 1, 1), &cfg, true, settings, 2);
        assert!(run.module.model.sequence_parallel());
        let partial: Vec<String> = run
            .module
            .model
            .params()
            .into_iter()
            .filter(|p| p.grad_partial_over_tp)
            .map(|p| p.name)
            .collect();
        assert!(
            partial.iter().any(|n| n.ends_with("q_norm.weight"))
                && partial.contains(&"model.norm.weight".to_owned())
        );
    }
);

rank_test!(cp2_matches_single_process, 2, |world| {
    // Context parallelism: each sequence (10 positions, padded to 12) in four chunks, rank 0
    // holding the first and last, rank 1 the middle two; keys and values gathered in every
    // layer, gradients summed over the group. Tied embeddings, distributed optimizer; then
    // Qwen3-MoE (per-token routing on each rank's positions) with the replicated one.
    let settings = distributed_optimizer();
    let cp2 = Grid {
        tp: 1,
        cp: 2,
        pp: 1,
        dp: 1,
    };
    let cfg = tiny_config(true);
    let run = fp32_matches(&world, cp2, &cfg, false, settings, 2);
    assert!(run.module.model.context_parallel().is_some());
    // The optimizer's state is split over DP x CP (Megatron's dp_cp group): half per rank.
    let (opt, total) = distributed_state(&run.module);
    assert!(
        opt.owned_numel() * 2 <= total + 64,
        "{} of {total}",
        opt.owned_numel()
    );
    let cfg = tiny_moe_config();
    fp32_matches(&world, cp2, &cfg, false, ParallelSettings::default(), 2);
    // Qwen3.5: each Gated DeltaNet layer gathers its input into sequence order, runs the
    // whole recurrence on both ranks and keeps its own positions.
    let cfg = tiny_qwen3_5_config(false);
    fp32_matches(&world, cp2, &cfg, false, distributed_optimizer(), 2);
});

rank_test!(tp2_cp2_matches_single_process, 4, |world| {
    // TP=2 x CP=2 on 4 ranks with sequence parallelism (Qwen3's per-head norms): each CP
    // rank's positions split again over TP between the tensor-parallel layers (10 positions
    // padded to 16); then Qwen3.5-MoE.
    let mut cfg = tiny_config(true);
    cfg.model_type = "qwen3".into();
    let settings = distributed_optimizer();
    let g = Grid {
        tp: 2,
        cp: 2,
        pp: 1,
        dp: 1,
    };
    fp32_matches(&world, g, &cfg, true, settings, 2);
    // Qwen3.5-MoE: DeltaNet heads split over TP, sequences over CP, experts over TP.
    let cfg = tiny_qwen3_5_config(true);
    fp32_matches(&world, g, &cfg, true, distributed_optimizer(), 2);
});

rank_test!(qwen3_5_pp2_and_dp2_match_single_process, 2, |world| {
    // Qwen3.5 on the Megatron engine (its Gated DeltaNet and gated attention layers whole on
    // each rank): two pipeline stages (DeltaNet layers 0-1, then layer 2 and the attention
    // layer), then the MoE variant over two data-parallel ranks with the distributed optimizer.
    let cfg = tiny_qwen3_5_config(false);
    let pp2 = grid(1, 2, 1);
    fp32_matches(&world, pp2, &cfg, false, ParallelSettings::default(), 4);
    qwen3_5_moe_matches_single_process(&world, grid(1, 1, 2), false);
});

rank_test!(qwen3_5_tp2_matches_single_process, 2, |world| {
    // Qwen3.5 under TP=2: each Gated DeltaNet layer holds one of its two key heads and its
    // value heads (the fused q/k/v projection and convolution split section by section),
    // `out_proj` split by rows, the gated norm's gradient summed over TP; the gated attention
    // layer's `q_proj` split with each head's gate; with sequence parallelism, then the MoE
    // variant (its experts split over TP) with the distributed optimizer.
    // (TP=2 without sequence parallelism runs in the engine test, engine.rs.)
    let cfg = tiny_qwen3_5_config(false);
    let run = fp32_matches(
        &world,
        grid(2, 1, 1),
        &cfg,
        true,
        ParallelSettings::default(),
        2,
    );
    let qkv = run
        .module
        .model
        .params()
        .into_iter()
        .find(|p| p.name == "model.layers.0.linear_attn.in_proj_qkv.weight")
        .unwrap();
    let l = &cfg.linear;
    assert_eq!(qkv.tensor.size(), vec![l.conv_dim() / 2, cfg.hidden_size]);
    qwen3_5_moe_matches_single_process(&world, grid(2, 1, 1), true);
});

/// The tiny Qwen3.5-MoE over `g` with the distributed optimizer, against one process.
fn qwen3_5_moe_matches_single_process(world: &ProcessGroup, g: Grid, sequence_parallel: bool) {
    let cfg = tiny_qwen3_5_config(true);
    let settings = distributed_optimizer();
    fp32_matches(world, g, &cfg, sequence_parallel, settings, 2);
}

rank_test!(qwen3_5_cp2_gradients_equal_one_process, 2, |world| {
    // One forward and backward of a Qwen3.5 under context parallel 2 (every Gated DeltaNet
    // layer gathering whole sequences, each rank keeping its positions' outputs): after the
    // gradients are summed over the group, every parameter's equals the single process's.
    let cfg = tiny_qwen3_5_config(false);
    let layout = RankLayout::megatron(1, 2, 1, 1).unwrap();
    let groups = ProcessGroups::new(&world, &layout).unwrap();
    let mut m = MegatronModule::with_sequence_parallel(
        &cfg,
        HeadKind::CausalLm,
        Some(groups),
        Device::Cpu,
        Kind::Float,
        false,
    )
    .unwrap();
    let (vs, model) = reference_model(&cfg, Kind::Float);
    m.load_full(&full_weights(&vs)).unwrap();
    // The replicated optimizer: its gradient finalisation sums the group's gradients.
    let settings = ParallelSettings::default();
    m.build_optimizer(optim_config(), make_groups, settings, LossScaling::LINKED)
        .unwrap();
    let (ids, mask, pos) = batch(&cfg, ROWS, LEN);
    let n = token_count(&mask);
    let mbs = vec![MicroBatch {
        input_ids: ids.shallow_clone(),
        position_ids: pos.shallow_clone(),
        attention_mask: Some(mask.shallow_clone()),
        images: None,
    }];
    m.zero_grad().unwrap();
    m.forward_backward(&mbs, &mut |mb, model, tape, hidden| {
        Ok(log_prob_sum(model, tape, hidden, &mbs[mb])? * (1.0 / n))
    })
    .unwrap();
    m.finalize_grads().unwrap();
    let logits = model.forward(&ids, &pos, Some(&mask), None);
    let lp = verlc_runtime::logits::logprob::log_probs_from_logits(
        &logits.narrow(1, 0, LEN - 1),
        &ids.narrow(1, 1, LEN - 1),
    );
    (masked_sum(&lp, &mask) / n).backward();
    let reference = vs.variables();
    let params = m.model.params();
    assert_eq!(params.len(), reference.len());
    for p in params {
        let theirs = reference[&p.name].grad();
        let d = max_diff(&p.tensor.grad(), &theirs);
        let scale = theirs.abs().max().double_value(&[]);
        assert!(
            d <= 1e-5 * scale + 1e-9,
            "{}: gradient differs by {d:e} (largest {scale:e})",
            p.name
        );
    }
});

//! The FSDP engine on 2 Gloo ranks against the single-process engine: steps of a masked
//! token-mean NLL on a fixed batch (each rank trains on its half of the rows, the single engine
//! on all of them), in lockstep (`lockstep`: each step from the same weights, the same loss,
//! grad norm and updated weights); sharded state is half of the single engine's; offload and the sharded checkpoint keep the trajectory. fp16: the same skipped
//! steps and loss scales as the single engine, an overflow on one rank's shard skips the step
//! on every rank, and the checkpoint restores the loss scaler.
#[path = "common/mod.rs"]
mod common;

use tch::{Device, Kind, Tensor};
use verlc_runtime::engine::fsdp::{FsdpEngine, FsdpSettings};
use verlc_runtime::engine::{
    Batch, Engine, EngineSettings, ForwardOptions, MicroLoss, OptimSettings, SchedulerSettings,
    SingleEngine, StepResult,
};
use verlc_runtime::model::{CausalLm, Dtype};
use verlc_runtime::optim::sched::{VerlSchedule, VerlSchedulerConfig};
use verlc_runtime::optim::{AdamWConfig, GradScaler, InnerConfig};
use verlc_runtime::parallel::dist::{ProcessGroup, ReduceOp};

const MODEL: &str = "builtin://tiny?layers=3&hidden=32&heads=4&kv_heads=2&intermediate=64";
const STEPS: usize = 20;
/// Steps of a [`lockstep`] comparison: each is checked from the same weights, so a few cover
/// what many would (the warm-up, the schedule's decay, Adam's moments building up).
const LOCKSTEP_STEPS: usize = 10;
const ROWS: i64 = 8;
const PROMPT: i64 = 4;
const RESP: i64 = 6;
const MICRO: usize = 2;

/// A tiny Qwen3-MoE: 4 experts, top-2, in both layers.
const MOE_MODEL: &str = "builtin://tiny?arch=qwen3_moe&layers=2&hidden=32&heads=4&kv_heads=2&intermediate=64&experts=4&experts_per_tok=2&moe_intermediate=16";

/// A tiny Qwen3.5-MoE: three Gated DeltaNet layers and a gated attention layer, every MLP
/// sparse (4 experts, top-3, so every expert sees tokens in every step: an expert no token
/// chose has no gradient on one process, which AdamW skips, while FSDP's flat shard steps it
/// with a zero gradient, as PyTorch's FSDP does) with a shared expert.
const QWEN3_5_MODEL: &str = "builtin://tiny?arch=qwen3_5_moe&layers=4&hidden=32&heads=4&kv_heads=2&experts=4&experts_per_tok=3&moe_intermediate=16";

fn settings(dtype: Dtype, offload: bool) -> EngineSettings {
    settings_for(MODEL, dtype, offload)
}

fn settings_for(model: &str, dtype: Dtype, offload: bool) -> EngineSettings {
    EngineSettings {
        model_path: model.into(),
        device: Device::Cpu,
        param_dtype: dtype,
        main_dtype: Dtype::Fp32,
        seed: 11,
        optim: Some(OptimSettings {
            freeze_vision_tower: false,
            inner: InnerConfig::AdamW(AdamWConfig::default()),
            lr: 5e-3,
            weight_decay: 0.01,
            clip_grad: 1.0,
            offload,
            offload_fraction: 0.0,
            schedule: SchedulerSettings::Verl(VerlSchedulerConfig {
                schedule: VerlSchedule::Cosine {
                    min_lr_ratio: 0.1,
                    num_cycles: 0.5,
                },
                lr_warmup_steps: 2,
                lr_warmup_steps_ratio: 0.0,
                total_training_steps: STEPS as i64,
                zero_indexed_step: true,
            }),
        }),
        loss_scale_factor: None,
        loss_scaling: verlc_runtime::optim::LossScaling::LINKED,
        lora: None,
        config_overrides: Default::default(),
        remove_padding: false,
    }
}

/// A fixed batch with left padding and ragged response masks.
fn full_batch() -> Batch {
    let t = PROMPT + RESP;
    let vocab = 14i64;
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    let mut pos = Vec::new();
    let mut rmask = Vec::new();
    for i in 0..ROWS {
        let pad = i % 3;
        let mut p = 0i64;
        for j in 0..t {
            ids.push(3 + (i * 7 + j * 5 + (i * j) % 3) % vocab);
            let m = i64::from(j >= pad);
            mask.push(m);
            pos.push(p);
            p += m;
        }
        for j in 0..RESP {
            rmask.push(if j < RESP - (i % 4) { 1f32 } else { 0.0 });
        }
    }
    let ids = Tensor::from_slice(&ids).view([ROWS, t]);
    let responses = ids.narrow(1, PROMPT, RESP).copy();
    Batch::new()
        .with("input_ids", ids)
        .and_then(|b| b.with("attention_mask", Tensor::from_slice(&mask).view([ROWS, t])))
        .and_then(|b| b.with("position_ids", Tensor::from_slice(&pos).view([ROWS, t])))
        .and_then(|b| b.with("responses", responses))
        .and_then(|b| {
            b.with(
                "response_mask",
                Tensor::from_slice(&rmask).view([ROWS, RESP]),
            )
        })
        .expect("batch")
}

/// One step of masked token-mean NLL; returns the global loss.
fn train_step<E: Engine<Head = CausalLm>>(
    e: &mut E,
    batch: &Batch,
    group: Option<&ProcessGroup>,
) -> f64 {
    let (loss, step) = try_step(e, batch, group);
    assert!(step.update_successful && step.grad_norm.is_some_and(f64::is_finite));
    loss
}

/// One step that may be skipped (fp16 overflow): the global loss and the optimizer's result.
fn try_step<E: Engine<Head = CausalLm>>(
    e: &mut E,
    batch: &Batch,
    group: Option<&ProcessGroup>,
) -> (f64, StepResult) {
    e.optimizer_zero_grad().expect("zero grad");
    let loss = backward(e, batch, group);
    let step = e.optimizer_step().expect("step");
    e.lr_scheduler_step().expect("lr");
    (loss, step)
}

/// Forward and backward of one step's micro-batches; returns the global loss.
fn backward<E: Engine<Head = CausalLm>>(
    e: &mut E,
    batch: &Batch,
    group: Option<&ProcessGroup>,
) -> f64 {
    let mut loss_fn = |mb: &Batch,
                       out: verlc_runtime::logits::LogProbOutput,
                       agg: &verlc_runtime::algo::AggOptions| {
        let m = mb.get("response_mask")?;
        let n = agg.batch_num_tokens.unwrap_or(1.0);
        let loss = -(out.log_probs * m).sum(Kind::Float) * (agg.dp_size as f64 / n);
        let v = loss.double_value(&[]) / agg.dp_size as f64;
        Ok(MicroLoss {
            loss,
            metrics: [("loss".to_owned(), v)].into_iter().collect(),
        })
    };
    let metrics = e
        .forward_backward(
            batch,
            &MICRO.into(),
            &ForwardOptions::default(),
            &mut loss_fn,
        )
        .expect("forward/backward");
    let local: f64 = metrics.iter().map(|m| m["loss"]).sum();
    match group {
        Some(g) => {
            let t = Tensor::from_slice(&[local]);
            g.all_reduce(&t, ReduceOp::Sum).expect("all-reduce");
            t.double_value(&[0])
        }
        None => local,
    }
}

/// `full_batch` with `extra` more padding columns on the left of every row.
fn padded_more(extra: i64) -> Batch {
    let b = full_batch();
    let mut out = Batch::new();
    for name in ["input_ids", "attention_mask", "position_ids"] {
        let t = b.get(name).expect("sequence tensor");
        let pad = Tensor::zeros([ROWS, extra], (t.kind(), Device::Cpu));
        out.insert(name, Tensor::cat(&[&pad, t], 1))
            .expect("insert");
    }
    for name in ["responses", "response_mask"] {
        out.insert(name, b.get(name).expect("response tensor").shallow_clone())
            .expect("insert");
    }
    out
}

// Prompts are left-padded for the whole batch; columns that are padding in every row of a
// micro-batch are dropped before its forward. The values of the valid tokens stay what the
// model computes over the full padded width.
#[test]
fn shared_left_padding_costs_no_compute_and_changes_no_value() {
    use verlc_runtime::engine::Head;
    let padded = padded_more(5);
    let trimmed = padded.without_shared_left_padding().expect("trim");
    // Some rows of `full_batch` have no padding: exactly the 5 extra columns go.
    assert_eq!(
        trimmed.get("input_ids").unwrap().size(),
        [ROWS, PROMPT + RESP]
    );
    assert_eq!(
        trimmed.get("position_ids").unwrap().size(),
        [ROWS, PROMPT + RESP]
    );
    assert_eq!(trimmed.get("responses").unwrap().size(), [ROWS, RESP]);
    let mut e = SingleEngine::<CausalLm>::new(settings(Dtype::Fp32, false)).expect("single");
    let fwd = ForwardOptions::default();
    let by_micro_batch = e.infer_batch(&padded, &MICRO.into(), &fwd).expect("infer");
    let got = Tensor::cat(
        &by_micro_batch
            .iter()
            .map(|o| &o.log_probs)
            .collect::<Vec<_>>(),
        0,
    );
    let want = tch::no_grad(|| Head::forward(e.module(), &padded, &fwd))
        .expect("forward")
        .log_probs;
    let d = (got - want).abs().max().double_value(&[]);
    assert!(d < 1e-5, "log-probs differ by {d}");
}

/// [`STEPS`] steps of the single engine in `dtype` on the whole batch: the losses and weights.
fn single_run(dtype: Dtype) -> (Vec<f64>, Vec<(String, Tensor)>) {
    let mut e = SingleEngine::<CausalLm>::new(settings(dtype, false)).expect("single engine");
    let batch = full_batch();
    let losses = (0..STEPS)
        .map(|_| train_step(&mut e, &batch, None))
        .collect();
    (losses, e.per_tensor_params().expect("params"))
}

fn single_engine(model: &str) -> SingleEngine<CausalLm> {
    SingleEngine::<CausalLm>::new(settings_for(model, Dtype::Fp32, false)).expect("single engine")
}

fn my_rows(pg: &ProcessGroup) -> Batch {
    let local = ROWS / pg.size() as i64;
    full_batch()
        .narrow(pg.rank() as i64 * local, local)
        .expect("rows")
}

fn assert_close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * y.abs().max(1.0),
            "{what} {i}: {x} vs {y} (all: {a:?} vs {b:?})"
        );
    }
}

fn assert_weights(a: &[(String, Tensor)], b: &[(String, Tensor)], tol: f64) {
    let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let (mut na, mut nb) = (names(a), names(b));
    na.sort();
    nb.sort();
    assert_eq!(na, nb);
    for (n, t) in a {
        let (_, u) = b.iter().find(|(m, _)| m == n).expect("same names");
        let d = (t.to_kind(Kind::Float) - u.to_kind(Kind::Float))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d <= tol, "weight {n}: max |diff| {d}");
    }
}

/// |a - b| / |b - init| over all weights (Frobenius norms): how far apart two runs from
/// `init` ended, relative to how far `b` moved.
fn update_drift(a: &[(String, Tensor)], b: &[(String, Tensor)], init: &[(String, Tensor)]) -> f64 {
    let find = |v: &[(String, Tensor)], n: &str| {
        v.iter()
            .find(|(m, _)| m == n)
            .map(|(_, x)| x.to_kind(Kind::Double))
            .expect("same names")
    };
    let sq = |x: Tensor| x.square().sum(Kind::Double).double_value(&[]);
    let (mut apart, mut moved) = (0f64, 0f64);
    for (n, t) in b {
        let t = t.to_kind(Kind::Double);
        apart += sq(find(a, n) - &t);
        moved += sq(t - find(init, n));
    }
    (apart / moved).sqrt()
}

/// Saves `e`'s sharded checkpoint, takes 3 more steps, and checks that a fresh engine of
/// `settings` loaded from the checkpoint takes the same 3 steps exactly.
fn assert_resumes_exactly(
    pg: &ProcessGroup,
    e: &mut FsdpEngine<CausalLm>,
    settings: EngineSettings,
    tag: &str,
) {
    let dir = std::env::temp_dir().join(format!(
        "verlc-fsdp-{tag}-ckpt-{}",
        std::os::unix::process::parent_id()
    ));
    e.save_checkpoint(&dir).expect("save");
    let rows = my_rows(pg);
    let want: Vec<f64> = (0..3).map(|_| train_step(e, &rows, Some(pg))).collect();
    let mut resumed =
        FsdpEngine::<CausalLm>::new(FsdpSettings::new(settings), pg.clone()).expect("fsdp engine");
    resumed.load_checkpoint(&dir).expect("load");
    let got: Vec<f64> = (0..3)
        .map(|_| train_step(&mut resumed, &rows, Some(pg)))
        .collect();
    assert_eq!(got, want, "resumed losses");
    pg.barrier().expect("barrier");
    if pg.rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn fsdp_run(pg: &ProcessGroup, dtype: Dtype, offload: bool) -> (Vec<f64>, FsdpEngine<CausalLm>) {
    let mut e = fsdp_engine(pg, MODEL, dtype, offload);
    let batch = my_rows(pg);
    let losses = (0..STEPS)
        .map(|_| train_step(&mut e, &batch, Some(pg)))
        .collect();
    (losses, e)
}

fn fsdp_engine(
    pg: &ProcessGroup,
    model: &str,
    dtype: Dtype,
    offload: bool,
) -> FsdpEngine<CausalLm> {
    let mut s = FsdpSettings::new(settings_for(model, dtype, offload));
    s.param_offload = offload;
    FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp engine")
}

/// One side of a [`lockstep`] comparison: its engine, the rows it trains on, and the group
/// its loss is summed over (none: it trains on the whole batch).
struct Side<'a, E> {
    engine: &'a mut E,
    rows: &'a Batch,
    group: Option<&'a ProcessGroup>,
}

/// Where a reference's gradients can be read after its step, to tell which weights an update
/// moves by signal and which by rounding.
trait Gradients {
    fn gradients(&self) -> Option<Vec<(String, Tensor)>>;
}

impl Gradients for SingleEngine<CausalLm> {
    fn gradients(&self) -> Option<Vec<(String, Tensor)>> {
        Some(param_grads(self))
    }
}

impl Gradients for FsdpEngine<CausalLm> {
    fn gradients(&self) -> Option<Vec<(String, Tensor)>> {
        None
    }
}

/// A gradient element below this fraction of the largest one is rounding-sized: an element
/// whose exact gradient is zero (a key bias: softmax ignores a shift all keys share) or tiny
/// (a DeltaNet decay rate on a tiny model) holds rounding noise, which AdamW normalises into
/// steps of the learning rate's size in either direction. Such weights are left out of the
/// per-step weight comparison; they move the loss by nothing measurable.
const ROUNDING_SIZED: f64 = 1e-4;

/// Trains `candidate` beside `reference` for `steps` steps, every step starting both from
/// the reference's weights: per step the losses and grad norms agree to 1e-5 (relative), the
/// updated weights to `tol` (absolute, where the reference's gradient is not rounding-sized),
/// and then the candidate takes the reference's weights. One step's drift is what is bounded,
/// so rounding never compounds over steps and the kernels a CPU happens to pick (AVX2,
/// AVX-512, AMX) cannot decide the test, while a wrong sum, scale or shard shows in the first
/// step. The optimizers keep their own state throughout. Returns both sides' losses.
fn lockstep<R, C>(
    reference: Side<'_, R>,
    candidate: Side<'_, C>,
    steps: usize,
    tol: f64,
) -> (Vec<f64>, Vec<f64>)
where
    R: Engine<Head = CausalLm> + Gradients,
    C: Engine<Head = CausalLm>,
{
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let (a, ra) = try_step(reference.engine, reference.rows, reference.group);
        let (b, rb) = try_step(candidate.engine, candidate.rows, candidate.group);
        assert!(
            ra.update_successful && rb.update_successful,
            "step {step} skipped"
        );
        let (na, nb) = (
            ra.grad_norm.unwrap_or(f64::NAN),
            rb.grad_norm.unwrap_or(f64::NAN),
        );
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "step {step}: loss {b} vs the reference's {a}"
        );
        assert!(
            (na - nb).abs() <= 1e-5 * na.abs().max(1.0),
            "step {step}: grad norm {nb} vs the reference's {na}"
        );
        let w = reference
            .engine
            .per_tensor_params()
            .expect("reference params");
        let mine = candidate
            .engine
            .per_tensor_params()
            .expect("candidate params");
        let signal = reference.engine.gradients().map(|g| {
            let largest = g
                .iter()
                .filter(|(_, t)| t.defined())
                .map(|(_, t)| t.abs().max().double_value(&[]))
                .fold(0.0, f64::max);
            g.into_iter()
                .map(|(n, t)| {
                    let keep = if t.defined() {
                        t.abs().ge(ROUNDING_SIZED * largest)
                    } else {
                        Tensor::zeros_like(&w.iter().find(|(m, _)| *m == n).expect("named").1)
                            .to_kind(Kind::Bool)
                    };
                    (n, keep)
                })
                .collect::<Vec<_>>()
        });
        assert_weights_where(&mine, &w, signal.as_deref(), tol, step);
        candidate
            .engine
            .load_params(&w)
            .expect("take the reference's weights");
        want.push(a);
        got.push(b);
    }
    (want, got)
}

/// `assert_weights` at one step of [`lockstep`], over the elements `signal` keeps (all where
/// none is given).
fn assert_weights_where(
    a: &[(String, Tensor)],
    b: &[(String, Tensor)],
    signal: Option<&[(String, Tensor)]>,
    tol: f64,
    step: usize,
) {
    assert_eq!(a.len(), b.len(), "the same parameters");
    for (n, t) in a {
        let (_, u) = b.iter().find(|(m, _)| m == n).expect("same names");
        let mut d = (t.to_kind(Kind::Float) - u.to_kind(Kind::Float)).abs();
        if let Some(keep) = signal.and_then(|s| s.iter().find(|(m, _)| m == n)) {
            d *= keep.1.to_kind(Kind::Float);
        }
        let d = d.max().double_value(&[]);
        assert!(
            d <= tol,
            "step {step}: weight {n} differs by {d:e} after the update"
        );
    }
}

/// [`lockstep`] of the FSDP engine `e` on this rank's rows against a single engine of `model`
/// on the whole batch; asserts the reference learns. Returns the reference's losses and engine.
fn fsdp_matches_single<E: Engine<Head = CausalLm>>(
    pg: &ProcessGroup,
    model: &str,
    e: &mut E,
) -> (Vec<f64>, Vec<f64>, SingleEngine<CausalLm>) {
    let mut single = single_engine(model);
    let (whole, rows) = (full_batch(), my_rows(pg));
    let (want, got) = lockstep(
        Side {
            engine: &mut single,
            rows: &whole,
            group: None,
        },
        Side {
            engine: e,
            rows: &rows,
            group: Some(pg),
        },
        LOCKSTEP_STEPS,
        1e-5,
    );
    assert!(
        want[LOCKSTEP_STEPS - 1] < want[0] * 0.9,
        "the reference does not learn: {want:?}"
    );
    (want, got, single)
}

rank_test!(fsdp_fp32_matches_single_engine, 2, |pg| {
    let mut e = fsdp_engine(&pg, MODEL, Dtype::Fp32, false);
    let (_, _, single) = fsdp_matches_single(&pg, MODEL, &mut e);
    // The module holds no full parameters outside the engine's passes.
    assert_eq!(e.module().model.embed_tokens.numel(), 0);
    // Hybrid engine: full weights for rollout, then freed again.
    e.summon_full_params().expect("summon");
    let b = full_batch();
    let (ids, pos, mask) = (
        b.get("input_ids").unwrap(),
        b.get("position_ids").unwrap(),
        b.get("attention_mask").unwrap(),
    );
    let got = e.module().forward(ids, pos, Some(mask), None);
    let want = single.module().forward(ids, pos, Some(mask), None);
    let d = (got - want).abs().max().double_value(&[]);
    assert!(d < 1e-4, "rollout logits differ by {d}");
    e.reshard().expect("reshard");
    assert_eq!(e.module().model.embed_tokens.numel(), 0);
});

// `enable_gradient_checkpointing: false`: the backward runs the forward's graphs instead of
// recomputing each layer. The same numbers (the recomputed forward is the same computation);
// what changes is what lives between forward and backward: every layer's gathered
// parameters (and activations) instead of one layer's at a time.
// Experts are parameters like any other: sharded in their layer's unit, gathered for the
// layer's forward and backward; the grouped expert computation runs on each rank's rows.
rank_test!(fsdp_moe_matches_single_engine, 2, |pg| {
    let mut e = fsdp_engine(&pg, MOE_MODEL, Dtype::Fp32, false);
    let (_, _, single) = fsdp_matches_single(&pg, MOE_MODEL, &mut e);
    assert!(
        single
            .per_tensor_params()
            .expect("params")
            .iter()
            .any(|(n, _)| n.ends_with("mlp.experts.3.down_proj.weight"))
    );
});

// Qwen3.5's DeltaNet state and conv run within each rank's own rows; its parameters (conv,
// A_log, dt_bias, gated norms, shared expert) shard like any other.
rank_test!(fsdp_qwen3_5_moe_matches_single_engine, 2, |pg| {
    let mut e = fsdp_engine(&pg, QWEN3_5_MODEL, Dtype::Fp32, false);
    let (_, _, single) = fsdp_matches_single(&pg, QWEN3_5_MODEL, &mut e);
    assert!(
        single
            .per_tensor_params()
            .expect("params")
            .iter()
            .any(|(n, _)| n.ends_with("linear_attn.A_log"))
    );
    // The sharded checkpoint (DeltaNet parameters, experts, optimizer state) resumes exactly.
    let settings = settings_for(QWEN3_5_MODEL, Dtype::Fp32, false);
    assert_resumes_exactly(&pg, &mut e, settings, "qwen3_5");
});

rank_test!(fsdp_without_checkpointing_matches_with_it, 2, |pg| {
    // Both in lockstep with the same reference: each step starts from the same weights, so
    // the two must agree exactly.
    let mut with = fsdp_engine(&pg, MODEL, Dtype::Fp32, false);
    let (_, losses, _) = fsdp_matches_single(&pg, MODEL, &mut with);
    let mut s = FsdpSettings::new(settings(Dtype::Fp32, false));
    s.gradient_checkpointing = false;
    let mut e = FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp engine");
    let (_, no_recompute, _) = fsdp_matches_single(&pg, MODEL, &mut e);
    assert_eq!(no_recompute, losses, "recomputing changed the numbers");
    let (peak_with, peak_without) = (with.memory().peak_gathered, e.memory().peak_gathered);
    assert!(
        peak_without > peak_with,
        "without checkpointing every layer stays gathered: {peak_without} vs {peak_with} bytes"
    );
    // Parameters are freed again after the backward.
    assert_eq!(e.module().model.embed_tokens.numel(), 0);
});

/// The engine over 4 ranks sharded in groups of 2 (HSDP: 2 replicas).
fn hsdp_engine(pg: &ProcessGroup, settings: EngineSettings) -> FsdpEngine<CausalLm> {
    let e = FsdpEngine::<CausalLm>::with_mesh(FsdpSettings::new(settings), pg.clone(), 2)
        .expect("hybrid fsdp");
    assert_eq!((e.dp_size(), e.group().size()), (4, 2));
    e
}

/// STEPS steps of [`hsdp_engine`].
fn hsdp_run(pg: &ProcessGroup, settings: EngineSettings) -> (Vec<f64>, FsdpEngine<CausalLm>) {
    let mut e = hsdp_engine(pg, settings);
    let batch = my_rows(pg);
    let losses = (0..STEPS)
        .map(|_| train_step(&mut e, &batch, Some(pg)))
        .collect();
    (losses, e)
}

rank_test!(fsdp_hybrid_shard_matches_single_engine, 4, |pg| {
    let mut e = hsdp_engine(&pg, settings(Dtype::Fp32, false));
    fsdp_matches_single(&pg, MODEL, &mut e);
});

rank_test!(fsdp_bf16_matches_single_engine, 2, |pg| {
    let (ref_losses, ref_w) = single_run(Dtype::Bf16);
    let (losses, e) = fsdp_run(&pg, Dtype::Bf16, false);
    // bf16 differs in where gradients accumulate (the single engine sums micro-batch grads in
    // bf16, FSDP in fp32 after the reduce-scatter); Adam's normalised steps (lr 5e-3) turn
    // that into weight differences of a few steps' size at most.
    assert_close("loss", &losses, &ref_losses, 2e-2);
    assert_weights(&e.full_params().expect("gather"), &ref_w, 5e-2);
});

/// Settings of a model trained in bf16 (`model_dtype: bf16`): bf16 compute and main dtype.
fn bf16_main(offload: bool) -> EngineSettings {
    EngineSettings {
        main_dtype: Dtype::Bf16,
        ..settings(Dtype::Bf16, offload)
    }
}

/// The single engine trained in bf16 for STEPS steps: (initial weights, losses, weights).
#[allow(clippy::type_complexity)]
fn single_bf16_main_run() -> (Vec<(String, Tensor)>, Vec<f64>, Vec<(String, Tensor)>) {
    let mut single = SingleEngine::<CausalLm>::new(bf16_main(false)).expect("single engine");
    let init: Vec<(String, Tensor)> = (single.per_tensor_params().expect("params"))
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    let batch = full_batch();
    let losses: Vec<f64> = (0..STEPS)
        .map(|_| train_step(&mut single, &batch, None))
        .collect();
    assert!(
        losses[STEPS - 1] < losses[0] * 0.8,
        "the reference does not learn: {losses:?}"
    );
    let w = single.per_tensor_params().expect("params");
    assert!(w.iter().all(|(_, t)| t.kind() == Kind::BFloat16));
    (init, losses, w)
}

// `model_dtype: bf16` (verl's FSDP engine loads, shards and steps the model in bf16): bf16
// shards and bf16 optimizer state, half the bytes of fp32 main shards, trained like the single
// engine's bf16 parameters stepped in place (losses within the mixed bf16 test's tolerance:
// where gradients are summed differs). Host offload keeps the state in bf16; the sharded checkpoint
// resumes exactly.
rank_test!(
    fsdp_bf16_shards_match_single_engine_and_resume_exactly,
    2,
    |pg| {
        let (init, ref_losses, ref_w) = single_bf16_main_run();
        let rows = my_rows(&pg);
        for offload in [false, true] {
            let mut s = FsdpSettings::new(bf16_main(offload));
            s.param_offload = offload;
            let mut e = FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp engine");
            assert!(e.units().all(|u| u.shard().kind() == Kind::BFloat16));
            let losses: Vec<f64> = (0..STEPS)
                .map(|_| train_step(&mut e, &rows, Some(&pg)))
                .collect();
            assert_close("loss", &losses, &ref_losses, 2e-2);
            // A bf16 weight below ~1 takes whole lr-sized steps (5e-3) and, where the two
            // runs' gradients round differently, a step of another sign: compare the whole
            // update, not single weights.
            let drift = update_drift(&e.full_params().expect("gather"), &ref_w, &init);
            eprintln!(
                "bf16 shards (offload {offload}): |fsdp - single| / |single's update| = {drift:.4}"
            );
            assert!(drift < 0.05, "the two runs moved apart: {drift}");
            let numel: i64 = e.units().map(|u| u.shard().numel() as i64).sum();
            let m = e.memory();
            assert_eq!(m.params, numel * 2, "bf16 shards");
            // Two bf16 moments (plus, offloaded, the host's bf16 params and grads), one fp32
            // step counter per chunk.
            let state = if offload {
                numel * 2 * 4
            } else {
                numel * 2 * 2
            };
            assert!(
                (state..state + 64).contains(&m.optimizer),
                "{} bytes of optimizer state for {numel} bf16 elements (offload {offload})",
                m.optimizer
            );
            if !offload {
                assert_resumes_exactly(&pg, &mut e, bf16_main(false), "bf16-shards");
            }
        }
    }
);

// Hybrid sharding with bf16 shards: the replicas' gradient sum runs in the reduce dtype (fp32),
// as PyTorch's HSDP does; the run follows the single engine as the full-shard one does.
rank_test!(
    fsdp_bf16_shards_under_hybrid_sharding_match_single_engine,
    4,
    |pg| {
        let (init, ref_losses, ref_w) = single_bf16_main_run();
        let (losses, e) = hsdp_run(&pg, bf16_main(false));
        assert_close("loss", &losses, &ref_losses, 2e-2);
        let drift = update_drift(&e.full_params().expect("gather"), &ref_w, &init);
        eprintln!("bf16 shards, HSDP 2 x 2: |fsdp - single| / |single's update| = {drift:.4}");
        assert!(drift < 0.05, "the two runs moved apart: {drift}");
    }
);

rank_test!(fsdp_offload_matches_single_engine, 2, |pg| {
    let mut e = fsdp_engine(&pg, MODEL, Dtype::Fp32, true);
    fsdp_matches_single(&pg, MODEL, &mut e);
    assert!(e.memory().optimizer > 0);
});

rank_test!(fsdp_sharded_state_is_half_of_single, 2, |pg| {
    use verlc_runtime::optim::param_groups::{named_params, single_group};
    use verlc_runtime::optim::{Dtype, Optimizer, OptimizerConfig};
    let bytes = |t: &Tensor| if t.defined() { t.numel() as i64 * 4 } else { 0 };
    // World size 1: fp32 params, their grads after a backward, AdamW state.
    let mut single = SingleEngine::<CausalLm>::new(settings(Dtype::Fp32, false)).expect("single");
    train_step(&mut single, &full_batch(), None);
    let mut loss_fn = |mb: &Batch,
                       out: verlc_runtime::logits::LogProbOutput,
                       agg: &verlc_runtime::algo::AggOptions| {
        let m = mb.get("response_mask")?;
        let loss = -(out.log_probs * m).sum(Kind::Float)
            * (agg.dp_size as f64 / agg.batch_num_tokens.unwrap_or(1.0));
        Ok(MicroLoss {
            loss,
            metrics: Default::default(),
        })
    };
    single
        .forward_backward(
            &full_batch(),
            &MICRO.into(),
            &ForwardOptions::default(),
            &mut loss_fn,
        )
        .expect("fb");
    let vars: Vec<Tensor> = single.var_store().variables().into_values().collect();
    let (p1, g1) = (
        vars.iter().map(bytes).sum::<i64>(),
        vars.iter().map(|v| bytes(&v.grad())).sum::<i64>(),
    );
    let mut cfg = OptimizerConfig::megatron(Dtype::Fp32);
    cfg.inner = InnerConfig::AdamW(AdamWConfig::default());
    let opt = Optimizer::new(
        single_group(named_params(single.var_store()), 1e-3, 0.0),
        cfg,
    )
    .expect("optimizer");
    let o1 = opt.owned_bytes().1;
    let total1 = p1 + g1 + o1;
    // World size 2.
    let mut e =
        FsdpEngine::<CausalLm>::new(FsdpSettings::new(settings(Dtype::Fp32, false)), pg.clone())
            .expect("fsdp");
    let batch = my_rows(&pg);
    train_step(&mut e, &batch, Some(&pg));
    e.forward_backward(
        &batch,
        &MICRO.into(),
        &ForwardOptions::default(),
        &mut loss_fn,
    )
    .expect("fb");
    let m = e.memory();
    eprintln!(
        "rank {}: world size 1: params {p1} + grads {g1} + optimizer {o1} = {total1} bytes; \
         world size 2: params {} + grads {} + optimizer {} = {} bytes (ratio {:.3}); peak gathered full units {} bytes",
        pg.rank(),
        m.params,
        m.grads,
        m.optimizer,
        m.sharded_total(),
        m.sharded_total() as f64 / total1 as f64,
        m.peak_gathered
    );
    let ratio = m.sharded_total() as f64 / total1 as f64;
    assert!((0.45..=0.55).contains(&ratio), "ratio {ratio}");
});

rank_test!(
    fsdp_sharded_checkpoint_resumes_at_world_size_2_and_1,
    2,
    |pg| {
        let dir = std::env::temp_dir().join(format!(
            "verlc-fsdp-ckpt-{}",
            std::os::unix::process::parent_id()
        ));
        let half = STEPS / 2;
        let fresh = |group: &ProcessGroup| {
            FsdpEngine::<CausalLm>::new(
                FsdpSettings::new(settings(Dtype::Fp32, false)),
                group.clone(),
            )
            .expect("fsdp")
        };
        // At world size 2, saving half way.
        let mut a = fresh(&pg);
        let batch = my_rows(&pg);
        for _ in 0..half {
            train_step(&mut a, &batch, Some(&pg));
        }
        a.save_checkpoint(&dir).expect("save");
        // Resumed at world size 1 (each rank alone, on all rows): the same weights, then the
        // uninterrupted run's steps, in lockstep with it.
        let me = pg.rank();
        let alone = pg
            .split(&[vec![0], vec![1]])
            .expect("split")
            .expect("own group");
        assert_eq!((alone.size(), alone.rank()), (1, 0));
        let mut c = fresh(&alone);
        c.load_checkpoint(&dir).expect("load at world size 1");
        assert_weights(
            &c.full_params().expect("params"),
            &a.full_params().expect("params"),
            0.0,
        );
        let full = full_batch();
        let (want, _) = lockstep(
            Side {
                engine: &mut a,
                rows: &batch,
                group: Some(&pg),
            },
            Side {
                engine: &mut c,
                rows: &full,
                group: None,
            },
            half,
            1e-5,
        );
        // Resumed at world size 2: the uninterrupted run's steps.
        let mut b = fresh(&pg);
        b.load_checkpoint(&dir).expect("load at world size 2");
        let got: Vec<f64> = (0..half)
            .map(|_| train_step(&mut b, &batch, Some(&pg)))
            .collect();
        assert_close("resumed loss (world size 2)", &got, &want, 1e-6);
        pg.barrier().expect("barrier");
        if me == 0 {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
);

rank_test!(
    fsdp_without_reshard_after_forward_matches_single_engine,
    2,
    |pg| {
        let mut s = FsdpSettings::new(settings(Dtype::Fp32, false));
        s.reshard_after_forward = false;
        let mut e = FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp engine");
        fsdp_matches_single(&pg, MODEL, &mut e);
        // Kept from forward to backward, so every unit was gathered at once.
        let m = e.memory();
        assert!(m.peak_gathered >= m.params * 2 - 64, "{m:?}");
    }
);

rank_test!(fsdp_forward_only_matches_single_engine, 2, |pg| {
    use verlc_runtime::model::ValueModel;
    let mut s = settings(Dtype::Fp32, false);
    s.optim = None;
    let batch = my_rows(&pg);
    let fwd = ForwardOptions {
        temperature: 0.7,
        with_entropy: true,
        with_sum_pi_squared: false,
        ..ForwardOptions::default()
    };
    // Reference policy: log-probs and entropy.
    let mut single = SingleEngine::<CausalLm>::new(s.clone()).expect("single");
    let mut e =
        FsdpEngine::<CausalLm>::new(FsdpSettings::new(s.clone()), pg.clone()).expect("fsdp");
    let want = single
        .infer_batch(&batch, &3.into(), &fwd)
        .expect("single infer");
    let got = e.infer_batch(&batch, &3.into(), &fwd).expect("fsdp infer");
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert!((&w.log_probs - &g.log_probs).abs().max().double_value(&[]) < 1e-5);
        let (we, ge) = (
            w.entropy.as_ref().expect("entropy"),
            g.entropy.as_ref().expect("entropy"),
        );
        assert!((we - ge).abs().max().double_value(&[]) < 1e-5);
    }
    assert!(
        e.optimizer_step().is_err(),
        "a forward-only engine has no optimizer"
    );
    // Critic: values.
    let mut single = SingleEngine::<ValueModel>::new(s.clone()).expect("single critic");
    let mut e =
        FsdpEngine::<ValueModel>::new(FsdpSettings::new(s), pg.clone()).expect("fsdp critic");
    let want = single
        .infer_batch(&batch, &4.into(), &fwd)
        .expect("single values");
    let got = e.infer_batch(&batch, &4.into(), &fwd).expect("fsdp values");
    for (w, g) in want.iter().zip(&got) {
        assert!((w - g).abs().max().double_value(&[]) < 1e-5);
    }
});

/// fp16 trajectory: per step the global loss, whether the update was applied, and the loss
/// scale after the step.
#[derive(Debug, Default)]
struct Fp16Run {
    losses: Vec<f64>,
    updated: Vec<bool>,
    scales: Vec<f64>,
}

impl Fp16Run {
    fn push(&mut self, (loss, step): (f64, StepResult), scale: f64) {
        assert_eq!(
            step.grad_norm.is_none(),
            !step.update_successful,
            "skipped steps have no norm: {step:?}"
        );
        self.losses.push(loss);
        self.updated.push(step.update_successful);
        self.scales.push(scale);
    }

    fn skipped(&self) -> usize {
        self.updated.iter().filter(|u| !**u).count()
    }
}

fn fsdp_fp16(pg: &ProcessGroup) -> FsdpEngine<CausalLm> {
    FsdpEngine::<CausalLm>::new(FsdpSettings::new(settings(Dtype::Fp16, false)), pg.clone())
        .expect("fsdp fp16")
}

fn fsdp_scaler(e: &FsdpEngine<CausalLm>) -> GradScaler {
    e.optimizer()
        .and_then(|o| o.scaler())
        .expect("fp16 has a loss scaler")
}

/// `steps` fp16 steps of `e` on this rank's rows.
fn fsdp_fp16_steps(e: &mut FsdpEngine<CausalLm>, pg: &ProcessGroup, steps: usize) -> Fp16Run {
    let batch = my_rows(pg);
    let mut run = Fp16Run::default();
    for _ in 0..steps {
        let r = try_step(e, &batch, Some(pg));
        run.push(r, fsdp_scaler(e).scale() as f64);
    }
    run
}

/// Asserts that every rank of `pg` holds the same `x`.
fn assert_same_on_all_ranks(pg: &ProcessGroup, what: &str, x: f64) {
    let t = Tensor::from_slice(&[x, -x]);
    pg.all_reduce(&t, ReduceOp::Max).expect("all-reduce");
    let (max, min) = (t.double_value(&[0]), -t.double_value(&[1]));
    assert!(
        max == x && min == x,
        "{what} differs across ranks: {min} to {max}"
    );
}

rank_test!(fsdp_fp16_matches_single_engine, 2, |pg| {
    let mut single =
        SingleEngine::<CausalLm>::new(settings(Dtype::Fp16, false)).expect("single fp16");
    let batch = full_batch();
    let mut want = Fp16Run::default();
    for _ in 0..STEPS {
        let r = try_step(&mut single, &batch, None);
        want.push(r, single.optimizer().expect("optimizer").loss_scale());
    }
    let want_w = single.per_tensor_params().expect("params");
    let mut e = fsdp_fp16(&pg);
    let got = fsdp_fp16_steps(&mut e, &pg, STEPS);
    // Megatron's dynamic scaler starts at 2^32: the first steps overflow and back off (the
    // gradient is pre-divided, so each rank's backward overflows exactly when the single
    // engine's does on the same rows).
    assert!(
        want.skipped() > 0 && want.skipped() <= STEPS - 5,
        "{want:?}"
    );
    assert_eq!(got.updated, want.updated, "skipped steps");
    assert_eq!(got.scales, want.scales, "loss scales");
    assert!(
        want.losses[STEPS - 1] < want.losses[0] - 0.2,
        "the reference does not learn: {want:?}"
    );
    // The single engine accumulates micro-batch grads in fp16, FSDP in fp32: the weights
    // differ by an fp16 ulp or two (1.3e-3 seen).
    assert_close("loss", &got.losses, &want.losses, 1e-4);
    assert_weights(&e.full_params().expect("gather"), &want_w, 1e-2);
    // fp16 compute params, fp32 main shards.
    assert_eq!(e.module().model.embed_tokens.kind(), Kind::Half);
    assert!(e.units().all(|u| u.shard().kind() == Kind::Float));
});

/// Warms up (the scale backs off from 2^32 until steps succeed), then overflows one element of
/// rank 0's gradient shard only: every rank skips that step, backs off the scale the same way
/// and keeps its weights; the next step succeeds everywhere.
fn fp16_overflow_on_one_rank(pg: &ProcessGroup, fsdp_size: i64) {
    let s = FsdpSettings::new(settings(Dtype::Fp16, false));
    let mut e = FsdpEngine::<CausalLm>::with_mesh(s, pg.clone(), fsdp_size).expect("fsdp fp16");
    let warm = fsdp_fp16_steps(&mut e, pg, 16);
    assert!(
        warm.updated[15],
        "warm-up ends with a successful step: {warm:?}"
    );
    let before = fsdp_scaler(&e);
    let weights = e.full_params().expect("gather");
    let batch = my_rows(pg);
    e.optimizer_zero_grad().expect("zero grad");
    backward(&mut e, &batch, Some(pg));
    let finite = |e: &FsdpEngine<CausalLm>| {
        e.units()
            .all(|u| u.shard().grad().isfinite().all().int64_value(&[]) == 1)
    };
    assert!(finite(&e), "rank {}: the batch itself overflows", pg.rank());
    if pg.rank() == 0 {
        let g = e.units().nth(1).expect("a layer").shard().grad();
        let _ = g.narrow(0, 0, 1).fill_(f64::NAN);
        let _ = g.narrow(0, 1, 1).fill_(f64::INFINITY);
    }
    assert_eq!(finite(&e), pg.rank() != 0, "only rank 0's shard overflows");
    let step = e.optimizer_step().expect("step");
    e.lr_scheduler_step().expect("lr");
    assert!(
        !step.update_successful && step.grad_norm.is_none(),
        "rank {}: {step:?}",
        pg.rank()
    );
    let after = fsdp_scaler(&e);
    let mut want = before.clone();
    want.update(true);
    assert_eq!(after, want);
    assert_eq!(
        after.scale(),
        before.scale() / 2.0,
        "backed off (hysteresis is spent by the warm-up)"
    );
    assert_same_on_all_ranks(pg, "loss scale", after.scale() as f64);
    assert_weights(&e.full_params().expect("gather"), &weights, 0.0);
    let (_, next) = try_step(&mut e, &batch, Some(pg));
    assert!(next.update_successful, "rank {}: {next:?}", pg.rank());
    assert_same_on_all_ranks(pg, "grad norm", next.grad_norm.expect("norm"));
    assert_same_on_all_ranks(pg, "loss scale", fsdp_scaler(&e).scale() as f64);
}

rank_test!(fsdp_fp16_overflow_on_one_rank_skips_on_all, 2, |pg| {
    fp16_overflow_on_one_rank(&pg, -1);
});

rank_test!(
    fsdp_fp16_hybrid_shard_overflow_on_one_rank_skips_on_all,
    4,
    |pg| {
        fp16_overflow_on_one_rank(&pg, 2);
    }
);

rank_test!(fsdp_fp16_checkpoint_restores_loss_scaler, 2, |pg| {
    let dir = std::env::temp_dir().join(format!(
        "verlc-fsdp-fp16-ckpt-{}",
        std::os::unix::process::parent_id()
    ));
    let half = STEPS / 2;
    // Uninterrupted, saving half way (the scale is still backing off).
    let mut a = fsdp_fp16(&pg);
    fsdp_fp16_steps(&mut a, &pg, half);
    let saved = fsdp_scaler(&a);
    a.save_checkpoint(&dir).expect("save");
    let want = fsdp_fp16_steps(&mut a, &pg, half);
    assert!(
        want.skipped() > 0 && want.skipped() < half,
        "the second half skips and updates: {want:?}"
    );
    // Resumed at world size 2: the same scaler, so the same skips, scales and losses.
    let mut b = fsdp_fp16(&pg);
    assert_ne!(fsdp_scaler(&b), saved);
    b.load_checkpoint(&dir).expect("load at world size 2");
    assert_eq!(fsdp_scaler(&b), saved);
    let got = fsdp_fp16_steps(&mut b, &pg, half);
    assert_eq!(got.updated, want.updated, "skipped steps");
    assert_eq!(got.scales, want.scales, "loss scales");
    assert_close("resumed loss", &got.losses, &want.losses, 1e-6);
    assert_weights(
        &b.full_params().expect("params"),
        &a.full_params().expect("params"),
        1e-6,
    );
    // Resumed at world size 1 (each rank alone, on all rows): the resharded state keeps it.
    let alone = pg
        .split(&[vec![0], vec![1]])
        .expect("split")
        .expect("own group");
    let mut c = fsdp_fp16(&alone);
    c.load_checkpoint(&dir).expect("load at world size 1");
    assert_eq!(fsdp_scaler(&c), saved);
    let full = full_batch();
    let mut got1 = Fp16Run::default();
    for _ in 0..half {
        let r = try_step(&mut c, &full, None);
        got1.push(r, fsdp_scaler(&c).scale() as f64);
    }
    assert_eq!(got1.updated, want.updated, "skipped steps (world size 1)");
    assert_eq!(got1.scales, want.scales, "loss scales (world size 1)");
    assert_close(
        "resumed loss (world size 1)",
        &got1.losses,
        &want.losses,
        1e-4,
    );
    pg.barrier().expect("barrier");
    if pg.rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
});

// ---------------------------------------------------------------------------------------------
// Packed sequences (`use_remove_padding`) and Ulysses sequence parallelism.

/// `full_batch` with responses of ragged length padded on the right as the rollout pads them:
/// attention mask and response mask 0 after each row's last response token.
fn ragged_batch() -> Batch {
    let b = full_batch();
    let t = PROMPT + RESP;
    let rmask = b.get("response_mask").unwrap().shallow_clone();
    let prompt_mask = b.get("attention_mask").unwrap().narrow(1, 0, PROMPT);
    let mask = Tensor::cat(&[prompt_mask, rmask.to_kind(Kind::Int64)], 1);
    let pos = verlc_runtime::model::position_ids_from_mask(&mask);
    let mut out = Batch::new();
    out.insert("input_ids", b.get("input_ids").unwrap().shallow_clone())
        .unwrap();
    out.insert("attention_mask", mask.view([ROWS, t])).unwrap();
    out.insert("position_ids", pos).unwrap();
    out.insert("responses", b.get("responses").unwrap().shallow_clone())
        .unwrap();
    out.insert("response_mask", rmask).unwrap();
    out
}

fn packed_settings(model: &str) -> EngineSettings {
    EngineSettings {
        model_path: model.into(),
        remove_padding: true,
        ..settings(Dtype::Fp32, false)
    }
}

/// [`lockstep`] of `candidate` (packed, on its rows of `batch`, its loss summed over `group`)
/// against the single engine of `model` on the whole padded `batch`.
fn packed_matches_padded<C: Engine<Head = CausalLm>>(
    model: &str,
    batch: &Batch,
    candidate: &mut C,
    rows: &Batch,
    group: Option<&ProcessGroup>,
) {
    let mut padded = single_engine(model);
    lockstep(
        Side {
            engine: &mut padded,
            rows: batch,
            group: None,
        },
        Side {
            engine: candidate,
            rows,
            group,
        },
        LOCKSTEP_STEPS,
        1e-5,
    );
}

/// A fresh single engine (the tests' settings) and its forward of `batch`, packed
/// (`use_remove_padding`) or padded.
fn fresh_forward(
    batch: &Batch,
    fwd: &ForwardOptions,
    packed: bool,
) -> (SingleEngine<CausalLm>, verlc_runtime::logits::LogProbOutput) {
    use verlc_runtime::engine::Head;
    let e = SingleEngine::<CausalLm>::new(settings(Dtype::Fp32, false)).expect("engine");
    let out = if packed {
        e.module().forward_packed(batch, fwd)
    } else {
        Head::forward(e.module(), batch, fwd)
    }
    .expect("forward");
    (e, out)
}

/// Every parameter's gradient of a single engine, by name.
fn param_grads(e: &SingleEngine<CausalLm>) -> Vec<(String, Tensor)> {
    let mut g: Vec<(String, Tensor)> = e
        .var_store()
        .variables()
        .into_iter()
        .map(|(n, v)| (n, v.grad()))
        .collect();
    g.sort_by(|a, b| a.0.cmp(&b.0));
    g
}

fn masked_max_diff(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    ((a - b) * mask).abs().max().double_value(&[])
}

// The packed forward computes only valid tokens, per sequence; at every response token its
// log-probs, entropies and values are the padded forward's, and zero at the padding.
#[test]
fn packed_forward_equals_padded_forward_at_every_response_token() {
    use verlc_runtime::engine::Head;
    use verlc_runtime::model::ValueModel;
    let batch = ragged_batch();
    let mask = batch.get("response_mask").unwrap();
    let fwd = ForwardOptions {
        temperature: 0.7,
        with_entropy: true,
        with_sum_pi_squared: false,
        ..ForwardOptions::default()
    };
    let e = SingleEngine::<CausalLm>::new(settings(Dtype::Fp32, false)).expect("actor");
    let padded = Head::forward(e.module(), &batch, &fwd).expect("padded");
    let packed = e.module().forward_packed(&batch, &fwd).expect("packed");
    let d = masked_max_diff(&padded.log_probs, &packed.log_probs, mask);
    assert!(d < 1e-5, "log-probs differ by {d}");
    let (pe, ke) = (padded.entropy.unwrap(), packed.entropy.unwrap());
    assert!(masked_max_diff(&pe, &ke, mask) < 1e-5);
    // A response token is predicted by the position before it: zero where that is padding.
    let predicted_by_padding = mask.narrow(1, 0, RESP - 1).eq(0.0);
    let outside = packed
        .log_probs
        .narrow(1, 1, RESP - 1)
        .masked_select(&predicted_by_padding)
        .abs()
        .sum(Kind::Float)
        .double_value(&[]);
    assert_eq!(outside, 0.0, "outputs predicted by padding must be zero");
    // Gradients of a masked loss agree too.
    let grads = |packed: bool| {
        let (e, out) = fresh_forward(&batch, &fwd, packed);
        (out.log_probs * mask).sum(Kind::Float).backward();
        param_grads(&e)
    };
    assert_weights(&grads(true), &grads(false), 1e-5);
    // The critic's values.
    let c = SingleEngine::<ValueModel>::new(settings(Dtype::Fp32, false)).expect("critic");
    let padded = Head::forward(c.module(), &batch, &fwd).expect("padded");
    let packed = c.module().forward_packed(&batch, &fwd).expect("packed");
    assert!(masked_max_diff(&padded, &packed, mask) < 1e-5);
}

// `use_remove_padding` changes the compute, not the update: 20 steps of the packed single
// engine follow the padded one.
#[test]
fn packed_training_follows_the_padded_update() {
    let batch = ragged_batch();
    let mut e = SingleEngine::<CausalLm>::new(packed_settings(MODEL)).expect("packed engine");
    packed_matches_padded(MODEL, &batch, &mut e, &batch, None);
}

/// The packed FSDP engine of `model` with Ulysses degree `ulysses` in lockstep with the
/// padded single engine, on this rank's rows of `batch` (its data-parallel share).
fn fsdp_packed_matches_padded(
    pg: &ProcessGroup,
    model: &str,
    ulysses: usize,
    batch: &Batch,
) -> FsdpEngine<CausalLm> {
    let mut s = FsdpSettings::new(packed_settings(model));
    s.ulysses = ulysses;
    let mut e = FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp engine");
    let dp = e.data_group().clone();
    let local = ROWS / dp.size() as i64;
    let rows = batch.narrow(dp.rank() as i64 * local, local).expect("rows");
    packed_matches_padded(model, batch, &mut e, &rows, Some(&dp));
    e
}

rank_test!(fsdp_packed_matches_single_padded_engine, 2, |pg| {
    fsdp_packed_matches_padded(&pg, MODEL, 1, &ragged_batch());
});

// Ulysses over both ranks (data-parallel size 1): each rank holds half of every packed
// micro-batch's tokens and, inside attention, half of the heads over all tokens.
rank_test!(fsdp_ulysses_matches_single_engine, 2, |pg| {
    use verlc_runtime::engine::Head;
    use verlc_runtime::model::ValueModel;
    let batch = ragged_batch();
    let e = fsdp_packed_matches_padded(&pg, MODEL, 2, &batch);
    assert_eq!((e.dp_size(), e.data_group().size()), (1, 1));
    // The critic's values through the same split.
    let single = SingleEngine::<ValueModel>::new(settings(Dtype::Fp32, false)).expect("critic");
    let mut s = FsdpSettings::new(packed_settings(MODEL));
    s.ulysses = 2;
    let mut c = FsdpEngine::<ValueModel>::new(s, pg.clone()).expect("fsdp critic");
    let fwd = ForwardOptions::default();
    let got = c.infer_batch(&batch, &MICRO.into(), &fwd).expect("infer");
    let got = Tensor::cat(&got, 0);
    let want = tch::no_grad(|| Head::forward(single.module(), &batch, &fwd)).expect("values");
    let mask = batch.get("response_mask").unwrap();
    let d = masked_max_diff(&got, &want, mask);
    assert!(d < 1e-5, "values differ by {d}");
});

// Under Ulysses over both ranks, layers that are not plain attention on a share of their
// heads: a Qwen3.5 model (three Gated DeltaNet layers, one gated attention layer), whose
// DeltaNet layer runs whole sequences on half of its key and value heads (its projections
// exchanged like attention's heads), a gpt-oss model, whose sliding-window layer and full
// layer attend with their heads' own sink logits, and a Gemma 2 model (soft-capped scores on
// each rank's heads, the norms around attention and MLP); training follows the single engine.
rank_test!(
    fsdp_ulysses_runs_deltanet_and_sink_layers_on_a_share_of_heads,
    2,
    |pg| {
        for model in [
            "builtin://tiny?layers=4&hidden=32&heads=2&kv_heads=2&arch=qwen3_5",
            "builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2&arch=gpt_oss&window=4",
            "builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2&arch=gemma2&window=4",
        ] {
            let e = fsdp_packed_matches_padded(&pg, model, 2, &ragged_batch());
            assert_eq!((e.dp_size(), e.data_group().size()), (1, 1));
        }
    }
);

// Ulysses 2 × data parallel 2 on 4 ranks, with one key/value head (fewer than the Ulysses
// degree: repeated to one per query head before the exchange).
rank_test!(
    fsdp_ulysses_with_data_parallel_matches_single_engine,
    4,
    |pg| {
        let model = "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=1&intermediate=64";
        let e = fsdp_packed_matches_padded(&pg, model, 2, &ragged_batch());
        assert_eq!(e.dp_size(), 2);
    }
);

// The teacher's top-k and the student's top-k KL of on-policy distillation's
// `forward_kl_topk` at every response token: the same from the padded forward, the packed
// one (`use_remove_padding`), the FSDP engine's packed forward on this rank's rows, and its
// Ulysses split (the teacher's lists follow each rank's share of the tokens); the gradient of
// the packed KL is the padded one's.
rank_test!(topk_distillation_outputs_equal_on_every_layout, 2, |pg| {
    use verlc_runtime::algo::topk_kl::TopKKl;
    use verlc_runtime::engine::Head;
    use verlc_runtime::logits::topk::{
        TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS, TopK, TopKOutput, TopKTargets,
    };
    const K: i64 = 4;
    let mut batch = ragged_batch();
    let mask = batch.get("response_mask").unwrap().shallow_clone();
    let valid = mask.to_kind(Kind::Bool).unsqueeze(-1);
    // A teacher of its own weights (another seed), scoring at temperature 1.
    let teacher = SingleEngine::<CausalLm>::new(EngineSettings {
        seed: 99,
        optim: None,
        ..settings(Dtype::Fp32, false)
    })
    .expect("teacher");
    let own = ForwardOptions {
        topk: TopK::Own(K),
        ..ForwardOptions::default()
    };
    let own_of = |out: verlc_runtime::logits::LogProbOutput| match out.topk {
        Some(TopKOutput::Own(t)) => t,
        other => panic!("{other:?}"),
    };
    let padded_teacher = own_of(Head::forward(teacher.module(), &batch, &own).expect("teacher"));
    let packed_teacher = own_of(
        teacher
            .module()
            .forward_packed(&batch, &own)
            .expect("teacher packed"),
    );
    let kept = |t: &Tensor| t.masked_select(&valid);
    assert!(kept(&padded_teacher.ids).equal(&kept(&packed_teacher.ids)));
    assert!(masked_max_diff(&padded_teacher.log_probs, &packed_teacher.log_probs, &valid) < 1e-5);
    let TopKTargets { ids, log_probs } = padded_teacher;
    batch.insert(TEACHER_TOPK_IDS, ids).unwrap();
    batch.insert(TEACHER_TOPK_LOG_PROBS, log_probs).unwrap();

    let kl = ForwardOptions {
        temperature: 0.7,
        topk: TopK::KlToTeacher {
            k: K,
            log_prob_min_clamp: Some(-4.0),
        },
        ..ForwardOptions::default()
    };
    let kl_of = |out: verlc_runtime::logits::LogProbOutput| match out.topk {
        Some(TopKOutput::Kl(t)) => t,
        other => panic!("{other:?}"),
    };
    let columns = |kl: &TopKKl| kl.columns().unwrap();
    // Padded and packed on one process, values and gradients.
    let run = |packed: bool| {
        let (e, out) = fresh_forward(&batch, &kl, packed);
        let out = kl_of(out);
        (&out.loss * &mask).sum(Kind::Float).backward();
        (columns(&out).detach(), param_grads(&e))
    };
    let (want, want_grads) = run(false);
    let (packed, packed_grads) = run(true);
    assert!(masked_max_diff(&want, &packed, &valid) < 1e-5);
    assert_weights(&packed_grads, &want_grads, 1e-5);
    assert!(want.select(-1, 0).sum(Kind::Float).double_value(&[]) > 0.0);

    // The FSDP engine: packed over both ranks' rows, then Ulysses over both ranks.
    for ulysses in [1, 2] {
        let mut s = FsdpSettings::new(packed_settings(MODEL));
        s.ulysses = ulysses;
        let mut e = FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp");
        let dp = e.data_group().clone();
        let local = ROWS / dp.size() as i64;
        let first = dp.rank() as i64 * local;
        let rows = batch.narrow(first, local).expect("rows");
        let outs = e.infer_batch(&rows, &MICRO.into(), &kl).expect("infer");
        let got: Vec<Tensor> = outs.into_iter().map(|o| columns(&kl_of(o))).collect();
        let got = Tensor::cat(&got, 0);
        let d = masked_max_diff(
            &got,
            &want.narrow(0, first, local),
            &valid.narrow(0, first, local),
        );
        assert!(
            d < 1e-5,
            "Ulysses {ulysses}: top-k KL columns differ by {d}"
        );
        let outs = e
            .infer_batch(&rows, &MICRO.into(), &own)
            .expect("teacher infer");
        let ids: Vec<Tensor> = outs.into_iter().map(|o| own_of(o).ids).collect();
        let ids = Tensor::cat(&ids, 0);
        // The student's own top-k on its layout equals the single engine's.
        let single = SingleEngine::<CausalLm>::new(settings(Dtype::Fp32, false)).expect("single");
        let whole = own_of(Head::forward(single.module(), &rows, &own).expect("own"));
        let v = valid.narrow(0, first, local);
        assert!(ids.masked_select(&v).equal(&whole.ids.masked_select(&v)));
    }
});

// A vision-language model: Qwen2.5-VL's input embeddings hold its images' embeddings.

/// A tiny Qwen2.5-VL (a 2-block tower).
const VL_MODEL: &str = "builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen2_5_vl";
/// A tiny Qwen3-VL (a 2-block tower, DeepStack features after the first added to the first
/// layer's output).
const QWEN3_VL_MODEL: &str = "builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen3_vl";
/// A tiny Qwen3-VL-MoE (Qwen3-VL's tower, four experts routed top two in every layer).
const QWEN3_VL_MOE_MODEL: &str = "builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen3_vl_moe&experts=4&experts_per_tok=2&moe_intermediate=32";
/// Rows of [`vision_batch`], and the prompt and response lengths of each.
const VL_ROWS: i64 = 4;
const VL_PROMPT: i64 = 14;
const VL_RESP: i64 = 4;

fn vl_settings_for(model: &str, lora: bool) -> EngineSettings {
    use verlc_runtime::model::lora::{LoraConfig, LoraTargets};
    EngineSettings {
        remove_padding: true,
        lora: lora.then(|| LoraConfig {
            rank: 4,
            alpha: 8.0,
            targets: LoraTargets::AllLinear,
            exclude: LoraTargets::Names(Vec::new()),
            adapter_dir: None,
        }),
        ..settings_for(model, Dtype::Fp32, false)
    }
}

/// Four rows, each prompt with an image (grids of 4 x 4 and 4 x 8 patches: 4 and 8
/// placeholders), left-padded by 0 to 2 tokens, responses ragged on the right as the rollout
/// pads them; positions are the model's M-RoPE ids `(B, T, 3)`.
fn vision_batch(model: &str) -> Batch {
    let e = single_engine(model);
    let cfg = e.model_config();
    let id = |k: &str| cfg.extra[k].as_i64().expect("a vision token id");
    let (start, image, end) = (
        id("vision_start_token_id"),
        id("image_token_id"),
        id("vision_end_token_id"),
    );
    let v = &cfg.extra["vision_config"];
    let dim = |k: &str| v[k].as_i64().expect("a vision_config size");
    let width = dim("in_channels") * dim("temporal_patch_size") * dim("patch_size").pow(2);
    let merge = dim("spatial_merge_size");
    let t = VL_PROMPT + VL_RESP;
    let (mut ids, mut mask, mut rmask) = (Vec::new(), Vec::new(), Vec::new());
    let mut images: Vec<verlc_runtime::engine::batch::RowImages> = Vec::new();
    tch::manual_seed(3);
    for i in 0..VL_ROWS {
        let grid = [1, 4, if i % 2 == 0 { 4 } else { 8 }];
        let k = grid.iter().product::<i64>() / (merge * merge);
        let text = |j: i64| 3 + (i * 5 + j * 3) % 11;
        let mut real = vec![text(0), start];
        real.extend(std::iter::repeat_n(image, k as usize));
        real.extend([end, text(1)]);
        real.extend((0..VL_PROMPT - real.len() as i64 - i % 3).map(|j| text(j + 2)));
        let pad = VL_PROMPT - real.len() as i64;
        let resp_len = VL_RESP - i % 3;
        ids.extend(std::iter::repeat_n(0, pad as usize).chain(real));
        ids.extend((0..VL_RESP).map(|j| text(j + 7)));
        mask.extend((0..t).map(|j| i64::from(j >= pad && j < VL_PROMPT + resp_len)));
        rmask.extend((0..VL_RESP).map(|j| if j < resp_len { 1f32 } else { 0.0 }));
        let n = grid.iter().product::<i64>() * width;
        let pixels = Tensor::randn([n], (Kind::Float, Device::Cpu));
        let image = verlc_runtime::model::vision::ProcessedImage {
            pixel_values: Vec::try_from(&pixels).expect("pixels"),
            grid_thw: grid,
            seconds_per_grid: None,
            timestamps: Vec::new(),
        };
        images.push(std::sync::Arc::from(vec![image]));
    }
    let ids = Tensor::from_slice(&ids).view([VL_ROWS, t]);
    let mask = Tensor::from_slice(&mask).view([VL_ROWS, t]);
    let grids: Vec<[i64; 3]> = images
        .iter()
        .flat_map(|i| i.iter().map(|p| p.grid_thw))
        .collect();
    let mut b = vl_rows(&e, ids, mask, &grids, &rmask);
    b.set_images(images).expect("images");
    b
}

// Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE on both ranks: under Ulysses (data-parallel size 1) every rank embeds
// the whole micro-batch's images and keeps its shard of the packed embeddings, DeepStack
// features and M-RoPE positions, the tower's gradient being the sum of the shards' shares
// (through the DeepStack features too, from the layer outputs they are added to); with LoRA on the text model and the
// tower (PEFT's all-linear) on 2 data-parallel ranks, the tower's adapters a unit of their
// own beside its frozen weights. Each follows the single engine step by step.
rank_test!(
    fsdp_vision_language_under_ulysses_and_lora_matches_single_engine,
    2,
    |pg| {
        for model in [VL_MODEL, QWEN3_VL_MODEL, QWEN3_VL_MOE_MODEL] {
            let batch = vision_batch(model);
            let mut s = FsdpSettings::new(vl_settings_for(model, false));
            s.ulysses = 2;
            let mut e = FsdpEngine::<CausalLm>::new(s, pg.clone()).expect("fsdp engine");
            assert_eq!(e.dp_size(), 1);
            let dp = e.data_group().clone();
            packed_matches_padded(model, &batch, &mut e, &batch, Some(&dp));
        }
        // LoRA on Qwen2.5-VL, and on Qwen3-VL-MoE, whose routers are adapted too.
        for model in [VL_MODEL, QWEN3_VL_MOE_MODEL] {
            let batch = vision_batch(model);
            let mut single =
                SingleEngine::<CausalLm>::new(vl_settings_for(model, true)).expect("single LoRA");
            let mut f = FsdpEngine::<CausalLm>::new(
                FsdpSettings::new(vl_settings_for(model, true)),
                pg.clone(),
            )
            .expect("fsdp LoRA");
            let local = VL_ROWS / 2;
            let rows = batch.narrow(pg.rank() as i64 * local, local).expect("rows");
            lockstep(
                Side {
                    engine: &mut single,
                    rows: &batch,
                    group: None,
                },
                Side {
                    engine: &mut f,
                    rows: &rows,
                    group: Some(&pg),
                },
                LOCKSTEP_STEPS,
                1e-5,
            );
        }
    }
);

/// `vision_batch`'s rows without their pictures: text only, positions the model's M-RoPE ids.
fn text_only_batch(model: &str) -> Batch {
    let e = single_engine(model);
    let t = VL_PROMPT + VL_RESP;
    let (mut ids, mut mask, mut rmask) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..VL_ROWS {
        let pad = i % 3;
        let resp_len = VL_RESP - i % 3;
        ids.extend((0..t).map(|j| if j < pad { 0 } else { 3 + (i * 5 + j * 3) % 11 }));
        mask.extend((0..t).map(|j| i64::from(j >= pad && j < VL_PROMPT + resp_len)));
        rmask.extend((0..VL_RESP).map(|j| if j < resp_len { 1f32 } else { 0.0 }));
    }
    let ids = Tensor::from_slice(&ids).view([VL_ROWS, t]);
    let mask = Tensor::from_slice(&mask).view([VL_ROWS, t]);
    vl_rows(&e, ids, mask, &[], &rmask)
}

/// The batch of `VL_ROWS` rows `ids` with their `mask` and response masks, positions the
/// model's M-RoPE ids for images of `grids`.
fn vl_rows(
    e: &SingleEngine<CausalLm>,
    ids: Tensor,
    mask: Tensor,
    grids: &[[i64; 3]],
    rmask: &[f32],
) -> Batch {
    let vision = e.module().vision.as_ref().expect("a vision tower");
    let (pos, _) = vision
        .positions(&ids, &mask, grids)
        .expect("M-RoPE positions");
    Batch::new()
        .with("input_ids", ids.shallow_clone())
        .and_then(|b| b.with("attention_mask", mask))
        .and_then(|b| b.with("position_ids", pos))
        .and_then(|b| b.with("responses", ids.narrow(1, VL_PROMPT, VL_RESP)))
        .and_then(|b| {
            b.with(
                "response_mask",
                Tensor::from_slice(rmask).view([VL_ROWS, VL_RESP]),
            )
        })
        .expect("batch")
}

fn tower_of(params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .filter(|(n, _)| n.starts_with("visual."))
        .collect()
}

// A vision-language model trained on rows without pictures: verl runs its tower on a dummy image
// and adds zero times the output, so the tower's weights get a zero gradient and AdamW's weight
// decay alone (`w (1 - lr wd)`), on one process and on FSDP's flat shards alike.
rank_test!(
    an_unused_vision_tower_takes_weight_decay_alone_as_in_verl,
    2,
    |pg| {
        let batch = text_only_batch(VL_MODEL);
        let mut single =
            SingleEngine::<CausalLm>::new(vl_settings_for(VL_MODEL, false)).expect("single engine");
        let mut fsdp = FsdpEngine::<CausalLm>::new(
            FsdpSettings::new(vl_settings_for(VL_MODEL, false)),
            pg.clone(),
        )
        .expect("fsdp engine");
        let before: Vec<(String, Tensor)> = tower_of(single.per_tensor_params().expect("params"))
            .into_iter()
            .map(|(n, t)| (n, t.copy()))
            .collect();
        let local = VL_ROWS / 2;
        let rows = batch.narrow(pg.rank() as i64 * local, local).expect("rows");
        // Two steps: the schedule's warm-up gives the first a learning rate of 0.
        for _ in 0..2 {
            train_step(&mut single, &batch, None);
            train_step(&mut fsdp, &rows, Some(&pg));
        }
        let (one, sharded) = (
            tower_of(single.per_tensor_params().expect("params")),
            tower_of(fsdp.per_tensor_params().expect("params")),
        );
        assert!(!one.is_empty());
        // One factor for every weight of the tower: decay, not an update.
        let ratio = |(w1, w0): (&Tensor, &Tensor)| (w1 / w0).masked_select(&w0.abs().gt(1e-3));
        let ratios = Tensor::cat(
            &one.iter()
                .zip(&before)
                .map(|((_, w1), (_, w0))| ratio((w1, w0)))
                .collect::<Vec<_>>(),
            0,
        );
        let (lo, hi) = (
            ratios.min().double_value(&[]),
            ratios.max().double_value(&[]),
        );
        assert!(
            hi < 1.0 && hi - lo < 1e-6,
            "the tower's weights scaled by {lo}..{hi}"
        );
        assert_weights(&sharded, &one, 1e-7);
    }
);

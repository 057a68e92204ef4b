//! Shared pieces: a tiny model, its single-process reference training run, batches.
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use verlc_runtime::builtin_uri::BuiltinUri;
use verlc_runtime::logits::logprob::log_probs_from_logits;
use verlc_runtime::model::init::init_weights;
use verlc_runtime::model::{CausalLm, ModelConfig, position_ids_from_mask};
use verlc_runtime::optim::param_groups::{
    MegatronGroupsConfig, megatron_param_groups, named_params,
};
use verlc_runtime::optim::{Dtype, NamedParam, Optimizer, OptimizerConfig, ParamGroup};

pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// builtin://tiny with 2 layers (Qwen2: q/k/v bias, GQA 4/2 heads, tied embeddings).
pub fn tiny_config(tied: bool) -> ModelConfig {
    let uri =
        BuiltinUri::parse("builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&intermediate=48")
            .unwrap()
            .unwrap();
    let mut cfg = verlc_runtime::model::builtin::config(&uri).unwrap();
    cfg.tie_word_embeddings = tied;
    // Megatron's embedding has no padding_idx (see engine.rs' engine_settings).
    cfg.extra.remove("pad_token_id");
    cfg
}

/// A tiny Qwen3-MoE (2 layers, 4 experts, top-3: every expert gets tokens each step) with
/// untied embeddings.
pub fn tiny_moe_config() -> ModelConfig {
    let uri = BuiltinUri::parse(
        "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&arch=qwen3_moe&experts=4&experts_per_tok=3&moe_intermediate=16",
    )
    .unwrap()
    .unwrap();
    let mut cfg = verlc_runtime::model::builtin::config(&uri).unwrap();
    cfg.tie_word_embeddings = false;
    cfg.extra.remove("pad_token_id");
    cfg
}

/// A tiny 2-layer model of the family `arch` names (`builtin://tiny?arch=`) with untied
/// embeddings unless `tied`, and the extra `config.json` keys `extra`.
pub fn tiny_family_config(
    arch: &str,
    tied: bool,
    extra: &[(&str, serde_json::Value)],
) -> ModelConfig {
    let uri =
        format!("builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&intermediate=48&arch={arch}");
    let uri = BuiltinUri::parse(&uri).unwrap().unwrap();
    let mut cfg = verlc_runtime::model::builtin::config(&uri).unwrap();
    cfg.tie_word_embeddings = tied;
    cfg.extra.remove("pad_token_id");
    for (k, v) in extra {
        cfg.extra.insert((*k).to_owned(), v.clone());
    }
    cfg
}

/// A tiny Qwen3.5 (`moe`: Qwen3.5-MoE): layers 0-2 Gated DeltaNet, layer 3 gated attention.
pub fn tiny_qwen3_5_config(moe: bool) -> ModelConfig {
    let uri = if moe {
        "builtin://tiny?layers=4&hidden=32&heads=2&kv_heads=2&arch=qwen3_5_moe&experts=4&experts_per_tok=4&moe_intermediate=16"
    } else {
        "builtin://tiny?layers=4&hidden=32&heads=2&kv_heads=2&arch=qwen3_5"
    };
    let uri = BuiltinUri::parse(uri).unwrap().unwrap();
    let mut cfg = verlc_runtime::model::builtin::config(&uri).unwrap();
    cfg.tie_word_embeddings = false;
    cfg.extra.remove("pad_token_id");
    cfg
}

pub const SEED: u64 = 1234;

/// Parameter dtype and optimizer of a run (the same on both sides of a comparison).
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub kind: Kind,
    pub optim: OptimizerConfig,
}

impl Setup {
    pub fn fp32() -> Self {
        Setup {
            kind: Kind::Float,
            optim: optim_config(),
        }
    }

    /// bf16 params, fp32 main params, half of the optimizer state on the host.
    pub fn bf16_offload() -> Self {
        let mut optim = OptimizerConfig::megatron(Dtype::Bf16);
        optim.offload_fraction = 0.5;
        Setup {
            kind: Kind::BFloat16,
            optim,
        }
    }
}

/// The single-process model with seeded weights (initialised in f32, then cast).
pub fn reference_model(cfg: &ModelConfig, kind: Kind) -> (VarStore, CausalLm) {
    let mut vs = VarStore::new(Device::Cpu);
    let model = CausalLm::new(cfg, vs.root()).unwrap();
    init_weights(&vs, cfg, SEED).unwrap();
    vs.set_kind(kind);
    (vs, model)
}

pub fn full_weights(vs: &VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A fixed batch: (input_ids, attention_mask, position_ids), (rows, len), some rows
/// left-padded.
pub fn batch(cfg: &ModelConfig, rows: i64, len: i64) -> (Tensor, Tensor, Tensor) {
    let mut rng = verlc_runtime::rng::Rng::new(99);
    let ids: Vec<i64> = (0..rows * len)
        .map(|_| rng.range(1, cfg.vocab_size - 1))
        .collect();
    let ids = Tensor::from_slice(&ids).view([rows, len]);
    let mask = Tensor::ones([rows, len], (Kind::Int64, Device::Cpu));
    for r in (0..rows).step_by(3) {
        let _ = mask.get(r).narrow(0, 0, 1 + r % 3).fill_(0);
    }
    let ids = ids.masked_fill(&mask.eq(0), 0);
    let pos = position_ids_from_mask(&mask);
    (ids, mask, pos)
}

pub fn groups_config() -> MegatronGroupsConfig {
    MegatronGroupsConfig {
        lr: 5e-3,
        min_lr: 0.0,
        weight_decay: 0.01,
        decoupled_lr: None,
        decoupled_min_lr: None,
        apply_wd_to_qk_layernorm: false,
    }
}

pub fn make_groups(params: Vec<NamedParam>) -> Vec<ParamGroup> {
    megatron_param_groups(params, &groups_config())
}

pub fn optim_config() -> OptimizerConfig {
    OptimizerConfig::megatron(Dtype::Fp32)
}

/// Next-token cross-entropy summed over real (input, target) pairs of `rows`, and the pair
/// count, from per-token log-probs (rows, len - 1).
pub fn masked_sum(log_probs: &Tensor, mask: &Tensor) -> Tensor {
    let m = mask.narrow(1, 1, mask.size()[1] - 1).to_kind(Kind::Float)
        * mask.narrow(1, 0, mask.size()[1] - 1).to_kind(Kind::Float);
    -(log_probs * m).sum(Kind::Float)
}

pub fn token_count(mask: &Tensor) -> f64 {
    let len = mask.size()[1];
    (mask.narrow(1, 1, len - 1) * mask.narrow(1, 0, len - 1))
        .sum(Kind::Double)
        .double_value(&[])
}

/// One side of a [`lockstep`] comparison: it takes one training step and shows its weights.
pub trait Stepper {
    /// One step: the global loss before it and the grad norm.
    fn step(&mut self) -> (f64, f64);
    /// Every parameter, whole, by name.
    fn weights(&self) -> Vec<(String, Tensor)>;
    /// The gradients of the last step by name, where this side can show them whole.
    fn gradients(&self) -> Option<Vec<(String, Tensor)>> {
        None
    }
    /// Takes these weights (and the optimizer's main copies); its optimizer state stays.
    fn load(&mut self, weights: &[(String, Tensor)]);
}

/// The single-process model and optimizer on the whole fixed batch: mean next-token
/// cross-entropy over its real tokens.
pub struct Reference {
    vs: VarStore,
    model: CausalLm,
    opt: Optimizer,
    batch: (Tensor, Tensor, Tensor),
    n: f64,
}

impl Reference {
    pub fn new(cfg: &ModelConfig, rows: i64, len: i64, setup: &Setup) -> Reference {
        let (vs, model) = reference_model(cfg, setup.kind);
        let opt = Optimizer::new(make_groups(named_params(&vs)), setup.optim).unwrap();
        let batch = batch(cfg, rows, len);
        let n = token_count(&batch.1);
        Reference {
            vs,
            model,
            opt,
            batch,
            n,
        }
    }
}

impl Stepper for Reference {
    fn step(&mut self) -> (f64, f64) {
        let (ids, mask, pos) = &self.batch;
        self.opt.zero_grad().unwrap();
        let logits = self.model.forward(ids, pos, Some(mask), None);
        next_token_step(&mut self.opt, &logits, ids, mask, self.n)
    }

    fn weights(&self) -> Vec<(String, Tensor)> {
        full_weights(&self.vs)
    }

    fn gradients(&self) -> Option<Vec<(String, Tensor)>> {
        Some(gradients_of(&self.vs))
    }

    fn load(&mut self, weights: &[(String, Tensor)]) {
        load_into(&self.vs, &mut self.opt, weights);
    }
}

/// One optimizer step on the mean next-token cross-entropy of `logits` over the `n` real
/// (input, target) pairs of `ids` (`mask` 1 on real tokens): the loss before it and the grad
/// norm.
pub fn next_token_step(
    opt: &mut Optimizer,
    logits: &Tensor,
    ids: &Tensor,
    mask: &Tensor,
    n: f64,
) -> (f64, f64) {
    let len = ids.size()[1];
    let lp = log_probs_from_logits(&logits.narrow(1, 0, len - 1), &ids.narrow(1, 1, len - 1));
    let loss = masked_sum(&lp, mask) / n;
    let value = loss.double_value(&[]);
    loss.backward();
    let out = opt.step(None).unwrap();
    assert!(out.update_successful);
    (value, out.grad_norm.unwrap_or(f64::NAN))
}

/// Every variable's gradient by name (undefined where it has none).
pub fn gradients_of(vs: &VarStore) -> Vec<(String, Tensor)> {
    vs.variables()
        .into_iter()
        .map(|(n, t)| (n, t.grad()))
        .collect()
}

/// Copies `weights` into the variables of `vs` by name and the optimizer's main copies.
pub fn load_into(vs: &VarStore, opt: &mut Optimizer, weights: &[(String, Tensor)]) {
    let vars = vs.variables();
    tch::no_grad(|| {
        for (n, w) in weights {
            vars[n].shallow_clone().copy_(w);
        }
    });
    opt.reload_model_params().unwrap();
}

/// The sum of micro-batch `b`'s next-token log-probs over its real tokens, from the last
/// stage's `hidden` states.
pub fn log_prob_sum(
    model: &verlc_runtime::engine::megatron::ParallelModel,
    tape: &mut verlc_runtime::parallel::mappings::Tape,
    hidden: &Tensor,
    b: &verlc_runtime::engine::megatron::MicroBatch,
) -> verlc_runtime::engine::megatron::Result<Tensor> {
    let len = b.input_ids.size()[1];
    let lp = model
        .next_token_log_probs(
            tape,
            hidden,
            &b.input_ids,
            (0, len - 1),
            1.0,
            verlc_runtime::logits::TokenStats::default(),
            (verlc_runtime::logits::topk::TopK::Off, None),
        )?
        .log_probs;
    Ok(masked_sum(&lp, b.attention_mask.as_ref().unwrap()))
}

/// The single-process run: `steps` full-batch steps of mean next-token cross-entropy.
/// Returns the loss before each step and the final weights.
pub fn reference_run(
    cfg: &ModelConfig,
    steps: usize,
    rows: i64,
    len: i64,
    setup: &Setup,
) -> (Vec<f64>, Vec<(String, Tensor)>) {
    let mut r = Reference::new(cfg, rows, len, setup);
    let losses = (0..steps).map(|_| r.step().0).collect();
    (losses, r.weights())
}

/// A gradient element below this fraction of the largest one is rounding-sized: an element
/// whose exact gradient is zero (a key bias: softmax ignores a shift all keys share) or tiny
/// (a DeltaNet decay rate `A_log` on these tiny models, about 1e-10) holds rounding noise,
/// which AdamW normalises into steps of the learning rate's size in either direction. Such
/// weights are left out of the per-step weight comparison; they move the loss by nothing
/// measurable.
pub const ROUNDING_SIZED: f64 = 1e-4;

/// Trains `candidate` beside `reference` for `steps` steps, every step starting both from the
/// reference's weights: per step the losses and grad norms agree to 1e-5 (relative), the
/// updated weights to `tol` (absolute; where the reference shows its gradients, only where
/// they are not rounding-sized), and then the candidate takes the reference's weights. One
/// step's drift is what is bounded, so rounding never compounds over steps and the kernels a
/// CPU happens to pick (AVX2, AVX-512, AMX) cannot decide the test, while a wrong sum, scale
/// or shard shows in the first step. The optimizers keep their own state throughout.
pub fn lockstep(
    reference: &mut dyn Stepper,
    candidate: &mut dyn Stepper,
    steps: usize,
    tol: f64,
) -> Trajectory {
    let mut out = Trajectory::default();
    for step in 0..steps {
        let (a, na) = reference.step();
        let (b, nb) = candidate.step();
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "step {step}: loss {b} vs the reference's {a}"
        );
        assert!(
            (na - nb).abs() <= 1e-5 * na.abs().max(1.0),
            "step {step}: grad norm {nb} vs the reference's {na}"
        );
        let w = reference.weights();
        let mine = candidate.weights();
        let signal = reference.gradients().map(|g| signal_mask(&g, &w));
        assert_eq!(mine.len(), w.len(), "the same parameters");
        for (name, t) in &mine {
            let (_, u) = w.iter().find(|(n, _)| n == name).expect("same names");
            assert_eq!(t.size(), u.size(), "{name}");
            let mut d = (t.to_kind(Kind::Double) - u.to_kind(Kind::Double)).abs();
            if let Some(keep) = signal
                .as_ref()
                .and_then(|s| s.iter().find(|(n, _)| n == name))
            {
                d *= keep.1.to_kind(Kind::Double);
            }
            let d = d.max().double_value(&[]);
            assert!(
                d <= tol,
                "step {step}: weight {name} differs by {d:e} after the update"
            );
        }
        candidate.load(&w);
        out.losses.push(a);
        out.norms.push(na);
        out.candidate_losses.push(b);
    }
    out
}

/// What a [`lockstep`] run recorded: the reference's losses and grad norms, the candidate's
/// losses.
#[derive(Debug, Default)]
pub struct Trajectory {
    pub losses: Vec<f64>,
    pub norms: Vec<f64>,
    pub candidate_losses: Vec<f64>,
}

/// Per parameter, the elements whose gradient is not rounding-sized ([`ROUNDING_SIZED`]); a
/// parameter without a gradient keeps none.
fn signal_mask(grads: &[(String, Tensor)], weights: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    let largest = grads
        .iter()
        .filter(|(_, g)| g.defined())
        .map(|(_, g)| g.abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    weights
        .iter()
        .map(|(n, w)| {
            let keep = match grads.iter().find(|(m, _)| m == n) {
                Some((_, g)) if g.defined() => g.abs().ge(ROUNDING_SIZED * largest),
                _ => w.zeros_like().to_kind(Kind::Bool),
            };
            (n.clone(), keep)
        })
        .collect()
}

/// The module's distributed optimizer and the number of parameter elements this rank holds
/// (what its owned state is compared with); panics when the module has another optimizer.
pub fn distributed_state(
    m: &verlc_runtime::engine::megatron::MegatronModule,
) -> (&verlc_runtime::optim::distrib::DistributedOptimizer, usize) {
    let Some(verlc_runtime::engine::megatron::ModuleOptimizer::Distributed(opt)) = m.optimizer()
    else {
        panic!("expected the distributed optimizer");
    };
    let total = m.model.params().iter().map(|p| p.tensor.numel()).sum();
    (opt, total)
}

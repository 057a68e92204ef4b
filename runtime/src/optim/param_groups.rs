//! Parameter groups: which params share lr / weight decay.
//!
//! [`megatron_param_groups`] follows `_get_param_groups` with the standard overrides: no
//! weight decay for biases and 1-D params (norm weights), optionally a decoupled lr for the
//! embedding and output layer; the no-override group comes first, then the others sorted by
//! their override tuple. [`single_group`] is verl's FSDP `AdamW(model.parameters())`.
use serde::{Deserialize, Serialize};
use tch::Tensor;

/// A model parameter with the facts the optimizer needs about it.
#[derive(Debug)]
pub struct NamedParam {
    pub name: String,
    pub tensor: Tensor,
    /// Megatron's `is_embedding_or_output_parameter` (gets `decoupled_lr`).
    pub is_embedding_or_output: bool,
    /// Counted in the grad norm and zero count (false for shared params and for
    /// tensor-parallel duplicates on TP rank > 0).
    pub in_grad_norm: bool,
}

impl NamedParam {
    pub fn new(name: impl Into<String>, tensor: Tensor) -> Self {
        NamedParam {
            name: name.into(),
            tensor,
            is_embedding_or_output: false,
            in_grad_norm: true,
        }
    }
}

/// Per-group hyper-parameters. `lr` and `weight_decay` are what the next step uses; the
/// schedulers rewrite them from the other fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupOptions {
    pub lr: f64,
    pub weight_decay: f64,
    /// Peak / floor lr of the Megatron scheduler for this group (scheduler default if None).
    pub max_lr: Option<f64>,
    pub min_lr: Option<f64>,
    /// `weight_decay = wd(t) * wd_mult` under the Megatron scheduler.
    pub wd_mult: f64,
    pub start_wd: Option<f64>,
    pub end_wd: Option<f64>,
    /// Megatron's `default_config`: no lr override (used to pick the lr to log).
    pub default_config: bool,
}

impl GroupOptions {
    pub fn new(lr: f64, weight_decay: f64) -> Self {
        GroupOptions {
            lr,
            weight_decay,
            max_lr: None,
            min_lr: None,
            wd_mult: 1.0,
            start_wd: None,
            end_wd: None,
            default_config: true,
        }
    }
}

#[derive(Debug)]
pub struct ParamGroup {
    pub params: Vec<NamedParam>,
    pub options: GroupOptions,
}

/// Settings of Megatron's standard param-group overrides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MegatronGroupsConfig {
    pub lr: f64,
    pub min_lr: f64,
    pub weight_decay: f64,
    /// lr of params flagged `is_embedding_or_output` (None: no separate group).
    pub decoupled_lr: Option<f64>,
    pub decoupled_min_lr: Option<f64>,
    /// Qwen3-Next rule: q/k layernorm weights keep weight decay.
    pub apply_wd_to_qk_layernorm: bool,
}

/// Megatron's sorted `(key, value)` override tuple.
type OverrideKey = Vec<(&'static str, OrdF64)>;

/// The override a param gets under the standard rules (`max_lr` < `min_lr` < `wd_mult`).
fn override_key(p: &NamedParam, cfg: &MegatronGroupsConfig) -> OverrideKey {
    let one_d = p.tensor.dim() == 1;
    let bias = p.name.ends_with(".bias");
    let no_wd = if cfg.apply_wd_to_qk_layernorm {
        (one_d || bias) && !(p.name.contains("q_layernorm.") || p.name.contains("k_layernorm."))
    } else {
        bias || one_d
    };
    let mut key = Vec::new();
    if let (Some(lr), true) = (cfg.decoupled_lr, p.is_embedding_or_output) {
        key.push(("max_lr", OrdF64(lr)));
        if let Some(min) = cfg.decoupled_min_lr {
            key.push(("min_lr", OrdF64(min)));
        }
    }
    if no_wd {
        key.push(("wd_mult", OrdF64(0.0)));
    }
    key
}

/// Total order on f64 for sorting override tuples like Python does on floats.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// Megatron's `_get_param_groups` with `get_standard_config_overrides`. Params that do not
/// require grad are dropped. Group options: `lr = max_lr`, `min_lr`, `wd_mult` from the rules.
pub fn megatron_param_groups(
    params: Vec<NamedParam>,
    cfg: &MegatronGroupsConfig,
) -> Vec<ParamGroup> {
    let mut groups: Vec<(OverrideKey, Vec<NamedParam>)> = Vec::new();
    for p in params.into_iter().filter(|p| p.tensor.requires_grad()) {
        let key = override_key(&p, cfg);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(p),
            None => groups.push((key, vec![p])),
        }
    }
    // None-override group first, then by override tuple (stable).
    groups.sort_by(|(a, _), (b, _)| (!a.is_empty(), a).cmp(&(!b.is_empty(), b)));
    groups
        .into_iter()
        .map(|(key, params)| {
            let mut o = GroupOptions::new(cfg.lr, cfg.weight_decay);
            o.max_lr = Some(cfg.lr);
            o.min_lr = Some(cfg.min_lr);
            for (k, OrdF64(v)) in &key {
                match *k {
                    "max_lr" => o.max_lr = Some(*v),
                    "min_lr" => o.min_lr = Some(*v),
                    "wd_mult" => o.wd_mult = *v,
                    _ => {}
                }
            }
            o.default_config = !key.iter().any(|(k, _)| k.contains("lr"));
            if let Some(m) = o.max_lr {
                o.lr = m;
            }
            o.weight_decay = cfg.weight_decay * o.wd_mult;
            ParamGroup { params, options: o }
        })
        .collect()
}

/// One group over every trainable param (verl FSDP: `AdamW(params, lr, weight_decay)`).
pub fn single_group(params: Vec<NamedParam>, lr: f64, weight_decay: f64) -> Vec<ParamGroup> {
    let params: Vec<NamedParam> = params
        .into_iter()
        .filter(|p| p.tensor.requires_grad())
        .collect();
    vec![ParamGroup {
        params,
        options: GroupOptions::new(lr, weight_decay),
    }]
}

/// Named trainable variables of a tch VarStore, sorted by name (VarStore order is a hash map).
pub fn named_params(vs: &tch::nn::VarStore) -> Vec<NamedParam> {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.into_iter().map(|(n, t)| NamedParam::new(n, t)).collect()
}

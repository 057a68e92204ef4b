//! Lowering: a checked, resolved config -> the [`BuildPlan`], what a generated trainer binds.
//!
//! The plan fixes, at build time, the three things the binary is monomorphized over — the
//! parallel strategy, the precision mode and the offload policy ([`Binding`], vocabulary and
//! support table in [`binding`]) — and records the rest of what the binary needs to know
//! about the run's shape: the algorithm and which roles exist.
//!
//! Where each binding comes from (actor side; the critic and reference policy must agree):
//! - strategy: `actor.strategy` — `fsdp`/`fsdp2` bind `Fsdp`, `megatron` binds `Megatron`.
//! - precision (FSDP): `fsdp_config.mixed_precision.param_dtype` when set, else the engine's
//!   compute `fsdp_config.dtype` — fp32 -> `Fp32`, bf16 -> `Bf16Mixed`, fp16 -> `Fp16Mixed`
//!   (loss scaling). `fsdp_config.model_dtype` has a verdict of its own ([`verdicts`]).
//! - precision (Megatron): `megatron.dtype` (bfloat16 or float16).
//! - offload (FSDP): `param_offload` offloads parameters and their gradients,
//!   `optimizer_offload` the optimizer state; FSDP2's `offload_policy` offloads all three.
//! - offload (Megatron): `optimizer_offload` (the engine keeps its model shards on the device:
//!   `param_offload`/`grad_offload` warn on CPU, where there is nothing to move, and are `B018`
//!   on CUDA).
//!
//! Problems come out as diagnostics with `B` ids ([`crate::codes`]):
//! - errors (`B01x`): combinations the binary cannot bind and (`B018`) values it cannot honour,
//!   at the YAML line that decided them;
//! - warnings (`B00x`): keys the binary does not read.
//!
//! Every key's verdict is in [`verdicts`] and reported for the keys the user changed
//! ([`verdict_diagnostics`]). `verlc check` shows all of it as warnings
//! ([`check_diagnostics`]); `verlc build` refuses the errors (`--deny-warnings` the warnings).
//!
//! Lowering also produces the trainer spec the binary runs ([`spec`]); the resolved config is
//! embedded in the binary as YAML ([`embed`]).

mod asynchronous;
mod distillation;
pub mod embed;
mod host;
mod invalid;
pub mod models;
mod rejection;
mod rollout_fit;
pub mod spec;
mod veomni;
mod verdict_report;
pub mod verdicts;

#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::config::{AdvEstimator, Device, KlEstimator, LossAggMode, PolicyLossMode, VerlConfig};
use crate::diag::Diagnostic;
use crate::load::compose::{self, Composed};
use crate::load::node::{Node, split_key};
use crate::reward::Rewards;
use crate::role::{Role, critic_runs, reference_runs};
use crate::rules::RuleContext;

pub use verdict_report::verdict_diagnostics;
pub use verlc_spec::binding::{self, Binding, Dtype, OffloadFlags, OffloadTarget, StrategyKind};

/// A config key whose value decided the binding; a run-time override that changes it is
/// refused ("rebuild with verlc").
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct BoundKey {
    /// Dotted key (`actor_rollout_ref.actor.fsdp_config.param_offload`).
    pub key: String,
    /// Its value at build time.
    pub value: serde_json::Value,
}

/// The RL algorithm as the trainer runs it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlgorithmPlan {
    pub adv_estimator: AdvEstimator,
    pub loss_mode: PolicyLossMode,
    pub loss_agg_mode: LossAggMode,
    /// KL to the reference policy as a loss term (`actor.use_kl_loss`), with its estimator.
    pub kl_loss: Option<KlEstimator>,
    /// KL to the reference policy subtracted from the reward (`algorithm.use_kl_in_reward`).
    pub kl_in_reward: Option<KlEstimator>,
}

/// Where rewards come from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardPlan {
    /// A scoring function: verl's default `compute_score` by `data_source` (built-in tasks
    /// included) or `custom_reward_function.path`.
    Function { custom_path: Option<String> },
    /// A reward model (`reward_model.enable`); not supported by the binary (B016).
    Model,
}

/// The workers the run needs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Roles {
    /// Always: the trained policy.
    pub actor: bool,
    /// Always: the built-in rollout engine.
    pub rollout: bool,
    /// `algorithm.use_kl_in_reward` or `actor.use_kl_loss`.
    pub reference: bool,
    /// `critic.enable` when set, else `algorithm.adv_estimator == gae` (verl's rule).
    pub critic: bool,
    pub reward: RewardPlan,
}

/// Accelerators of the run: `trainer.nnodes` × `trainer.n_gpus_per_node` ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct World {
    pub device: Device,
    pub nnodes: i64,
    pub n_gpus_per_node: i64,
}

impl World {
    pub fn size(&self) -> i64 {
        self.nnodes * self.n_gpus_per_node
    }
}

/// Everything `verlc build` decides from a config.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BuildPlan {
    pub binding: Binding,
    pub world: World,
    pub algorithm: AlgorithmPlan,
    pub roles: Roles,
    /// The keys that decided [`BuildPlan::binding`] and the device, with their values.
    pub bound_keys: Vec<BoundKey>,
    /// Everything the binary runs, decided here (see [`spec`]).
    pub spec: verlc_spec::TrainerSpec,
}

/// The plan of an SFT config (verl's `sft_trainer`): its binding, the keys that decided it
/// and the spec the trainer runs.
#[derive(Clone, Debug, Serialize)]
pub struct SftPlan {
    pub binding: Binding,
    pub bound_keys: Vec<BoundKey>,
    pub spec: verlc_spec::sft::SftSpec,
}

/// What `verlc build` generates a trainer for: verl's RL loop or its SFT loop.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Planned {
    Rl(Box<BuildPlan>),
    Sft(Box<SftPlan>),
}

/// The key of the embedded spec document that marks an SFT trainer's spec (an RL trainer's is
/// the `TrainerSpec` itself).
pub const SFT_SPEC_KEY: &str = "sft";

impl Planned {
    pub fn binding(&self) -> Binding {
        match self {
            Planned::Rl(p) => p.binding,
            Planned::Sft(p) => p.binding,
        }
    }

    pub fn bound_keys(&self) -> &[BoundKey] {
        match self {
            Planned::Rl(p) => &p.bound_keys,
            Planned::Sft(p) => &p.bound_keys,
        }
    }

    /// Whether the trainer runs on CUDA devices.
    pub fn cuda(&self) -> bool {
        match self {
            Planned::Rl(p) => p.world.device == Device::Cuda,
            Planned::Sft(p) => p.spec.world.device == verlc_spec::trainer::DeviceKind::Cuda,
        }
    }

    /// The spec document a trainer embeds: the RL `TrainerSpec`, or `{"sft": SftSpec}`.
    pub fn spec_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        match self {
            Planned::Rl(p) => serde_json::to_value(&p.spec),
            Planned::Sft(p) => {
                Ok(serde_json::json!({ SFT_SPEC_KEY: serde_json::to_value(&p.spec)? }))
            }
        }
    }
}

/// A plan and the problems found while lowering.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub plan: BuildPlan,
    /// Errors (`B01x`, `B018` from lowering) only; [`verdict_diagnostics`] adds the verdicts of
    /// the keys the user changed.
    pub diagnostics: Vec<Diagnostic>,
}

impl Lowered {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// The algorithm semantics of the verl release `label` a config was judged against
/// (`Checked::release_version`): the modelled 0.7.0's where the label says nothing.
pub fn algo_release(label: &str) -> verlc_spec::algo::AlgoRelease {
    crate::load::version::release_triple(label)
        .map_or(verlc_spec::algo::AlgoRelease::V0_7_0, |(a, b, c)| {
            verlc_spec::algo::AlgoRelease(a, b, c)
        })
}

/// Lower a typed config whose tree is `root` (for the origins of diagnostics), judged against
/// the release whose algorithm functions the run follows.
pub(crate) fn lower(
    cfg: &VerlConfig,
    root: &Node,
    release: verlc_spec::algo::AlgoRelease,
) -> Lowered {
    let actor = Role::actor(cfg);
    let (precision, _) = actor.precision().unwrap_or((Dtype::Bf16, String::new()));
    let binding = Binding {
        strategy: actor.strategy_kind(),
        precision,
    };

    let a = &cfg.actor_rollout_ref.actor;
    let roles = Roles {
        actor: true,
        rollout: true,
        reference: reference_runs(cfg),
        critic: critic_runs(cfg),
        reward: {
            let r = Rewards::of(cfg, root);
            if r.model.enabled() {
                RewardPlan::Model
            } else {
                RewardPlan::Function {
                    custom_path: r.function.path.map(str::to_owned),
                }
            }
        },
    };
    let algorithm = AlgorithmPlan {
        adv_estimator: cfg.algorithm.adv_estimator,
        loss_mode: a.policy_loss.loss_mode,
        loss_agg_mode: a.loss_agg_mode,
        kl_loss: a.use_kl_loss.then_some(a.kl_loss_type),
        kl_in_reward: cfg
            .algorithm
            .use_kl_in_reward
            .then_some(cfg.algorithm.kl_penalty),
    };
    let t = &cfg.trainer;
    let world = World {
        device: t.device,
        nnodes: t.nnodes,
        n_gpus_per_node: t.n_gpus_per_node,
    };

    let mut keys = actor.deciding_keys();
    if roles.critic {
        keys.extend(Role::critic(cfg).deciding_keys());
    }
    if roles.reference {
        let r = Role::reference(cfg);
        keys.push(r.strategy_key());
        if let Some((_, k)) = r.precision() {
            keys.push(k);
        }
    }
    keys.push("trainer.device".to_owned());
    let bound_keys = keys
        .into_iter()
        .map(|key| {
            let value = root
                .get_path(&crate::load::node::split_key(&key))
                .map_or(serde_json::Value::Null, Node::to_json);
            BoundKey { key, value }
        })
        .collect();

    let (spec, mut spec_diagnostics) = spec::lower_spec(cfg, root, binding, release);
    if let Some(d) = host::bf16_emulated_warning(&actor, binding, t.device, root) {
        spec_diagnostics.push(d);
    }
    let plan = BuildPlan {
        binding,
        world,
        algorithm,
        roles,
        bound_keys,
        spec,
    };
    let mut diagnostics = invalid::check(cfg, root, &plan);
    diagnostics.extend(spec_diagnostics);
    Lowered { plan, diagnostics }
}

/// The plan's findings for `verlc check` (only those enabled): what the binary cannot bind or
/// honour, and the verdicts of the keys the user changed.
pub fn check_diagnostics(
    ctx: &RuleContext,
    enabled: &dyn Fn(crate::diag::Code) -> bool,
) -> Vec<Diagnostic> {
    let (a, b, c) = ctx.release_triple();
    let lowered = lower(ctx.config, ctx.root, verlc_spec::algo::AlgoRelease(a, b, c));
    let mut out = lowered.diagnostics;
    drop_expert_degrees_no_effect(&mut out, ctx.model, ctx.root);
    if let Some(model) = ctx.model {
        out.extend(rollout_fit::rollout_fit(
            &lowered.plan.spec,
            model,
            ctx.root,
        ));
    }
    if let Some(defaults) = ctx.default_tree() {
        out.extend(verdict_diagnostics(
            ctx.config,
            ctx.root,
            ctx.sources,
            defaults,
        ));
    }
    out.into_iter().filter(|d| enabled(d.code)).collect()
}

/// Lowering warns that the expert degrees place expert layers a dense model lacks (`B006`);
/// a model with experts (the policy's `config.json` at hand, or a role's `builtin://` model)
/// makes them count (their layout is checked at build, [`models`]), so the warning goes.
fn drop_expert_degrees_no_effect(
    diagnostics: &mut Vec<Diagnostic>,
    model: Option<&crate::rules::ModelDims>,
    root: &Node,
) {
    let policy_has_experts = model.is_some_and(|m| m.moe.num_experts > 0);
    let builtin_has_experts = |key: &str| {
        let path = if key.starts_with("critic.") {
            "critic.model.path"
        } else {
            "actor_rollout_ref.model.path"
        };
        root.get_path(&split_key(path))
            .and_then(Node::as_str)
            .and_then(models::builtin_has_experts)
            .unwrap_or(false)
    };
    diagnostics.retain(|d| {
        let Some(key) = d.key_path.as_deref() else {
            return true;
        };
        let expert_degree = key.ends_with(".expert_model_parallel_size")
            || key.ends_with(".expert_tensor_parallel_size");
        let experts =
            (policy_has_experts && !key.starts_with("critic.")) || builtin_has_experts(key);
        d.code != crate::codes::BUILD_NO_EFFECT || !expert_degree || !experts
    });
}

/// The plan of a checked RL config with what `verlc build` reports beyond the check's own
/// rules: the plan's errors, the verdicts of the keys the user changed that `verdict_for`
/// accepts, and whether the rollout fits the model (`crate::compile` puts them in place of the
/// check's view and keeps the plan).
pub(crate) fn lower_for_build_with_findings(
    cfg: &VerlConfig,
    composed: &Composed,
    baseline: Option<&Node>,
    model: Option<&crate::rules::ModelDims>,
    release: verlc_spec::algo::AlgoRelease,
    verdict_for: &dyn Fn(&str) -> bool,
) -> Lowered {
    let mut lowered = lower_for_build_where(cfg, composed, baseline, release, verdict_for);
    drop_expert_degrees_no_effect(&mut lowered.diagnostics, model, &composed.root);
    if let Some(model) = model {
        lowered.diagnostics.extend(rollout_fit::rollout_fit(
            &lowered.plan.spec,
            model,
            &composed.root,
        ));
    }
    lowered
}

/// Lower and collect everything `verlc build` reports: the plan's errors plus the verdicts
/// of the keys the user changed (the config judged against `release`).
#[cfg(test)]
pub(crate) fn lower_for_build(
    cfg: &VerlConfig,
    composed: &Composed,
    release: verlc_spec::algo::AlgoRelease,
) -> Lowered {
    lower_for_build_where(cfg, composed, None, release, &|_| true)
}

/// [`lower_for_build`] keeping only the verdicts of the keys `verdict_for` accepts.
fn lower_for_build_where(
    cfg: &VerlConfig,
    composed: &Composed,
    baseline: Option<&Node>,
    release: verlc_spec::algo::AlgoRelease,
    verdict_for: &dyn Fn(&str) -> bool,
) -> Lowered {
    let mut lowered = lower(cfg, &composed.root, release);
    // What "not changed" means for the unused-key warnings.
    let defaults = baseline.unwrap_or_else(|| compose::builtin_tree(cfg.flavour()));
    let verdicts = verdict_diagnostics(cfg, &composed.root, &composed.sources, defaults);
    lowered.diagnostics.extend(
        verdicts
            .into_iter()
            .filter(|d| d.key_path.as_deref().is_some_and(verdict_for)),
    );
    lowered
}

/// Whether the dotted `key` is, contains or lies inside a key that decided the binding.
pub fn is_bound(plan: &BuildPlan, key: &str) -> bool {
    plan.bound_keys.iter().any(|b| keys_overlap(&b.key, key))
}

/// Whether dotted keys `a` and `b` are the same key or one lies inside the other.
pub fn keys_overlap(a: &str, b: &str) -> bool {
    let inside = |inner: &str, outer: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|r| r.starts_with('.'))
    };
    a == b || inside(a, b) || inside(b, a)
}

/// The dotted key a Hydra override is about (`+k=v`, `~k`, `group@package=option`).
pub fn override_key(text: &str) -> &str {
    text.trim_start_matches(['+', '~'])
        .split(['=', '@'])
        .next()
        .unwrap_or("")
}

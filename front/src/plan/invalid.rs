//! Combinations a generated binary cannot bind (`B01x` errors). Each is also what
//! `verlc check` reports, at the line that decided it.
//!
//! - B010 `RoleStrategyMismatch`: the critic or reference policy runs another strategy family
//!   than the actor. One binary binds one engine (`fsdp` and `fsdp2` are one family).
//! - B011 `RolePrecisionMismatch`: the critic or reference policy computes in another
//!   precision than the actor. One binary binds one precision.
//! - B012 `UnsupportedBinding`: the actor's strategy × precision, or the offload of a trained
//!   role (actor, critic) under it, is not in the runtime's support table (see
//!   [`super::binding`]; e.g. fp16 with FSDP parameter offload).
//! - B013 `OffloadKeyIgnored`: offload is switched on in the engine section of the *other*
//!   strategy (`fsdp_config.param_offload` or `fsdp_config.offload_policy` of a Megatron role,
//!   `megatron.*_offload` of an FSDP role). It would silently do nothing.
//! - (B014, the critic offloading differently from the actor, is retired: placement is each
//!   role's engine setting, read at run time.)
//! - B015 `EngineSectionMissing`: a role's strategy has no engine section to read.
//! - B016 `RewardModelNotClassifier` is reported by `verlc build` once the reward model's
//!   checkpoint is at hand ([`super::models::model_problems`]).
//! - B017 `DeviceUnsupported`: `trainer.device` other than `cpu` or `cuda` (libtorch from PyPI
//!   has no NPU backend).

use crate::codes;
use crate::config::{Device, VerlConfig};
use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};
use crate::source::Origin;

use super::BuildPlan;
use super::binding::{Part, validate_offload};
use crate::role::{Role, RoleKind};

fn origin(root: &Node, key: &str) -> Option<Origin> {
    root.get_path(&split_key(key))
        .and_then(|n| n.origin.clone())
}

pub(super) fn check(cfg: &VerlConfig, root: &Node, plan: &BuildPlan) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let actor = Role::actor(cfg);
    let mut others = Vec::new();
    if plan.roles.critic {
        others.push(Role::critic(cfg));
    }
    if plan.roles.reference {
        others.push(Role::reference(cfg));
    }

    for r in std::iter::once(&actor).chain(&others) {
        if foreign_engine(r, root).is_some() {
            continue; // reported once below
        }
        if r.engine().is_none() {
            out.push(
                Diagnostic::error(codes::BUILD_ENGINE_SECTION_MISSING, format!("the {} runs `{}` but has no `{}` section", r.name, strategy_name(r), r.engine_key()))
                    .with_key(r.engine_key())
                    .with_primary(origin(root, &r.strategy_key()), "strategy chosen here")
                    .with_help("compose the config from the matching verl base (ppo_trainer for FSDP, ppo_megatron_trainer for Megatron) or add the section"),
            );
        }
        ignored_offload(r, root, &mut out);
    }

    out.extend(super::veomni::refusals(root, plan));

    // verl 0.8+'s other engines (`model_engine=torchtitan`, `automodel`, …): their strategy from
    // verl's own files is not one verlc models (the check's copy holds a repaired `fsdp`); one
    // error for the roles that run it, instead of a missing FSDP section each. No key path: the
    // key is verl's own, which `verlc check` passes through and would drop findings about; the
    // message names it and the label points at it.
    let foreign: Vec<(&Role, &str)> = std::iter::once(&actor)
        .chain(&others)
        .filter_map(|r| foreign_engine(r, root).map(|e| (r, e)))
        .collect();
    if let Some((first, engine)) = foreign.first() {
        let (key, at) = match origin(root, "model_engine") {
            Some(o) => ("model_engine".to_owned(), Some(o)),
            None => (first.strategy_key(), origin(root, &first.strategy_key())),
        };
        let roles: Vec<&str> = foreign.iter().map(|(r, _)| r.name).collect();
        let roles = match roles.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => roles.join(""),
        };
        let mut d = Diagnostic::error(
            codes::BUILD_UNSUPPORTED_SETTING,
            format!("`{key}`: the {roles} run verl's `{engine}` engine, which verlc's trainer does not implement"),
        )
        .with_primary(at, format!("`{engine}` chosen here"))
        .with_help("verlc trains with FSDP (model_engine=dp: strategy fsdp or fsdp2), Megatron (model_engine=megatron) or VeOmni's settings on FSDP (model_engine=veomni)");
        if let Some(why) = foreign_engine_differs(engine) {
            d.notes.push(why.to_owned());
        }
        out.push(d);
    }

    let (actor_precision, actor_precision_key) = actor
        .precision()
        .unwrap_or((plan.binding.precision, actor.strategy_key()));
    for r in &others {
        if r.strategy_kind() != actor.strategy_kind() {
            out.push(
                Diagnostic::error(
                    codes::BUILD_ROLE_STRATEGY_MISMATCH,
                    format!("the {} runs `{}` but the actor runs `{}`; a verlc binary binds one strategy", r.name, strategy_name(r), strategy_name(&actor)),
                )
                .with_key(r.strategy_key())
                .with_primary(origin(root, &r.strategy_key()), format!("{} strategy set here", r.name))
                .with_secondary(origin(root, &actor.strategy_key()), "actor strategy set here")
                .with_help(format!("set `{}={}`", r.strategy_key(), strategy_name(&actor))),
            );
            continue;
        }
        if let Some((p, key)) = r.precision()
            && p != actor_precision
        {
            out.push(
                Diagnostic::error(
                    codes::BUILD_ROLE_PRECISION_MISMATCH,
                    format!("the {} computes in {} but the actor in {}; a verlc binary binds one precision", r.name, p.marker(), actor_precision.marker()),
                )
                .with_key(key.clone())
                .with_primary(origin(root, &key), format!("{} precision set here", r.name))
                .with_secondary(origin(root, &actor_precision_key), "actor precision set here")
                .with_help(precision_help(&key, &actor_precision_key, actor_precision)),
            );
        }
    }

    if let Err(rej) = plan.binding.validate() {
        let primary = match rej.part {
            Part::Strategy => actor.strategy_key(),
            Part::Precision | Part::Offload(_) => actor_precision_key.clone(),
        };
        out.push(
            Diagnostic::error(
                codes::BUILD_UNSUPPORTED_BINDING,
                format!("unsupported binding: {}", rej.message),
            )
            .with_key(primary.clone())
            .with_primary(origin(root, &primary), "set here")
            .with_note(format!("the binding would be `{}`", plan.binding))
            .with_help(rej.help),
        );
    }

    // Placement is each trained role's own (the reference policy only runs forward passes).
    let trained =
        std::iter::once(&actor).chain(others.iter().filter(|r| r.kind == RoleKind::Critic));
    for r in trained.filter(|r| r.strategy_kind() == plan.binding.strategy) {
        let (flags, flag_keys) = r.offload();
        let Err(rej) = validate_offload(plan.binding.strategy, plan.binding.precision, flags)
        else {
            continue;
        };
        let key_of = |t| {
            flag_keys
                .iter()
                .find(|(ft, _)| *ft == t)
                .map(|(_, k)| k.clone())
        };
        let precision_key = r
            .precision()
            .map_or_else(|| actor_precision_key.clone(), |(_, k)| k);
        let (primary, secondary): (String, Option<String>) = match rej.part {
            Part::Strategy => (r.strategy_key(), None),
            Part::Precision => (
                precision_key.clone(),
                flag_keys.first().map(|(_, k)| k.clone()),
            ),
            Part::Offload(t) => (
                key_of(t).unwrap_or_else(|| r.engine_key()),
                Some(precision_key.clone()),
            ),
        };
        let mut d = Diagnostic::error(
            codes::BUILD_UNSUPPORTED_BINDING,
            format!("unsupported offload for the {}: {}", r.name, rej.message),
        )
        .with_key(primary.clone())
        .with_primary(origin(root, &primary), "set here")
        .with_note(format!(
            "the {} would offload {} under `{}`",
            r.name,
            flags.list(),
            plan.binding
        ))
        .with_help(rej.help);
        if let Some(s) = secondary {
            d = d.with_secondary(origin(root, &s), "together with this");
        }
        out.push(d);
    }

    if !matches!(cfg.trainer.device, Device::Cpu | Device::Cuda) {
        out.push(
            Diagnostic::error(
                codes::BUILD_DEVICE_UNSUPPORTED,
                "verlc's generated trainer runs on `cpu` or `cuda`",
            )
            .with_key("trainer.device")
            .with_primary(origin(root, "trainer.device"), "device set here")
            .with_help("set `trainer.device=cuda` (or `cpu`)"),
        );
    }
    out
}

/// Why an engine verl ships does not lower onto verlc's FSDP engine (docs/parallelism.md),
/// where that is known.
fn foreign_engine_differs(engine: &str) -> Option<&'static str> {
    Some(match engine {
        "torchtitan" => {
            "verl's torchtitan engine trains torchtitan's own models and passes neither `optim.clip_grad` (it clips at torchtitan's max_norm) nor the run's step count (its decay follows torchtitan's own horizon, its warmup counts from step 1): FSDP with the same keys would train other numbers"
        }
        "automodel" => {
            "verl's NeMo Automodel engine starts its warmup at `init_lr_ratio` x lr (0.1 by default), builds its optimizer through NeMo, and may run TransformerEngine layers or FP8: FSDP with the same keys would train other numbers"
        }
        "fsdp_turbo" => {
            "verl's fsdp_turbo engine wraps the model with the FSDP-Turbo package (its own tensor, expert and context parallel plan from `turbo_config`, fused modules): verlc's FSDP engine would shard and compute differently"
        }
        "mindspeed" | "mindspeed_megatron" => {
            "MindSpeed is Megatron for Ascend NPUs (torch_npu), which libtorch from PyPI cannot drive"
        }
        _ => return None,
    })
}

/// The engine `r` runs when it is none verlc models or lowers (its strategy as composed;
/// VeOmni's, with its section, runs as the FSDP role it equals: [`crate::veomni`], with its own
/// refusals in [`super::veomni`]).
fn foreign_engine<'t>(r: &Role, root: &'t Node) -> Option<&'t str> {
    if crate::veomni::runs_veomni(root, r.prefix) {
        return None;
    }
    root.get_path(&split_key(&r.strategy_key()))
        .and_then(Node::as_str)
        .filter(|s| !matches!(*s, "fsdp" | "fsdp2" | "megatron"))
}

fn strategy_name(r: &Role) -> &'static str {
    match r.strategy {
        crate::config::Strategy::Fsdp => "fsdp",
        crate::config::Strategy::Fsdp2 => "fsdp2",
        crate::config::Strategy::Megatron => "megatron",
    }
}

/// Offload switched on in the engine section the role's strategy does not read.
fn ignored_offload(r: &Role, root: &Node, out: &mut Vec<Diagnostic>) {
    let (fsdp, fsdp_key, megatron) = (r.fsdp, r.fsdp_key, r.megatron);
    let megatron_key = format!("{}.megatron", r.prefix);
    let mut set = Vec::new();
    if r.strategy == crate::config::Strategy::Megatron {
        if let Some(f) = fsdp {
            for (on, name, instead) in [
                (f.param_offload, "param_offload", "param_offload"),
                (
                    f.optimizer_offload,
                    "optimizer_offload",
                    "optimizer_offload",
                ),
                (f.offload_policy, "offload_policy", "param_offload"),
            ] {
                if on {
                    set.push((
                        format!("{fsdp_key}.{name}"),
                        format!("{megatron_key}.{instead}"),
                    ));
                }
            }
        }
    } else if let Some(m) = megatron {
        for (on, name, instead) in [
            (m.param_offload, "param_offload", "param_offload"),
            (m.grad_offload, "grad_offload", "param_offload"),
            (
                m.optimizer_offload,
                "optimizer_offload",
                "optimizer_offload",
            ),
        ] {
            if on {
                set.push((
                    format!("{megatron_key}.{name}"),
                    format!("{fsdp_key}.{instead}"),
                ));
            }
        }
    }
    for (key, instead) in set {
        out.push(
            Diagnostic::error(
                codes::BUILD_OFFLOAD_KEY_IGNORED,
                format!(
                    "`{key}` has no effect: the {} runs `{}`, which reads `{}`",
                    r.name,
                    strategy_name(r),
                    r.engine_key()
                ),
            )
            .with_key(key.clone())
            .with_primary(origin(root, &key), "offload switched on here")
            .with_secondary(origin(root, &r.strategy_key()), "strategy chosen here")
            .with_help(format!("remove it and set `{instead}` instead")),
        );
    }
}

/// How to make a role compute like the actor. An FSDP engine without `mixed_precision` computes
/// in its `dtype`, which verl limits to half precisions: fp32 (or a precision that differs from
/// the `dtype`) goes in `mixed_precision.param_dtype`, a key verl's tree leaves out (`+` on the
/// command line).
fn precision_help(key: &str, actor_key: &str, actor: crate::plan::Dtype) -> String {
    match key.strip_suffix(".dtype") {
        Some(engine) if !key.ends_with("megatron.dtype") => {
            let value = actor.name();
            format!(
                "set `{engine}.mixed_precision.param_dtype: {value}` as `{actor_key}` is (on the command line `+{engine}.mixed_precision.param_dtype={value}`: verl's tree does not have the key)"
            )
        }
        _ => format!("make `{key}` match `{actor_key}`"),
    }
}

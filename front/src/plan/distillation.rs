//! Lowering of verl 0.9's `distillation` section (on-policy distillation): the teachers the
//! trainer loads (forward-only, on the reference's engine settings) and the actor's loss term.
//!
//! The section is read from the composed tree rather than typed: verl's own file fills the
//! teacher's `inference` settings from the rollout's by interpolation, which typed checking
//! would report as the user's. What verl itself raises at start-up (an unregistered loss mode,
//! `k1` without the policy gradient, a policy loss other than `vanilla`, a teacher without a
//! model, duplicate keys) is an error at its key here, as is what verlc does not implement
//! (routing by another field than `data_source`).
use serde_json::Value;
use verlc_spec::algo::KlKind;
use verlc_spec::trainer::{
    DistillationLossSpec, DistillationMode, DistillationSpec, ReferenceSpec, TeacherSpec,
};

use super::spec::{Lowering, Roles, engine_spec};
use crate::config::VerlConfig;
use crate::role::Role;

/// The estimators verl 0.9 registers for distillation (its `kl_penalty` names, no `full` and no
/// `+` forms), and the top-k forward KL.
const ESTIMATORS: &[&str] = &["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"];
const TOP_K: &str = "forward_kl_topk";

/// The teachers and the actor's loss term, when `distillation.enabled`.
pub(super) fn lower(
    cfg: &VerlConfig,
    roles: &Roles,
    reference: Option<&ReferenceSpec>,
    l: &mut Lowering,
) -> Option<(DistillationSpec, DistillationLossSpec)> {
    let section = l.root.get_path(&["distillation"])?.to_json();
    if section.get("enabled").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    if !known_keys(&section, l) {
        return None;
    }
    let loss = loss_spec(&section, l)?;
    let teachers = teachers(&section, l)?;
    // The teachers run forward-only like the reference, on its engine settings.
    let (engine, micro_batch, max_token_len) = match reference.filter(|r| !r.actor_without_adapters)
    {
        Some(r) => (r.engine, r.micro_batch, r.max_token_len),
        None => {
            let engine = engine_spec(&Role::reference(cfg), roles.world, l);
            let micro = cfg
                .actor_rollout_ref
                .reference
                .log_prob_micro_batch_size_per_gpu
                .and_then(|m| usize::try_from(m).ok())
                .filter(|m| *m > 0)
                .unwrap_or(1);
            (engine, micro, None)
        }
    };
    // The teacher pool is verl's own Ray resource; verlc's teachers share the trainer's ranks.
    for (key, default) in [("n_gpus_per_node", 8), ("nnodes", 0)] {
        if section
            .get(key)
            .and_then(Value::as_i64)
            .is_some_and(|v| v != default)
        {
            l.no_effect(
                &format!("distillation.{key}"),
                format!("`distillation.{key}` sizes verl's separate teacher pool; verlc's teachers run on the trainer's own ranks"),
            );
        }
    }
    Some((
        DistillationSpec {
            teachers,
            engine,
            micro_batch,
            max_token_len,
        },
        loss,
    ))
}

/// The fields of verl 0.9.1's `DistillationConfig`, `DistillationLossConfig` and
/// `DistillationTeacherModelConfig` (`verl/workers/config/distillation.py`): anything else
/// makes verl's conversion of the section to its dataclasses fail.
const SECTION_KEYS: &[&str] = &[
    "_target_",
    "enabled",
    "distillation_loss",
    "n_gpus_per_node",
    "nnodes",
    "teacher_models",
    "teacher_key",
];
const LOSS_KEYS: &[&str] = &[
    "_target_",
    "loss_mode",
    "topk",
    "use_task_rewards",
    "distillation_loss_coef",
    "loss_max_clamp",
    "log_prob_min_clamp",
    "use_policy_gradient",
    "policy_loss_mode",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "use_chunked_topk",
    "chunked_topk_chunk_size",
    "global_batch_info",
    "loss_settings",
];
const TEACHER_KEYS: &[&str] = &["_target_", "key", "model_path", "num_replicas", "inference"];

/// Whether every key of the section is one of verl's; each other is refused at its line.
fn known_keys(section: &Value, l: &mut Lowering) -> bool {
    let mut ok = true;
    let mut check = |at: &str, node: Option<&Value>, known: &[&str], l: &mut Lowering| {
        for key in node
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|m| m.keys())
        {
            if !known.contains(&key.as_str()) {
                let fields = known.iter().filter(|k| !k.starts_with('_')).copied();
                let help = match crate::diag::did_you_mean(key, fields.clone()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("use one of {}", fields.collect::<Vec<_>>().join(", ")),
                };
                l.unsupported(
                    &format!("{at}.{key}"),
                    format!(
                        "`{key}` is not a field of verl 0.9's `{at}` (verl's dataclass raises)"
                    ),
                    help,
                );
                ok = false;
            }
        }
    };
    check("distillation", Some(section), SECTION_KEYS, l);
    check(
        "distillation.distillation_loss",
        section.get("distillation_loss"),
        LOSS_KEYS,
        l,
    );
    for (name, entry) in section
        .get("teacher_models")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        check(
            &format!("distillation.teacher_models.{name}"),
            Some(entry),
            TEACHER_KEYS,
            l,
        );
    }
    ok
}

fn loss_spec(section: &Value, l: &mut Lowering) -> Option<DistillationLossSpec> {
    let key = |leaf: &str| format!("distillation.distillation_loss.{leaf}");
    let loss = section
        .get("distillation_loss")
        .cloned()
        .unwrap_or(Value::Null);
    let get = |leaf: &str| loss.get(leaf).filter(|v| !v.is_null());
    let number = |leaf: &str| get(leaf).and_then(Value::as_f64);
    let flag = |leaf: &str, default: bool| get(leaf).and_then(Value::as_bool).unwrap_or(default);
    let mode = get("loss_mode")
        .and_then(Value::as_str)
        .unwrap_or("k3")
        .to_owned();
    let use_policy_gradient = flag("use_policy_gradient", false);
    let use_task_rewards = flag("use_task_rewards", true);
    let mut ok = true;
    let estimator = if mode == TOP_K {
        None
    } else if ESTIMATORS.contains(&mode.as_str()) {
        KlKind::from_verl_name(&mode)
    } else {
        l.unsupported(
            &key("loss_mode"),
            format!("`{mode}` is not a distillation loss verl registers (verl raises at start-up)"),
            format!("use one of {}, {TOP_K}", ESTIMATORS.join(", ")),
        );
        return None;
    };
    let mode_spec = match estimator {
        Some(e) => DistillationMode::Estimator(e),
        None => DistillationMode::ForwardKlTopk {
            topk: topk(get("topk"), l)?,
            log_prob_min_clamp: number("log_prob_min_clamp"),
        },
    };
    if estimator == Some(KlKind::K1) && !use_policy_gradient {
        l.unsupported(
            &key("loss_mode"),
            format!("`{mode}` as a supervised loss has no useful gradient; verl raises unless `use_policy_gradient` is true"),
            "set distillation.distillation_loss.use_policy_gradient=true, or use k3",
        );
        ok = false;
    }
    if estimator.is_none() && flag("use_chunked_topk", false) {
        l.no_effect(
            &key("use_chunked_topk"),
            "verlc computes the student's log-softmax over the vocabulary whole (the values are those of the chunked form; its memory saving is not implemented)",
        );
    }
    let policy = get("policy_loss_mode")
        .and_then(Value::as_str)
        .unwrap_or("vanilla");
    if policy != "vanilla" {
        l.unsupported(
            &key("policy_loss_mode"),
            format!(
                "verl's distillation runs the `vanilla` policy loss only (it raises for `{policy}`)"
            ),
            "set it to vanilla",
        );
        ok = false;
    }
    if get("log_prob_min_clamp").is_some() && estimator.is_some() {
        l.no_effect(
            &key("log_prob_min_clamp"),
            format!("verl clamps log-probs for the top-k loss only; `{mode}` reads none"),
        );
    }
    if get("topk").and_then(Value::as_i64).is_some_and(|k| k != 32) && estimator.is_some() {
        l.no_effect(
            &key("topk"),
            format!("the teacher's top-k is read by `{TOP_K}` only; `{mode}` uses the sampled token's log-prob"),
        );
    }
    let clip = number("clip_ratio").unwrap_or(0.2);
    let spec = DistillationLossSpec {
        mode: mode_spec,
        use_task_rewards,
        coef: if use_task_rewards {
            number("distillation_loss_coef").unwrap_or(1.0)
        } else {
            1.0
        },
        loss_max_clamp: number("loss_max_clamp"),
        use_policy_gradient,
        clip_ratio_low: number("clip_ratio_low").unwrap_or(clip),
        clip_ratio_high: number("clip_ratio_high").unwrap_or(clip),
    };
    ok.then_some(spec)
}

/// `topk` of the top-k loss: verl raises without one (the teacher's `_validate_topk_logprobs`),
/// and `torch.topk` fails for a count below one.
fn topk(value: Option<&Value>, l: &mut Lowering) -> Option<i64> {
    let at = "distillation.distillation_loss.topk";
    match value.and_then(Value::as_i64) {
        Some(k) if k >= 1 => Some(k),
        Some(k) => {
            l.unsupported(
                at,
                format!("the top-k loss needs at least one token per position, got {k}"),
                "set topk to a positive count (verl's default is 32)",
            );
            None
        }
        None => {
            l.unsupported(
                at,
                "`forward_kl_topk` needs `topk` (verl raises: topk must be specified)",
                "set topk, e.g. 32",
            );
            None
        }
    }
}

/// verl's teacher resolution: one entry scores every row; with several, the default
/// `teacher_model` entry is dropped and each other needs a model and a distinct `key` (a
/// `data_source` value).
fn teachers(section: &Value, l: &mut Lowering) -> Option<Vec<TeacherSpec>> {
    let Some(entries) = section.get("teacher_models").and_then(Value::as_object) else {
        l.unsupported(
            "distillation.teacher_models",
            "distillation needs a teacher (`distillation.teacher_models`)",
            "set distillation.teacher_models.teacher_model.model_path",
        );
        return None;
    };
    let several = entries.len() > 1;
    let teacher_key = section
        .get("teacher_key")
        .and_then(Value::as_str)
        .unwrap_or("data_source");
    if several && teacher_key != "data_source" {
        l.unsupported(
            "distillation.teacher_key",
            format!("verlc routes rows to teachers by their `data_source`; `{teacher_key}` is not carried to the trainer"),
            "set distillation.teacher_key=data_source",
        );
        return None;
    }
    let mut out: Vec<TeacherSpec> = Vec::new();
    let mut ok = true;
    for (name, entry) in entries {
        if several && name == "teacher_model" {
            continue; // verl pops the default entry when others are given
        }
        let at = |leaf: &str| format!("distillation.teacher_models.{name}.{leaf}");
        let text = |leaf: &str| entry.get(leaf).and_then(Value::as_str).map(str::to_owned);
        let Some(model_path) = text("model_path") else {
            l.unsupported(
                &at("model_path"),
                format!("teacher `{name}` has no model (verl raises)"),
                "set its model_path to the teacher's directory or Hub id (it must share the actor's tokenizer)",
            );
            ok = false;
            continue;
        };
        let key = if several {
            let Some(key) = text("key") else {
                l.unsupported(
                    &at("key"),
                    format!("with several teachers each needs the `data_source` it scores; `{name}` has none (verl raises)"),
                    "set its key",
                );
                ok = false;
                continue;
            };
            if out.iter().any(|t| t.key.as_deref() == Some(key.as_str())) {
                l.unsupported(
                    &at("key"),
                    format!("two teachers score `{key}` (verl raises)"),
                    "give each teacher its own key",
                );
                ok = false;
                continue;
            }
            Some(key)
        } else {
            None
        };
        out.push(TeacherSpec { key, model_path });
    }
    (ok && !out.is_empty()).then_some(out)
}

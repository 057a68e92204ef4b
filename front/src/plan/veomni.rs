//! What of verl's VeOmni engine the FSDP role it runs as ([`crate::veomni`]) cannot express:
//! `B018` at the key (VeOmni's expert parallelism, its sparse attention, quantization-aware
//! training, optimizers other than AdamW, a linear schedule, a warmup start or decay horizon
//! other than VeOmni's defaults), and `B006` where verl's VeOmni engine ignores a key FSDP
//! would read.
//! Router replay is refused by its verdict (`router_replay.mode`, every engine).

use crate::codes;
use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};
use crate::veomni::runs_veomni;

use super::BuildPlan;

/// The findings of every VeOmni role that runs.
pub(super) fn refusals(root: &Node, plan: &BuildPlan) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let roles = [
        (
            "actor_rollout_ref.actor",
            true,
            Some("actor_rollout_ref.model"),
        ),
        ("actor_rollout_ref.ref", plan.roles.reference, None),
        ("critic", plan.roles.critic, Some("critic.model")),
    ];
    for (prefix, runs, trained_model) in roles {
        if !runs || !runs_veomni(root, prefix) {
            continue;
        }
        engine(root, &format!("{prefix}.veomni"), &mut out);
        if let Some(model) = trained_model {
            optim(root, &format!("{prefix}.optim"), &mut out);
            lora(root, model, &mut out);
        }
    }
    out
}

/// verl's VeOmni engine applies no LoRA adapters (it trains the full model, or fails on the
/// adapter paths), while verlc's FSDP engine would train adapters: refused.
fn lora(root: &Node, model: &str, out: &mut Vec<Diagnostic>) {
    let at = Keys { root, key: model };
    for leaf in ["lora_rank", "lora.rank"] {
        if let Some((k, n)) = at.get(leaf)
            && n.as_f64().is_some_and(|r| r > 0.0)
        {
            out.push(refuse(
                &k,
                n,
                "verl's VeOmni engine applies no LoRA adapters (its LoRA support is unimplemented); verlc's FSDP engine would train adapters instead of the model",
                "set the rank to 0 under model_engine=veomni, or train LoRA with model_engine=dp",
            ));
        }
    }
}

fn engine(root: &Node, key: &str, out: &mut Vec<Diagnostic>) {
    let at = Keys { root, key };
    if let Some((k, n)) = at.get("expert_parallel_size")
        && n.as_f64().is_some_and(|ep| ep > 1.0)
    {
        out.push(refuse(
            &k,
            n,
            "VeOmni's expert parallelism splits the experts over ranks; verlc's FSDP engine shards them like any other parameter (the same numbers with expert_parallel_size 1)",
            "set it to 1, or train with model_engine=megatron and its expert_model_parallel_size",
        ));
    }
    if let Some((k, n)) = at.get("qat_implementation")
        && n.as_str().is_some_and(|q| q != "none")
    {
        out.push(refuse(
            &k,
            n,
            "quantization-aware training fake-quantizes weights in the forward pass; verlc's models compute in full precision",
            "set it to none",
        ));
    }
    if let Some((k, n)) = at.get("attn_implementation")
        && n.as_str() == Some("native-sparse")
    {
        out.push(refuse(
            &k,
            n,
            "native sparse attention computes other numbers than the model's full attention, which verlc's models run",
            "use an exact attention implementation (eager, sdpa, flash_attention_2, ...)",
        ));
    }
}

fn optim(root: &Node, key: &str, out: &mut Vec<Diagnostic>) {
    let at = Keys { root, key };
    if let Some((k, n)) = at.get("optimizer") {
        let why = match n.as_str() {
            Some("adamw") => None,
            Some("anyprecision_adamw") => Some(
                "`anyprecision_adamw` keeps bf16 optimizer state with Kahan-compensated updates; verlc's engines step torch's AdamW",
            ),
            Some("muon") => Some(
                "Muon orthogonalises the updates of weight matrices; verlc's engines step torch's AdamW",
            ),
            _ => Some("VeOmni's engine accepts adamw, anyprecision_adamw and muon only"),
        };
        if let Some(why) = why {
            out.push(refuse(&k, n, why, "use adamw"));
        }
    }
    let schedule = at.get("lr_scheduler_type");
    if let Some((k, n)) = &schedule {
        let why = match n.as_str() {
            Some("constant" | "cosine") => None,
            Some("linear") => Some(
                "VeOmni's linear schedule (decay to a floor of 1e-7 x lr) has no FSDP schedule verlc implements",
            ),
            _ => Some("VeOmni's schedules are constant, linear and cosine"),
        };
        if let Some(why) = why {
            out.push(refuse(k, n, why, "use cosine (with lr_min) or constant"));
        }
    }
    if let (Some((k, n)), Some(lr)) = (at.get("lr_min"), at.get("lr").and_then(|(_, n)| n.as_f64()))
        && n.as_f64().is_some_and(|m| m > 0.0 && (lr <= 0.0 || m > lr))
    {
        out.push(refuse(
            &k,
            n,
            "an lr_min above lr (or lr 0) is no decay FSDP's cosine expresses: VeOmni ramps up to lr_min (or divides by lr)",
            "set lr_min at most lr",
        ));
    }
    if let Some((k, n)) = at.get("lr_start")
        && n.as_f64().is_some_and(|v| v != 0.0)
    {
        out.push(refuse(
            &k,
            n,
            "a warmup that starts above 0 is not one of verl's FSDP schedules, which verlc implements",
            "set lr_start to 0",
        ));
    }
    let cosine = schedule.as_ref().and_then(|(_, n)| n.as_str()) == Some("cosine");
    if let Some((k, n)) = at.get("lr_decay_ratio")
        && cosine
        && n.as_f64().is_some_and(|v| v != 1.0)
    {
        out.push(refuse(
            &k,
            n,
            "a cosine decay over other than the whole run is not one of verl's FSDP schedules, which verlc implements",
            "set lr_decay_ratio to 1.0",
        ));
    }
    if let Some((k, n)) = at.get("lr_warmup_steps")
        && n.as_f64().is_some_and(|v| v > 0.0)
    {
        out.push(ignored(
            &k,
            n,
            "is not read by verl's VeOmni engine: its warmup is lr_warmup_steps_ratio x the training steps (verlc's trainer does the same)",
        ));
    }
    if let Some((k, n)) = at.get("override_optimizer_config")
        && n.as_map().is_some_and(|m| !m.is_empty())
    {
        out.push(ignored(
            &k,
            n,
            "is not read by verl's VeOmni engine (nor by verlc's trainer)",
        ));
    }
}

/// The keys under one section of the composed tree.
struct Keys<'a> {
    root: &'a Node,
    key: &'a str,
}

impl<'a> Keys<'a> {
    fn get(&self, leaf: &str) -> Option<(String, &'a Node)> {
        let key = format!("{}.{leaf}", self.key);
        let node = self.root.get_path(&split_key(&key))?;
        Some((key, node))
    }
}

fn refuse(key: &str, n: &Node, why: &str, help: &str) -> Diagnostic {
    Diagnostic::error(codes::BUILD_UNSUPPORTED_SETTING, format!("`{key}`: {why}"))
        .with_key(key)
        .with_primary(n.origin.clone(), "set here")
        .with_help(help)
}

fn ignored(key: &str, n: &Node, why: &str) -> Diagnostic {
    Diagnostic::warning(codes::BUILD_NO_EFFECT, format!("`{key}` {why}"))
        .with_key(key)
        .with_primary(n.origin.clone(), "has no effect")
}

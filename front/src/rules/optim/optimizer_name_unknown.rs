//! ## What it checks
//! For FSDP roles (the actor, and the critic when it runs) whose `optim.optimizer_impl` is
//! `torch.optim` (the default), `optim.optimizer` must be a class of `torch.optim`: `AdamW`,
//! `Adam`, `SGD`, … (names are case-sensitive). Other modules (`bitsandbytes.optim`,
//! `torchao.optim`, …) are not checked, and neither are the roles of the engines verl 0.8+
//! selects with `model_engine` (VeOmni, MindSpeed, TorchTitan, …: their `strategy` in the
//! composed tree), whose optimizer names are their own (`adamw`, `adam`).
//!
//! ## Why
//! verl looks the class up by name with `getattr` when it builds the optimizer ("Optimizer '…'
//! not found in module 'torch.optim'"), after the model is loaded on every rank.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     optim:
//!       optimizer: adamw     # the class is AdamW
//! ```
//!
//! ## Fix
//! Use the exact class name, e.g. `AdamW`.

use crate::diag::{Code, Diagnostic, did_you_mean};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, is_fsdp};

const CODE: Code = Code("V031");

/// Optimizer classes exported by `torch.optim` (torch 2.x).
const TORCH_OPTIM: &[&str] = &[
    "Adafactor",
    "Adadelta",
    "Adagrad",
    "Adam",
    "Adamax",
    "AdamW",
    "ASGD",
    "LBFGS",
    "Muon",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
    "SparseAdam",
];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    // The strategy as composed (a newer tree's engines are not verlc's repaired default).
    let torch_optim = |prefix: &str| {
        ctx.node(&format!("{prefix}.strategy"))
            .and_then(|n| n.as_str())
            .is_none_or(|s| matches!(s, "fsdp" | "fsdp2"))
    };
    if is_fsdp(a.strategy) && torch_optim("actor_rollout_ref.actor") {
        push(ctx, out, "actor_rollout_ref.actor.optim", &a.optim);
    }
    if critic_runs(c) && is_fsdp(c.critic.strategy) && torch_optim("critic") {
        push(ctx, out, "critic.optim", &c.critic.optim);
    }
}

fn push(
    ctx: &RuleContext,
    out: &mut Vec<Diagnostic>,
    prefix: &str,
    optim: &crate::config::OptimConfig,
) {
    let module = optim.optimizer_impl.as_deref().unwrap_or("torch.optim");
    let name = optim.optimizer.as_str();
    if module != "torch.optim" || TORCH_OPTIM.contains(&name) {
        return;
    }
    let key = format!("{prefix}.optimizer");
    let suggestion = TORCH_OPTIM
        .iter()
        .find(|c| c.eq_ignore_ascii_case(name))
        .copied()
        .or_else(|| did_you_mean(name, TORCH_OPTIM.iter().copied()));
    let help = match suggestion {
        Some(s) => format!("did you mean `{s}`? (class names are case-sensitive)"),
        None => format!(
            "use a torch.optim class ({}), or set `{prefix}.optimizer_impl` to the module that defines `{name}`",
            TORCH_OPTIM.join(", ")
        ),
    };
    out.push(
        Diagnostic::error(
            CODE,
            format!("`torch.optim` has no optimizer class `{name}`"),
        )
        .with_key(key.clone())
        .with_primary(ctx.origin(&key), format!("`{name}` set here"))
        .with_help(help),
    );
}

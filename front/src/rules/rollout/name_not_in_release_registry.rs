//! ## What it checks
//! Names verl looks up in a registry of the judged release when the trainer starts:
//! `actor_rollout_ref.rollout.checkpoint_engine.backend` (its checkpoint-engine backends:
//! `naive`, `nccl`, `nixl`, `kimi_ckpt_engine`, `mooncake` from 0.7.1, `delta_sharded` from
//! 0.9.0; any name once `checkpoint_engine.custom_backend_module` imports a module that
//! registers more) and `actor_rollout_ref.rollout.multi_turn.format` (its tool-call parsers:
//! `hermes`, `gpt-oss` in 0.7.0; `qwen3_coder` from 0.7.1; `gemma4` from 0.8.0; `glm`, `seed`,
//! `minimax`, `kimi`, `deepseek_v4` from 0.9.0).
//!
//! ## Why
//! The config's text accepts any string there; verl's registry lookup raises at start-up
//! ("... is not registered") after Ray and the workers are up.
//!
//! ## Example
//! ```yaml
//! # on verl 0.9.1's tree
//! actor_rollout_ref:
//!   rollout:
//!     checkpoint_engine:
//!       backend: carrier_pigeon
//! ```
//!
//! ## Fix
//! Use a registered name (the diagnostic lists them, with the nearest), or register yours
//! through `custom_backend_module`.

use crate::diag::{Code, Diagnostic, did_you_mean};
use crate::rules::RuleContext;

const CODE: Code = Code("V062");

/// A registry: each name with the release that registered it.
type Registry = &'static [(&'static str, (u32, u32, u32))];

const CHECKPOINT_ENGINES: Registry = &[
    ("naive", (0, 7, 1)),
    ("nccl", (0, 7, 1)),
    ("nixl", (0, 7, 1)),
    ("kimi_ckpt_engine", (0, 7, 1)),
    ("mooncake", (0, 7, 1)),
    ("delta_sharded", (0, 9, 0)),
];

const TOOL_PARSERS: Registry = &[
    ("hermes", (0, 7, 0)),
    ("gpt-oss", (0, 7, 0)),
    ("qwen3_coder", (0, 7, 1)),
    ("gemma4", (0, 8, 0)),
    ("glm", (0, 9, 0)),
    ("seed", (0, 9, 0)),
    ("minimax", (0, 9, 0)),
    ("kimi", (0, 9, 0)),
    ("deepseek_v4", (0, 9, 0)),
];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let release = ctx.release_triple();
    let rollout = "actor_rollout_ref.rollout";
    let backend = format!("{rollout}.checkpoint_engine.backend");
    let custom = format!("{rollout}.checkpoint_engine.custom_backend_module");
    if ctx.node(&custom).is_none_or(|n| n.is_null()) {
        lookup(
            ctx,
            out,
            &backend,
            "checkpoint-engine backend",
            CHECKPOINT_ENGINES,
            release,
        );
    }
    let multi_turn = ctx
        .node(&format!("{rollout}.multi_turn.enable"))
        .and_then(|n| n.as_bool())
        == Some(true);
    if multi_turn {
        lookup(
            ctx,
            out,
            &format!("{rollout}.multi_turn.format"),
            "tool-call parser",
            TOOL_PARSERS,
            release,
        );
    }
}

fn lookup(
    ctx: &RuleContext,
    out: &mut Vec<Diagnostic>,
    key: &str,
    what: &str,
    registry: Registry,
    release: (u32, u32, u32),
) {
    let Some(name) = ctx.node(key).and_then(|n| n.as_str()) else {
        return;
    };
    let registered: Vec<&str> = registry
        .iter()
        .filter(|(_, since)| *since <= release)
        .map(|(n, _)| *n)
        .collect();
    if registered.contains(&name) {
        return;
    }
    let label = ctx.release_label();
    let later = registry.iter().find(|(n, _)| *n == name);
    let (message, help) = match later {
        Some((_, (a, b, c))) => (
            format!(
                "`{name}` is a {what} of verl {a}.{b}.{c} on; verl {label} has {}",
                registered.join(", ")
            ),
            format!("choose one verl {label} has, or judge the config against verl {a}.{b}.{c}+"),
        ),
        None => (
            format!(
                "`{name}` is not a registered {what} of verl {label} (registered: {})",
                registered.join(", ")
            ),
            match did_you_mean(name, registered.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("use one of {}", registered.join(", ")),
            },
        ),
    };
    out.push(
        Diagnostic::error(CODE, message)
            .with_key(key)
            .with_primary(ctx.origin(key), format!("`{name}` set here"))
            .with_help(help),
    );
}

//! ## What it checks
//! Keys of verl 0.7.0's legacy SFT config (`sft_trainer`, run by `fsdp_sft_trainer`) that the
//! legacy trainer never reads, set to something other than their default:
//! `data.micro_batch_size` (superseded by `micro_batch_size_per_gpu`), the `data.multiturn`
//! column names (the multi-turn dataset reads `data.messages_key`, `data.tools_key` and
//! `data.enable_thinking_key` instead), and the keys of the shared FSDP optimizer group that
//! only the engine trainers' schedulers read (`lr_warmup_steps`, `lr_scheduler_type`,
//! `min_lr_ratio`, `num_cycles`, `warmup_style`, `total_training_steps`).
//!
//! ## Why
//! Hydra accepts them (they are in the composed config), so nothing tells the user that the
//! run ignores them: a conversation column named under `data.multiturn.messages_key` is not
//! found (the dataset looks for `messages`), and a micro-batch size written under the old
//! key leaves the micro-batches at 4.
//!
//! ## Example
//! ```yaml
//! data:
//!   micro_batch_size: 8
//!   multiturn:
//!     enable: true
//!     messages_key: conversation
//! ```
//!
//! ## Fix
//! Use the key the trainer reads: `data.micro_batch_size_per_gpu`, `+data.messages_key=...`,
//! `optim.lr_scheduler` (cosine or wsd) and `optim.lr_warmup_steps_ratio`.

use crate::diag::{Code, Diagnostic};
use crate::load::node::Node;
use crate::sft::rules::SftContext;

/// (key, its default, the key the trainer reads instead).
const NOT_READ: &[(&str, Default, &str)] = &[
    (
        "data.micro_batch_size",
        Default::Null,
        "data.micro_batch_size_per_gpu",
    ),
    (
        "data.multiturn.messages_key",
        Default::Str("messages"),
        "+data.messages_key",
    ),
    (
        "data.multiturn.tools_key",
        Default::Str("tools"),
        "+data.tools_key",
    ),
    (
        "data.multiturn.enable_thinking_key",
        Default::Str("enable_thinking"),
        "+data.enable_thinking_key",
    ),
    (
        "optim.lr_warmup_steps",
        Default::Int(-1),
        "optim.lr_warmup_steps_ratio",
    ),
    (
        "optim.lr_scheduler_type",
        Default::Str("constant"),
        "optim.lr_scheduler",
    ),
    ("optim.min_lr_ratio", Default::Float(0.0), "nothing"),
    ("optim.num_cycles", Default::Float(0.5), "nothing"),
    ("optim.warmup_style", Default::Null, "optim.lr_scheduler"),
    (
        "optim.total_training_steps",
        Default::Int(-1),
        "trainer.total_training_steps",
    ),
];

#[derive(Clone, Copy)]
enum Default {
    Null,
    Str(&'static str),
    Int(i64),
    Float(f64),
}

impl Default {
    fn holds(self, n: &Node) -> bool {
        match self {
            Default::Null => n.is_null(),
            Default::Str(s) => n.as_str() == Some(s),
            Default::Int(i) => n.as_i64() == Some(i),
            Default::Float(f) => n.as_f64() == Some(f),
        }
    }
}

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    if !ctx.config.is_legacy() {
        return;
    }
    for &(key, default, instead) in NOT_READ {
        let path: Vec<&str> = key.split('.').collect();
        let Some(node) = ctx.root.get_path(&path) else {
            continue;
        };
        if default.holds(node) {
            continue;
        }
        let help = if instead == "nothing" {
            "the legacy trainer's schedulers use their built-in value; remove it".to_owned()
        } else {
            format!("the legacy trainer reads `{instead}`")
        };
        out.push(
            Diagnostic::warning(
                Code("F014"),
                format!("verl 0.7.0's legacy SFT trainer does not read `{key}`"),
            )
            .with_key(key)
            .with_primary(node.origin.clone(), "has no effect")
            .with_help(help),
        );
    }
}

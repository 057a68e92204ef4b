//! ## What it checks
//! An FSDP role whose `fsdp_config.fsdp_size` is between 1 and the number of GPUs but does
//! not divide it.
//!
//! ## Why
//! With `0 < fsdp_size < world size` verl builds a 2-D device mesh of shape
//! `(world / fsdp_size, fsdp_size)` (hybrid sharding). When `fsdp_size` does not divide the
//! GPU count that shape does not cover the world, and PyTorch refuses the mesh when the
//! workers start.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   n_gpus_per_node: 8
//! actor_rollout_ref:
//!   actor:
//!     fsdp_config:
//!       fsdp_size: 3
//! ```
//!
//! ## Fix
//! Use a divisor of the GPU count (shards of 2, 4 or 8 GPUs above), or `-1` to shard over
//! all of them.

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{divisors, n_gpus, push_unique};

const CODE: Code = Code("V046");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let world = n_gpus(c);
    if world <= 1 {
        return;
    }
    for role in Role::all(c) {
        let Some(size) = role
            .fsdp
            .filter(|_| role.runs && role.is_fsdp())
            .map(|f| f.fsdp_size)
        else {
            continue;
        };
        let prefix = role.fsdp_key;
        if size <= 0 || size >= world || world % size == 0 {
            continue;
        }
        let key = format!("{prefix}.fsdp_size");
        let fits: Vec<String> = divisors(world)
            .into_iter()
            .filter(|d| *d > 1 && *d < world)
            .map(|d| d.to_string())
            .collect();
        let help = if fits.is_empty() {
            "use -1 to shard over every GPU".to_owned()
        } else {
            format!(
                "use a divisor of {world} ({}), or -1 to shard over every GPU",
                fits.join(", ")
            )
        };
        push_unique(
            out,
            Diagnostic::error(
                CODE,
                format!("`{key}` is {size}, which does not divide the {world} GPUs: the hybrid-shard mesh cannot be built"),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("shards of {size} GPUs"))
            .with_secondary(ctx.origin("trainer.n_gpus_per_node"), "GPUs per node set here")
            .with_help(help),
        );
    }
}

//! ## What it checks
//! For an FSDP actor (and an FSDP critic when it runs), the GPU count must be a multiple of
//! the Ulysses sequence-parallel size the worker uses (the role-level
//! `ulysses_sequence_parallel_size` for the legacy workers, `fsdp_config.…` for the engine
//! workers).
//!
//! ## Why
//! verl lays the ranks out as a (data parallel, sequence parallel) mesh of `GPUs ÷ sp` by `sp`;
//! with a remainder some ranks are left out of the mesh and the run fails when the workers
//! start.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ulysses_sequence_parallel_size: 3   # 8 GPUs are not a multiple of 3
//! ```
//!
//! ## Fix
//! Use a sequence-parallel size that divides the GPU count (1, 2, 4 or 8 on 8 GPUs).

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{n_gpus, nearest_divisor, push_unique};

const CODE: Code = Code("V015");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let gpus = n_gpus(ctx.config);
    for (role, _) in Role::trained(ctx.config) {
        if !role.is_fsdp() || role.sp <= 1 || gpus % role.sp == 0 {
            continue;
        }
        let suggestion = nearest_divisor(gpus, role.sp).unwrap_or(1);
        push_unique(
            out,
            Diagnostic::error(
                CODE,
                format!(
                    "{gpus} GPUs are not a multiple of the sequence-parallel size {} of `{}`",
                    role.sp, role.prefix
                ),
            )
            .with_key(role.sp_key)
            .with_primary(
                ctx.origin(role.sp_key),
                format!("sequence parallel {}", role.sp),
            )
            .with_secondary(
                ctx.origin("trainer.n_gpus_per_node"),
                "GPUs per node set here",
            )
            .with_help(format!(
                "set `{}` to a divisor of {gpus}, e.g. {suggestion}",
                role.sp_key
            )),
        );
    }
}

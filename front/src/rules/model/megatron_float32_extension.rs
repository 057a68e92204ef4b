//! ## What it checks
//! `megatron.dtype: float32` on a Megatron role. A warning: verlc trains it, verl does not.
//!
//! ## Why
//! verl's Megatron engine accepts only `bfloat16` and `float16` and refuses anything else
//! when it starts. verlc accepts `float32` as an extension: fp32 training without loss
//! scaling, the fast choice on CPUs without native bf16. A config that uses it runs under
//! verlc's trainer only.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     megatron:
//!       dtype: float32
//! ```
//!
//! ## Fix
//! Nothing, for verlc runs. For verl, use `bfloat16` (or `float16` with loss scaling).

use crate::config::{EngineDtype, Strategy};
use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::push_unique;

const CODE: Code = Code("V050");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for role in Role::all(ctx.config) {
        let megatron = role
            .megatron
            .filter(|_| role.runs && role.strategy == Strategy::Megatron);
        if megatron.is_none_or(|m| m.dtype != EngineDtype::Float32) {
            continue;
        }
        let key = format!("{}.megatron.dtype", role.prefix);
        // The reference copies the actor's dtype by interpolation: one report per line.
        push_unique(
            out,
            Diagnostic::warning(
                CODE,
                format!("`{key}: float32` is a verlc extension: verlc trains in fp32, verl's Megatron engine refuses it"),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), "fp32 chosen here")
            .with_help("keep it for verlc runs; for verl use bfloat16 (or float16)"),
        );
    }
}

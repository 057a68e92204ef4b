//! ## What it checks
//! A LoRA rank above 512 with the vLLM rollout. The rank is `actor_rollout_ref.model.lora.rank`
//! when positive, else `actor_rollout_ref.model.lora_rank`; with `lora.merge: true` the
//! adapters are merged before reaching vLLM and the rule does not apply.
//!
//! ## Why
//! vLLM serves adapters only up to its largest supported rank (512; its `MaxLoRARanks` are 1,
//! 8, 16, 32, 64, 128, 256, 320 and 512, and verl rounds up to the next one). verl's
//! `validate_config` rejects larger ranks ("lora_rank must be less than or equal to …").
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   model:
//!     lora_rank: 1024
//!   rollout:
//!     name: vllm
//! ```
//!
//! ## Fix
//! Use a rank of at most 512, or merge the adapters (`model.lora.merge: true`).

use crate::config::RolloutName;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V025");
const VLLM_MAX_LORA_RANK: i64 = 512;

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let m = &c.actor_rollout_ref.model;
    if c.actor_rollout_ref.rollout.name != RolloutName::Vllm {
        return;
    }
    let lora = m.lora.as_ref();
    if lora.and_then(|l| l.merge).unwrap_or(false) {
        return;
    }
    let (rank, key) = match lora.and_then(|l| l.rank).filter(|r| *r > 0) {
        Some(r) => (r, "actor_rollout_ref.model.lora.rank"),
        None => (m.lora_rank, "actor_rollout_ref.model.lora_rank"),
    };
    if rank <= VLLM_MAX_LORA_RANK {
        return;
    }
    out.push(
        Diagnostic::error(
            CODE,
            format!("LoRA rank {rank} is above vLLM's largest supported rank {VLLM_MAX_LORA_RANK}"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), format!("rank {rank}"))
        .with_secondary(
            ctx.origin("actor_rollout_ref.rollout.name"),
            "vLLM chosen here",
        )
        .with_help(format!(
            "set `{key}` to at most {VLLM_MAX_LORA_RANK} (e.g. 256 or 512)"
        )),
    );
}

//! ## What it checks
//! Needs the model's `config.json`. For grouped-query attention models
//! (`num_key_value_heads` below `num_attention_heads`), the key/value heads must fit each
//! degree that splits heads:
//! - Megatron actor tensor parallel: `num_key_value_heads` must be a multiple of it
//!   (Megatron-core divides the query groups, `divide(num_query_groups, world_size)`; it never
//!   replicates them).
//! - Rollout tensor parallel (vLLM, SGLang) and Ulysses sequence parallel (verl's patch): when
//!   the degree is at most the number of key/value heads it must divide them; when larger, it
//!   must be a multiple of them (each head is then replicated on `degree ÷ kv heads` ranks, as
//!   vLLM's `QKVParallelLinear` does).
//!
//! ## Why
//! Otherwise the key/value projection cannot be split into equal shards and the engine fails
//! while loading the model.
//!
//! ## Example
//! ```yaml
//! # 32 attention heads, 8 key/value heads
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     megatron:
//!       tensor_model_parallel_size: 16   # 8 kv heads are not a multiple of 16
//! ```
//!
//! ## Fix
//! Use a degree that divides the key/value head count (Megatron), or one that divides it or is
//! a multiple of it (rollout, Ulysses).

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

use super::tensor_parallel_does_not_divide_heads::{head_splits, pick};
use crate::rules::facts::n_gpus;

const CODE: Code = Code("V202");
/// Head counts above this are not a real model; the rule skips them rather than search.
const MAX_HEADS: i64 = 1 << 20;

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(model) = ctx.model else { return };
    let heads = i64::try_from(model.num_attention_heads).unwrap_or(i64::MAX);
    let kv = i64::try_from(model.kv_heads()).unwrap_or(i64::MAX);
    // Without grouped-query attention the head rule (V201) says it all.
    if kv <= 0 || kv >= heads || heads > MAX_HEADS {
        return;
    }
    for (key, size, what, replicates) in head_splits(ctx) {
        // A degree that does not divide the query heads is V201's finding.
        if heads % size != 0 {
            continue;
        }
        let fits = if replicates && size > kv {
            size % kv == 0
        } else {
            kv % size == 0
        };
        if fits {
            continue;
        }
        let valid: Vec<i64> = (1..=heads)
            .filter(|d| {
                heads % d == 0
                    && if replicates && *d > kv {
                        d % kv == 0
                    } else {
                        kv % d == 0
                    }
            })
            .collect();
        let suggestion = pick(&valid, size, n_gpus(ctx.config));
        let rule = if replicates {
            format!("must divide the {kv} key/value heads or be a multiple of them")
        } else {
            format!("must divide the {kv} key/value heads (Megatron does not replicate them)")
        };
        let list: Vec<String> = valid.iter().map(i64::to_string).collect();
        out.push(
            Diagnostic::error(CODE, format!("{what} size {size} does not fit the model's {kv} key/value heads: it {rule}"))
                .with_key(key.clone())
                .with_primary(ctx.origin(&key), format!("{what} {size}"))
                .with_note(format!("the model's config.json has num_attention_heads = {heads}, num_key_value_heads = {kv}"))
                .with_help(format!("set `{key}` to one of {}, e.g. {suggestion}", list.join(", "))),
        );
    }
}

//! ## What it checks
//! Needs the model's `config.json`, of a mixture-of-experts model (`num_experts` > 0). Every
//! degree that splits the experts must divide `num_experts`: the Megatron actor's and
//! critic's `expert_model_parallel_size` and the rollout's `expert_parallel_size`; and
//! Megatron's `expert_tensor_parallel_size`, which splits each expert's MLP, must divide
//! `moe_intermediate_size`.
//!
//! ## Why
//! Each expert-parallel rank holds a whole number of experts: Megatron-core asserts
//! `num_moe_experts % expert_model_parallel_size == 0` when it builds the MoE layer, and vLLM
//! and SGLang refuse an expert-parallel size that does not divide the experts when they load
//! the model. Expert tensor parallelism splits each expert's intermediate size by columns.
//! All of these fail only after the cluster has started and the checkpoint is loading.
//!
//! ## Example
//! ```yaml
//! # Qwen3-30B-A3B: 128 experts
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     megatron:
//!       expert_model_parallel_size: 6   # 128 is not a multiple of 6
//! ```
//!
//! ## Fix
//! Use a degree that divides the expert count (a power of two for 128 experts).

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{divisors, megatron_roles};

const CODE: Code = Code("V206");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(model) = ctx.model else { return };
    let (Ok(experts), Ok(width)) = (
        i64::try_from(model.moe.num_experts),
        i64::try_from(model.moe.moe_intermediate_size),
    ) else {
        return;
    };
    if experts <= 0 {
        return;
    }
    let c = ctx.config;
    let megatron = megatron_roles(c);
    // (key, degree, what it splits, its size, the size's name)
    let mut splits: Vec<(String, i64, i64, &str)> = Vec::new();
    for (prefix, m) in megatron {
        splits.push((
            format!("{prefix}.expert_model_parallel_size"),
            m.expert_model_parallel_size,
            experts,
            "num_experts",
        ));
        if let Some(etp) = m.expert_tensor_parallel_size {
            splits.push((
                format!("{prefix}.expert_tensor_parallel_size"),
                etp,
                width,
                "moe_intermediate_size",
            ));
        }
    }
    splits.push((
        "actor_rollout_ref.rollout.expert_parallel_size".to_owned(),
        c.actor_rollout_ref.rollout.expert_parallel_size,
        experts,
        "num_experts",
    ));
    for (key, degree, size, name) in splits {
        if degree <= 1 || size <= 0 || size % degree == 0 {
            continue;
        }
        let fits: Vec<String> = divisors(size)
            .into_iter()
            .filter(|d| *d > 1)
            .take(8)
            .map(|d| d.to_string())
            .collect();
        out.push(
            Diagnostic::error(
                CODE,
                format!("`{key}` = {degree} does not divide the model's {name} ({size})"),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("{degree} ranks"))
            .with_note(format!("the model's config.json has {name} = {size}"))
            .with_help(format!(
                "use a degree that divides {size} ({}, ...), or 1",
                fits.join(", ")
            )),
        );
    }
}

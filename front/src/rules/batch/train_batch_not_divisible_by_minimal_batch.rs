//! ## What it checks
//! With fixed-size micro-batches (`actor_rollout_ref.actor.use_dynamic_bsz: false`), the
//! responses of one step, `data.train_batch_size × actor_rollout_ref.rollout.n`, must be a
//! multiple of the smallest batch the ranks can split: the GPU count for FSDP, or the
//! data-parallel size times `ppo_micro_batch_size_per_gpu` for Megatron.
//!
//! ## Why
//! verl asserts this in `validate_config` before it starts any worker ("real_train_batch_size
//! (…) must be divisible by minimal possible batch size (…)"): every data-parallel rank must get
//! the same number of responses.
//!
//! ## Example
//! ```yaml
//! data:
//!   train_batch_size: 100      # 100 prompts × n=1 = 100 responses
//! trainer:
//!   n_gpus_per_node: 8         # 100 is not a multiple of 8
//! ```
//!
//! ## Fix
//! Pick a train batch size whose response count is a multiple of the minimal batch (96 or
//! 104 above), or change the GPU count.

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{gcd, megatron_model_parallel, n_gpus, nearest_multiple};

const CODE: Code = Code("V001");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let actor = &c.actor_rollout_ref.actor;
    if actor.use_dynamic_bsz {
        return;
    }
    let gpus = n_gpus(c);
    let n = c.actor_rollout_ref.rollout.n;
    let tbs = c.data.train_batch_size;
    let real = tbs.saturating_mul(n);
    let (minimal, how) = if actor.strategy == Strategy::Megatron {
        let Some(m) = actor.megatron.as_ref() else {
            return;
        };
        let mp = megatron_model_parallel(m);
        // A model-parallel size that does not divide the GPU count is V014's finding.
        if mp <= 0 || gpus % mp != 0 {
            return;
        }
        let Some(micro) = actor.ppo_micro_batch_size_per_gpu else {
            return;
        };
        let dp = gpus / mp;
        (
            dp.saturating_mul(micro),
            format!("{dp} data-parallel ranks × ppo_micro_batch_size_per_gpu {micro}"),
        )
    } else {
        (gpus, format!("one response per GPU on {gpus} GPUs"))
    };
    if minimal <= 0 || real % minimal == 0 {
        return;
    }
    let step = minimal / gcd(minimal, n.max(1));
    let suggestion = nearest_multiple(tbs, step);
    let mut d = Diagnostic::error(
        CODE,
        format!(
            "{real} responses per step (train_batch_size {tbs} × rollout.n {n}) are not a multiple of the minimal batch {minimal} ({how})"
        ),
    )
    .with_key("data.train_batch_size")
    .with_primary(ctx.origin("data.train_batch_size"), format!("{tbs} prompts per step"));
    if n > 1 {
        d = d.with_secondary(
            ctx.origin("actor_rollout_ref.rollout.n"),
            format!("{n} responses per prompt"),
        );
    }
    d = d.with_secondary(
        ctx.origin("trainer.n_gpus_per_node"),
        "GPUs per node set here",
    );
    if c.trainer.nnodes > 1 {
        d = d.with_secondary(ctx.origin("trainer.nnodes"), "nodes set here");
    }
    if actor.strategy == Strategy::Megatron {
        d = d.with_secondary(
            ctx.origin("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
            "micro-batch per GPU set here",
        );
    }
    out.push(d.with_help(format!(
        "set data.train_batch_size to a multiple of {step}, e.g. {suggestion}, so the responses split evenly"
    )));
}

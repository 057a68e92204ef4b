//! ## What it checks
//! `data.gen_batch_size` set to a value other than 1 where verl 0.9's v1 trainer refills exact
//! numbers of prompts: an asynchronous mode (`trainer.v1.trainer_mode: colocate_async` or
//! `separate_async`), DAPO's `algorithm.filter_groups`, or
//! `trainer.v1.sampler.sync_refill_failed_groups`.
//!
//! ## Why
//! There the replay buffer replaces each group it evicts (failed, filtered, past the
//! off-policy threshold) by exactly one fresh prompt, so verl's trainer sets
//! `data.gen_batch_size` to 1 when it starts (logging "data.gen_batch_size=N is overridden to
//! 1"): the value written has no effect. A step still trains on `data.train_batch_size` prompts.
//!
//! ## Example
//! ```yaml
//! data:
//!   gen_batch_size: 96
//! trainer:
//!   v1:
//!     trainer_mode: colocate_async
//! ```
//!
//! ## Fix
//! Remove `data.gen_batch_size` (or set it to 1).

use crate::config::TrainerMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V064");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(mode) = ctx.v1_trainer_mode() else {
        return;
    };
    let key = "data.gen_batch_size";
    let Some(n) = ctx.config.data.gen_batch_size.filter(|&g| g != 1) else {
        return;
    };
    let filter = ctx
        .config
        .algorithm
        .filter_groups
        .as_ref()
        .is_some_and(|f| f.enable);
    let refill_failed = ctx
        .node("trainer.v1.sampler.sync_refill_failed_groups")
        .and_then(|n| n.as_bool())
        == Some(true);
    let why = if mode != TrainerMode::Sync {
        format!("`trainer_mode: {}`", crate::config::common::spelling(&mode))
    } else if filter {
        "`algorithm.filter_groups`".to_owned()
    } else if refill_failed {
        "`trainer.v1.sampler.sync_refill_failed_groups`".to_owned()
    } else {
        return;
    };
    out.push(
        Diagnostic::warning(
            CODE,
            format!(
                "verl {} overrides `{key}` ({n}) to 1 with {why}: its replay buffer refills evicted groups one prompt at a time",
                ctx.release_label()
            ),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "has no effect")
        .with_help("remove it (a step trains on data.train_batch_size prompts either way)"),
    );
}

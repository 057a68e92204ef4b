//! ## What it checks
//! An asynchronous v1 trainer mode (`trainer.v1.trainer_mode: colocate_async` or
//! `separate_async`, verl 0.9) while `data.gen_batch_size` (by default `data.train_batch_size`)
//! is above 1.
//!
//! ## Why
//! verl 0.9's asynchronous replay buffer replaces every group it evicts (a failed rollout, a
//! group DAPO's `filter_groups` finds without signal, a group past
//! `max_off_policy_threshold` under `drop`) by queueing exactly as many fresh prompts. The
//! trainer fetches them from the dataloader in whole `gen_batch_size` batches and raises
//! `ValueError: num_prompts (k) must be a positive multiple of gen_batch_size` when `k` is not a
//! multiple. Groups fail and go stale one at a time, so the first such eviction stops the run,
//! however long it has been training. verlc's own trainer refills exactly `k`.
//!
//! ## Example
//! ```yaml
//! data:
//!   train_batch_size: 64
//! trainer:
//!   v1:
//!     trainer_mode: colocate_async
//! ```
//!
//! ## Fix
//! Set `data.gen_batch_size: 1` (the dataloader then fetches one prompt at a time; the step's
//! batch is still `train_batch_size` prompts).

use crate::config::TrainerMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V064");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    if matches!(ctx.v1_trainer_mode(), None | Some(TrainerMode::Sync)) {
        return;
    }
    let d = &ctx.config.data;
    let chunk = d
        .gen_batch_size
        .filter(|&g| g > 0)
        .unwrap_or(d.train_batch_size);
    if chunk <= 1 {
        return;
    }
    let key = "trainer.v1.trainer_mode";
    let from = if d.gen_batch_size.is_some_and(|g| g > 0) {
        "data.gen_batch_size"
    } else {
        "data.train_batch_size, as data.gen_batch_size is unset"
    };
    out.push(
        Diagnostic::warning(
            CODE,
            format!(
                "verl {} refills the groups its asynchronous replay buffer evicts (failed, filtered, stale) in whole dataloader fetches of {chunk} prompts ({from}) and stops the run with ValueError at the first eviction that is not a multiple of {chunk}",
                ctx.release_label()
            ),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "asynchronous mode chosen here")
        .with_help("set `data.gen_batch_size: 1` (the step still trains on train_batch_size prompts)"),
    );
}

//! ## What it checks
//! That `data.train_batch_size` gives every data-parallel rank at least one sample, and says
//! when it is not a multiple of the data-parallel size. The data-parallel size is the world
//! (`trainer.nnodes × trainer.n_gpus_per_node`) over the ranks that share a batch (Ulysses
//! under FSDP, TP × PP × CP under Megatron).
//!
//! It runs when the config states the world (`trainer.nnodes`, `trainer.n_gpus_per_node`, which
//! verl's Ray SFT launcher reads); under torchrun, `--nproc_per_node` decides it instead.
//!
//! ## Why
//! verl's SFT trainer gives each rank `train_batch_size // dp` samples a step: with fewer
//! samples than ranks that is 0, and its data loader refuses a batch size of 0 at start-up;
//! otherwise the remainder is never trained (the global batch is `(train_batch_size // dp) × dp`).
//! verl 0.7.0's legacy trainer (`fsdp_sft_trainer`) asserts the multiple at start-up instead.
//!
//! ## Example
//! ```yaml
//! data:
//!   train_batch_size: 4
//! trainer:
//!   n_gpus_per_node: 8
//! ```
//!
//! ## Fix
//! Make `data.train_batch_size` a multiple of the data-parallel size.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let Some(dp) = c.data_parallel().filter(|dp| *dp > 0) else {
        return;
    };
    if c.train_batch_size <= 0 {
        return;
    }
    let key = "data.train_batch_size";
    if c.train_batch_size < dp {
        out.push(
            Diagnostic::error(
                Code("F001"),
                format!(
                    "data.train_batch_size ({}) is below the {dp} data-parallel ranks: each gets {} samples a step",
                    c.train_batch_size,
                    c.train_batch_size / dp
                ),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "the global batch")
            .with_help(format!("use at least {dp} (a multiple of it)")),
        );
    } else if c.train_batch_size % dp != 0 && c.is_legacy() {
        let used = c.train_batch_size / dp * dp;
        out.push(
            Diagnostic::error(
                Code("F001"),
                format!(
                    "data.train_batch_size ({}) is not a multiple of the {dp} data-parallel ranks",
                    c.train_batch_size
                ),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "the legacy trainer asserts it at start-up")
            .with_help(format!("use {used} or {}", used + dp)),
        );
    } else if c.train_batch_size % dp != 0 {
        let used = c.train_batch_size / dp * dp;
        out.push(
            Diagnostic::warning(
                Code("F001"),
                format!(
                    "data.train_batch_size ({}) is not a multiple of the {dp} data-parallel ranks: verl trains {used} samples a step",
                    c.train_batch_size
                ),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "the global batch")
            .with_help(format!("use {used} or {}", used + dp)),
        );
    }
}

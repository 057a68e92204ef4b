//! ## What it checks
//! Without dynamic batching (`data.use_dynamic_bsz: false`), that a rank's share of the batch
//! (`data.train_batch_size // dp`) is a multiple of `data.micro_batch_size_per_gpu`.
//!
//! It runs when the config states the world (`trainer.nnodes`, `trainer.n_gpus_per_node`, which
//! verl's Ray SFT launcher reads); under torchrun, `--nproc_per_node` decides it instead.
//!
//! ## Why
//! verl splits a rank's batch into micro-batches of `micro_batch_size_per_gpu` and, from 0.7.1
//! on, asserts that they come out whole. 0.7.0 instead cuts the batch into
//! `per-rank batch // micro_batch_size_per_gpu` pieces, each then larger than the micro-batch
//! size the run was sized for.
//!
//! ## Example
//! ```yaml
//! data:
//!   train_batch_size: 48
//!   micro_batch_size_per_gpu: 5
//!   use_dynamic_bsz: false
//! ```
//!
//! ## Fix
//! Pick a micro-batch size that divides the per-rank batch, or turn dynamic batching on.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let Some(dp) = c.data_parallel().filter(|dp| *dp > 0) else {
        return;
    };
    if c.use_dynamic_bsz || c.micro_batch_size_per_gpu <= 0 {
        return;
    }
    let per_rank = c.train_batch_size / dp;
    if per_rank == 0 || per_rank % c.micro_batch_size_per_gpu == 0 {
        return;
    }
    let key = "data.micro_batch_size_per_gpu";
    let message = format!(
        "a rank's batch ({per_rank} = {} // {dp}) does not split into micro-batches of {}",
        c.train_batch_size, c.micro_batch_size_per_gpu
    );
    let pieces = per_rank / c.micro_batch_size_per_gpu;
    let d = if ctx.release != "0.7.0" || c.is_legacy() {
        Diagnostic::error(Code("F002"), message)
            .with_help("verl asserts that the micro-batches come out whole")
    } else if pieces == 0 {
        Diagnostic::error(Code("F002"), message)
            .with_help("verl 0.7.0 cuts the batch into no micro-batch at all")
    } else {
        Diagnostic::warning(Code("F002"), message).with_help(format!(
            "verl 0.7.0 cuts it into {pieces} pieces of up to {} samples, more than the micro-batch size",
            (per_rank + pieces - 1) / pieces
        ))
    };
    out.push(
        d.with_key(key)
            .with_primary(ctx.origin(key), "the micro-batch size")
            .with_secondary(ctx.origin("data.train_batch_size"), "the global batch"),
    );
}

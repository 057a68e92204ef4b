//! ## What it checks
//! That the world (`trainer.nnodes × trainer.n_gpus_per_node`) is a multiple of the ranks that
//! share one batch: the Ulysses size under FSDP, tensor × pipeline × context parallel under
//! Megatron.
//!
//! It runs when the config states the world (`trainer.nnodes`, `trainer.n_gpus_per_node`, which
//! verl's Ray SFT launcher reads); under torchrun, `--nproc_per_node` decides it instead.
//!
//! ## Why
//! verl lays the ranks out as a (data, model-parallel) mesh; torch refuses a mesh that does
//! not fill the world, at start-up on every rank.
//!
//! ## Example
//! ```yaml
//! engine:
//!   ulysses_sequence_parallel_size: 4
//! trainer:
//!   n_gpus_per_node: 6
//! ```
//!
//! ## Fix
//! Choose a parallel size that divides the number of ranks.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let Some(mp) = c.engine.model_parallel() else {
        return;
    };
    let world = c.world();
    if !c.world_stated || mp <= 0 || world <= 0 || world % mp == 0 {
        return;
    }
    let key = if c.engine.is_megatron() {
        "engine.tensor_model_parallel_size"
    } else {
        "engine.ulysses_sequence_parallel_size"
    };
    out.push(
        Diagnostic::error(
            Code("F008"),
            format!("the {world} ranks do not divide into groups of {mp} that share a batch"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "the model-parallel size")
        .with_secondary(ctx.origin("trainer.n_gpus_per_node"), "ranks per node")
        .with_help(format!("use a size that divides {world}")),
    );
}

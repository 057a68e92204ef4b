//! ## What it checks
//! `trainer.default_hdfs_dir` set while `trainer.resume_mode` is not `disable` (the default is
//! `auto`).
//!
//! ## Why
//! verl's trainer cannot load checkpoints from HDFS: with an HDFS folder configured, its
//! checkpoint loader raises "load from hdfs is not implemented yet" before the first step,
//! even when there is nothing to resume.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   default_hdfs_dir: hdfs://cluster/ckpt/run1
//!   # resume_mode: auto (default)
//! ```
//!
//! ## Fix
//! Set `trainer.resume_mode=disable` while saving to HDFS, or remove `default_hdfs_dir` and
//! resume from the local copy.

use crate::config::ResumeMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V036");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let t = &ctx.config.trainer;
    if t.resume_mode == ResumeMode::Disable || t.default_hdfs_dir.is_none() {
        return;
    }
    let key = "trainer.default_hdfs_dir";
    out.push(
        Diagnostic::error(CODE, "verl cannot resume from HDFS: with `default_hdfs_dir` set, loading a checkpoint fails at start-up")
            .with_key(key)
            .with_primary(ctx.origin(key), "HDFS folder set here")
            .with_secondary(ctx.origin("trainer.resume_mode"), "resuming is on")
            .with_help("set `trainer.resume_mode=disable`, or remove `trainer.default_hdfs_dir`"),
    );
}

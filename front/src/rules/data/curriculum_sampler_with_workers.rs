//! ## What it checks
//! A custom (curriculum) sampler, `data.sampler.class_path`, with dataloader worker
//! processes (`data.dataloader_num_workers` above 0).
//!
//! ## Why
//! A curriculum sampler changes what it samples as training goes on; worker processes would
//! prefetch and cache batches drawn from an out-of-date sampler. verl asserts "If using
//! curriculum, num_workers must be 0" when it builds the dataloader.
//!
//! ## Example
//! ```yaml
//! data:
//!   dataloader_num_workers: 8
//!   sampler:
//!     class_path: my_sampler.py
//!     class_name: MyCurriculumSampler
//! ```
//!
//! ## Fix
//! Set `data.dataloader_num_workers: 0`.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V048");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let d = &ctx.config.data;
    let workers = d.dataloader_num_workers;
    if d.sampler.class_path.is_none() || workers <= 0 {
        return;
    }
    let key = "data.dataloader_num_workers";
    out.push(
        Diagnostic::error(
            CODE,
            format!("a custom (curriculum) sampler needs `{key}: 0`, but it is {workers}"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), format!("{workers} worker processes"))
        .with_secondary(
            ctx.origin("data.sampler.class_path"),
            "custom sampler set here",
        )
        .with_help(format!("set `{key}: 0`")),
    );
}

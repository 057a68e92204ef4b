//! ## What it checks
//! A Megatron critic that shuffles its mini-batches (`critic.shuffle: true`) needs
//! `critic.data_loader_seed`. In the Megatron trainer the critic's seed copies the actor's
//! `data_loader_seed`, so it is null only when set to null on purpose.
//!
//! ## Why
//! verl's Megatron actor and critic assert a seed when shuffling ("If shuffle dataloader, seed
//! must be manually set"), so that every data-parallel rank shuffles identically. The actor's
//! seed cannot be null in verlc's schema; the critic's can.
//!
//! ## Example
//! ```yaml
//! critic:
//!   strategy: megatron
//!   shuffle: true
//!   data_loader_seed: null
//! ```
//!
//! ## Fix
//! Give `critic.data_loader_seed` an integer (or turn shuffling off).

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::critic_runs;

const CODE: Code = Code("V013");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let cr = &c.critic;
    if !critic_runs(c)
        || cr.strategy != Strategy::Megatron
        || !cr.shuffle
        || cr.data_loader_seed.is_some()
    {
        return;
    }
    let key = "critic.data_loader_seed";
    out.push(
        Diagnostic::error(
            CODE,
            "the Megatron critic shuffles mini-batches but `critic.data_loader_seed` is null",
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "no seed")
        .with_secondary(ctx.origin("critic.shuffle"), "shuffling turned on here")
        .with_help(format!(
            "set `{key}` to an integer (e.g. {}) or `critic.shuffle: false`",
            c.actor_rollout_ref.actor.data_loader_seed
        )),
    );
}

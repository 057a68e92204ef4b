//! Derived quantities several rules need, computed the way verl computes them: the
//! micro-batch key pairs, and arithmetic for suggestions. Which roles run and each role's
//! parallel layout are the role view's ([`crate::role::Role`]), re-exported here for the rules.
//! Pure functions of the typed config; no diagnostics here.

use crate::config::{Strategy, VerlConfig};
use crate::diag::Diagnostic;

pub(crate) use crate::role::{
    critic_runs, is_fsdp, megatron_model_parallel, n_gpus, new_engine, reference_runs,
};

/// A pair of micro-batch keys verl treats as alternatives: the deprecated global size and
/// the per-GPU size.
pub(crate) struct MicroPair {
    /// Node the keys live in (`actor_rollout_ref.ref`, `critic`, …).
    pub prefix: &'static str,
    /// Name of the deprecated global key inside the node.
    pub global_name: &'static str,
    pub global: Option<i64>,
    pub per_gpu: Option<i64>,
    /// Whether verl requires exactly one of the two (its validation runs and dynamic
    /// batching is off for this role).
    pub exactly_one: bool,
    /// Whether a Megatron legacy worker requires at least one whatever dynamic batching says.
    pub at_least_one: bool,
    /// The key whose `use_dynamic_bsz` value decides, for the help text.
    pub dynamic_key: &'static str,
}

impl MicroPair {
    pub fn global_key(&self) -> String {
        format!("{}.{}", self.prefix, self.global_name)
    }

    pub fn per_gpu_key(&self) -> String {
        format!("{}.{}_per_gpu", self.prefix, self.global_name)
    }
}

/// Every micro-batch pair with the conditions under which verl checks it
/// (`validate_config`, the actor and critic dataclasses, the Megatron ref worker).
pub(crate) fn micro_pairs(c: &VerlConfig) -> Vec<MicroPair> {
    let a = &c.actor_rollout_ref.actor;
    let r = &c.actor_rollout_ref.rollout;
    let rf = &c.actor_rollout_ref.reference;
    let cr = &c.critic;
    let rm = &c.reward_model;
    let actor_fixed = !a.use_dynamic_bsz;
    let actor_dyn = "actor_rollout_ref.actor.use_dynamic_bsz";
    vec![
        MicroPair {
            prefix: "actor_rollout_ref.actor",
            global_name: "ppo_micro_batch_size",
            global: a.ppo_micro_batch_size,
            per_gpu: a.ppo_micro_batch_size_per_gpu,
            exactly_one: actor_fixed,
            at_least_one: false,
            dynamic_key: actor_dyn,
        },
        MicroPair {
            prefix: "actor_rollout_ref.rollout",
            global_name: "log_prob_micro_batch_size",
            global: r.log_prob_micro_batch_size,
            per_gpu: r.log_prob_micro_batch_size_per_gpu,
            exactly_one: actor_fixed,
            at_least_one: false,
            dynamic_key: actor_dyn,
        },
        MicroPair {
            prefix: "actor_rollout_ref.ref",
            global_name: "log_prob_micro_batch_size",
            global: rf.log_prob_micro_batch_size,
            per_gpu: rf.log_prob_micro_batch_size_per_gpu,
            exactly_one: reference_runs(c) && actor_fixed,
            at_least_one: reference_runs(c) && a.strategy == Strategy::Megatron && !new_engine(c),
            dynamic_key: actor_dyn,
        },
        MicroPair {
            prefix: "critic",
            global_name: "ppo_micro_batch_size",
            global: cr.ppo_micro_batch_size,
            per_gpu: cr.ppo_micro_batch_size_per_gpu,
            exactly_one: critic_runs(c) && !cr.use_dynamic_bsz,
            at_least_one: false,
            dynamic_key: "critic.use_dynamic_bsz",
        },
        MicroPair {
            prefix: "reward_model",
            global_name: "micro_batch_size",
            global: rm.micro_batch_size,
            per_gpu: rm.micro_batch_size_per_gpu,
            // The legacy reward model worker of a 0.7.0 layout (0.7.1+ serves it in the loop).
            exactly_one: rm.enable
                && c.reward.is_none()
                && !rm.use_dynamic_bsz
                && !rm.use_reward_loop,
            at_least_one: false,
            dynamic_key: "reward_model.use_dynamic_bsz",
        },
    ]
}

/// Push `d` unless a diagnostic with the same code already points at the same place (a
/// value mirrored into two roles is one mistake).
/// The trained roles that run on the Megatron strategy, with their engine section's key
/// prefix: the actor, and the critic when it runs.
pub(crate) fn megatron_roles(
    c: &VerlConfig,
) -> Vec<(&'static str, &crate::config::MegatronEngineConfig)> {
    let mut roles = Vec::new();
    let a = &c.actor_rollout_ref.actor;
    if a.strategy == crate::config::Strategy::Megatron
        && let Some(m) = &a.megatron
    {
        roles.push(("actor_rollout_ref.actor.megatron", m));
    }
    if critic_runs(c)
        && c.critic.strategy == crate::config::Strategy::Megatron
        && let Some(m) = &c.critic.megatron
    {
        roles.push(("critic.megatron", m));
    }
    roles
}

pub(crate) fn push_unique(out: &mut Vec<Diagnostic>, d: Diagnostic) {
    let same = |o: &Diagnostic| {
        o.code == d.code
            && o.primary.is_some()
            && o.primary.as_ref().map(|l| &l.origin) == d.primary.as_ref().map(|l| &l.origin)
    };
    if !out.iter().any(same) {
        out.push(d);
    }
}

/// Greatest common divisor (for "nearest valid value" suggestions).
pub(crate) fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(i64::MAX)
}

/// The multiple of `step` closest to `value` (ties go up), never below `step`.
pub(crate) fn nearest_multiple(value: i64, step: i64) -> i64 {
    if step <= 0 {
        return value;
    }
    let down = (value / step) * step;
    let up = down.saturating_add(step);
    if down < step {
        return step;
    }
    if value - down < up - value { down } else { up }
}

/// Largest number whose divisors are searched (a bound on the work for absurd inputs).
const DIVISOR_SEARCH_LIMIT: i64 = 1_000_000_000_000;

/// The divisors of `n` (ascending); empty for `n <= 0` or `n` above 10^12.
pub(crate) fn divisors(n: i64) -> Vec<i64> {
    if n <= 0 || n > DIVISOR_SEARCH_LIMIT {
        return Vec::new();
    }
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1;
    while i * i <= n {
        if n % i == 0 {
            small.push(i);
            if i != n / i {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// The divisor of `n` closest to `target` (ties go down).
pub(crate) fn nearest_divisor(n: i64, target: i64) -> Option<i64> {
    divisors(n)
        .into_iter()
        .min_by_key(|d| ((d - target).abs(), *d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_helpers() {
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(nearest_multiple(100, 16), 96);
        assert_eq!(nearest_multiple(105, 16), 112);
        assert_eq!(nearest_multiple(3, 16), 16);
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(nearest_divisor(12, 5), Some(4));
        assert_eq!(nearest_divisor(0, 5), None);
    }
}

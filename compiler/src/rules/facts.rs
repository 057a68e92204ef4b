//! Derived quantities several rules need, computed the way verl computes them: the cluster
//! size, which roles run, which worker implementation is used, and each role's parallel
//! layout. Pure functions of the typed config; no diagnostics here.

use crate::config::{
    FsdpEngineConfig, LegacyWorkerImpl, MegatronEngineConfig, Strategy, VerlConfig,
};
use crate::diag::Diagnostic;

/// Accelerators of the run: `trainer.n_gpus_per_node × trainer.nnodes`.
pub(crate) fn n_gpus(c: &VerlConfig) -> i64 {
    c.trainer.n_gpus_per_node.saturating_mul(c.trainer.nnodes)
}

/// Whether the critic runs: `critic.enable`, or (when null) only for the `gae` estimator.
pub(crate) fn critic_runs(c: &VerlConfig) -> bool {
    c.critic.enable.unwrap_or(matches!(
        c.algorithm.adv_estimator,
        crate::config::AdvEstimator::Gae
    ))
}

/// Whether the reference policy runs: for the KL loss or the in-reward KL penalty.
pub(crate) fn reference_runs(c: &VerlConfig) -> bool {
    c.algorithm.use_kl_in_reward || c.actor_rollout_ref.actor.use_kl_loss
}

/// Whether verl uses its engine-based workers (`trainer.use_legacy_worker_impl: disable`)
/// instead of the legacy per-backend workers (`auto`, `enable`).
pub(crate) fn new_engine(c: &VerlConfig) -> bool {
    c.trainer.use_legacy_worker_impl == LegacyWorkerImpl::Disable
}

pub(crate) fn is_fsdp(s: Strategy) -> bool {
    matches!(s, Strategy::Fsdp | Strategy::Fsdp2)
}

/// The actor's Ulysses sequence-parallel degree as the workers use it. The legacy FSDP worker
/// reads the role-level key `actor.ulysses_sequence_parallel_size`; the engine workers read
/// `fsdp_config.ulysses_sequence_parallel_size`, into which a role-level value above 1 is
/// copied.
pub(crate) fn actor_sp(c: &VerlConfig) -> i64 {
    let a = &c.actor_rollout_ref.actor;
    if !is_fsdp(a.strategy) {
        return 1;
    }
    let role = a.ulysses_sequence_parallel_size.unwrap_or(1);
    if !new_engine(c) {
        return role.max(1);
    }
    let engine = a
        .fsdp_config
        .as_ref()
        .map_or(1, |f| f.ulysses_sequence_parallel_size);
    if role > 1 { role } else { engine.max(1) }
}

/// The dotted key that sets [`actor_sp`] (for labels).
pub(crate) fn actor_sp_key(c: &VerlConfig) -> &'static str {
    let a = &c.actor_rollout_ref.actor;
    if !new_engine(c) || a.ulysses_sequence_parallel_size.unwrap_or(1) > 1 {
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    } else {
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
    }
}

/// The critic's Ulysses degree as its worker uses it (same split as [`actor_sp`]).
pub(crate) fn critic_sp(c: &VerlConfig) -> i64 {
    let cr = &c.critic;
    if !is_fsdp(cr.strategy) {
        return 1;
    }
    let role = cr.ulysses_sequence_parallel_size.unwrap_or(1);
    if !new_engine(c) {
        return role.max(1);
    }
    let engine = cr
        .model
        .fsdp_config
        .as_ref()
        .map_or(1, |f| f.ulysses_sequence_parallel_size);
    if role > 1 { role } else { engine.max(1) }
}

/// The dotted key that sets [`critic_sp`].
pub(crate) fn critic_sp_key(c: &VerlConfig) -> &'static str {
    if !new_engine(c) || c.critic.ulysses_sequence_parallel_size.unwrap_or(1) > 1 {
        "critic.ulysses_sequence_parallel_size"
    } else {
        "critic.model.fsdp_config.ulysses_sequence_parallel_size"
    }
}

/// Megatron model-parallel group size: tensor × pipeline × context parallel degrees.
pub(crate) fn megatron_model_parallel(m: &MegatronEngineConfig) -> i64 {
    m.tensor_model_parallel_size
        .saturating_mul(m.pipeline_model_parallel_size)
        .saturating_mul(m.context_parallel_size)
}

/// Data-parallel size of a role on `world` ranks: `world / sp` for FSDP, `world / (tp·pp·cp)`
/// for Megatron. `None` when the division is not exact (another rule reports that) or a
/// size is not positive.
pub(crate) fn data_parallel(
    world: i64,
    strategy: Strategy,
    sp: i64,
    megatron: Option<&MegatronEngineConfig>,
) -> Option<i64> {
    let group = if is_fsdp(strategy) {
        sp
    } else {
        megatron.map(megatron_model_parallel)?
    };
    (group > 0 && world > 0 && world % group == 0).then(|| world / group)
}

/// The actor's data-parallel size.
pub(crate) fn actor_dp(c: &VerlConfig) -> Option<i64> {
    let a = &c.actor_rollout_ref.actor;
    data_parallel(n_gpus(c), a.strategy, actor_sp(c), a.megatron.as_ref())
}

/// The critic's data-parallel size.
pub(crate) fn critic_dp(c: &VerlConfig) -> Option<i64> {
    data_parallel(
        n_gpus(c),
        c.critic.strategy,
        critic_sp(c),
        c.critic.megatron.as_ref(),
    )
}

/// A trainable role (actor or critic) as the batch rules see it.
pub(crate) struct TrainRole {
    /// Key prefix: `actor_rollout_ref.actor` or `critic`.
    pub prefix: &'static str,
    pub strategy: Strategy,
    pub mini: i64,
    /// Responses per prompt the role multiplies the mini-batch by.
    pub n: i64,
    /// The key `n` is read from.
    pub n_key: &'static str,
    pub sp: i64,
    pub sp_key: &'static str,
    pub micro_per_gpu: Option<i64>,
    pub micro_global: Option<i64>,
    pub dp: Option<i64>,
    /// Whether this role runs in verl's engine workers (else the legacy workers).
    pub engine: bool,
}

/// The actor, and the critic when it runs.
pub(crate) fn train_roles(c: &VerlConfig) -> Vec<TrainRole> {
    let a = &c.actor_rollout_ref.actor;
    let mut roles = vec![TrainRole {
        prefix: "actor_rollout_ref.actor",
        strategy: a.strategy,
        mini: a.ppo_mini_batch_size,
        n: c.actor_rollout_ref.rollout.n,
        n_key: "actor_rollout_ref.rollout.n",
        sp: actor_sp(c),
        sp_key: actor_sp_key(c),
        micro_per_gpu: a.ppo_micro_batch_size_per_gpu,
        micro_global: a.ppo_micro_batch_size,
        dp: actor_dp(c),
        engine: new_engine(c),
    }];
    if critic_runs(c) {
        let cr = &c.critic;
        roles.push(TrainRole {
            prefix: "critic",
            strategy: cr.strategy,
            mini: cr.ppo_mini_batch_size,
            n: cr.rollout_n,
            n_key: "critic.rollout_n",
            sp: critic_sp(c),
            sp_key: critic_sp_key(c),
            micro_per_gpu: cr.ppo_micro_batch_size_per_gpu,
            micro_global: cr.ppo_micro_batch_size,
            dp: critic_dp(c),
            // verl runs a Megatron critic in the legacy worker whatever the setting.
            engine: new_engine(c) && is_fsdp(cr.strategy),
        });
    }
    roles
}

/// A role that owns a model engine: the actor, the reference policy and the critic.
pub(crate) struct EngineRole<'a> {
    /// `actor_rollout_ref.actor`, `actor_rollout_ref.ref` or `critic`; the Megatron section
    /// is `<prefix>.megatron`.
    pub prefix: &'static str,
    /// The role's `fsdp_config` (the critic's lives under `critic.model`).
    pub fsdp_key: &'static str,
    /// Whether verl runs the role (the actor always; see [`reference_runs`], [`critic_runs`]).
    pub runs: bool,
    pub strategy: Strategy,
    pub fsdp: Option<&'a FsdpEngineConfig>,
    pub megatron: Option<&'a MegatronEngineConfig>,
}

/// The actor, the reference policy and the critic, with their engine sections.
pub(crate) fn engine_roles(c: &VerlConfig) -> [EngineRole<'_>; 3] {
    let a = &c.actor_rollout_ref.actor;
    let r = &c.actor_rollout_ref.reference;
    let cr = &c.critic;
    [
        EngineRole {
            prefix: "actor_rollout_ref.actor",
            fsdp_key: "actor_rollout_ref.actor.fsdp_config",
            runs: true,
            strategy: a.strategy,
            fsdp: a.fsdp_config.as_ref(),
            megatron: a.megatron.as_ref(),
        },
        EngineRole {
            prefix: "actor_rollout_ref.ref",
            fsdp_key: "actor_rollout_ref.ref.fsdp_config",
            runs: reference_runs(c),
            strategy: r.strategy,
            fsdp: r.fsdp_config.as_ref(),
            megatron: r.megatron.as_ref(),
        },
        EngineRole {
            prefix: "critic",
            fsdp_key: "critic.model.fsdp_config",
            runs: critic_runs(c),
            strategy: cr.strategy,
            fsdp: cr.model.fsdp_config.as_ref(),
            megatron: cr.megatron.as_ref(),
        },
    ]
}

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
            exactly_one: rm.enable && !rm.use_dynamic_bsz && !rm.use_reward_loop,
            at_least_one: false,
            dynamic_key: "reward_model.use_dynamic_bsz",
        },
    ]
}

/// Push `d` unless a diagnostic with the same code already points at the same place (a
/// value mirrored into two roles is one mistake).
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

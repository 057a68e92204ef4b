//! One role's view of the config: the actor, the reference policy and the critic, each with
//! its engine section, its parallel layout (sequence-, model- and data-parallel sizes), its
//! precision and where its state lives, and the dotted keys that set them.
//!
//! The rules, lowering ([`crate::plan`]) and `verlc explain` all read roles through this one
//! view, so a size or a placement is derived once, the way verl's workers derive it. After
//! lowering, the runtime reads the same facts from the trainer spec (`EngineSpec`), where the
//! values the binary cannot honour have already been reported.

use verlc_spec::Dtype;
use verlc_spec::binding::{OffloadFlags, OffloadTarget, StrategyKind};

use crate::config::{
    AdvEstimator, FsdpEngineConfig, LegacyWorkerImpl, MegatronEngineConfig, Strategy, VerlConfig,
};

/// Which role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoleKind {
    Actor,
    Reference,
    Critic,
}

/// The engine section of one role under its strategy.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Engine<'a> {
    Fsdp(&'a FsdpEngineConfig),
    Megatron(&'a MegatronEngineConfig),
}

/// A trained role's batch keys (the actor's and the critic's `ppo_*` sizes).
#[derive(Clone, Debug)]
pub(crate) struct MiniBatch {
    pub mini: i64,
    /// Responses per prompt the role multiplies the mini-batch by.
    pub n: i64,
    /// The key `n` is read from.
    pub n_key: &'static str,
    pub micro_per_gpu: Option<i64>,
    pub micro_global: Option<i64>,
    /// `use_dynamic_bsz` and its per-GPU token budget `ppo_max_token_len_per_gpu`.
    pub dynamic: bool,
    pub max_tokens: i64,
    pub epochs: i64,
}

impl MiniBatch {
    pub(crate) fn actor(c: &VerlConfig) -> Self {
        let a = &c.actor_rollout_ref.actor;
        MiniBatch {
            mini: a.ppo_mini_batch_size,
            n: c.actor_rollout_ref.rollout.n,
            n_key: "actor_rollout_ref.rollout.n",
            micro_per_gpu: a.ppo_micro_batch_size_per_gpu,
            micro_global: a.ppo_micro_batch_size,
            dynamic: a.use_dynamic_bsz,
            max_tokens: a.ppo_max_token_len_per_gpu,
            epochs: a.ppo_epochs,
        }
    }

    pub(crate) fn critic(c: &VerlConfig) -> Self {
        let cr = &c.critic;
        MiniBatch {
            mini: cr.ppo_mini_batch_size,
            n: cr.rollout_n,
            n_key: "critic.rollout_n",
            micro_per_gpu: cr.ppo_micro_batch_size_per_gpu,
            micro_global: cr.ppo_micro_batch_size,
            dynamic: cr.use_dynamic_bsz,
            max_tokens: cr.ppo_max_token_len_per_gpu,
            epochs: cr.ppo_epochs,
        }
    }
}

/// One role as verl's workers see it.
#[derive(Clone, Debug)]
pub(crate) struct Role<'a> {
    pub kind: RoleKind,
    /// `actor`, `reference policy`, `critic` (for messages).
    pub name: &'static str,
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
    /// The role model's `enable_gradient_checkpointing` and its dotted key (on, with no key,
    /// for the reference, which runs no backward).
    pub gradient_checkpointing: (bool, &'static str),
    /// The role model's `use_remove_padding` (packed micro-batches).
    pub remove_padding: bool,
    /// The Ulysses degree the role's worker uses (1 under Megatron) and the key that sets it.
    pub sp: i64,
    pub sp_key: &'static str,
    /// Whether the role runs in verl's engine workers (else the legacy per-backend workers).
    pub engine_worker: bool,
    /// Ranks of the run (`trainer.nnodes × n_gpus_per_node`).
    pub world: i64,
}

impl<'a> Role<'a> {
    pub(crate) fn actor(c: &'a VerlConfig) -> Self {
        let a = &c.actor_rollout_ref.actor;
        let (sp, sp_key) = actor_ulysses(c);
        Role {
            kind: RoleKind::Actor,
            name: "actor",
            prefix: "actor_rollout_ref.actor",
            fsdp_key: "actor_rollout_ref.actor.fsdp_config",
            runs: true,
            strategy: a.strategy,
            fsdp: a.fsdp_config.as_ref(),
            megatron: a.megatron.as_ref(),
            gradient_checkpointing: (
                c.actor_rollout_ref.model.enable_gradient_checkpointing,
                "actor_rollout_ref.model.enable_gradient_checkpointing",
            ),
            remove_padding: c.actor_rollout_ref.model.use_remove_padding,
            sp,
            sp_key,
            engine_worker: new_engine(c),
            world: n_gpus(c),
        }
    }

    pub(crate) fn reference(c: &'a VerlConfig) -> Self {
        let r = &c.actor_rollout_ref.reference;
        // It reads the actor's rows: the actor's packing and sequence split.
        let (sp, sp_key) = actor_ulysses(c);
        Role {
            kind: RoleKind::Reference,
            name: "reference policy",
            prefix: "actor_rollout_ref.ref",
            fsdp_key: "actor_rollout_ref.ref.fsdp_config",
            runs: reference_runs(c),
            strategy: r.strategy,
            fsdp: r.fsdp_config.as_ref(),
            megatron: r.megatron.as_ref(),
            // No backward: the model's checkpointing key is the actor's to report, not twice.
            gradient_checkpointing: (true, ""),
            remove_padding: c.actor_rollout_ref.model.use_remove_padding,
            sp,
            sp_key,
            engine_worker: new_engine(c),
            world: n_gpus(c),
        }
    }

    pub(crate) fn critic(c: &'a VerlConfig) -> Self {
        let cr = &c.critic;
        let (sp, sp_key) = critic_ulysses(c);
        // verl 0.8+ moved the critic's FSDP engine from `critic.model.fsdp_config` to
        // `critic.fsdp`.
        let (fsdp, fsdp_key) = match &cr.fsdp {
            Some(f) => (Some(f), "critic.fsdp"),
            None => (cr.model.fsdp_config.as_ref(), "critic.model.fsdp_config"),
        };
        Role {
            kind: RoleKind::Critic,
            name: "critic",
            prefix: "critic",
            fsdp_key,
            runs: critic_runs(c),
            strategy: cr.strategy,
            fsdp,
            megatron: cr.megatron.as_ref(),
            // verl's critic default (`critic/dp_critic.yaml`) when the flavour has no such key.
            gradient_checkpointing: (
                cr.model.enable_gradient_checkpointing.unwrap_or(true),
                "critic.model.enable_gradient_checkpointing",
            ),
            remove_padding: cr.model.use_remove_padding.unwrap_or(false),
            sp,
            sp_key,
            // verl runs a Megatron critic in the legacy worker whatever the setting.
            engine_worker: new_engine(c) && is_fsdp(cr.strategy),
            world: n_gpus(c),
        }
    }

    /// The actor, the reference policy and the critic, whether or not they run.
    pub(crate) fn all(c: &'a VerlConfig) -> [Self; 3] {
        [Self::actor(c), Self::reference(c), Self::critic(c)]
    }

    /// The trained roles that run (the actor, and the critic when it runs) with their batch
    /// keys.
    pub(crate) fn trained(c: &'a VerlConfig) -> Vec<(Self, MiniBatch)> {
        [
            (Self::actor(c), MiniBatch::actor(c)),
            (Self::critic(c), MiniBatch::critic(c)),
        ]
        .into_iter()
        .filter(|(r, _)| r.runs)
        .collect()
    }

    pub(crate) fn is_fsdp(&self) -> bool {
        is_fsdp(self.strategy)
    }

    pub(crate) fn strategy_kind(&self) -> StrategyKind {
        strategy_kind(self.strategy)
    }

    /// Dotted key of the role's `strategy`.
    pub(crate) fn strategy_key(&self) -> String {
        format!("{}.strategy", self.prefix)
    }

    /// The engine section for the role's strategy; `None` when it is absent.
    pub(crate) fn engine(&self) -> Option<Engine<'a>> {
        if self.is_fsdp() {
            self.fsdp.map(Engine::Fsdp)
        } else {
            self.megatron.map(Engine::Megatron)
        }
    }

    /// Dotted key of the engine section for the role's strategy.
    pub(crate) fn engine_key(&self) -> String {
        if self.is_fsdp() {
            self.fsdp_key.to_owned()
        } else {
            format!("{}.megatron", self.prefix)
        }
    }

    /// Ranks that hold one copy of the model between them: the Ulysses degree under FSDP,
    /// tensor × pipeline × context parallel under Megatron; `None` when the Megatron
    /// section is absent.
    pub(crate) fn model_parallel(&self) -> Option<i64> {
        if self.is_fsdp() {
            Some(self.sp)
        } else {
            self.megatron.map(megatron_model_parallel)
        }
    }

    /// Ranks one sequence is split over: the Ulysses degree under FSDP, context parallel
    /// under Megatron (1 when the section is absent).
    pub(crate) fn sequence_split(&self) -> i64 {
        if self.is_fsdp() {
            self.sp
        } else {
            self.megatron.map_or(1, |m| m.context_parallel_size)
        }
    }

    /// Data-parallel size: the world over [`Self::model_parallel`]. `None` when the division
    /// is not exact (a rule reports that) or a size is not positive.
    pub(crate) fn dp(&self) -> Option<i64> {
        let group = self.model_parallel()?;
        (group > 0 && self.world > 0 && self.world % group == 0).then(|| self.world / group)
    }

    /// The precision the role trains in and the key that decided it: FSDP's
    /// `mixed_precision.param_dtype` when set, else the engine's `dtype`.
    pub(crate) fn precision(&self) -> Option<(Dtype, String)> {
        let key = self.engine_key();
        match self.engine()? {
            Engine::Fsdp(f) => Some(
                match f.mixed_precision.as_ref().and_then(|m| m.param_dtype) {
                    Some(d) => (d.dtype(), format!("{key}.mixed_precision.param_dtype")),
                    None => (f.dtype.dtype(), format!("{key}.dtype")),
                },
            ),
            Engine::Megatron(m) => Some((m.dtype.dtype(), format!("{key}.dtype"))),
        }
    }

    /// Where the role's parameters, gradients and optimizer state live and, per target, the
    /// key that moved it to host memory. FSDP's `param_offload` moves parameters with their
    /// gradients; FSDP2's `offload_policy` (only under `fsdp2`) moves all three.
    pub(crate) fn offload(&self) -> (OffloadFlags, Vec<(OffloadTarget, String)>) {
        let k = |name: &str| format!("{}.{name}", self.engine_key());
        let mut flags = OffloadFlags::NONE;
        let mut keys = Vec::new();
        match self.engine() {
            Some(Engine::Fsdp(f)) => {
                let policy = f.offload_policy && self.strategy == Strategy::Fsdp2;
                let by = |own: bool, name: &str| k(if own { name } else { "offload_policy" });
                if f.param_offload || policy {
                    let key = by(f.param_offload, "param_offload");
                    flags = flags.with(OffloadTarget::Params).with(OffloadTarget::Grads);
                    keys.push((OffloadTarget::Params, key.clone()));
                    keys.push((OffloadTarget::Grads, key));
                }
                if f.optimizer_offload || policy {
                    flags = flags.with(OffloadTarget::Optimizer);
                    keys.push((
                        OffloadTarget::Optimizer,
                        by(f.optimizer_offload, "optimizer_offload"),
                    ));
                }
            }
            Some(Engine::Megatron(m)) => {
                for (on, target, name) in [
                    (m.param_offload, OffloadTarget::Params, "param_offload"),
                    (m.grad_offload, OffloadTarget::Grads, "grad_offload"),
                    (
                        m.optimizer_offload,
                        OffloadTarget::Optimizer,
                        "optimizer_offload",
                    ),
                ] {
                    if on {
                        flags = flags.with(target);
                        keys.push((target, k(name)));
                    }
                }
            }
            None => {}
        }
        (flags, keys)
    }

    /// The keys whose values decide the binding (strategy and precision) for this role.
    pub(crate) fn deciding_keys(&self) -> Vec<String> {
        let k = |name: &str| format!("{}.{name}", self.engine_key());
        let mut keys = vec![self.strategy_key()];
        match self.engine() {
            Some(Engine::Fsdp(_)) => {
                keys.extend(["mixed_precision.param_dtype", "dtype"].map(k));
            }
            Some(Engine::Megatron(_)) => keys.push(k("dtype")),
            None => {}
        }
        keys
    }
}

/// Accelerators of the run: `trainer.n_gpus_per_node × trainer.nnodes`.
pub(crate) fn n_gpus(c: &VerlConfig) -> i64 {
    c.trainer.n_gpus_per_node.saturating_mul(c.trainer.nnodes)
}

/// verl's `need_critic`: `critic.enable` when set, else whether the estimator is GAE.
pub(crate) fn critic_runs(c: &VerlConfig) -> bool {
    c.critic
        .enable
        .unwrap_or(c.algorithm.adv_estimator == AdvEstimator::Gae)
}

/// verl's `need_reference_policy`: a KL term in the loss or in the reward.
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

pub(crate) fn strategy_kind(s: Strategy) -> StrategyKind {
    if is_fsdp(s) {
        StrategyKind::Fsdp
    } else {
        StrategyKind::Megatron
    }
}

/// Megatron model-parallel group size: tensor × pipeline × context parallel degrees.
pub(crate) fn megatron_model_parallel(m: &MegatronEngineConfig) -> i64 {
    m.tensor_model_parallel_size
        .saturating_mul(m.pipeline_model_parallel_size)
        .saturating_mul(m.context_parallel_size)
}

/// A Ulysses degree as the workers use it, with the key that sets it. The legacy FSDP worker
/// reads the role-level key; the engine workers read `fsdp_config`'s, into which a role-level
/// value above 1 is copied. 1 under Megatron.
fn ulysses(
    c: &VerlConfig,
    strategy: Strategy,
    role_level: Option<i64>,
    engine_level: Option<i64>,
    (role_key, engine_key): (&'static str, &'static str),
) -> (i64, &'static str) {
    let role = role_level.unwrap_or(1);
    let key = if !new_engine(c) || role > 1 {
        role_key
    } else {
        engine_key
    };
    if !is_fsdp(strategy) {
        return (1, key);
    }
    if !new_engine(c) {
        return (role.max(1), key);
    }
    (
        if role > 1 {
            role
        } else {
            engine_level.unwrap_or(1).max(1)
        },
        key,
    )
}

fn actor_ulysses(c: &VerlConfig) -> (i64, &'static str) {
    let a = &c.actor_rollout_ref.actor;
    ulysses(
        c,
        a.strategy,
        a.ulysses_sequence_parallel_size,
        a.fsdp_config
            .as_ref()
            .map(|f| f.ulysses_sequence_parallel_size),
        (
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
        ),
    )
}

fn critic_ulysses(c: &VerlConfig) -> (i64, &'static str) {
    let cr = &c.critic;
    let (engine, engine_key) = match &cr.fsdp {
        Some(f) => (Some(f), "critic.fsdp.ulysses_sequence_parallel_size"),
        None => (
            cr.model.fsdp_config.as_ref(),
            "critic.model.fsdp_config.ulysses_sequence_parallel_size",
        ),
    };
    ulysses(
        c,
        cr.strategy,
        cr.ulysses_sequence_parallel_size,
        engine.map(|f| f.ulysses_sequence_parallel_size),
        ("critic.ulysses_sequence_parallel_size", engine_key),
    )
}

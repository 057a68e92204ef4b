//! Lowering of verl 0.9's v1 trainer modes (`trainer.v1.trainer_mode`) and of the replay
//! buffer's bound (`trainer.v1.sampler`).
//!
//! `sync` is the synchronous loop. `colocate_async` and `separate_async` lower to [`AsyncSpec`]:
//! the runtime's replay-buffer loop, with a rollout thread beside the trainer in every rank for
//! `colocate_async`; for `separate_async` verl's rollout pool on devices of its own is, with the
//! built-in rollout, a replica process per trainer rank (`rollout.nnodes × n_gpus_per_node` of
//! them), with vLLM its server.
//! What that loop does not run yet is an error at the key that asks for it (see
//! [`check_support`]).
//!
//! The sampler section is read from the composed tree: verl 0.9.1 allows a null threshold (no
//! version control), 0.9.0 asserts a positive integer; both assert `drop` or `wait`.
use serde_json::Value;
use verlc_spec::TrainerSpec;
use verlc_spec::algo::AdvEstimator;
use verlc_spec::optim::{LrDecayStyle, VerlSchedule};
use verlc_spec::trainer::{AsyncMode, AsyncSpec, EngineSpec, OffPolicyStrategy, ScheduleSpec};

use super::spec::Lowering;
use crate::config::{RolloutName, TrainerMode, VerlConfig};

const THRESHOLD: &str = "trainer.v1.sampler.max_off_policy_threshold";
const STRATEGY: &str = "trainer.v1.sampler.max_off_policy_strategy";

/// The asynchronous loop the mode asks for (`None`: the synchronous loop).
pub(super) fn lower(cfg: &VerlConfig, l: &mut Lowering) -> Option<AsyncSpec> {
    let v1 = cfg.trainer.v1.as_ref()?;
    // verl's defaults where the mode's section is absent: one warm-up batch, and 4 updates per
    // weight sync for separate_async.
    let (mode, warmup, sync_step) = match v1.trainer_mode {
        TrainerMode::Sync => return None,
        TrainerMode::ColocateAsync => (
            AsyncMode::ColocateAsync,
            v1.colocate_async
                .as_ref()
                .map_or(1.0, |c| c.num_warmup_batches),
            1,
        ),
        TrainerMode::SeparateAsync => {
            let s = v1.separate_async.as_ref();
            (
                AsyncMode::SeparateAsync,
                s.map_or(1.0, |s| s.num_warmup_batches),
                s.map_or(4, |s| s.parameter_sync_step),
            )
        }
    };
    let sampler = l
        .root
        .get_path(&["trainer", "v1", "sampler"])
        .map(|n| n.to_json())
        .unwrap_or(Value::Null);
    let threshold = match sampler.get("max_off_policy_threshold") {
        None => Some(8),
        Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(k) if k > 0 => Some(k as u64),
            _ => {
                l.unsupported(
                    THRESHOLD,
                    format!("`{THRESHOLD}` must be a positive integer (or null for no version control), got {v}"),
                    "1 trains only on groups queued by the current policy",
                );
                Some(1)
            }
        },
    };
    let strategy = match sampler
        .get("max_off_policy_strategy")
        .and_then(Value::as_str)
    {
        None | Some("drop") => OffPolicyStrategy::Drop,
        Some("wait") => OffPolicyStrategy::Wait,
        Some(other) => {
            l.unsupported(
                STRATEGY,
                format!("`{STRATEGY}` must be drop or wait, got `{other}`"),
                "drop evicts groups past the threshold; wait lets them finish",
            );
            OffPolicyStrategy::Drop
        }
    };
    let batch = usize::try_from(cfg.data.train_batch_size)
        .unwrap_or(1)
        .max(1);
    let rollout = &cfg.actor_rollout_ref.rollout;
    let rollout_processes = if mode == AsyncMode::SeparateAsync && rollout.name != RolloutName::Vllm
    {
        // verl's default pool width is the trainer's (`${trainer.n_gpus_per_node}`).
        let per_node = rollout
            .n_gpus_per_node
            .unwrap_or(cfg.trainer.n_gpus_per_node);
        usize::try_from(rollout.nnodes.unwrap_or(0).max(0) * per_node.max(0)).unwrap_or(0)
    } else {
        0
    };
    Some(AsyncSpec {
        mode,
        parameter_sync_step: usize::try_from(sync_step).unwrap_or(1).max(1),
        // verl rounds the warm-up window down to whole dataloader fetches, and fetches one
        // prompt at a time in the asynchronous modes (it sets data.gen_batch_size to 1).
        warmup_prompts: (warmup.max(0.0) * batch as f64).floor() as usize,
        max_off_policy_threshold: threshold,
        strategy,
        rollout_processes,
    })
}

/// Whether the actor updates as verl's `separate_async` does with several mini-batches per
/// weight sync: each mini-batch through its `ppo_epochs` before the next.
pub(super) fn updates_one_mini_batch_at_a_time(cfg: &VerlConfig) -> bool {
    cfg.trainer.v1.as_ref().is_some_and(|v1| {
        matches!(v1.trainer_mode, TrainerMode::SeparateAsync)
            && v1
                .separate_async
                .as_ref()
                .map_or(4, |s| s.parameter_sync_step)
                > 1
    })
}

/// What the asynchronous loop does not run yet, at the key that asks for it.
pub(super) fn check_support(spec: &TrainerSpec, l: &mut Lowering) {
    let Some(a) = spec.run.asynchronous else {
        return;
    };
    if a.parameter_sync_step > 1 {
        separate_updates(spec, l);
    }
    let mode = match a.mode {
        AsyncMode::ColocateAsync => "colocate_async",
        AsyncMode::SeparateAsync => "separate_async",
    };
    let refuse = |l: &mut Lowering, key: &str, what: &str, help: &str| {
        l.unsupported(
            key,
            format!("{what} is not implemented with `trainer_mode: {mode}`"),
            help,
        );
    };
    if let EngineSpec::Megatron(m) = &spec.actor.engine {
        // The built-in rollout decodes the whole model beside each rank (a sharded rollout
        // would decode with collectives on the groups the trainer thread is using meanwhile);
        // a vLLM server is sized by its own settings.
        if spec.rollout.vllm.is_none()
            && spec.rollout.tensor_parallel.unwrap_or(m.tensor_parallel) > 1
        {
            l.no_effect(
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                "the asynchronous built-in rollout decodes the whole model beside each rank: the rollout's tensor-parallel size applies to validation only",
            );
        }
    }
    if a.mode == AsyncMode::SeparateAsync {
        rollout_pool(spec, a.rollout_processes, l);
    }
    if spec.algorithm.estimator == AdvEstimator::Remax {
        refuse(
            l,
            "algorithm.adv_estimator",
            "ReMax's greedy baseline rollout",
            "use trainer_mode: sync with remax",
        );
    }
}

/// `separate_async`'s rollout pool: with the built-in rollout, replica processes shared out
/// among the trainer ranks (each at least one); with vLLM its server is the pool, whatever the
/// pool's size says.
fn rollout_pool(spec: &TrainerSpec, processes: usize, l: &mut Lowering) {
    const GPUS: &str = "actor_rollout_ref.rollout.n_gpus_per_node";
    if spec.rollout.vllm.is_some() {
        l.no_effect(
            GPUS,
            "with the vLLM rollout, separate_async's rollout pool is the vLLM server's process (sized by its own tensor and data parallel settings); rollout.nnodes × n_gpus_per_node has no effect",
        );
        return;
    }
    let ranks = spec.world.nnodes * spec.world.n_gpus_per_node;
    // The pool's size is verl's rule (V065) where it is 0; here only its fit to the trainer.
    if processes > 0 && processes < ranks {
        l.unsupported(
            GPUS,
            format!(
                "a built-in rollout pool of {processes} processes (rollout.nnodes × n_gpus_per_node) for {ranks} trainer ranks is not implemented: every trainer rank drives replicas of its own, one at least"
            ),
            format!("give the pool {ranks} processes or more (actor_rollout_ref.rollout.nnodes × n_gpus_per_node)"),
        );
    }
}

/// `separate_async` with `parameter_sync_step` P > 1: verl runs each of the P mini-batches of a
/// step through the whole PPO pipeline in turn (old log-probs against the step's first weights,
/// values, advantages, `ppo_epochs` updates, one lr-scheduler step each). verlc's step computes
/// the old log-probs, values and advantages once and runs the P mini-batch updates over the
/// batch: the same numbers where nothing between the mini-batches changes them (one epoch, no
/// critic, a constant learning rate; the actor runs each mini-batch's `ppo_epochs` before the
/// next, as verl's one-mini-batch updates do), and refused at the key where something would.
fn separate_updates(spec: &TrainerSpec, l: &mut Lowering) {
    let why = "verl's separate_async runs each of the parameter_sync_step mini-batches through the whole PPO step in turn";
    if spec.critic.is_some() {
        l.unsupported(
            "algorithm.adv_estimator",
            format!("a critic with separate_async is not implemented: {why}, updating the critic between them; verlc computes the values once per step"),
            "use a critic-free estimator (grpo, rloo, ...), or parameter_sync_step=1",
        );
    }
    let constant = match spec.actor.optim.schedule {
        ScheduleSpec::Verl {
            schedule,
            lr_warmup_steps,
            lr_warmup_steps_ratio,
            ..
        } => {
            schedule == VerlSchedule::Constant
                && lr_warmup_steps <= 0
                && lr_warmup_steps_ratio == 0.0
        }
        // Megatron's scheduler (a Megatron actor's): constant decay without warm-up.
        ScheduleSpec::Megatron {
            lr_warmup_steps,
            lr_warmup_steps_ratio,
            lr_decay_style,
            ..
        } => {
            lr_decay_style == LrDecayStyle::Constant
                && lr_warmup_steps.is_none_or(|w| w <= 0)
                && lr_warmup_steps_ratio == 0.0
        }
    };
    if !constant {
        l.unsupported(
            "actor_rollout_ref.actor.optim",
            format!("a learning-rate warm-up or decay with separate_async is not implemented: {why}, stepping the schedule after each; verlc steps it once per step"),
            "use a constant learning rate without warm-up, or parameter_sync_step=1",
        );
    }
}

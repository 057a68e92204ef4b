//! Lowering of verl 0.9's v1 trainer modes (`trainer.v1.trainer_mode`) and of the replay
//! buffer's bound (`trainer.v1.sampler`).
//!
//! `sync` is the synchronous loop. `colocate_async` lowers to [`AsyncSpec`]: the runtime's
//! replay-buffer loop with a rollout thread beside the trainer in every rank. What that loop does not
//! run yet is an error at the key that asks for it (see [`check_support`]); `separate_async` (a
//! rollout pool apart from the trainer ranks) is refused at the mode.
//!
//! The sampler section is read from the composed tree: verl 0.9.1 allows a null threshold (no
//! version control), 0.9.0 asserts a positive integer; both assert `drop` or `wait`.
use serde_json::Value;
use verlc_spec::TrainerSpec;
use verlc_spec::algo::AdvEstimator;
use verlc_spec::trainer::{AsyncSpec, OffPolicyStrategy, StrategyName};

use super::spec::Lowering;
use crate::config::{TrainerMode, VerlConfig};

const MODE: &str = "trainer.v1.trainer_mode";
const THRESHOLD: &str = "trainer.v1.sampler.max_off_policy_threshold";
const STRATEGY: &str = "trainer.v1.sampler.max_off_policy_strategy";

/// The asynchronous loop the mode asks for (`None`: the synchronous loop).
pub(super) fn lower(cfg: &VerlConfig, l: &mut Lowering) -> Option<AsyncSpec> {
    let v1 = cfg.trainer.v1.as_ref()?;
    match v1.trainer_mode {
        TrainerMode::Sync => None,
        TrainerMode::SeparateAsync => {
            l.unsupported(
                MODE,
                "`trainer_mode: separate_async` (a rollout pool on its own devices) is not implemented: verlc runs the asynchronous trainer with the rollout beside the trainer on the same ranks",
                "use colocate_async, or sync",
            );
            None
        }
        TrainerMode::ColocateAsync => {
            let warmup = v1
                .colocate_async
                .as_ref()
                .map_or(1.0, |c| c.num_warmup_batches);
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
            let chunk = cfg
                .data
                .gen_batch_size
                .and_then(|g| usize::try_from(g).ok())
                .filter(|&g| g > 0)
                .unwrap_or(batch);
            // verl 0.9.1 rounds the warm-up window down to whole dataloader fetches.
            let chunks = (warmup.max(0.0) * batch as f64 / chunk as f64).floor() as usize;
            Some(AsyncSpec {
                warmup_prompts: chunks * chunk,
                max_off_policy_threshold: threshold,
                strategy,
            })
        }
    }
}

/// What the asynchronous loop does not run yet, at the key that asks for it.
pub(super) fn check_support(spec: &TrainerSpec, l: &mut Lowering) {
    if spec.run.asynchronous.is_none() {
        return;
    }
    let refuse = |l: &mut Lowering, key: &str, what: &str, help: &str| {
        l.unsupported(
            key,
            format!("{what} is not implemented with `trainer_mode: colocate_async`"),
            help,
        );
    };
    if spec.strategy == StrategyName::Megatron {
        refuse(
            l,
            "actor_rollout_ref.actor.strategy",
            "the Megatron engine's sharded rollout",
            "use fsdp or fsdp2",
        );
    }
    if spec.rollout.vllm.is_some() {
        refuse(
            l,
            "actor_rollout_ref.rollout.name",
            "the vLLM rollout",
            "the asynchronous loop generates with the built-in engine",
        );
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

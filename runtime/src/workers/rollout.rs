//! The rollout side of the hybrid engine: its own copy of the policy in the rollout dtype
//! (`rollout.dtype`), generating with [`crate::rollout::generate`], and refreshed from the
//! actor's parameters after every update (verl's `update_weights`: the trainer's full tensors
//! are copied into the inference engine).

use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::model::{CausalLm, ModelConfig, Precision};
use crate::rollout::{RolloutOutput, SamplingParams, StopTokens, generate};

use super::{Result, WorkerError};

/// The generator of the hybrid engine.
pub struct RolloutWorker {
    vs: VarStore,
    model: CausalLm,
    pub dtype: Precision,
    /// True once weights have been loaded.
    synced: bool,
}

impl std::fmt::Debug for RolloutWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutWorker").field("dtype", &self.dtype).field("synced", &self.synced).finish_non_exhaustive()
    }
}

impl RolloutWorker {
    /// An empty model of `config` in `dtype` on `device`; call [`RolloutWorker::update_weights`]
    /// before generating.
    pub fn new(config: &ModelConfig, dtype: Precision, device: Device) -> Result<Self> {
        let mut vs = VarStore::new(device);
        let model = CausalLm::new(config, vs.root()).map_err(WorkerError::Config)?;
        vs.set_kind(dtype.kind());
        vs.freeze();
        Ok(RolloutWorker { vs, model, dtype, synced: false })
    }

    /// Copies `params` (every parameter, by checkpoint name) into the rollout model.
    pub fn update_weights(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        let vars = self.vs.variables();
        if params.len() != vars.len() {
            return Err(WorkerError::Config(format!(
                "weight sync: the trainer sent {} tensors, the rollout model has {}",
                params.len(),
                vars.len()
            )));
        }
        tch::no_grad(|| -> Result<()> {
            for (name, src) in params {
                let dst = vars
                    .get(name)
                    .ok_or_else(|| WorkerError::Config(format!("weight sync: the rollout model has no `{name}`")))?;
                if dst.size() != src.size() {
                    return Err(WorkerError::Config(format!(
                        "weight sync: `{name}` is {:?} in the trainer, {:?} in the rollout model",
                        src.size(),
                        dst.size()
                    )));
                }
                dst.shallow_clone().f_copy_(src)?;
            }
            Ok(())
        })?;
        self.synced = true;
        Ok(())
    }

    /// Generates `params.n` responses per prompt.
    pub fn generate(&self, prompts: &[Vec<i64>], params: &SamplingParams, stop: &StopTokens) -> Result<RolloutOutput> {
        if !self.synced {
            return Err(WorkerError::Config("the rollout model has no weights yet (update_weights first)".into()));
        }
        Ok(generate(&self.model, prompts, params, stop)?)
    }

    pub fn model(&self) -> &CausalLm {
        &self.model
    }
}

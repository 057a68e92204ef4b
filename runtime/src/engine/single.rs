//! [`SingleEngine`]: the single-process engine: one full model on one device, the Megatron
//! optimizer of [`crate::optim`] (fp32 main params for bf16/fp16 models, loss scaling for
//! fp16, optional host offload of the optimizer), verl's or Megatron's lr scheduler, and
//! checkpoints as `huggingface/` (config + safetensors, loadable by transformers) plus
//! `optim.safetensors` (exact optimizer and scheduler state).

use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::model::load::{Checkpoint, LoadOptions, load_weights};
use crate::model::lora::{is_adapter, load_adapter};
use crate::model::pretrained::materialize;
use crate::model::{Dtype, ModelConfig, ModelSource, TorchKind};
use crate::optim::param_groups::{named_params, single_group};
use crate::optim::stack;
use crate::optim::{LossScaling, Optimizer};

use super::{
    ADAPTER_DIR, Batch, Engine, EngineError, ForwardOptions, HF_DIR, Head, LossFn, Metrics,
    MicroBatching, Result, StepResult, global_agg_options, save_model,
};

pub use verlc_spec::optim::{OptimSettings, SchedulerSettings};

/// Everything a [`SingleEngine`] is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// A Hugging Face checkpoint directory or `builtin://tiny…`.
    pub model_path: String,
    pub device: Device,
    /// dtype of the model's parameters (the compute dtype).
    pub param_dtype: Dtype,
    /// dtype of the parameters the optimizer steps: fp32 main params, or `param_dtype` itself
    /// (bf16 only: the model's bf16 parameters stepped in place with bf16 optimizer state,
    /// as a torch optimizer over a bf16 model; verl's FSDP `model_dtype: bf16`).
    pub main_dtype: Dtype,
    /// Seed of the random initialisation (built-in models, fresh value heads).
    pub seed: u64,
    /// `None` builds a forward-only engine (the reference policy).
    pub optim: Option<OptimSettings>,
    /// Normaliser of `seq-mean-token-sum-norm` (`loss_scale_factor`); response length if None.
    pub loss_scale_factor: Option<f64>,
    /// The grad scaler code available to the optimizer (fp16 needs it): a trainer binary's
    /// precision marker decides, so only fp16 binaries link it.
    pub loss_scaling: LossScaling,
    /// LoRA adapters on the model: only they are trained (the base weights are frozen and
    /// outside the optimizer).
    pub lora: Option<crate::model::lora::LoraConfig>,
    /// `config.json` keys replaced before the model is built (`model.override_config`).
    pub config_overrides: serde_json::Map<String, serde_json::Value>,
    /// Run micro-batches packed, without their padding (`use_remove_padding`).
    pub remove_padding: bool,
}

impl EngineSettings {
    /// The model's config with `config_overrides` applied, checked to be trainable when
    /// the engine trains (not forward-only).
    pub(crate) fn model_config(&self, source: &ModelSource) -> Result<ModelConfig> {
        let path = &self.model_path;
        let bad = |msg: String| EngineError::Config(format!("model `{path}`: {msg}"));
        let config = source
            .config()?
            .with_overrides(&self.config_overrides)
            .map_err(bad)?;
        if self.optim.is_some()
            && let Some(why) = config.training_problem()
        {
            return Err(bad(why));
        }
        Ok(config)
    }
}

/// One model, its optimizer and scheduler, in this process.
pub struct SingleEngine<H: Head> {
    vs: VarStore,
    module: H,
    config: ModelConfig,
    /// With its lr schedule.
    optimizer: Option<Optimizer>,
    settings: EngineSettings,
}

impl<H: Head> std::fmt::Debug for SingleEngine<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SingleEngine")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

const OPTIM_FILE: &str = "optim.safetensors";

impl<H: Head> SingleEngine<H> {
    /// The model (for tests and tools; the trainer goes through [`Engine`]).
    pub fn module(&self) -> &H {
        &self.module
    }

    /// Builds the model (loaded from its checkpoint, or initialised from `seed` for a
    /// `builtin://` model) and, unless forward-only, its optimizer and scheduler.
    pub fn new(settings: EngineSettings) -> Result<Self> {
        let path = &settings.model_path;
        let source = ModelSource::parse(path)?;
        let mut config = settings.model_config(&source)?;
        config.lora = settings.lora.clone();
        let mut vs = VarStore::new(settings.device);
        let module = H::build(&config, vs.root())
            .map_err(|msg| EngineError::Config(format!("model `{path}`: {msg}")))?;
        vs.set_kind(settings.param_dtype.kind());
        materialize(&vs, &source, &config, settings.seed, H::fresh_prefixes())?;
        Self::assemble(vs, module, config, settings)
    }

    /// verl runs a vision tower that a batch gave no image on a dummy image and adds zero
    /// times its output to the embeddings (its model patches, for every family with a tower),
    /// so the tower's parameters always have a gradient, zero then, which AdamW turns into
    /// weight decay alone; FSDP's flat shards step them the same way. Here they took none:
    /// give them that zero, so that the optimizer does not skip them.
    fn zero_grads_for_an_unused_tower(&self) -> Result<()> {
        let tower = self.config.arch().is_ok_and(|a| a.has_vision());
        if self.optimizer.is_none() || !tower {
            return Ok(());
        }
        for (name, var) in self.vs.variables() {
            if name.starts_with("visual.") && var.requires_grad() && !var.grad().defined() {
                crate::ops::set_grad(&var, Some(&var.zeros_like()))
                    .map_err(crate::optim::OptimError::from)?;
            }
        }
        Ok(())
    }

    fn assemble(
        mut vs: VarStore,
        module: H,
        config: ModelConfig,
        settings: EngineSettings,
    ) -> Result<Self> {
        let optimizer = match &settings.optim {
            None => {
                vs.freeze();
                None
            }
            Some(o) => {
                // Only the adapters train under LoRA, and a frozen vision tower does not; the
                // optimizer keeps what requires grad.
                for (name, var) in vs.variables() {
                    let frozen = o.freeze_vision_tower && name.starts_with("visual.");
                    if frozen || (config.lora.is_some() && !is_adapter(&name)) {
                        let _ = var.set_requires_grad(false);
                    }
                }
                Some(stack::build(
                    single_group(named_params(&vs), o.lr, o.weight_decay),
                    o,
                    settings.param_dtype,
                    settings.main_dtype,
                    settings.loss_scaling,
                )?)
            }
        };
        Ok(SingleEngine {
            vs,
            module,
            config,
            optimizer,
            settings,
        })
    }

    /// The head's forward, packed when the settings say so and the micro-batch has enough
    /// padding to gain from it ([`crate::model::packed::worth_packing`]).
    fn forward(&self, mb: &Batch, fwd: &ForwardOptions) -> Result<H::Output> {
        if self.settings.remove_padding
            && crate::model::packed::worth_packing(mb.get("attention_mask")?)
        {
            self.module.forward_packed(mb, fwd)
        } else {
            self.module.forward(mb, fwd)
        }
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// The optimizer (None for a forward-only engine), e.g. for its loss scaler.
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.optimizer.as_ref()
    }

    fn optimizer_mut(&mut self) -> Result<&mut Optimizer> {
        self.optimizer
            .as_mut()
            .ok_or_else(|| EngineError::Config("this engine is forward-only (no optimizer)".into()))
    }

    fn ck(path: &Path, msg: impl std::fmt::Display) -> EngineError {
        EngineError::Checkpoint {
            path: path.to_path_buf(),
            msg: msg.to_string(),
        }
    }

    fn sorted_params(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

impl<H: Head> Engine for SingleEngine<H> {
    type Head = H;

    fn model_config(&self) -> &crate::model::ModelConfig {
        self.module.config()
    }

    fn set_adapters_enabled(&self, enabled: bool) -> Result<()> {
        self.module.backbone().set_adapters_enabled(enabled);
        Ok(())
    }

    fn forward_backward(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
        loss: &mut LossFn<'_, H::Output>,
    ) -> Result<Vec<Metrics>> {
        let agg = global_agg_options(batch, self.dp_size(), self.settings.loss_scale_factor)?;
        let mut out = Vec::new();
        for mb in micro.cut(batch)? {
            let output = self.forward(&mb, fwd)?;
            let micro = loss(&mb, output, &agg)?;
            let opt = self.optimizer_mut()?;
            opt.scale_loss(&micro.loss)?.f_backward()?;
            out.push(micro.metrics);
        }
        Ok(out)
    }

    fn infer_batch(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
    ) -> Result<Vec<H::Output>> {
        let _guard = tch::no_grad_guard();
        micro
            .cut(batch)?
            .iter()
            .map(|mb| self.forward(mb, fwd))
            .collect()
    }

    fn optimizer_zero_grad(&mut self) -> Result<()> {
        Ok(self.optimizer_mut()?.zero_grad()?)
    }

    fn optimizer_step(&mut self) -> Result<StepResult> {
        self.zero_grads_for_an_unused_tower()?;
        let opt = self.optimizer_mut()?;
        let outcome = opt.step(None)?;
        opt.zero_grad()?;
        Ok(StepResult {
            grad_norm: outcome.grad_norm,
            update_successful: outcome.update_successful,
        })
    }

    fn lr_scheduler_step(&mut self) -> Result<f64> {
        Ok(self.optimizer_mut()?.scheduler_step(1))
    }

    fn lr(&self) -> f64 {
        self.optimizer.as_ref().map_or(0.0, Optimizer::lr)
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Self::ck(dir, e))?;
        let arch = H::architecture(&self.config).map_err(|e| Self::ck(dir, e))?;
        save_model(
            dir,
            &self.sorted_params(),
            &self.config,
            arch,
            &self.settings.model_path,
        )?;
        if let Some(opt) = &self.optimizer {
            opt.save(&dir.join(OPTIM_FILE))?;
        }
        Ok(())
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let hf: PathBuf = dir.join(HF_DIR);
        let ckpt = Checkpoint::open(&hf)?;
        let opts = LoadOptions {
            strict_unexpected: false,
            ..LoadOptions::default()
        };
        let report = load_weights(&self.vs, &ckpt, &opts)?;
        if let Some(m) = report.missing.first() {
            return Err(Self::ck(&hf, format!("no tensor `{m}`")));
        }
        if self.config.lora.is_some() {
            load_adapter(&self.vs, &dir.join(ADAPTER_DIR))?;
        }
        if let Some(opt) = self.optimizer.as_mut() {
            let path = dir.join(OPTIM_FILE);
            if !path.is_file() {
                return Err(Self::ck(
                    &path,
                    "missing (the checkpoint has no optimizer state)",
                ));
            }
            opt.load(&path)?;
        }
        Ok(())
    }

    fn per_tensor_params(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self
            .sorted_params()
            .into_iter()
            .map(|(n, t)| (n, t.detach()))
            .collect())
    }

    fn load_params(&mut self, named: &[(String, Tensor)]) -> Result<()> {
        let given: std::collections::HashMap<&str, &Tensor> =
            named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for (name, var) in self.sorted_params() {
            let src = given
                .get(name.as_str())
                .ok_or_else(|| EngineError::Config(format!("no tensor given for `{name}`")))?;
            if src.size() != var.size() {
                return Err(EngineError::Config(format!(
                    "`{name}`: given shape {:?}, the model's {:?}",
                    src.size(),
                    var.size()
                )));
            }
            tch::no_grad(|| var.shallow_clone().f_copy_(src))?;
        }
        if let Some(opt) = self.optimizer.as_mut() {
            opt.reload_model_params()?;
        }
        Ok(())
    }
}

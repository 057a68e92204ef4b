//! [`Trainer`]: set-up (data, models, workers, loggers, resume) and the step loop.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use tch::{Kind, Tensor};
use verlc_spec::TrainerSpec;
use verlc_spec::data::DataSpec;
use verlc_spec::trainer::{
    FilterGroupsSpec, GroupMetric, KlControlSpec, LoraSpec, ModuleSelector, RewardManagerSpec,
    RewardSpec,
};

use crate::algo::advantage::gdpo::Components;
use crate::algo::pf_ppo::{pf_ppo_sample, pf_ppo_weights};
use crate::algo::rollout_correction::rollout_correction;
use crate::algo::variance_proxy::{VarianceInputs, variance_proxy_metrics};
use crate::algo::{
    AdvEstimator, AdvantageConfig, AdvantageInputs, GroupIndex, KlController, KlEstimator,
    apply_kl_penalty, compute_advantage,
};
use crate::data::image::ImageProcessorConfig;
use crate::data::video::VideoProcessor;
use crate::data::{DatasetOptions, PromptItem, RlDataset, VisionData};
use crate::engine::batch::RowImages;
use crate::engine::{Batch, Engine, EngineError, EngineSettings, Metrics};
use crate::logging::{Tracking, TrackingOptions};
use crate::logits::probs_diff;
use crate::model::ModelSource;
use crate::model::lora::{LoraConfig, LoraTargets};
use crate::rng::Rng;
use crate::rollout::sampling::masked_tokens;
use crate::rollout::{RolloutOutput, SamplingParams, StopTokens};
use crate::tokenizer::Tokenizer;
use crate::workers::actor::Actor;
use crate::workers::critic::Critic;
use crate::workers::reference::{Reference, ReferencePolicy};
use crate::workers::reward::manager;
use crate::workers::reward::python_manager::{ManagerSettings, PythonManager};
use crate::workers::reward::{
    PythonRewardFn, PythonSettings, RewardError, RewardFn, RewardInput, RewardModel, Score,
    ScoreItem, token_level_rewards_of,
};
use crate::workers::rollout::RolloutWorker;
use crate::workers::rollout_pool::{ReplicaCommand, ReplicaPlace};
use crate::workers::teacher::{TEACHER_COLUMN, Teachers};
use verlc_spec::trainer::DistillationMode;

use super::checkpoint::{self, TrainerState};
use super::metrics::{
    Timers, ValRecord, data_metrics, throughput_metrics, timing_metrics, validation_metrics,
};
use super::parallel::{DataParallel, Roles, SingleRoles, pad_prompts};
use super::prompts::{self, PromptSampler};
use super::{RunOptions, RunSummary, TrainerError};

/// Scores, the items that were scored, and the scorer's full results.
type Scored = (Vec<f64>, Vec<ScoreItem>, Vec<Score>);

/// Stream ids of the seeded generators (so no two uses share a stream).
#[path = "colocate.rs"]
mod colocate;

const STREAM_ROLLOUT: u64 = 1;
const STREAM_VAL: u64 = 2;
const STREAM_PF_PPO: u64 = 3;

/// The PPO/GRPO trainer of one rank; `R` binds the engines of its roles (one process by
/// default; see [`super::parallel`] for several ranks).
pub struct Trainer<R: Roles = SingleRoles> {
    spec: TrainerSpec,
    /// Shared with the asynchronous loop's rollout thread (the agent loop tokenizes there).
    tokenizer: Arc<Tokenizer>,
    train: RlDataset,
    val: Option<RlDataset>,
    sampler: PromptSampler,
    actor: Actor<R::Actor>,
    critic: Option<Critic<R::Critic>>,
    reference: Option<ReferencePolicy<R::Actor>>,
    /// On-policy distillation's teachers (`teacher_log_prob`, or their top-k, for the actor's
    /// loss).
    teachers: Option<Teachers<R::Actor>>,
    /// The `k` of the top-k distillation loss (the teachers give their top-k).
    teacher_topk: Option<i64>,
    dp: DataParallel,
    /// Names the temporary checkpoint directory all ranks write into (rank 0's pid).
    ckpt_tag: u64,
    rollout: RolloutWorker,
    /// `rollout.multi_turn`: the agent loop and its tools.
    agent: Option<Arc<super::agent::AgentRollout>>,
    reward: RewardFn,
    /// A Python reward manager, which scores instead of `reward` (and `manager::apply`).
    python_manager: Option<PythonManager>,
    /// Scores training responses instead of `reward` when set.
    reward_model: Option<RewardModel>,
    kl_ctrl: KlController,
    kl_penalty: KlEstimator,
    estimator: AdvEstimator,
    adv_cfg: AdvantageConfig,
    train_sampling: SamplingParams,
    val_sampling: SamplingParams,
    stop: StopTokens,
    tracking: Tracking,
    ckpt_root: PathBuf,
    seed: u64,
    global_step: u64,
    resumed_from: u64,
    total_steps: u64,
    /// A checkpoint written this step, committed once the step's metrics are logged.
    staged_checkpoint: Option<u64>,
    /// A vision-language actor's image settings (its checkpoints carry the processor's file).
    vision: Option<VisionData>,
    /// `trainer_mode: colocate_async` or `separate_async`: the replay buffer and the rollout
    /// thread.
    colocated: Option<colocate::Colocated>,
}

impl<R: Roles> std::fmt::Debug for Trainer<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("global_step", &self.global_step)
            .field("total_steps", &self.total_steps)
            .finish_non_exhaustive()
    }
}

fn bad(msg: impl Into<String>) -> TrainerError {
    TrainerError::Config(msg.into())
}

pub(crate) fn absolute(p: &str) -> PathBuf {
    let path = PathBuf::from(p);
    if path.is_absolute() {
        path
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    }
}

fn dataset_options(d: &DataSpec, max_samples: Option<usize>) -> DatasetOptions {
    DatasetOptions {
        prompt_key: d.prompt_key.clone(),
        reward_fn_key: d.reward_fn_key.clone(),
        max_prompt_length: d.max_prompt_length,
        truncation: d.truncation,
        filter_overlong_prompts: d.filter_overlong_prompts,
        max_samples,
        shuffle: d.shuffle,
        seed: d.seed,
        chat_template_kwargs: d.chat_template_kwargs.clone(),
        vision: None,
    }
}

/// The model's LoRA configuration of the spec's; an adapter directory brings its own.
pub(crate) fn lora_config(l: &LoraSpec) -> Result<LoraConfig, TrainerError> {
    if let Some(dir) = &l.adapter_path {
        return LoraConfig::from_adapter_dir(&absolute(dir))
            .map_err(|e| bad(format!("actor_rollout_ref.model.lora_adapter_path: {e}")));
    }
    let selector = |m: &ModuleSelector| match m {
        ModuleSelector::AllLinear => Ok(LoraTargets::AllLinear),
        ModuleSelector::Names(n) => Ok(LoraTargets::Names(n.clone())),
        ModuleSelector::Regex(p) => LoraTargets::regex(p).map_err(bad),
    };
    Ok(LoraConfig {
        rank: l.rank as i64,
        alpha: l.alpha,
        targets: selector(&l.target_modules)?,
        exclude: selector(&l.exclude_modules)?,
        adapter_dir: None,
    })
}

/// Each row's response tokens up to its end (EOS included), without padding.
fn response_ids(out: &RolloutOutput) -> Result<Vec<Vec<i64>>, TrainerError> {
    let r = out.responses.size()[1] as usize;
    let ids = Vec::<i64>::try_from(out.responses.f_flatten(0, -1)?)?;
    Ok(out
        .response_lengths
        .iter()
        .enumerate()
        .map(|(row, &len)| ids[row * r..row * r + len].to_vec())
        .collect())
}

/// Where the rows' images are and how they are prepared, when the actor's model has a vision
/// tower: its checkpoint's image processor (a built-in model takes the defaults).
fn vision_data(spec: &TrainerSpec) -> Result<Option<VisionData>, TrainerError> {
    let source = ModelSource::parse(&spec.actor.model_path).map_err(EngineError::from)?;
    let cfg = source.config().map_err(EngineError::from)?;
    if !cfg.arch().is_ok_and(|a| a.has_vision()) {
        return Ok(None);
    }
    // A scaled stand-in (`verlc smoke`) prepares images as the model it stands in for.
    let model_dir = match source {
        ModelSource::Dir(dir) => Some(dir),
        ModelSource::Builtin(uri) if uri.name == "scaled" => {
            uri.params.get("from").map(std::path::PathBuf::from)
        }
        ModelSource::Builtin(_) => None,
    };
    let processor = match &model_dir {
        Some(dir) => ImageProcessorConfig::from_model_dir(dir).map_err(bad)?,
        None => ImageProcessorConfig::default(),
    };
    // A Qwen3.5 checkpoint beside a critic trains on text (B022 at build).
    let text_only = cfg
        .arch()
        .ok()
        .and_then(|a| Some((a, spec.text_prompts_only(a, false)?)))
        .map(|(a, why)| {
            format!(
                "this run trains the {} model `{}` {why} on text prompts only: verlc does not yet send images there (verlc build warned, B022)",
                a.row().name,
                spec.actor.model_path,
            )
        });
    let tower = cfg.arch().ok().and_then(|a| a.tower());
    Ok(Some(VisionData {
        image_key: spec.data.image_key.clone(),
        measure_patch_size: spec.data.image_patch_size.unwrap_or(processor.patch_size),
        video: VideoProcessor::of_model(tower, model_dir.as_deref()).map_err(bad)?,
        processor,
        model_dir,
        text_only,
    }))
}

/// The reward function, started and checked against the data sources it will score: those
/// the reward model does not (everything without one, validation unless it scores that too).
fn reward_function(
    spec: &TrainerSpec,
    opts: &RunOptions,
    train: &RlDataset,
    val: Option<&RlDataset>,
) -> Result<RewardFn, TrainerError> {
    // A Python reward manager calls the function itself (see `python_manager`).
    if matches!(spec.reward_manager, RewardManagerSpec::Python(_)) {
        return Ok(RewardFn::Builtin { verl: None });
    }
    let settings = |path: PathBuf, name: String, reward_kwargs| PythonSettings {
        python: opts.python(),
        path,
        name,
        reward_kwargs,
        startup_timeout: opts.reward_startup_timeout,
        call_timeout: opts.reward_call_timeout,
    };
    // The sources the rule scorers see: those the reward model does not score (everything
    // without one, validation unless it scores that too), and validation only where it runs,
    // up to the batch that ends it (`validate_on`).
    let rm = spec.reward_model.as_ref();
    let train_sources = train.items.iter().filter(|_| rm.is_none());
    let validates = spec.run.test_freq > 0 || spec.run.val_before_train;
    let val_batch = spec.data.val_batch_size.unwrap_or(usize::MAX).max(1);
    let val_sources = val
        .filter(|_| validates)
        .into_iter()
        .flat_map(|v| {
            v.items
                .chunks(val_batch)
                .take_while(|batch| !ends_validation(rm.is_some(), batch.first()))
                .flatten()
        })
        .filter(|_| !rm.is_some_and(|m| m.scores_validation));
    let sources = train_sources
        .chain(val_sources)
        .map(|it| it.sample.data_source.as_str());
    Ok(match &spec.reward {
        RewardSpec::Python {
            path,
            name,
            reward_kwargs,
        } => RewardFn::Python(Box::new(PythonRewardFn::start(settings(
            absolute(path),
            name.clone(),
            reward_kwargs.clone(),
        ))?)),
        RewardSpec::Builtin => RewardFn::for_sources(sources, || {
            settings(PathBuf::new(), String::new(), Default::default())
        })?,
    })
}

/// Scores without a scorer's other outputs (a reward model's, an agent loop's own).
fn plain_scores(values: &[f64]) -> Vec<Score> {
    values.iter().copied().map(Score::of).collect()
}

/// verl validates rule-scored data only: with a reward model, a validation batch whose first
/// sample is `style: model` ends validation (without metrics).
fn ends_validation(reward_model: bool, first: Option<&PromptItem>) -> bool {
    reward_model && first.and_then(|it| it.sample.reward_model.style.as_deref()) == Some("model")
}

/// A Python reward manager (`RewardManagerSpec::Python`), started on this rank with the
/// model's tokenizer and the user's `compute_score` (else verl's default).
fn python_manager(
    spec: &TrainerSpec,
    opts: &RunOptions,
    tokenizer: &Tokenizer,
) -> Result<Option<PythonManager>, TrainerError> {
    let RewardManagerSpec::Python(m) = &spec.reward_manager else {
        return Ok(None);
    };
    let (tokenizer_dir, _saved) = prompts::tokenizer_dir(&spec.tokenizer_path, tokenizer)?;
    let function = match &spec.reward {
        RewardSpec::Python {
            path,
            name,
            reward_kwargs,
        } => Some((absolute(path), name.clone(), reward_kwargs.clone())),
        RewardSpec::Builtin => None,
    };
    let manager = PythonManager::start(&ManagerSettings {
        python: opts.python(),
        spec: (**m).clone(),
        tokenizer_dir,
        function,
        startup_timeout: opts.reward_startup_timeout,
        call_timeout: opts.reward_call_timeout,
    })?;
    Ok(Some(manager))
}

/// The value model on its engine, when the estimator needs one.
fn critic_role<R: Roles>(
    roles: &R,
    spec: &TrainerSpec,
    opts: &RunOptions,
    total_steps: u64,
) -> Result<Option<Critic<R::Critic>>, TrainerError> {
    let Some(c) = &spec.critic else {
        return Ok(None);
    };
    let engine = roles.critic(
        &c.engine,
        EngineSettings {
            model_path: c.model_path.clone(),
            device: opts.device,
            param_dtype: spec.binding.precision,
            main_dtype: c.engine.main_dtype(),
            seed: c.seed,
            optim: Some(c.optim.resolve(total_steps)),
            loss_scale_factor: c.update.loss_scale_factor,
            loss_scaling: opts.loss_scaling,
            lora: None,
            config_overrides: Default::default(),
            remove_padding: c.engine.remove_padding(),
        },
    )?;
    Ok(Some(Critic::new(engine, c.update.clone())?))
}

/// On-policy distillation's teachers, each a frozen engine scoring at temperature 1.
fn distillation_teachers<R: Roles>(
    roles: &R,
    spec: &TrainerSpec,
    opts: &RunOptions,
) -> Result<Option<Teachers<R::Actor>>, TrainerError> {
    let Some(d) = &spec.distillation else {
        return Ok(None);
    };
    let mut teachers = Vec::with_capacity(d.teachers.len());
    for t in &d.teachers {
        let batching = (d.micro_batch, d.max_token_len, 1.0);
        let scorer = frozen_reference(roles, spec, opts, (&d.engine, &t.model_path), batching)?;
        teachers.push((t.key.clone(), scorer));
    }
    Ok(Some(Teachers::new(teachers)?))
}

/// The frozen reference policy: its own model, or the actor with its adapters off (LoRA).
fn reference_policy<R: Roles>(
    roles: &R,
    spec: &TrainerSpec,
    opts: &RunOptions,
) -> Result<Option<ReferencePolicy<R::Actor>>, TrainerError> {
    let Some(r) = &spec.reference else {
        return Ok(None);
    };
    if r.actor_without_adapters {
        return Ok(Some(ReferencePolicy::ActorWithoutAdapters {
            micro_batch_size: r.micro_batch,
            max_token_len: r.max_token_len,
            temperature: r.temperature,
        }));
    }
    let batching = (r.micro_batch, r.max_token_len, r.temperature);
    let reference = frozen_reference(roles, spec, opts, (&r.engine, &r.model_path), batching)?;
    Ok(Some(ReferencePolicy::Own(reference)))
}

/// A forward-only causal-LM scorer of `model_path` on `engine` (the reference, a teacher),
/// in micro-batches of `micro_batch` rows (or a token budget), at `temperature`.
fn frozen_reference<R: Roles>(
    roles: &R,
    spec: &TrainerSpec,
    opts: &RunOptions,
    (engine, model_path): (&verlc_spec::trainer::EngineSpec, &str),
    (micro_batch, max_token_len, temperature): (usize, Option<usize>, f64),
) -> Result<Reference<R::Actor>, TrainerError> {
    let engine = roles.reference(
        engine,
        EngineSettings {
            model_path: model_path.to_owned(),
            device: opts.device,
            param_dtype: spec.binding.precision,
            main_dtype: verlc_spec::trainer::Dtype::Fp32,
            seed: spec.model_seed,
            optim: None,
            loss_scale_factor: None,
            loss_scaling: opts.loss_scaling,
            lora: None,
            config_overrides: spec.actor.config_overrides.clone(),
            remove_padding: engine.remove_padding(),
        },
    )?;
    let mut reference = Reference::new(engine, micro_batch, temperature)?;
    reference.max_token_len = max_token_len;
    Ok(reference)
}

fn kl_controller(spec: KlControlSpec) -> Result<KlController, TrainerError> {
    Ok(match spec {
        KlControlSpec::Adaptive {
            kl_coef,
            target_kl,
            horizon,
        } => KlController::adaptive(kl_coef, target_kl, horizon)?,
        KlControlSpec::Fixed { kl_coef } => KlController::fixed(kl_coef),
    })
}

impl Trainer<SingleRoles> {
    /// The trainer of a one-process run (the single engine).
    pub fn new(spec: &TrainerSpec, opts: &RunOptions) -> Result<Self, TrainerError> {
        Self::with_roles(spec, opts, SingleRoles)
    }
}

impl<R: Roles> Trainer<R> {
    /// Loads data and models, starts the reward function and the loggers, and restores the
    /// checkpoint the spec's resume mode asks for. Collective over `roles`' world: every rank
    /// calls it with the same spec.
    pub fn with_roles(
        spec: &TrainerSpec,
        opts: &RunOptions,
        roles: R,
    ) -> Result<Self, TrainerError> {
        let world = spec.world.size();
        let ranks = roles.world().map_or(1, |w| w.size());
        if world != ranks {
            return Err(bad(format!(
                "trainer.nnodes × trainer.n_gpus_per_node = {world}, but the trainer runs on {ranks} rank(s)"
            )));
        }
        let tokenizer = Arc::new(Tokenizer::from_pretrained(&spec.tokenizer_path)?);
        let vision = vision_data(spec)?;
        let d = &spec.data;
        let mut opts_data = dataset_options(d, d.train_max_samples);
        opts_data.vision = vision.clone();
        let load_dp = DataParallel {
            group: None,
            world: roles.world().cloned(),
        };
        let mut loaded = prompts::load(
            d,
            &spec.tokenizer_path,
            &tokenizer,
            opts_data,
            &opts.python(),
            &load_dp,
        )?;
        let sampler = PromptSampler::new(d, &mut loaded, &load_dp)?;
        if let Some(note) = &loaded.note {
            println!("{note}");
        }
        let (train, val) = (loaded.train, loaded.val);
        let total_steps = spec
            .run
            .total_training_steps
            .unwrap_or((sampler.batches_per_epoch() as u64) * spec.run.total_epochs);
        let reward = reward_function(spec, opts, &train, val.as_ref())?;
        let python_manager = python_manager(spec, opts, &tokenizer)?;

        // Models, in the same order on every rank (their construction is collective).
        let dtype_ = spec.binding.precision;
        let seed = spec.model_seed;
        let a = &spec.actor;
        let actor_engine = roles.actor(
            &a.engine,
            EngineSettings {
                model_path: a.model_path.clone(),
                device: opts.device,
                param_dtype: dtype_,
                main_dtype: a.engine.main_dtype(),
                seed,
                optim: Some(a.optim.resolve(total_steps)),
                loss_scale_factor: a.loss_scale_factor,
                loss_scaling: opts.loss_scaling,
                lora: a.lora.as_ref().map(lora_config).transpose()?,
                config_overrides: a.config_overrides.clone(),
                remove_padding: a.engine.remove_padding(),
            },
        )?;
        let dp = DataParallel {
            group: roles.data_group(&actor_engine),
            world: roles.world().cloned(),
        };
        let mut actor = Actor::new(actor_engine, a.update.clone())?;
        let critic = critic_role(&roles, spec, opts, total_steps)?;
        let reference = reference_policy(&roles, spec, opts)?;
        let teachers = distillation_teachers(&roles, spec, opts)?;
        // Several teachers: every training row's data_source must have one (now, not at the
        // first batch that holds it).
        if let Some(t) = teachers.as_ref().filter(|t| t.routed()) {
            for item in &train.items {
                t.route(&item.sample.data_source)?;
            }
        }
        let reward_model = match &spec.reward_model {
            Some(m) => Some(RewardModel::load(
                m,
                m.dtype.unwrap_or(dtype_),
                opts.device,
            )?),
            None => None,
        };
        let rollout_dtype = spec.rollout.dtype.unwrap_or(dtype_);
        // A rollout model without weights; `group`: the ranks a vLLM server is shared by.
        let new_rollout = |actor: &mut Actor<R::Actor>,
                           group: Option<crate::parallel::dist::ProcessGroup>|
         -> Result<RolloutWorker, TrainerError> {
            Ok(match &spec.rollout.vllm {
                // vLLM takes the whole model by name from the main rank (no sharded layout);
                // a vision-language policy's server takes its prompts' images too.
                Some(vllm) => {
                    let mut worker = RolloutWorker::vllm(
                        actor.engine.model_config(),
                        rollout_dtype,
                        vllm.clone(),
                        seed,
                        opts.device,
                        group,
                    )?;
                    if let Some(v) = vision.as_ref().filter(|v| v.text_only.is_none()) {
                        worker.serve_images(crate::rollout::vllm::VisionServing::new(
                            spec.tokenizer_path.clone(),
                            v.processor.clone(),
                            v.video,
                        ))?;
                    }
                    worker
                }
                None => {
                    let layout = actor.engine.rollout_layout(spec.rollout.tensor_parallel)?;
                    RolloutWorker::for_layout(&layout, rollout_dtype, opts.device)?
                }
            })
        };
        let rollout = new_rollout(&mut actor, roles.world().cloned())?;

        let agent = match &spec.rollout.multi_turn {
            Some(mt) => Some(Arc::new(super::agent::AgentRollout::start(
                mt,
                opts,
                &actor.engine.model_config().model_type,
                &rollout,
                (&spec.tokenizer_path, &tokenizer),
            )?)),
            None => None,
        };
        // What verl's vLLM rollout never samples, on every rollout of this run.
        let masked = masked_tokens(actor.engine.model_config(), tokenizer.vocab_size());
        let masking = |p: &SamplingParams| SamplingParams {
            masked: masked.clone(),
            ..p.clone()
        };
        let alg = &spec.algorithm;
        let stop = StopTokens {
            eos: tokenizer.eos_token_ids.clone(),
            pad: tokenizer.pad_token_id,
        };
        let colocated = match spec.run.asynchronous {
            Some(a) => {
                // With vLLM, a server of its own (the trainer's serves validation), shared by
                // the ranks' rollout threads over a group of their own: the trainer threads'
                // collectives go on meanwhile.
                let lockstep = match roles.world() {
                    Some(w) if spec.rollout.vllm.is_some() => w
                        .new_group(&(0..w.size()).collect::<Vec<_>>())
                        .map_err(|e| TrainerError::Config(e.to_string()))?,
                    _ => None,
                };
                // The built-in rollout thread decodes the whole model from whole tensors by
                // name, on every engine: a Megatron rank's sharded rollout would decode with
                // collectives of the groups its trainer thread is using meanwhile.
                let mut worker = match &spec.rollout.vllm {
                    Some(_) => new_rollout(&mut actor, lockstep.clone())?,
                    // separate_async's pool: this rank's replicas in processes of their own
                    // (see `replica_places`).
                    None if a.rollout_processes > 0 => {
                        let command = match &opts.rollout_replica {
                            Some(c) => c.clone(),
                            None => ReplicaCommand::this_binary().map_err(|e| {
                                TrainerError::Config(format!("the rollout replica's program: {e}"))
                            })?,
                        };
                        let places = replica_places(
                            roles.world().map_or((0, 1), |w| (w.rank(), w.size())),
                            spec.world.n_gpus_per_node,
                            a.rollout_processes,
                            opts.device,
                        );
                        RolloutWorker::replica(
                            actor.engine.model_config(),
                            rollout_dtype,
                            &command,
                            &places,
                        )?
                    }
                    None => {
                        RolloutWorker::new(actor.engine.model_config(), rollout_dtype, opts.device)?
                    }
                };
                worker.share_cores_with_trainer();
                let agent = agent.clone().map(|a| (a, Arc::clone(&tokenizer)));
                Some(colocate::Colocated::new(
                    a,
                    worker,
                    (stop.clone(), opts.partial_rollout),
                    agent,
                    lockstep,
                )?)
            }
            None => None,
        };
        let ckpt_root = absolute(&spec.run.checkpoint_dir);
        let ckpt_tag = dp.broadcast_from_main(i64::from(std::process::id()))? as u64;

        let mut trainer = Trainer {
            spec: spec.clone(),
            tokenizer,
            train,
            val,
            sampler,
            actor,
            critic,
            reference,
            teachers,
            teacher_topk: match spec.actor.update.distillation.map(|d| d.mode) {
                Some(DistillationMode::ForwardKlTopk { topk, .. }) => Some(topk),
                _ => None,
            },
            dp,
            ckpt_tag,
            rollout,
            agent,
            reward,
            python_manager,
            reward_model,
            kl_ctrl: kl_controller(alg.kl_ctrl)?,
            kl_penalty: alg.kl_penalty,
            estimator: alg.estimator,
            adv_cfg: alg.advantage,
            train_sampling: masking(&spec.rollout.train),
            val_sampling: masking(&spec.rollout.val),
            stop,
            tracking: Tracking::from_loggers(Vec::new()),
            ckpt_root,
            seed,
            global_step: 0,
            resumed_from: 0,
            total_steps,
            staged_checkpoint: None,
            vision,
            colocated,
        };
        trainer.load_checkpoint()?;
        if trainer.dp.is_main() {
            trainer.start_tracking(opts)?;
        }
        Ok(trainer)
    }

    /// The loggers of the main rank (after a resume, they continue at its step).
    fn start_tracking(&mut self, opts: &RunOptions) -> Result<(), TrainerError> {
        let spec = &self.spec;
        self.tracking = Tracking::new(
            &spec.run.loggers,
            &TrackingOptions {
                project: spec.run.project_name.clone(),
                experiment: spec.run.experiment_name.clone(),
                total_steps: self.total_steps,
                resume_from_step: (self.global_step > 0).then_some(self.global_step),
                console_lines: opts.console_lines,
                config: serde_json::to_value(spec).unwrap_or_default(),
                python: crate::workers::reward::python::PythonSettings::default_python(),
                tracker_env: Vec::new(),
            },
        )?;
        Ok(())
    }

    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// The checkpoint to resume from, per `trainer.resume_mode`.
    fn resume_dir(&self) -> Result<Option<PathBuf>, TrainerError> {
        checkpoint::resume_dir(&self.spec.run.resume, &self.ckpt_root)
    }

    fn load_checkpoint(&mut self) -> Result<(), TrainerError> {
        if self.dp.is_main() {
            checkpoint::remove_leftovers(&self.ckpt_root)?;
        }
        self.dp.barrier()?;
        let Some(dir) = self.resume_dir()? else {
            return Ok(());
        };
        let missing = |what: &str| TrainerError::Checkpoint {
            path: dir.clone(),
            msg: format!("incomplete checkpoint: no {what}"),
        };
        if !dir.is_dir() {
            return Err(missing("directory"));
        }
        let state = checkpoint::read_state(&dir)?;
        if checkpoint::parse_step(&dir) != Some(state.global_step) {
            return Err(TrainerError::Checkpoint {
                path: dir.clone(),
                msg: format!(
                    "the directory name does not match the saved step {}",
                    state.global_step
                ),
            });
        }
        if !dir.join("actor").is_dir() {
            return Err(missing("actor/"));
        }
        self.actor.engine.load_checkpoint(&dir.join("actor"))?;
        if let Some(c) = self.critic.as_mut() {
            if !dir.join("critic").is_dir() {
                return Err(missing("critic/"));
            }
            c.engine.load_checkpoint(&dir.join("critic"))?;
        }
        self.sampler
            .resume(state.sampler, state.python_sampler.as_ref(), &self.dp)?;
        match &mut self.kl_ctrl {
            KlController::Fixed { value } | KlController::Adaptive { value, .. } => {
                *value = state.kl_coef
            }
        }
        self.global_step = state.global_step;
        self.resumed_from = state.global_step;
        self.dp.barrier()?;
        if self.spec.run.del_local_ckpt_after_load && self.dp.is_main() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    }

    /// Writes this step's checkpoint; [`Trainer::commit_checkpoint`] makes it the resume point.
    fn save_checkpoint(&mut self) -> Result<(), TrainerError> {
        let (sampler, python_sampler) = self.sampler.state(&self.dp)?;
        let state = TrainerState {
            global_step: self.global_step,
            sampler,
            python_sampler,
            kl_coef: self.kl_ctrl.value(),
        };
        let (root, step, main) = (self.ckpt_root.clone(), self.global_step, self.dp.is_main());
        // Rank 0 prepares the directory, every rank writes its part (the engines' saves
        // are collective), rank 0 writes the shared files and moves it into place.
        let tmp = checkpoint::temp_dir(&root, step, self.ckpt_tag);
        if main {
            checkpoint::begin(&root, &tmp)?;
        }
        self.dp.barrier()?;
        let actor_dir = tmp.join("actor");
        self.actor.engine.save_checkpoint(&actor_dir)?;
        if let Some(c) = &self.critic {
            c.engine.save_checkpoint(&tmp.join("critic"))?;
        }
        if main {
            self.tokenizer.save(&actor_dir.join("huggingface"))?;
            if let Some(v) = &self.vision {
                v.processor
                    .save(&actor_dir.join("huggingface"), v.model_dir.as_deref())
                    .map_err(bad)?;
            }
            checkpoint::write_state(&tmp, &state)?;
        }
        self.dp.barrier()?;
        if main {
            checkpoint::finish(&root, step, &tmp)?;
        }
        self.staged_checkpoint = Some(step);
        Ok(())
    }

    /// Commits the staged checkpoint (after its step is logged), then applies retention, so
    /// the checkpoint the tracker names is never the one retention removes.
    fn commit_checkpoint(&mut self) -> Result<(), TrainerError> {
        let Some(step) = self.staged_checkpoint.take() else {
            return Ok(());
        };
        if !self.dp.is_main() {
            return Ok(());
        }
        checkpoint::commit(&self.ckpt_root, step)?;
        checkpoint::apply_retention(
            &self.ckpt_root,
            self.spec.run.max_actor_ckpt_to_keep,
            self.spec.run.max_critic_ckpt_to_keep,
        )
    }

    /// Binds the actor's current weights to the rollout model (the full weights, gathered by
    /// sharded FSDP engines; a Megatron rank's own shards); [`RolloutWorker::release`] drops
    /// them after generating.
    fn load_rollout(&mut self) -> Result<(), TrainerError> {
        let params = self.weights_for_rollout(self.rollout.takes_whole_tensors())?;
        self.rollout.update_weights(&params)?;
        Ok(())
    }

    /// The actor's weights as a rollout takes them: whole tensors by checkpoint name (`whole`:
    /// a vLLM server's), or the built-in rollout model's layout.
    pub(super) fn weights_for_rollout(
        &mut self,
        whole: bool,
    ) -> Result<Vec<(String, tch::Tensor)>, TrainerError> {
        Ok(if whole {
            self.actor.engine.per_tensor_params()?
        } else {
            self.actor.engine.rollout_weights()?
        })
    }

    /// Runs the loop to `total_steps`; returns the logged metrics.
    pub fn fit(&mut self) -> Result<RunSummary, TrainerError> {
        let mut summary = RunSummary {
            resumed_from: self.resumed_from,
            ..RunSummary::default()
        };
        if self.val.is_some() && self.spec.run.val_before_train {
            let m = self.validate()?;
            self.tracking.log(self.global_step, &m)?;
            summary.history.push((self.global_step, m));
            if self.spec.run.val_only {
                self.rollout.finish()?;
                self.tracking.finish();
                return Ok(summary);
            }
        }
        while self.global_step < self.total_steps {
            self.global_step += 1;
            let metrics = self.step()?;
            self.tracking.log(self.global_step, &metrics)?;
            self.commit_checkpoint()?;
            summary.history.push((self.global_step, metrics));
        }
        summary.last_step = self.global_step;
        self.rollout.finish()?;
        self.tracking.finish();
        Ok(summary)
    }

    /// The sampling seed of `stream` at this step; data-parallel ranks draw from their own
    /// streams (rank 0's is the one-process stream).
    fn sampling_seed(&self, stream: u64, dp_rank: usize) -> u64 {
        self.sampling_seed_at(stream, dp_rank, self.global_step)
    }

    /// [`Trainer::sampling_seed`] of another step (the asynchronous loop queues ahead).
    fn sampling_seed_at(&self, stream: u64, dp_rank: usize, step: u64) -> u64 {
        let rank = (dp_rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        Rng::derive(
            self.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ rank,
            step,
        )
        .next_u64()
    }

    /// Generates for `items` and builds the batch (verl's repeat + union): sequences,
    /// masks and, per row, the prompt it belongs to.
    fn generate(
        &self,
        items: &[&PromptItem],
        params: &SamplingParams,
    ) -> Result<(Batch, RolloutOutput), TrainerError> {
        let out = match &self.agent {
            Some(agent) => {
                agent.generate(&self.rollout, &self.tokenizer, items, params, &self.stop)?
            }
            None => generate_prompt_items(&self.rollout, items, params, &self.stop)?,
        };
        let mut batch = rollout_batch(&out)?;
        label_prompt_items(&mut batch, items, &out.prompt_index)?;
        Ok((batch, out))
    }

    /// The images of a batch of training rows that went through a gather (which carries
    /// tensors only), from each row's prompt in the training set `train`.
    fn attach_images(train: &RlDataset, batch: &mut Batch) -> Result<(), TrainerError> {
        let Some(column) = batch.opt(PROMPT_ITEM) else {
            return Ok(());
        };
        let images = Vec::<i64>::try_from(column)?
            .into_iter()
            .map(|i| {
                let item = usize::try_from(i).ok().and_then(|i| train.items.get(i));
                item.map(|it| it.images.clone())
                    .ok_or_else(|| bad(format!("row of prompt {i}: no such training prompt")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        batch.set_images(images)?;
        Ok(())
    }

    /// Decodes the responses and scores them.
    fn score(
        &mut self,
        items: &[&PromptItem],
        out: &RolloutOutput,
    ) -> Result<Scored, TrainerError> {
        let score_items = self.score_items(items, out)?;
        if let Some(m) = self.python_manager.as_mut() {
            let batch = manager_batch(items, out, &score_items, &self.spec.data.reward_fn_key)?;
            let scores = m.score(batch, score_items.len())?;
            return Ok((
                scores.iter().map(|s| s.score).collect(),
                score_items,
                scores,
            ));
        }
        let mut scores = self
            .reward
            .score(&score_items)
            .map_err(|e| on_sample(e, items, out, &score_items))?;
        manager::apply(
            &self.spec.reward_manager,
            &mut scores,
            &out.response_lengths,
        );
        Ok((
            scores.iter().map(|s| s.score).collect(),
            score_items,
            scores,
        ))
    }

    /// What a reward function sees of each response.
    fn score_items(
        &self,
        items: &[&PromptItem],
        out: &RolloutOutput,
    ) -> Result<Vec<ScoreItem>, TrainerError> {
        let responses = response_ids(out)?;
        let mut score_items = Vec::with_capacity(out.prompt_index.len());
        for (row, (ids, &p)) in responses.iter().zip(&out.prompt_index).enumerate() {
            let sample = &items[p].sample;
            let mut extra_info = sample.extra_info.clone();
            // What verl's reward loop adds for agent-loop rollouts.
            if let Some(turns) = out.num_turns.get(row) {
                extra_info.insert("num_turns".to_owned(), json!(turns));
                extra_info.insert("tool_rewards".to_owned(), json!(out.tool_rewards[row]));
                let scores = out.turn_scores.get(row).cloned().unwrap_or_default();
                extra_info.insert("turn_scores".to_owned(), json!(scores));
            }
            if let RewardManagerSpec::Gdpo { experiment_name } = &self.spec.reward_manager {
                extra_info.insert("experiment_name".to_owned(), json!(experiment_name));
            }
            score_items.push(ScoreItem {
                data_source: sample.data_source.clone(),
                solution_str: self.tokenizer.decode(ids, true)?,
                ground_truth: sample.reward_model.ground_truth.clone(),
                extra_info,
            });
        }
        Ok(score_items)
    }

    /// The reward model's score of each response.
    fn model_scores(
        &self,
        rm: &RewardModel,
        items: &[&PromptItem],
        out: &RolloutOutput,
    ) -> Result<Vec<f64>, TrainerError> {
        let responses = response_ids(out)?;
        let inputs: Vec<RewardInput<'_>> = responses
            .iter()
            .zip(&out.prompt_index)
            .map(|(ids, &p)| RewardInput {
                messages: &items[p].sample.prompt,
                prompt_ids: &items[p].input_ids,
                response_ids: ids,
            })
            .collect();
        Ok(rm.score(&self.tokenizer, &inputs)?)
    }

    /// The agent loops' own scores, where every row of the batch has one: verl puts them in
    /// the batch as `rm_scores` (at each response's last token), and neither the reward model
    /// nor the reward function scores such a batch.
    fn loop_scored(
        &self,
        items: &[&PromptItem],
        out: &RolloutOutput,
    ) -> Result<Option<Scored>, TrainerError> {
        let Some(values) = out
            .loop_scores
            .iter()
            .copied()
            .collect::<Option<Vec<f64>>>()
            .filter(|v| !v.is_empty())
        else {
            return Ok(None);
        };
        let scores = plain_scores(&values);
        Ok(Some((values, self.score_items(items, out)?, scores)))
    }

    /// The scores of training responses: the loops' own (`loop_scored`), the reward model's
    /// when there is one (verl's
    /// `rm_scores`), else the reward function's.
    /// With the reward function, also each response's other outputs (verl's
    /// `reward_extra_info`); a reward model's scores have none.
    fn train_scores(
        &mut self,
        items: &[&PromptItem],
        out: &RolloutOutput,
    ) -> Result<(Vec<f64>, Vec<Score>), TrainerError> {
        if let Some((values, _, scores)) = self.loop_scored(items, out)? {
            return Ok((values, scores));
        }
        match &self.reward_model {
            Some(rm) => Ok((self.model_scores(rm, items, out)?, Vec::new())),
            None => {
                let (values, _, scores) = self.score(items, out)?;
                Ok((values, scores))
            }
        }
    }

    /// Validation scores: the reward function's, or the reward model's where verl's reward
    /// loop scores validation too (`RewardModelSpec::scores_validation`).
    fn score_for_validation(
        &mut self,
        items: &[&PromptItem],
        out: &RolloutOutput,
    ) -> Result<Scored, TrainerError> {
        if let Some(scored) = self.loop_scored(items, out)? {
            return Ok(scored);
        }
        match &self.reward_model {
            Some(rm)
                if self
                    .spec
                    .reward_model
                    .as_ref()
                    .is_some_and(|m| m.scores_validation) =>
            {
                let values = self.model_scores(rm, items, out)?;
                let score_items = self.score_items(items, out)?;
                let scores = plain_scores(&values);
                Ok((values, score_items, scores))
            }
            _ => self.score(items, out),
        }
    }

    /// One training step; returns its metrics.
    fn step(&mut self) -> Result<Metrics, TrainerError> {
        let step = self.global_step;
        let is_last = step >= self.total_steps;
        let mut timers = Timers::default();
        let mut metrics = Metrics::new();
        let step_start = std::time::Instant::now();

        // The asynchronous loop draws its prompts as it queues them.
        let indices = if self.colocated.is_some() {
            Vec::new()
        } else {
            self.sampler.next_batch(&self.dp)?
        };
        let epoch = self.sampler.epoch();
        let train = std::mem::replace(
            &mut self.train,
            RlDataset {
                items: Vec::new(),
                filtered: 0,
            },
        );
        let result = self.step_inner(&train, &indices, step, &mut timers, &mut metrics);
        self.train = train;
        let batch = result?;
        // verl hands a curriculum sampler each trained batch before the step's validation and
        // checkpoint.
        self.sampler.update(&batch, &self.train, step, &self.dp)?;
        if self.colocated.is_some() {
            timers.time("update_weights", || self.colocated_step_end(step))?;
        }
        timers
            .0
            .insert("step".into(), step_start.elapsed().as_secs_f64());

        if let Some(dir) = self
            .spec
            .run
            .rollout_data_dir
            .clone()
            .filter(|_| self.dp.is_main())
        {
            timers.time("dump_rollout_generations", || {
                self.dump_generations(&dir, &batch)
            })?;
        }
        if self.val.is_some()
            && self.spec.run.test_freq > 0
            && (is_last || step.is_multiple_of(self.spec.run.test_freq))
        {
            let m = timers.time("testing", || self.validate())?;
            metrics.extend(m);
        }
        if self.spec.run.save_freq > 0 && (is_last || step.is_multiple_of(self.spec.run.save_freq))
        {
            timers.time("save_checkpoint", || self.save_checkpoint())?;
        }
        metrics.insert("training/global_step".into(), step as f64);
        metrics.insert("training/epoch".into(), epoch as f64);
        metrics.extend(data_metrics(
            &batch,
            self.critic.is_some(),
            self.spec.data.max_prompt_length,
        )?);
        metrics.extend(timing_metrics(&timers, &batch)?);
        metrics.extend(throughput_metrics(&timers, &batch, self.dp.world_size())?);
        Ok(metrics)
    }

    fn step_inner(
        &mut self,
        train: &RlDataset,
        indices: &[usize],
        step: u64,
        timers: &mut Timers,
        metrics: &mut Metrics,
    ) -> Result<Batch, TrainerError> {
        let mut batch = match self.spec.algorithm.filter_groups.clone() {
            _ if self.colocated.is_some() => self.colocated_batch(train, step, timers, metrics)?,
            None => self.rollout_round(train, indices, 0, 0, false, timers)?,
            Some(f) => self.dynamic_sampling(train, indices, &f, timers, metrics)?,
        };

        // Bypass mode (verl's apply_bypass_mode): the rollout's log-probs are the old policy
        // and no old-log-prob pass runs.
        let bypass = self.spec.actor.update.bypass.is_some();
        let entropy = if bypass {
            let rollout_lp = batch.get("rollout_log_probs")?.shallow_clone();
            batch.insert("old_log_probs", rollout_lp)?;
            None
        } else {
            let out = timers.time("old_log_prob", || self.actor.compute_log_prob(&batch))?;
            batch.insert("old_log_probs", out.log_probs)?;
            if let Some(sq) = out.sum_pi_squared {
                batch.insert("sum_pi_squared", sq)?;
            }
            out.entropy
        };
        if let Some(r) = self.reference.as_mut() {
            let actor = &mut self.actor.engine;
            let ref_lp = timers.time("ref", || r.compute_ref_log_prob(actor, &batch))?;
            batch.insert("ref_log_prob", ref_lp)?;
        }
        if let Some(t) = self.teachers.as_mut() {
            let topk = self.teacher_topk;
            timers.time("teacher", || t.score(&mut batch, topk))?;
        }
        if let Some(c) = self.critic.as_mut() {
            let values = timers.time("values", || c.compute_values(&batch))?;
            batch.insert("values", values)?;
        }

        // From here on the whole batch, as one process sees it.
        let mut batch = self.dp.gather_batch(&batch)?;
        let mask = batch.get("response_mask")?.shallow_clone();
        if let Some(entropy) = entropy {
            let entropy = self.dp.gather_rows(&entropy)?;
            metrics.insert(
                "actor/entropy".into(),
                self.actor.entropy_metric(&entropy, &mask)?,
            );
        }
        if let Some(rlp) = batch.opt("rollout_log_probs").filter(|_| !bypass) {
            let d = probs_diff(rlp, batch.get("old_log_probs")?, &mask);
            metrics.insert("training/rollout_probs_diff_max".into(), d.max);
            metrics.insert("training/rollout_probs_diff_mean".into(), d.mean);
            metrics.insert("training/rollout_probs_diff_std".into(), d.std);
            metrics.insert(
                "training/rollout_actor_probs_pearson_corr".into(),
                d.pearson,
            );
        }

        let adv_start = std::time::Instant::now();
        let scores_t = batch.get("token_level_scores")?.shallow_clone();
        let rewards = if self.spec.algorithm.kl_in_reward {
            let p = apply_kl_penalty(
                &scores_t,
                batch.get("old_log_probs")?,
                batch.get("ref_log_prob")?,
                &mask,
                self.kl_penalty,
                &mut self.kl_ctrl,
            )?;
            for (k, v) in p.metrics() {
                metrics.insert(k.into(), v);
            }
            p.token_level_rewards
        } else {
            scores_t
        };
        batch.insert("token_level_rewards", rewards.shallow_clone())?;
        // Rollout correction (decoupled mode), before the advantages as in verl: importance
        // weights for the policy loss, rejected tokens out of the response mask.
        let mut mask = mask;
        if let (Some(rc), Some(rollout_lp)) = (
            self.spec.algorithm.rollout_correction.clone(),
            batch.opt("rollout_log_probs").map(Tensor::shallow_clone),
        ) {
            let c = rollout_correction(batch.get("old_log_probs")?, &rollout_lp, &mask, &rc)?;
            if let Some(w) = c.weights {
                batch.insert("rollout_is_weights", w)?;
            }
            mask = c.response_mask;
            batch.insert("response_mask", mask.shallow_clone())?;
            metrics.extend(c.metrics);
        }
        let uids = Vec::<i64>::try_from(batch.get("uid")?)?;
        let index = GroupIndex::from_ids(&uids);
        let mut inputs = AdvantageInputs::new(&rewards, &mask).index(&index);
        let values = batch.opt("values").map(Tensor::shallow_clone);
        if let Some(v) = &values {
            inputs = inputs.values(v);
        }
        let baselines = batch.opt("reward_baselines").map(Tensor::shallow_clone);
        if let Some(b) = &baselines {
            inputs = inputs.reward_baselines(b);
        }
        let old_log_probs = batch.get("old_log_probs")?.shallow_clone();
        let sum_pi_squared = batch.opt("sum_pi_squared").map(Tensor::shallow_clone);
        if let Some(sq) = &sum_pi_squared {
            inputs = inputs.path_variance(&old_log_probs, sq);
        }
        let is_weights = batch.opt("rollout_is_weights").map(Tensor::shallow_clone);
        if let Some(w) = &is_weights {
            inputs = inputs.rollout_is_weights(w);
        }
        let gdpo = self.spec.algorithm.gdpo.clone();
        let components: Vec<Tensor> = match &gdpo {
            Some(g) => g
                .keys
                .iter()
                .map(|k| Ok(batch.get(&gdpo_column(k))?.shallow_clone()))
                .collect::<Result<_, TrainerError>>()?,
            None => Vec::new(),
        };
        if let Some(g) = &gdpo {
            inputs = inputs.components(Components {
                scores: &components,
                weights: g.weights.as_deref(),
            });
            for (key, values) in g.keys.iter().zip(&components) {
                metrics.extend(gdpo_metrics(key, values)?);
            }
        }
        let adv = compute_advantage(self.estimator, &inputs, &self.adv_cfg)?;
        batch.insert("advantages", adv.advantages)?;
        batch.insert("returns", adv.returns)?;
        if let Some(pf) = self.spec.algorithm.pf_ppo {
            // The same draw on every rank: the stream depends on the step only.
            let scores =
                batch
                    .get("token_level_scores")?
                    .f_sum_dim_intlist(-1i64, false, Kind::Float)?;
            let weights = pf_ppo_weights(&scores, pf.method, pf.weight_pow)?;
            let mut rng = Rng::new(self.sampling_seed(STREAM_PF_PPO, 0));
            let rows = pf_ppo_sample(&weights, batch.rows() as usize, &mut rng)?;
            batch = batch.select(&rows)?;
        }
        timers
            .0
            .insert("adv".into(), adv_start.elapsed().as_secs_f64());

        // The updates take this rank's rows; the engines average gradients over the ranks.
        let mut own_rows = self.dp.own_rows(&batch)?;
        Self::attach_images(train, &mut own_rows)?;
        own_rows.remove(PROMPT_ITEM);
        own_rows.remove("uid");
        own_rows.remove("reward_baselines");
        for key in self.spec.algorithm.gdpo.iter().flat_map(|g| &g.keys) {
            own_rows.remove(&gdpo_column(key));
        }
        if let Some(c) = self.critic.as_mut() {
            let m = timers.time("update_critic", || c.update_critic(&own_rows, step))?;
            metrics.extend(self.dp.mean_metrics(m)?);
        }
        if self.spec.run.critic_warmup <= step {
            let m = timers.time("update_actor", || self.actor.update_policy(&own_rows, step))?;
            metrics.extend(self.dp.mean_metrics(m)?);
        }
        if let Some(sq) = batch.opt("sum_pi_squared") {
            let inputs = VarianceInputs {
                old_log_probs: batch.get("old_log_probs")?,
                sum_pi_squared: sq,
                advantages: batch.get("advantages")?,
                response_mask: batch.get("response_mask")?,
                rollout_is_weights: batch.opt("rollout_is_weights"),
            };
            let grad_norm = metrics.get("actor/grad_norm").copied();
            for (k, v) in variance_proxy_metrics(&inputs, grad_norm)? {
                metrics.insert(k.into(), v);
            }
        }
        Ok(batch)
    }

    /// One generation round on `indices` (this rank's share): responses, group ids from
    /// `uid_base`, the ReMax baseline, scores (and GDPO's reward components). `round` > 0 are
    /// DAPO's refills. The rollout gets the policy's weights before generating and frees them
    /// before scoring, unless `held`: the caller loaded them for several rounds.
    fn rollout_round(
        &mut self,
        train: &RlDataset,
        indices: &[usize],
        uid_base: i64,
        round: u64,
        held: bool,
        timers: &mut Timers,
    ) -> Result<Batch, TrainerError> {
        // This data-parallel rank's prompts; `offset` makes their group ids global.
        let own = self.dp.chunk(indices.len())?;
        let offset = uid_base + own.start as i64;
        let items = train.batch(&indices[own]);
        let mut params = self.train_sampling.clone();
        // Refill rounds draw from their own streams; the first is the step's usual one.
        params.seed = self.sampling_seed(STREAM_ROLLOUT + (round << 8), self.dp.rank());
        if !held {
            timers.time("update_weights", || self.load_rollout())?;
        }
        let (mut batch, out) = timers.time("gen", || self.generate(&items, &params))?;
        if self.dp.size() > 1 {
            // One prompt width on every rank, so that the rows can be gathered.
            let width = self.dp.max(batch.get("prompts")?.size()[1])?;
            pad_prompts(&mut batch, width, self.stop.pad)?;
        }

        // REMAX baseline: the summed reward of a greedy rollout of each prompt.
        if self.estimator == AdvEstimator::Remax {
            let greedy = SamplingParams {
                do_sample: false,
                n: 1,
                ..params.clone()
            };
            let (_, gout) = timers.time("gen_max", || self.generate(&items, &greedy))?;
            let (scores, _) = self.train_scores(&items, &gout)?;
            let per_row: Vec<f32> = out.prompt_index.iter().map(|&p| scores[p] as f32).collect();
            batch.insert("reward_baselines", Tensor::from_slice(&per_row))?;
        }
        if !held {
            self.rollout.release()?;
        }
        let uids: Vec<i64> = out
            .prompt_index
            .iter()
            .map(|&p| offset + p as i64)
            .collect();
        self.label_generated(&items, &mut batch, &out, &uids, timers)?;
        Ok(batch)
    }

    /// What a generated batch carries besides the rollout's tensors: the rollout's
    /// log-probs, each row's group id (`uids`, one per row), the teacher a row goes to, and
    /// its scores (with GDPO's and the group filter's reward components).
    fn label_generated(
        &mut self,
        items: &[&PromptItem],
        batch: &mut Batch,
        out: &RolloutOutput,
        uids: &[i64],
        timers: &mut Timers,
    ) -> Result<(), TrainerError> {
        if self.spec.rollout.calculate_log_probs {
            batch.insert("rollout_log_probs", out.rollout_log_probs.shallow_clone())?;
        }
        batch.insert("uid", Tensor::from_slice(uids))?;
        if let Some(t) = self.teachers.as_ref().filter(|t| t.routed()) {
            let which = out
                .prompt_index
                .iter()
                .map(|&p| t.route(&items[p].sample.data_source))
                .collect::<Result<Vec<i64>, _>>()?;
            batch.insert(TEACHER_COLUMN, Tensor::from_slice(&which))?;
        }
        let (scores, details) = timers.time("reward", || self.train_scores(items, out))?;
        if let Some(g) = &self.spec.algorithm.gdpo {
            for key in &g.keys {
                let values = reward_component(key, "GDPO reward key", &details)?;
                batch.insert(&gdpo_column(key), values)?;
            }
        }
        if let Some(FilterGroupsSpec {
            metric: GroupMetric::Extra(key),
            ..
        }) = &self.spec.algorithm.filter_groups
        {
            let values = reward_component(key, "algorithm.filter_groups.metric", &details)?;
            batch.insert(GROUP_METRIC, values)?;
        }
        let mask = batch.get("response_mask")?.shallow_clone();
        batch.insert(
            "token_level_scores",
            token_level_rewards_of(&scores, &details, &mask)?,
        )?;
        Ok(())
    }

    /// DAPO's dynamic sampling (verl 0.9's `algorithm.filter_groups`): prompt groups whose
    /// metric is the same for every response carry no signal and are dropped; fresh prompts from
    /// the sampler are generated and scored until `indices.len()` groups remain, then the first
    /// that many (in generation order) train, split evenly over the data-parallel ranks again.
    fn dynamic_sampling(
        &mut self,
        train: &RlDataset,
        indices: &[usize],
        f: &FilterGroupsSpec,
        timers: &mut Timers,
        metrics: &mut Metrics,
    ) -> Result<Batch, TrainerError> {
        // The groups the step trains on (the first round's prompts may be more: the legacy
        // trainer's gen_batch_size).
        let target = self.spec.data.train_batch_size as i64;
        let mut kept: Vec<Batch> = Vec::new();
        let (mut total, mut evicted, mut uid_base, mut round) = (0i64, 0i64, 0i64, 0u64);
        let mut prompts = indices.to_vec();
        // The weights do not change between rounds: one sync for all of them.
        timers.time("update_weights", || self.load_rollout())?;
        loop {
            let b = self.rollout_round(train, &prompts, uid_base, round, true, timers)?;
            uid_base += prompts.len() as i64;
            round += 1;
            let (rows, groups, dropped) = varying_groups(&b, &f.metric)?;
            kept.push(b.select(&rows)?);
            total += self.dp.sum(groups)?;
            evicted += self.dp.sum(dropped)?;
            if total >= target {
                break;
            }
            if f.max_rounds > 0 && round >= f.max_rounds as u64 {
                return Err(TrainerError::Config(format!(
                    "algorithm.filter_groups: after {round} generation rounds only {total} of {target} prompt groups have a varying `{}` (max_num_gen_batches={}); the prompts may be too easy or too hard for the policy: raise max_num_gen_batches (0 is no limit) or check the data and reward",
                    metric_name(&f.metric),
                    f.max_rounds
                )));
            }
            // The missing groups, rounded up to whole prompts per rank.
            let per = self.dp.size();
            let missing = usize::try_from(target - total).unwrap_or(0).div_ceil(per) * per;
            prompts = self.sampler.next_prompts(missing, &self.dp)?;
        }
        self.rollout.release()?;
        metrics.insert(
            "training/filter_groups/num_gen_batches".into(),
            round as f64,
        );
        metrics.insert(
            "training/filter_groups/evicted_samples".into(),
            evicted as f64,
        );
        metrics.insert(
            "training/filter_groups/discarded_surplus_samples".into(),
            (total - target) as f64,
        );
        // Every rank's kept rows, the first `target` groups of them, this rank's share.
        let width = kept
            .iter()
            .map(|b| b.get("prompts").map(|p| p.size()[1]))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .max()
            .unwrap_or(0);
        let width = self.dp.max(width)?;
        for b in &mut kept {
            pad_prompts(b, width, self.stop.pad)?;
        }
        let local = Batch::cat(&kept)?;
        let all = self.dp.gather_uneven(&local)?;
        let first = first_groups(all.get("uid")?, target as usize)?;
        let mut selected = all.select(&first)?;
        selected.remove(GROUP_METRIC);
        let mut own = self.dp.own_rows(&selected)?;
        Self::attach_images(train, &mut own)?;
        Ok(own)
    }

    /// `trainer.rollout_data_dir`: one JSONL file per step with input, output, score.
    fn dump_generations(&self, dir: &str, batch: &Batch) -> Result<(), TrainerError> {
        let dir = absolute(dir);
        let io = |e: std::io::Error, p: &Path| TrainerError::Checkpoint {
            path: p.to_path_buf(),
            msg: e.to_string(),
        };
        std::fs::create_dir_all(&dir).map_err(|e| io(e, &dir))?;
        let path = dir.join(format!("{}.jsonl", self.global_step));
        let mut f = std::fs::File::create(&path).map_err(|e| io(e, &path))?;
        let decode = |t: &Tensor, mask: &Tensor| -> Result<Vec<String>, TrainerError> {
            let rows = t.size()[0];
            (0..rows)
                .map(|i| {
                    let ids = Vec::<i64>::try_from(
                        t.get(i)
                            .f_masked_select(&mask.get(i).f_to_kind(Kind::Bool)?)?,
                    )?;
                    Ok(self.tokenizer.decode(&ids, true)?)
                })
                .collect()
        };
        let r = batch.get("responses")?.size()[1];
        let attn = batch.get("attention_mask")?;
        let inputs = decode(
            batch.get("prompts")?,
            &attn.f_narrow(1, 0, attn.size()[1] - r)?,
        )?;
        let outputs = decode(batch.get("responses")?, batch.get("response_mask")?)?;
        let scores = Vec::<f64>::try_from(batch.get("token_level_scores")?.f_sum_dim_intlist(
            -1i64,
            false,
            Kind::Double,
        )?)?;
        for ((i, o), s) in inputs.iter().zip(&outputs).zip(&scores) {
            let line = json!({"input": i, "output": o, "score": s, "step": self.global_step});
            writeln!(f, "{line}").map_err(|e| io(e, &path))?;
        }
        Ok(())
    }

    /// verl's `_validate`: generate with `val_kwargs` for the validation set and score.
    pub fn validate(&mut self) -> Result<Metrics, TrainerError> {
        let Some(val) = self.val.take() else {
            return Ok(Metrics::new());
        };
        let result = self.validate_on(&val);
        self.val = Some(val);
        result
    }

    fn validate_on(&mut self, val: &RlDataset) -> Result<Metrics, TrainerError> {
        let mut params = self.val_sampling.clone();
        params.seed = self.sampling_seed(STREAM_VAL, 0);
        let bs = self.spec.data.val_batch_size.unwrap_or(val.len());
        let mut records = Vec::new();
        let all: Vec<usize> = (0..val.len()).collect();
        self.load_rollout()?;
        for chunk in all.chunks(bs) {
            let items = val.batch(chunk);
            if ends_validation(self.reward_model.is_some(), items.first().copied()) {
                self.rollout.release()?;
                return Ok(Metrics::new());
            }
            let (_, out) = self.generate(&items, &params)?;
            let (_, score_items, scores) = self.score_for_validation(&items, &out)?;
            for ((row, it), s) in out.prompt_index.iter().zip(&score_items).zip(&scores) {
                let mut vars = std::collections::BTreeMap::new();
                vars.insert("reward".to_owned(), s.score);
                for (k, v) in &s.extra {
                    if let Some(x) = match v {
                        Value::Number(n) => n.as_f64(),
                        Value::Bool(b) => Some(f64::from(u8::from(*b))),
                        _ => None,
                    } {
                        vars.insert(k.clone(), x);
                    }
                }
                records.push(ValRecord {
                    data_source: it.data_source.clone(),
                    prompt: chunk[*row],
                    vars,
                });
            }
        }
        self.rollout.release()?;
        Ok(validation_metrics(&records, params.n))
    }
}

/// The batch column of GDPO's reward component `key`.
fn gdpo_column(key: &str) -> String {
    format!("gdpo/{key}")
}

/// The reward function's output `key` of every response (`[N]`, f32; GDPO's components, DAPO's
/// group metric): a number or a bool (verl takes them as float32); a response without it is
/// an error naming the keys it has (verl's assertion, at the same point).
fn reward_component(key: &str, what: &str, scores: &[Score]) -> Result<Tensor, TrainerError> {
    let mut values = Vec::with_capacity(scores.len());
    for s in scores {
        let v = match s.extra.get(key) {
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::Bool(b)) => Some(f64::from(u8::from(*b))),
            _ => None,
        };
        let Some(v) = v else {
            let have: Vec<&str> = s.extra.keys().map(String::as_str).collect();
            return Err(TrainerError::Config(format!(
                "{what} `{key}` is not a number in the reward function's result (its other keys: {}); it must name a key compute_score returns",
                if have.is_empty() {
                    "none".to_owned()
                } else {
                    have.join(", ")
                }
            )));
        };
        values.push(v as f32);
    }
    Ok(Tensor::from_slice(&values))
}

/// verl's `gdpo/{key}/{mean,std,max,min}` over the batch (population std, as numpy's).
fn gdpo_metrics(key: &str, values: &Tensor) -> Result<Metrics, TrainerError> {
    let v = Vec::<f64>::try_from(values.f_to_kind(Kind::Double)?)?;
    let mut m = Metrics::new();
    if v.is_empty() {
        return Ok(m);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    m.insert(format!("gdpo/{key}/mean"), mean);
    m.insert(format!("gdpo/{key}/std"), std);
    m.insert(
        format!("gdpo/{key}/max"),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    m.insert(
        format!("gdpo/{key}/min"),
        v.iter().copied().fold(f64::INFINITY, f64::min),
    );
    Ok(m)
}

/// The batch column of DAPO's group metric when it is a key of the reward function's result.
const GROUP_METRIC: &str = "filter_groups/metric";

fn metric_name(m: &GroupMetric) -> &str {
    match m {
        GroupMetric::Score => "reward",
        GroupMetric::Extra(k) => k,
    }
}

/// The rows of `batch`'s groups (by `uid`) whose metric varies, with the numbers of groups
/// kept and dropped. A group of one response is kept (as verl: no spread to measure).
fn varying_groups(
    batch: &Batch,
    metric: &GroupMetric,
) -> Result<(Vec<i64>, i64, i64), TrainerError> {
    let (mut rows, mut kept, mut dropped) = (Vec::new(), 0, 0);
    for (_, members, flat) in group_spread(batch, metric)? {
        if flat {
            dropped += 1;
        } else {
            kept += 1;
            rows.extend(members.iter().map(|&i| i as i64));
        }
    }
    rows.sort_unstable();
    Ok((rows, kept, dropped))
}

/// The group ids (`uid`) of `batch`'s groups whose metric is the same for every response.
pub(super) fn flat_groups(batch: &Batch, metric: &GroupMetric) -> Result<Vec<i64>, TrainerError> {
    Ok(group_spread(batch, metric)?
        .into_iter()
        .filter(|(_, _, flat)| *flat)
        .map(|(uid, _, _)| uid)
        .collect())
}

/// Each group of `batch` (by `uid`): its id, its rows, and whether its metric is the same for
/// every response (never for a group of one).
fn group_spread(
    batch: &Batch,
    metric: &GroupMetric,
) -> Result<Vec<(i64, Vec<usize>, bool)>, TrainerError> {
    let values = match metric {
        GroupMetric::Score => {
            batch
                .get("token_level_scores")?
                .f_sum_dim_intlist(-1i64, false, Kind::Double)?
        }
        GroupMetric::Extra(_) => batch.get(GROUP_METRIC)?.f_to_kind(Kind::Double)?,
    };
    let values = Vec::<f64>::try_from(values)?;
    let uids = Vec::<i64>::try_from(batch.get("uid")?)?;
    let index = GroupIndex::from_ids(&uids);
    Ok(index
        .groups()
        .map(|members| {
            let first = values[members[0]];
            let flat = members.len() > 1 && members.iter().all(|&i| values[i] == first);
            (uids[members[0]], members.to_vec(), flat)
        })
        .collect())
}

/// The rows of the first `n` groups of a gathered batch, in row order.
fn first_groups(uid: &Tensor, n: usize) -> Result<Vec<i64>, TrainerError> {
    let uids = Vec::<i64>::try_from(uid)?;
    let index = GroupIndex::from_ids(&uids);
    let mut rows: Vec<i64> = index
        .groups()
        .take(n)
        .flat_map(|m| m.iter().map(|&i| i as i64))
        .collect();
    rows.sort_unstable();
    Ok(rows)
}

/// A reward error that names one response, with the data file and row of its prompt and what
/// was scored (a user's reward code fails on some responses only: the sample is the clue).
fn on_sample(
    e: RewardError,
    items: &[&PromptItem],
    out: &RolloutOutput,
    scored: &[ScoreItem],
) -> TrainerError {
    let RewardError::Sample { index, source } = e else {
        return e.into();
    };
    let (Some(it), Some(prompt)) = (
        scored.get(index),
        out.prompt_index.get(index).and_then(|&p| items.get(p)),
    ) else {
        return (*source).into();
    };
    const SHOWN: usize = 300;
    let mut response: String = it.solution_str.chars().take(SHOWN).collect();
    if it.solution_str.chars().nth(SHOWN).is_some() {
        response.push_str("...");
    }
    TrainerError::RewardSample {
        file: prompt.source.clone(),
        row: prompt.row,
        data_source: it.data_source.clone(),
        ground_truth: it.ground_truth.to_string(),
        response,
        source,
    }
}

/// The batch of a generation (verl's repeat + union): sequences, masks and the agent loop's
/// per-row counts.
/// The batch column of each row's prompt's place in the training set (vision-language rows).
pub(super) const PROMPT_ITEM: &str = "prompt_item";

/// A batch as verl hands it to a reward manager: `prompts`, `responses`, `attention_mask` and
/// `response_mask`, and each row's sample fields (`data_source` also under `reward_fn_key`,
/// `reward_model`, `extra_info` as the scorer sees it, `raw_prompt`, `ability`, `index`, and
/// the agent loop's `__num_turns__`).
fn manager_batch(
    items: &[&PromptItem],
    out: &RolloutOutput,
    score_items: &[ScoreItem],
    reward_fn_key: &str,
) -> Result<Value, TrainerError> {
    let mut tensors = serde_json::Map::new();
    for (name, t) in [
        ("prompts", &out.prompts),
        ("responses", &out.responses),
        ("attention_mask", &out.attention_mask),
        ("response_mask", &out.response_mask),
    ] {
        tensors.insert(name.into(), prompts::tensor_json(t)?);
    }
    let mut columns: Vec<(String, Vec<Value>)> = [
        "data_source",
        "reward_model",
        "extra_info",
        "raw_prompt",
        "ability",
        "index",
    ]
    .iter()
    .map(|k| (k.to_string(), Vec::new()))
    .collect();
    if reward_fn_key != "data_source" {
        columns.push((reward_fn_key.to_owned(), Vec::new()));
    }
    let agent = !out.num_turns.is_empty();
    if agent {
        columns.push(("__num_turns__".into(), Vec::new()));
    }
    for (row, (&p, it)) in out.prompt_index.iter().zip(score_items).enumerate() {
        let s = &items[p].sample;
        for (name, col) in &mut columns {
            col.push(match name.as_str() {
                "reward_model" => json!({"style": s.reward_model.style, "ground_truth": s.reward_model.ground_truth}),
                "extra_info" => Value::Object(it.extra_info.clone()),
                "raw_prompt" => serde_json::to_value(&s.prompt).unwrap_or(Value::Null),
                "ability" => json!(s.ability),
                "index" => json!(s.index),
                "__num_turns__" => json!(out.num_turns.get(row)),
                _ => json!(s.data_source),
            });
        }
    }
    let non_tensors: serde_json::Map<String, Value> = columns
        .into_iter()
        .map(|(k, v)| (k, Value::Array(v)))
        .collect();
    Ok(json!({"tensors": tensors, "non_tensors": non_tensors, "meta_info": {}}))
}

/// Labels each row with its prompt's place in the training set (`prompt_item`): after a
/// gather over ranks, rows find their prompt's images and sample by it. Rows of prompts with
/// images carry them too (verl's `multi_modal_data`; a gather drops them and
/// [`Trainer::attach_images`] finds them again by `prompt_item`).
pub(super) fn label_prompt_items(
    batch: &mut Batch,
    items: &[&PromptItem],
    prompt_index: &[usize],
) -> Result<(), TrainerError> {
    let index = prompt_index
        .iter()
        .map(|&p| {
            items
                .get(p)
                .map(|it| it.index as i64)
                .ok_or_else(|| bad(format!("generated row of prompt {p}: no such prompt")))
        })
        .collect::<Result<Vec<i64>, _>>()?;
    batch.insert(PROMPT_ITEM, Tensor::from_slice(&index))?;
    if items.iter().any(|it| !it.images.is_empty()) {
        let rows = prompt_index
            .iter()
            .map(|&p| items[p].images.clone())
            .collect();
        batch.set_images(rows)?;
    }
    Ok(())
}

/// One turn generated for `items` on `rollout`, a vision-language prompt prefilled with its
/// images (the synchronous loop's and the asynchronous rollout thread's).
pub(super) fn generate_prompt_items(
    rollout: &RolloutWorker,
    items: &[&PromptItem],
    params: &SamplingParams,
    stop: &StopTokens,
) -> Result<RolloutOutput, TrainerError> {
    let prompts: Vec<Vec<i64>> = items.iter().map(|it| it.input_ids.clone()).collect();
    let images = prompt_images(items.iter().copied());
    Ok(rollout.generate_images(&prompts, &images, params, stop)?)
}

/// The images of each of `items` in order, as the rollout takes them: empty when none has
/// any (a text batch).
pub(super) fn prompt_images<'a>(
    items: impl Iterator<Item = &'a PromptItem> + Clone,
) -> Vec<RowImages> {
    if items.clone().any(|it| !it.images.is_empty()) {
        items.map(|it| it.images.clone()).collect()
    } else {
        Vec::new()
    }
}

pub(super) fn rollout_batch(out: &RolloutOutput) -> Result<Batch, TrainerError> {
    let mut b = Batch::new();
    for (column, counts) in [
        (super::metrics::NUM_TURNS, &out.num_turns),
        (super::metrics::TOOL_CALLS, &out.tool_calls),
        (super::metrics::TOOL_FAILURES, &out.tool_failures),
    ] {
        if !counts.is_empty() {
            let v: Vec<f64> = counts.iter().map(|&t| t as f64).collect();
            b.insert(column, Tensor::from_slice(&v))?;
        }
    }
    b.insert("prompts", out.prompts.shallow_clone())?;
    b.insert("responses", out.responses.shallow_clone())?;
    b.insert("input_ids", out.input_ids.shallow_clone())?;
    b.insert("attention_mask", out.attention_mask.shallow_clone())?;
    b.insert("position_ids", out.position_ids.shallow_clone())?;
    b.insert("response_mask", out.response_mask.f_to_kind(Kind::Float)?)?;
    Ok(b)
}

/// Where rank `rank` of `ranks` runs its replicas of a rollout pool of `pool` processes: pool
/// replica `j` belongs to rank `j % ranks` (every rank has one at least: the lowering refuses
/// a smaller pool). On CUDA the pool's devices follow the trainer's `per_node` ones on each
/// node (replica `m` of a rank with node-local rank `l`: `per_node × (m + 1) + l`), as verl's
/// resource pools put the rollout on GPUs of its own. Each replica gets the rank's intra-op
/// threads, but no more than its share of the cores among the ranks and replicas (spinning
/// OpenMP threads of a rank and a replica on the same cores made a step three times slower
/// on 2 cores).
fn replica_places(
    (rank, ranks): (usize, usize),
    per_node: usize,
    pool: usize,
    device: tch::Device,
) -> Vec<ReplicaPlace> {
    let own = usize::try_from(tch::get_num_threads()).unwrap_or(1);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = own.min(cores / (ranks + pool).max(1)).max(1);
    let local = rank % per_node.max(1);
    (rank..pool)
        .step_by(ranks.max(1))
        .enumerate()
        .map(|(m, _)| ReplicaPlace {
            device: match device {
                tch::Device::Cuda(_) => tch::Device::Cuda(per_node * (m + 1) + local),
                other => other,
            },
            threads,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::replica_places;

    #[test]
    fn pool_replicas_are_shared_out_among_the_ranks() {
        let count =
            |rank, ranks, pool| replica_places((rank, ranks), ranks, pool, Device::Cpu).len();
        assert_eq!(count(0, 1, 1), 1);
        assert_eq!(count(0, 1, 2), 2);
        // Five replicas over two ranks: 0, 2, 4 and 1, 3.
        assert_eq!((count(0, 2, 5), count(1, 2, 5)), (3, 2));
        // On CUDA a rank's replicas sit on the node's devices after the trainer's: node-local
        // rank 1 of 2 per node, its replicas the second and fourth of the pool's.
        let devices: Vec<Device> = replica_places((1, 2), 2, 4, Device::Cuda(1))
            .iter()
            .map(|p| p.device)
            .collect();
        assert_eq!(devices, [Device::Cuda(3), Device::Cuda(5)]);
        assert!(
            replica_places((0, 1), 1, 1, Device::Cpu)
                .iter()
                .all(|p| p.threads >= 1)
        );
    }
}

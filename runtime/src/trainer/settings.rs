//! From the typed config ([`VerlConfig`]) to the settings of the engines and workers: batch
//! sizes in responses, micro-batch fallbacks (deprecated global keys, token budgets of
//! `use_dynamic_bsz`), optimizer and scheduler, loss options, sampling parameters.

use std::str::FromStr;

use serde::Serialize;
use verlc::config::{ActorConfig, OptimConfig, SamplingConfig, VerlConfig};
use verlc::plan::PrecisionKind;

use crate::algo::{AdvEstimator, KlEstimator, LossAggMode, PolicyLossConfig, PolicyLossMode};
use crate::engine::{OptimSettings, SchedulerSettings};
use crate::model::Precision as ParamDtype;
use crate::optim::sched::{LrDecayStyle, MegatronSchedulerConfig, VerlSchedule, VerlSchedulerConfig, WdIncrStyle};
use crate::optim::{AdamWConfig, InnerConfig, SgdConfig};
use crate::rollout::{LogProbPath, SamplingParams};
use crate::workers::actor::ActorSettings;
use crate::workers::critic::CriticSettings;

use super::TrainerError;

fn bad(msg: impl Into<String>) -> TrainerError {
    TrainerError::Config(msg.into())
}

/// verl's spelling of a config enum (its serde name).
pub fn spelling<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

fn positive(key: &str, v: i64) -> Result<usize, TrainerError> {
    usize::try_from(v).ok().filter(|&n| n > 0).ok_or_else(|| bad(format!("{key} must be positive, got {v}")))
}

/// Parameter dtype of the trainable models for a precision binding.
pub fn param_dtype(p: PrecisionKind) -> ParamDtype {
    match p {
        PrecisionKind::Fp32 => ParamDtype::Fp32,
        PrecisionKind::Bf16Mixed => ParamDtype::Bf16,
        PrecisionKind::Fp16Mixed => ParamDtype::Fp16,
    }
}

/// The engine seed of the actor (`fsdp_config.seed` / `megatron.seed`, 42 by default): it
/// initialises built-in models and fresh value heads.
pub fn model_seed(actor: &ActorConfig) -> u64 {
    let s = actor.fsdp_config.as_ref().map(|f| f.seed).or(actor.megatron.as_ref().map(|m| m.seed)).unwrap_or(42);
    s as u64
}

/// Rows of a micro-batch: the per-GPU key, else the deprecated global key over the world,
/// else (dynamic batch size) as many sequences as fit the token budget.
fn micro_batch(
    what: &str,
    per_gpu: Option<i64>,
    global: Option<i64>,
    world: usize,
    dynamic: bool,
    max_tokens: i64,
    seq_len: usize,
) -> Result<usize, TrainerError> {
    if let Some(n) = per_gpu {
        return positive(&format!("{what}_per_gpu"), n);
    }
    if let Some(n) = global {
        return Ok(positive(what, n)?.div_ceil(world).max(1));
    }
    if dynamic {
        return Ok((max_tokens.max(1) as usize / seq_len.max(1)).max(1));
    }
    Err(bad(format!("set {what}_per_gpu (or use_dynamic_bsz=true)")))
}

/// The optimizer and scheduler of `optim` for `total_steps` training steps.
pub fn optim_settings(key: &str, o: &OptimConfig, total_steps: u64, offload: bool) -> Result<OptimSettings, TrainerError> {
    let inner = match o.optimizer.to_ascii_lowercase().as_str() {
        "adamw" => InnerConfig::AdamW(AdamWConfig { beta1: o.betas[0], beta2: o.betas[1], eps: 1e-8 }),
        // Megatron's `adam` decays weights decoupled (its OptimizerConfig defaults
        // decoupled_weight_decay=True, which verl's megatron optim does not expose): AdamW.
        "adam" if o.weight_decay == 0.0 || o.lr_decay_style.is_some() => {
            InnerConfig::AdamW(AdamWConfig { beta1: o.betas[0], beta2: o.betas[1], eps: 1e-8 })
        }
        "sgd" => InnerConfig::Sgd(SgdConfig { momentum: 0.0, dampening: 0.0, nesterov: false }),
        other => {
            return Err(bad(format!(
                "{key}.optimizer `{other}` is not supported by verlc's engines (AdamW, SGD; Adam without weight decay)"
            )));
        }
    };
    let total = total_steps as i64;
    let scheduler = if let Some(style) = o.lr_decay_style {
        // Megatron flavour: OptimizerParamScheduler counted in optimizer steps.
        let lr = o.lr;
        let min_lr = o.min_lr.unwrap_or(0.0);
        let warmup = match o.lr_warmup_steps {
            Some(w) if w > 0 => w as f64,
            _ => (o.lr_warmup_steps_ratio * total as f64).floor(),
        };
        let decay = o.lr_decay_steps.map(|d| d as f64).unwrap_or(total as f64).max(warmup + 1.0);
        let style = match spelling(&style).as_str() {
            "constant" => LrDecayStyle::Constant,
            "linear" => LrDecayStyle::Linear,
            "cosine" => LrDecayStyle::Cosine,
            "inverse-square-root" => LrDecayStyle::InverseSquareRoot,
            other => return Err(bad(format!("{key}.lr_decay_style `{other}` is not supported by the single-process engine"))),
        };
        SchedulerSettings::Megatron(MegatronSchedulerConfig {
            init_lr: o.lr_warmup_init.unwrap_or(0.0),
            max_lr: lr,
            min_lr,
            lr_warmup_steps: warmup,
            lr_decay_steps: decay,
            lr_decay_style: style,
            start_wd: o.weight_decay,
            end_wd: o.weight_decay,
            wd_incr_steps: decay,
            wd_incr_style: WdIncrStyle::Constant,
            wsd_decay_steps: None,
            lr_wsd_decay_style: None,
        })
    } else {
        let kind = o.lr_scheduler_type.or(o.warmup_style).map(|k| spelling(&k)).unwrap_or_else(|| "constant".into());
        let schedule = match kind.as_str() {
            "constant" => VerlSchedule::Constant,
            "cosine" => VerlSchedule::Cosine { min_lr_ratio: o.min_lr_ratio.unwrap_or(0.0), num_cycles: o.num_cycles.unwrap_or(0.5) },
            other => return Err(bad(format!("{key}.lr_scheduler_type `{other}` is not supported"))),
        };
        SchedulerSettings::Verl(VerlSchedulerConfig {
            schedule,
            lr_warmup_steps: o.lr_warmup_steps.unwrap_or(-1),
            lr_warmup_steps_ratio: o.lr_warmup_steps_ratio,
            total_training_steps: total,
        })
    };
    let clip = o.grad_clip.unwrap_or(o.clip_grad);
    Ok(OptimSettings { inner, lr: o.lr, weight_decay: o.weight_decay, clip_grad: clip, offload, scheduler })
}

/// `rollout.n`.
pub fn rollout_n(cfg: &VerlConfig) -> Result<usize, TrainerError> {
    positive("actor_rollout_ref.rollout.n", cfg.actor_rollout_ref.rollout.n)
}

fn world(cfg: &VerlConfig) -> usize {
    (cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node).max(1) as usize
}

/// The data-parallel size of a role: the world, over Megatron's model-parallel ranks
/// (tensor × pipeline × context) when the role runs Megatron.
fn data_parallel(cfg: &VerlConfig, megatron: Option<&verlc::config::engine::MegatronEngineConfig>) -> usize {
    let w = world(cfg);
    match megatron.filter(|_| cfg.flavour() == verlc::config::Flavour::Megatron) {
        Some(m) => {
            let mp = (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size).max(1) as usize;
            (w / mp).max(1)
        }
        None => w,
    }
}

fn seq_len(cfg: &VerlConfig) -> usize {
    (cfg.data.max_prompt_length + cfg.data.max_response_length).max(1) as usize
}

/// The actor's update settings.
pub fn actor_settings(cfg: &VerlConfig) -> Result<ActorSettings, TrainerError> {
    let a = &cfg.actor_rollout_ref.actor;
    let r = &cfg.actor_rollout_ref.rollout;
    let n = rollout_n(cfg)?;
    let w = data_parallel(cfg, a.megatron.as_ref());
    let mini = positive("actor.ppo_mini_batch_size", a.ppo_mini_batch_size)? * n / w;
    let micro = micro_batch(
        "actor_rollout_ref.actor.ppo_micro_batch_size",
        a.ppo_micro_batch_size_per_gpu,
        a.ppo_micro_batch_size,
        w,
        a.use_dynamic_bsz,
        a.ppo_max_token_len_per_gpu,
        seq_len(cfg),
    )?;
    let log_prob_micro = micro_batch(
        "actor_rollout_ref.rollout.log_prob_micro_batch_size",
        r.log_prob_micro_batch_size_per_gpu,
        r.log_prob_micro_batch_size,
        w,
        true,
        r.log_prob_max_token_len_per_gpu,
        seq_len(cfg),
    )?;
    let mode = spelling(&a.policy_loss.loss_mode);
    if mode == "bypass_mode" {
        return Err(bad("actor.policy_loss.loss_mode=bypass_mode (rollout correction) is not supported yet"));
    }
    let pl = &a.policy_loss;
    Ok(ActorSettings {
        ppo_mini_batch_size: mini.max(1),
        ppo_micro_batch_size: micro,
        log_prob_micro_batch_size: log_prob_micro,
        ppo_epochs: positive("actor.ppo_epochs", a.ppo_epochs)?,
        shuffle: a.shuffle,
        data_loader_seed: a.data_loader_seed as u64,
        loss_mode: PolicyLossMode::from_str(&mode)?,
        policy_loss: PolicyLossConfig {
            clip_ratio: a.clip_ratio,
            clip_ratio_low: Some(a.clip_ratio_low),
            clip_ratio_high: Some(a.clip_ratio_high),
            clip_ratio_c: a.clip_ratio_c,
            tau_pos: a.tau_pos,
            tau_neg: a.tau_neg,
            clip_cov_ratio: pl.clip_cov_ratio,
            clip_cov_lb: pl.clip_cov_lb,
            clip_cov_ub: pl.clip_cov_ub,
            kl_cov_ratio: pl.kl_cov_ratio,
            ppo_kl_coef: pl.ppo_kl_coef,
        },
        loss_agg_mode: LossAggMode::from_str(&spelling(&a.loss_agg_mode))?,
        entropy_coeff: a.entropy_coeff,
        calculate_entropy: a.calculate_entropy,
        use_kl_loss: a.use_kl_loss,
        kl_loss_coef: a.kl_loss_coef,
        kl_loss_type: KlEstimator::from_str(&spelling(&a.kl_loss_type))?,
        temperature: r.temperature,
    })
}

/// The critic's update settings.
pub fn critic_settings(cfg: &VerlConfig) -> Result<CriticSettings, TrainerError> {
    let c = &cfg.critic;
    let n = rollout_n(cfg)?;
    let w = data_parallel(cfg, c.megatron.as_ref());
    let micro = micro_batch(
        "critic.ppo_micro_batch_size",
        c.ppo_micro_batch_size_per_gpu,
        c.ppo_micro_batch_size,
        w,
        c.use_dynamic_bsz,
        c.ppo_max_token_len_per_gpu,
        seq_len(cfg),
    )?;
    let forward = micro_batch(
        "critic.forward_micro_batch_size",
        c.forward_micro_batch_size_per_gpu,
        c.forward_micro_batch_size,
        w,
        true,
        c.forward_max_token_len_per_gpu,
        seq_len(cfg),
    )?;
    Ok(CriticSettings {
        ppo_mini_batch_size: (positive("critic.ppo_mini_batch_size", c.ppo_mini_batch_size)? * n / w).max(1),
        ppo_micro_batch_size: micro,
        forward_micro_batch_size: forward,
        ppo_epochs: positive("critic.ppo_epochs", c.ppo_epochs)?,
        shuffle: c.shuffle,
        data_loader_seed: c.data_loader_seed.unwrap_or(cfg.actor_rollout_ref.actor.data_loader_seed) as u64,
        cliprange_value: c.cliprange_value,
        loss_agg_mode: LossAggMode::from_str(&spelling(&c.loss_agg_mode))?,
    })
}

/// The reference's micro-batch.
pub fn ref_micro_batch(cfg: &VerlConfig) -> Result<usize, TrainerError> {
    let r = &cfg.actor_rollout_ref.reference;
    micro_batch(
        "actor_rollout_ref.ref.log_prob_micro_batch_size",
        r.log_prob_micro_batch_size_per_gpu,
        r.log_prob_micro_batch_size,
        world(cfg),
        true,
        r.log_prob_max_token_len_per_gpu,
        seq_len(cfg),
    )
}

/// The advantage estimator.
pub fn adv_estimator(cfg: &VerlConfig) -> Result<AdvEstimator, TrainerError> {
    Ok(AdvEstimator::from_str(&spelling(&cfg.algorithm.adv_estimator))?)
}

/// verl's `need_critic`: `gae`, or `critic.enable: true`.
pub fn need_critic(cfg: &VerlConfig) -> Result<bool, TrainerError> {
    Ok(match cfg.critic.enable {
        Some(e) => e,
        None => adv_estimator(cfg)? == AdvEstimator::Gae,
    })
}

/// verl's `need_reference_policy`: the KL loss or the in-reward KL penalty.
pub fn need_reference(cfg: &VerlConfig) -> bool {
    cfg.actor_rollout_ref.actor.use_kl_loss || cfg.algorithm.use_kl_in_reward
}

/// Training-time sampling (`rollout.*`).
pub fn train_sampling(cfg: &VerlConfig) -> Result<SamplingParams, TrainerError> {
    let r = &cfg.actor_rollout_ref.rollout;
    let p = SamplingParams {
        do_sample: r.do_sample,
        temperature: r.temperature,
        top_k: r.top_k,
        top_p: r.top_p,
        n: rollout_n(cfg)?,
        max_new_tokens: positive("rollout.response_length", r.response_length)?,
        seed: 0,
        ignore_eos: r.ignore_eos,
        log_prob_path: LogProbPath::Decode,
        max_prompts_per_pass: None,
        log_prob_micro_batch: 16,
    };
    p.validate().map_err(|m| bad(format!("actor_rollout_ref.rollout: {m}")))?;
    Ok(p)
}

/// Validation sampling (`rollout.val_kwargs`).
pub fn val_sampling(cfg: &VerlConfig) -> Result<SamplingParams, TrainerError> {
    let v: &SamplingConfig = &cfg.actor_rollout_ref.rollout.val_kwargs;
    let mut p = train_sampling(cfg)?;
    p.do_sample = v.do_sample;
    p.temperature = v.temperature;
    p.top_k = v.top_k;
    p.top_p = v.top_p;
    p.n = positive("rollout.val_kwargs.n", v.n)?;
    p.validate().map_err(|m| bad(format!("actor_rollout_ref.rollout.val_kwargs: {m}")))?;
    Ok(p)
}

/// `rollout.dtype` (`auto`: the trainer's parameter dtype).
pub fn rollout_dtype(cfg: &VerlConfig, trainer: ParamDtype) -> ParamDtype {
    match spelling(&cfg.actor_rollout_ref.rollout.dtype).as_str() {
        "bfloat16" => ParamDtype::Bf16,
        "float16" | "half" => ParamDtype::Fp16,
        "float32" | "float" => ParamDtype::Fp32,
        _ => trainer,
    }
}

//! Lowering a checked SFT config to the [`SftSpec`] a generated trainer runs.
//!
//! The binding comes from the engine section as for an RL actor: `engine.strategy` (`fsdp`,
//! `fsdp2`; a Megatron engine section) and the precision (`engine.mixed_precision.param_dtype`
//! when set, else `engine.dtype`; Megatron's `engine.dtype`). The engine and optimizer sections
//! are verl's shared groups, lowered by the RL lowering's own functions. Every key the trainer
//! does not honour is reported at its line when the user set it: `B018` (an error for the build,
//! a warning in `verlc check`) for what would change training, `B006` for what has no effect
//! here.

use verlc_spec::algo::AlgoRelease;
use verlc_spec::binding::StrategyKind;
use verlc_spec::data::Truncation;
use verlc_spec::optim::{AdamWConfig, InnerConfig, VerlSchedule};
use verlc_spec::sft::{
    SftBatching, SftDataSpec, SftFormat, SftFrequency, SftModelSpec, SftPadding, SftRunSpec,
    SftSpec, SftTrainerKind,
};
use verlc_spec::trainer::{
    DeviceKind, Dtype, EngineSpec, FsdpEngineSpec, LoggerKind, MegatronEngineSpec, OptimSpec,
    ResumeSpec, ScheduleSpec, StrategyName, WorldSpec,
};

use crate::config::{FsdpEngineConfig, HfModelConfig, MegatronEngineConfig, OptimConfig};
use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};
use crate::plan::Binding;
use crate::plan::spec::{Lowering, model_lora, optim_spec, router_spec};
use crate::source::Origin;

use super::config::{Frequency, SftConfig};

/// The keys whose values decide an SFT trainer's binding and device: a run-time override that
/// changes one needs a rebuild.
pub const BOUND_KEYS: &[&str] = &[
    "engine.strategy",
    "engine.dtype",
    "engine.mixed_precision.param_dtype",
    "trainer.device",
];

/// Keys the SFT trainer has no use for here, with why (`B006` when the user set them).
const NO_EFFECT: &[(&str, &str)] = &[
    (
        "data.num_workers",
        "the trainer tokenizes every conversation when it starts; there is no loader process",
    ),
    ("data.use_shm", "files are read where they are"),
    ("data.balance_dp_token", "verl does not implement it either"),
    ("model.use_shm", "the model is read where it is"),
    (
        "model.trust_remote_code",
        "verlc's model families are compiled in; no code is loaded",
    ),
    ("model.use_liger", "verlc's kernels are its own"),
    ("model.use_fused_kernels", "verlc's kernels are its own"),
    (
        "model.enable_activation_offload",
        "activations stay where they are computed",
    ),
    (
        "engine.wrap_policy",
        "the FSDP engine wraps each decoder layer",
    ),
    (
        "engine.forward_prefetch",
        "the engine gathers one unit at a time",
    ),
    (
        "engine.use_orig_params",
        "the engine keeps its own flat shards",
    ),
    ("engine.use_torch_compile", "the engine runs eagerly"),
    (
        "engine.entropy_from_logits_with_chunking",
        "the SFT loss needs no entropy",
    ),
    (
        "engine.entropy_checkpointing",
        "the SFT loss needs no entropy",
    ),
    (
        "engine.use_no_sync_for_gradient_accumulation",
        "gradients are reduced once per step",
    ),
    (
        "engine.full_determinism",
        "runs on CPU are deterministic for a given seed",
    ),
    (
        "checkpoint.save_contents",
        "a checkpoint always holds the model (Hugging Face layout), the optimizer and the loop state",
    ),
    (
        "checkpoint.load_contents",
        "a resume loads the whole checkpoint",
    ),
    (
        "trainer.balance_batch",
        "verl's SFT trainer does not read it",
    ),
    (
        "trainer.seed",
        "verl's SFT trainer does not read it (its sampler's seed is 0; the model's is `engine.seed`)",
    ),
    (
        "engine.pad_to_length_bucket",
        "micro-batches are packed or padded to their longest row",
    ),
    ("trainer.profile_interval", "verlc does not profile"),
    ("profiler", "verlc does not profile"),
];

/// Keys whose setting would change training and that the trainer cannot honour (`B018`), with
/// the value that is fine and the reason.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "data.custom_cls.path",
        "a custom dataset class is Python code verlc does not run",
    ),
    (
        "model.custom_chat_template",
        "the tokenizer's own chat template is used",
    ),
    (
        "model.external_lib",
        "verlc's model families are compiled in",
    ),
    (
        "model.hf_config_path",
        "the model's config.json is read from model.path",
    ),
    ("model.tiled_mlp.enabled", "the MLP runs untiled"),
    (
        "model.mtp.enable",
        "multi-token prediction is not implemented",
    ),
    (
        "engine.qat.enable",
        "quantization-aware training is not implemented",
    ),
    (
        "engine.pad_to_length",
        "micro-batches are packed or padded to their longest row",
    ),
    ("engine.forward_only", "the SFT trainer trains its model"),
    (
        "model.lora.rank",
        "LoRA on the Megatron engine is not implemented (FSDP's `model.lora_rank` is)",
    ),
    (
        "trainer.default_hdfs_dir",
        "checkpoints stay in trainer.default_local_dir",
    ),
];

/// The spec of `cfg` (the composed tree `root`, judged against `release`) and what it cannot
/// honour.
pub fn lower(cfg: &SftConfig, root: &Node, release: AlgoRelease) -> (SftSpec, Vec<Diagnostic>) {
    let mut l = Lowering::new(root, release);
    let spec = if cfg.is_legacy() {
        super::lower_legacy::build(cfg, root, release, &mut l)
    } else {
        build(cfg, root, release, &mut l)
    };
    (spec, l.into_diagnostics())
}

/// Everything `verlc build` reports of an SFT config: what lowering cannot honour and the
/// verdicts of the keys the user set (`release` is the tree's verl release label).
pub fn build_diagnostics(
    cfg: &SftConfig,
    root: &Node,
    release: &str,
    users: &dyn Fn(Option<&Origin>) -> bool,
) -> Vec<Diagnostic> {
    let (_, mut out) = lower(cfg, root, crate::plan::algo_release(release));
    if cfg.is_legacy() {
        out.extend(super::lower_legacy::verdicts(root, users));
    } else {
        out.extend(verdicts(root, users));
    }
    out
}

/// Whether the user wrote `key`'s value, or a value inside it (not a verl default).
pub(super) fn user_set(root: &Node, key: &str, users: &dyn Fn(Option<&Origin>) -> bool) -> bool {
    let Some(node) = root.get_path(&split_key(key)) else {
        return false;
    };
    let mut set = false;
    node.walk(&mut |_, n, _| set |= users(n.origin.as_ref()));
    set
}

/// The `B006`/`B018` verdicts of the keys the user set (`users` tells a user's origin from a
/// verl file's).
pub fn verdicts(root: &Node, users: &dyn Fn(Option<&Origin>) -> bool) -> Vec<Diagnostic> {
    let mut l = Lowering::new(root, AlgoRelease::NEWEST);
    no_effect_verdicts(root, users, "", NO_EFFECT, &mut l);
    let engine_no_effect = match engine_strategy(root) {
        Some("veomni") => super::lower_veomni::NO_EFFECT,
        Some("automodel") => super::lower_automodel::NO_EFFECT,
        _ => &[],
    };
    no_effect_verdicts(root, users, "engine.", engine_no_effect, &mut l);
    megatron_override_verdicts(root, users, &mut l);
    for key in unjudged_keys(root) {
        if user_set(root, &key, users) {
            l.no_effect(&key, format!("`{key}` is not read by verlc's SFT trainer"));
        }
    }
    unsupported_verdicts(root, users, UNSUPPORTED, &mut l);
    l.into_diagnostics()
}

/// `B006` for each of `keys` (under `prefix`) the user set, with why it has no effect.
pub(super) fn no_effect_verdicts(
    root: &Node,
    users: &dyn Fn(Option<&Origin>) -> bool,
    prefix: &str,
    keys: &[(&str, &str)],
    l: &mut Lowering,
) {
    for (key, why) in keys {
        let key = format!("{prefix}{key}");
        if user_set(root, &key, users) {
            l.no_effect(
                &key,
                format!("`{key}` has no effect in a verlc trainer: {why}"),
            );
        }
    }
}

/// `B018` for each of `keys` the user set to something other than off (null, false, 0).
pub(super) fn unsupported_verdicts(
    root: &Node,
    users: &dyn Fn(Option<&Origin>) -> bool,
    keys: &[(&str, &str)],
    l: &mut Lowering,
) {
    for (key, why) in keys {
        let node = root.get_path(&split_key(key));
        let set = node.is_some_and(|n| {
            !n.is_null() && !matches!(n.as_bool(), Some(false)) && n.as_i64() != Some(0)
        });
        if set && user_set(root, key, users) {
            l.unsupported(
                key,
                format!("`{key}` cannot be honoured by a verlc trainer: {why}"),
                format!("remove `{key}`"),
            );
        }
    }
}

/// The keys of section `key` that verlc's typed model `T` of it does not have: verl's newer
/// releases add keys to these shared groups.
fn unknown_keys<T: schemars::JsonSchema>(root: &Node, key: &str) -> Vec<String> {
    let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    let (Some(known), Some(obj)) = (
        schema.get("properties").and_then(|p| p.as_object()),
        root.get_path(&split_key(key)).and_then(Node::as_map),
    ) else {
        return Vec::new();
    };
    obj.iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !known.contains_key(*k))
        .map(|k| format!("{key}.{k}"))
        .collect()
}

/// The leaves of a Megatron engine's Megatron-core overrides (`engine.override_*_config`) that
/// the user set, judged as the same keys of an RL actor's `megatron` section are
/// (`crate::plan::verdicts`): kernel and placement switches have no effect, the router's
/// settings are lowered (`router_spec`), the rest is refused.
fn megatron_override_verdicts(
    root: &Node,
    users: &dyn Fn(Option<&Origin>) -> bool,
    l: &mut Lowering,
) {
    use crate::plan::verdicts::{Verdict, verdict};
    if root
        .get_path(&["engine", "tensor_model_parallel_size"])
        .is_none()
    {
        return;
    }
    for section in [
        "override_transformer_config",
        "override_ddp_config",
        "override_mcore_model_config",
    ] {
        let Some(node) = root.get_path(&["engine", section]) else {
            continue;
        };
        let mut leaves = Vec::new();
        node.walk(&mut |ptr, n, _| {
            if n.as_map().is_none() && !ptr.is_empty() && users(n.origin.as_ref()) {
                leaves.push(ptr.trim_start_matches('/').replace('/', "."));
            }
        });
        for leaf in leaves {
            let key = format!("engine.{section}.{leaf}");
            let as_actor = format!("actor_rollout_ref.actor.megatron.{section}.{leaf}");
            match verdict(&as_actor).map(|e| &e.verdict) {
                Some(Verdict::NoEffect(_, why)) => {
                    l.no_effect(&key, format!("`{key}` {why}"));
                }
                Some(Verdict::Unsupported(why)) => {
                    l.unsupported(&key, format!("`{key}` {why}"), format!("remove `{key}`"))
                }
                _ => {}
            }
        }
    }
}

/// `engine.strategy`: VeOmni's and AutoModel's sections (and their optimizers') are judged by
/// their own lowering ([`super::lower_veomni`], [`super::lower_automodel`]).
fn engine_strategy(root: &Node) -> Option<&str> {
    root.get_path(&["engine", "strategy"])
        .and_then(Node::as_str)
}

/// The unknown keys of the typed sections (see [`unknown_keys`]) that no verdict names.
fn unjudged_keys(root: &Node) -> Vec<String> {
    let mut keys = unknown_keys::<HfModelConfig>(root, "model");
    if matches!(engine_strategy(root), Some("veomni" | "automodel")) {
        return keys;
    }
    keys.extend(unknown_keys::<OptimConfig>(root, "optim"));
    if root
        .get_path(&["engine", "tensor_model_parallel_size"])
        .is_some()
    {
        keys.extend(unknown_keys::<MegatronEngineConfig>(root, "engine"));
    } else {
        keys.extend(unknown_keys::<FsdpEngineConfig>(root, "engine"));
    }
    let inside = |a: &str, b: &str| a.strip_prefix(b).is_some_and(|r| r.starts_with('.'));
    keys.retain(|k| {
        !NO_EFFECT
            .iter()
            .chain(UNSUPPORTED)
            .any(|(v, _)| k == v || inside(k, v) || inside(v, k))
    });
    keys
}

/// The section `key` as verlc's typed model `T` of it, without the keys `T` does not have
/// ([`unknown_keys`]; [`verdicts`] reports those the user set).
pub(super) fn typed<T: serde::de::DeserializeOwned + schemars::JsonSchema>(
    root: &Node,
    key: &str,
    l: &mut Lowering,
) -> Option<T> {
    let node = root.get_path(&split_key(key))?;
    let mut value = node.to_json();
    if let Some(obj) = value.as_object_mut() {
        for k in unknown_keys::<T>(root, key) {
            obj.remove(k.rsplit('.').next().unwrap_or_default());
        }
        // The RL actor's Megatron section has `grad_offload`; the SFT engine group does not
        // (nothing to offload: off).
        if key == "engine" && obj.contains_key("tensor_model_parallel_size") {
            obj.entry("grad_offload")
                .or_insert(serde_json::Value::Bool(false));
        }
    }
    match serde_json::from_value(value) {
        Ok(v) => Some(v),
        Err(e) => {
            l.unsupported(
                key,
                format!("`{key}` does not have the form verlc's trainer reads: {e}"),
                "compare it with the release's own group file",
            );
            None
        }
    }
}

fn build(cfg: &SftConfig, root: &Node, release: AlgoRelease, l: &mut Lowering) -> SftSpec {
    let world = WorldSpec {
        device: match root.get_path(&["trainer", "device"]).and_then(Node::as_str) {
            Some("cpu") => DeviceKind::Cpu,
            _ => DeviceKind::Cuda,
        },
        nnodes: usize::try_from(cfg.nnodes.max(1)).unwrap_or(1),
        n_gpus_per_node: usize::try_from(cfg.n_gpus_per_node.max(1)).unwrap_or(1),
    };
    let model_cfg: Option<HfModelConfig> = typed(root, "model", l);
    let (strategy, engine, precision) = engine(cfg, root, model_cfg.as_ref(), l);
    let optim = if cfg.engine.strategy == "veomni" {
        super::lower_veomni::optim(root, cfg.lr, engine.optimizer_offload(), l)
    } else if cfg.engine.strategy == "automodel" {
        super::lower_automodel::optim(root, cfg.lr, engine.optimizer_offload(), l)
    } else {
        match typed::<OptimConfig>(root, "optim", l) {
            Some(o) => optim_spec("optim", &o, None, engine.optimizer_offload(), l),
            // Reported; a spec of AdamW at the config's lr keeps lowering total.
            None => default_optim(cfg.lr),
        }
    };
    let lora = model_cfg
        .as_ref()
        .and_then(|m| model_lora(m, "model", strategy == StrategyName::Megatron, l));
    let tokenizer_path = model_cfg
        .as_ref()
        .and_then(|m| m.tokenizer_path.clone())
        .unwrap_or_else(|| cfg.model_path.clone());
    let seed = root
        .get_path(&["engine", "seed"])
        .and_then(Node::as_i64)
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(42);
    let config_overrides = root
        .get_path(&["model", "override_config"])
        .map(Node::to_json)
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    let binding = Binding {
        strategy: match strategy {
            StrategyName::Megatron => StrategyKind::Megatron,
            _ => StrategyKind::Fsdp,
        },
        precision,
    };
    if let Err(e) = binding.validate() {
        l.unsupported(
            "engine.dtype",
            format!("the binding {binding} cannot be built: {}", e.message),
            e.help,
        );
    }
    SftSpec {
        binding,
        strategy,
        world,
        data: data(cfg, root, l),
        model: SftModelSpec {
            path: cfg.model_path.clone(),
            tokenizer_path,
            seed,
            engine,
            optim,
            lora,
            config_overrides,
        },
        batching: SftBatching {
            global_batch: l_count(l, "data.train_batch_size", cfg.train_batch_size),
            micro_batch: l_count(
                l,
                "data.micro_batch_size_per_gpu",
                cfg.micro_batch_size_per_gpu,
            ),
            token_budget: cfg
                .use_dynamic_bsz
                .then(|| usize::try_from(cfg.token_budget().max(1)).unwrap_or(usize::MAX)),
        },
        run: run(cfg, root),
        release,
        trainer: SftTrainerKind::Engine,
    }
}

pub(super) fn default_optim(lr: f64) -> OptimSpec {
    OptimSpec {
        inner: InnerConfig::AdamW(AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }),
        lr,
        weight_decay: 0.01,
        clip_grad: 1.0,
        offload: false,
        offload_fraction: 0.0,
        schedule: ScheduleSpec::Verl {
            schedule: VerlSchedule::Constant,
            lr_warmup_steps: -1,
            lr_warmup_steps_ratio: 0.0,
            zero_indexed_step: true,
        },
        freeze_vision_tower: false,
    }
}

pub(super) fn l_count(l: &mut Lowering, key: &str, v: i64) -> usize {
    match usize::try_from(v) {
        Ok(n) if n > 0 => n,
        _ => {
            l.unsupported(
                key,
                format!("`{key}` must be positive, got {v}"),
                "set a positive value",
            );
            1
        }
    }
}

/// The engine spec, the strategy as written and the precision the binary binds.
fn engine(
    cfg: &SftConfig,
    root: &Node,
    model: Option<&HfModelConfig>,
    l: &mut Lowering,
) -> (StrategyName, EngineSpec, Dtype) {
    let checkpointing = model.is_none_or(|m| m.enable_gradient_checkpointing);
    let remove_padding = cfg.use_remove_padding;
    match cfg.engine.strategy.as_str() {
        "megatron" => {
            let Some(m) = typed::<MegatronEngineConfig>(root, "engine", l) else {
                return (
                    StrategyName::Megatron,
                    default_fsdp(remove_padding),
                    Dtype::Fp32,
                );
            };
            let spec = MegatronEngineSpec {
                tensor_parallel: usize::try_from(m.tensor_model_parallel_size.max(1)).unwrap_or(1),
                pipeline_parallel: usize::try_from(m.pipeline_model_parallel_size.max(1))
                    .unwrap_or(1),
                sequence_parallel: m.sequence_parallel && m.tensor_model_parallel_size > 1,
                use_distributed_optimizer: m.use_distributed_optimizer,
                optimizer_offload: m.optimizer_offload,
                param_offload: m.param_offload,
                grad_offload: m.grad_offload,
                expert_parallel: usize::try_from(m.expert_model_parallel_size.max(1)).unwrap_or(1),
                expert_tensor_parallel: m
                    .expert_tensor_parallel_size
                    .and_then(|v| usize::try_from(v).ok()),
                context_parallel: usize::try_from(m.context_parallel_size.max(1)).unwrap_or(1),
                router: router_spec(
                    &|leaf| format!("engine.{leaf}"),
                    &m.override_transformer_config,
                    l,
                ),
            };
            (
                StrategyName::Megatron,
                EngineSpec::Megatron(spec),
                m.dtype.dtype(),
            )
        }
        "fsdp" | "fsdp2" => {
            let name = if cfg.engine.strategy == "fsdp2" {
                StrategyName::Fsdp2
            } else {
                StrategyName::Fsdp
            };
            let Some(f) = typed::<FsdpEngineConfig>(root, "engine", l) else {
                return (name, default_fsdp(remove_padding), Dtype::Fp32);
            };
            let precision = match f.mixed_precision.as_ref().and_then(|m| m.param_dtype) {
                Some(d) => d.dtype(),
                None => f.dtype.dtype(),
            };
            let policy = f.offload_policy && name == StrategyName::Fsdp2;
            let main_dtype = match f.model_dtype.dtype() {
                Dtype::Fp32 => Dtype::Fp32,
                d if d == precision && d == Dtype::Bf16 => d,
                d => {
                    l.unsupported(
                        "engine.model_dtype",
                        format!(
                            "model_dtype {} with compute in {}: the engine steps fp32 main parameters, or bf16 ones when it also computes in bf16",
                            d.name(),
                            precision.name()
                        ),
                        "use model_dtype fp32",
                    );
                    Dtype::Fp32
                }
            };
            let ulysses = usize::try_from(f.ulysses_sequence_parallel_size.max(1)).unwrap_or(1);
            let spec = FsdpEngineSpec {
                param_offload: f.param_offload || policy,
                optimizer_offload: f.optimizer_offload || policy,
                reshard_after_forward: f.reshard_after_forward,
                gradient_checkpointing: checkpointing,
                reduce_dtype: f
                    .mixed_precision
                    .as_ref()
                    .and_then(|m| m.reduce_dtype)
                    .map_or(Dtype::Fp32, |d| d.dtype()),
                fsdp_size: f.fsdp_size,
                remove_padding,
                ulysses,
                main_dtype,
            };
            (name, EngineSpec::Fsdp(spec), precision)
        }
        "veomni" => super::lower_veomni::engine(root, cfg, checkpointing, l),
        "automodel" => super::lower_automodel::engine(root, cfg, l),
        other => {
            l.unsupported(
                "engine.strategy",
                format!("the `{other}` engine is not implemented by verlc's SFT trainer"),
                "use fsdp, fsdp2, veomni or megatron",
            );
            (
                StrategyName::Fsdp,
                default_fsdp(remove_padding),
                Dtype::Fp32,
            )
        }
    }
}

fn default_fsdp(remove_padding: bool) -> EngineSpec {
    EngineSpec::Fsdp(FsdpEngineSpec {
        param_offload: false,
        optimizer_offload: false,
        reshard_after_forward: true,
        gradient_checkpointing: false,
        reduce_dtype: Dtype::Fp32,
        fsdp_size: -1,
        remove_padding,
        ulysses: 1,
        main_dtype: Dtype::Fp32,
    })
}

pub(super) fn data(cfg: &SftConfig, root: &Node, l: &mut Lowering) -> SftDataSpec {
    let s = |k: &str, d: &str| {
        root.get_path(&["data", k])
            .and_then(Node::as_str)
            .unwrap_or(d)
            .to_owned()
    };
    let max_samples = |k: &str| {
        root.get_path(&["data", k])
            .and_then(Node::as_i64)
            .and_then(|v| usize::try_from(v).ok())
            .filter(|v| *v > 0)
    };
    // `none` (the string) leaves the template's default; verl compares the string.
    let thinking = match root.get_path(&["data", "enable_thinking_default"]) {
        Some(n) => match (n.as_bool(), n.as_str()) {
            (Some(b), _) => Some(b),
            (None, Some(t)) if t.eq_ignore_ascii_case("true") => Some(true),
            (None, Some(t)) if t.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        },
        None => None,
    };
    let truncation = match cfg.truncation.as_str() {
        "left" => Truncation::Left,
        "right" => Truncation::Right,
        "middle" => Truncation::Middle,
        _ => Truncation::Error,
    };
    SftDataSpec {
        train_files: cfg.train_files.clone(),
        val_files: cfg.val_files.clone(),
        messages_key: s("messages_key", "messages"),
        tools_key: s("tools_key", "tools"),
        enable_thinking_key: s("enable_thinking_key", "enable_thinking"),
        enable_thinking_default: thinking,
        max_length: l_count(l, "data.max_length", cfg.max_length),
        truncation,
        ignore_input_ids_mismatch: root
            .get_path(&["data", "ignore_input_ids_mismatch"])
            .and_then(Node::as_bool)
            .unwrap_or(false),
        chat_template_kwargs: root
            .get_path(&["data", "apply_chat_template_kwargs"])
            .map(Node::to_json)
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default(),
        train_max_samples: max_samples("train_max_samples"),
        val_max_samples: max_samples("val_max_samples"),
        format: SftFormat::MultiTurn,
        padding: SftPadding::NoPadding,
    }
}

fn frequency(f: &Frequency) -> SftFrequency {
    match f {
        Frequency::Steps(n) if *n > 0 => SftFrequency::Steps(*n as u64),
        Frequency::AfterEachEpoch => SftFrequency::AfterEachEpoch,
        _ => SftFrequency::Never,
    }
}

pub(super) fn run(cfg: &SftConfig, root: &Node) -> SftRunSpec {
    let s = |k: &str| {
        root.get_path(&["trainer", k])
            .and_then(Node::as_str)
            .map(str::to_owned)
    };
    let resume = match cfg.resume_mode.as_str() {
        "disable" => ResumeSpec::Disable,
        // Without a path, rule F009 reports it.
        "resume_path" => match &cfg.resume_from_path {
            Some(p) => ResumeSpec::Path { path: p.clone() },
            None => ResumeSpec::Disable,
        },
        _ => match &cfg.resume_from_path {
            // verl's `auto` takes resume_from_path first when it is set.
            Some(p) => ResumeSpec::Path { path: p.clone() },
            None => ResumeSpec::Auto,
        },
    };
    let mut loggers = Vec::new();
    for name in &cfg.logger {
        match name.as_str() {
            "console" => loggers.push(LoggerKind::Console),
            "file" => loggers.push(LoggerKind::File),
            "tensorboard" => loggers.push(LoggerKind::Tensorboard),
            "wandb" | "tracking" => loggers.push(LoggerKind::Wandb),
            "mlflow" => loggers.push(LoggerKind::Mlflow),
            // The rules report unknown names (F-codes); nothing to lower.
            _ => {}
        }
    }
    SftRunSpec {
        total_epochs: u64::try_from(cfg.total_epochs.max(0)).unwrap_or(0),
        total_training_steps: cfg
            .total_training_steps
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| *n > 0),
        test_freq: frequency(&cfg.test_freq),
        save_freq: frequency(&cfg.save_freq),
        checkpoint_dir: s("default_local_dir").unwrap_or_else(|| "checkpoints".into()),
        resume,
        max_ckpt_to_keep: root
            .get_path(&["trainer", "max_ckpt_to_keep"])
            .and_then(Node::as_i64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0),
        seed: 0,
        project_name: s("project_name").unwrap_or_default(),
        experiment_name: s("experiment_name").unwrap_or_default(),
        loggers,
    }
}

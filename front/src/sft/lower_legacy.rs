//! Lowering verl 0.7.0's legacy SFT config (`sft_trainer`, run by `fsdp_sft_trainer`) to the
//! [`SftSpec`] of the legacy trainer ([`SftTrainerKind::Legacy`]).
//!
//! What the legacy trainer fixes in its code rather than its config: FSDP (`model.strategy`
//! fsdp or fsdp2) with bf16 compute (its mixed-precision policy and autocast) over
//! `model.fsdp_config.model_dtype` parameters and fp32 gradient reduction; AdamW or another
//! optimizer from the shared `optim` group; the scheduler `optim.lr_scheduler` (cosine or wsd
//! with their functions' defaults) with `int(ratio × epochs' steps)` warm-up steps; rows
//! padded on the right. Its data: the single-turn dataset, or the multi-turn one with
//! `data.multiturn.enable` (which reads its column names from `data.messages_key`, ...).

use verlc_spec::algo::AlgoRelease;
use verlc_spec::binding::StrategyKind;
use verlc_spec::optim::VerlSchedule;
use verlc_spec::sft::{
    SftBatching, SftFormat, SftModelSpec, SftPadding, SftSpec, SftTrainerKind, SingleTurnKeys,
};
use verlc_spec::trainer::{
    DeviceKind, Dtype, EngineSpec, FsdpEngineSpec, ScheduleSpec, StrategyName, WorldSpec,
};

use crate::config::OptimConfig;
use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};
use crate::plan::Binding;
use crate::plan::spec::{LoraKeys, Lowering, lora_of_keys, optim_spec};
use crate::source::Origin;

use super::config::SftConfig;
use super::lower::{data, l_count, no_effect_verdicts, run, typed, unsupported_verdicts};

/// Keys of the legacy config the trainer has no use for here (`B006` when the user set
/// them), with why.
const NO_EFFECT: &[(&str, &str)] = &[
    ("data.use_shm", "files are read where they are"),
    ("model.use_shm", "the model is read where it is"),
    (
        "model.trust_remote_code",
        "verlc's model families are compiled in; no code is loaded",
    ),
    ("model.use_liger", "verlc's kernels are its own"),
    (
        "model.fsdp_config.wrap_policy",
        "the FSDP engine wraps each decoder layer",
    ),
    (
        "trainer.checkpoint",
        "a checkpoint always holds the model (Hugging Face layout), the optimizer and the loop state",
    ),
    (
        "trainer.seed",
        "verl's legacy SFT trainer does not read it either",
    ),
    (
        "data.image_key",
        "the legacy trainer builds its datasets without a processor: no image is read",
    ),
    (
        "data.video_key",
        "the legacy trainer builds its datasets without a processor: no video is read",
    ),
    (
        "data.image_patch_size",
        "the legacy trainer builds its datasets without a processor",
    ),
];

/// Keys whose setting the trainer cannot honour (`B018`), with why.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "data.custom_cls.path",
        "a custom dataset class is Python code verlc does not run",
    ),
    (
        "model.external_lib",
        "verlc's model families are compiled in",
    ),
    (
        "trainer.default_hdfs_dir",
        "checkpoints stay in trainer.default_local_dir",
    ),
    (
        "data.shuffle",
        "data.train_max_samples/val_max_samples take the first rows (numpy's random pick is not reproduced)",
    ),
];

/// The legacy config's spec (module docs).
pub(super) fn build(
    cfg: &SftConfig,
    root: &Node,
    release: AlgoRelease,
    l: &mut Lowering,
) -> SftSpec {
    let get = |key: &str| root.get_path(&split_key(key));
    let world = WorldSpec {
        device: match get("trainer.device").and_then(Node::as_str) {
            Some("cpu") => DeviceKind::Cpu,
            _ => DeviceKind::Cuda,
        },
        nnodes: usize::try_from(cfg.nnodes.max(1)).unwrap_or(1),
        n_gpus_per_node: usize::try_from(cfg.n_gpus_per_node.max(1)).unwrap_or(1),
    };
    let strategy = match cfg.engine.strategy.as_str() {
        "fsdp" => StrategyName::Fsdp,
        "fsdp2" => StrategyName::Fsdp2,
        other => {
            l.unsupported(
                "model.strategy",
                format!("the legacy SFT trainer has no `{other}` strategy"),
                "use fsdp or fsdp2",
            );
            StrategyName::Fsdp2
        }
    };
    let main_dtype = match get("model.fsdp_config.model_dtype").and_then(Node::as_str) {
        None | Some("fp32" | "float32") => Dtype::Fp32,
        Some("bf16" | "bfloat16") => Dtype::Bf16,
        Some(other) => {
            l.unsupported(
                "model.fsdp_config.model_dtype",
                format!("model_dtype `{other}`: the engine steps fp32 or bf16 parameters"),
                "use fp32 (the default) or bf16",
            );
            Dtype::Fp32
        }
    };
    let lora_keys = legacy_lora(root, l);
    let engine = EngineSpec::Fsdp(FsdpEngineSpec {
        param_offload: cfg.engine.param_offload,
        optimizer_offload: false,
        reshard_after_forward: true,
        gradient_checkpointing: get("model.enable_gradient_checkpointing")
            .and_then(Node::as_bool)
            .unwrap_or(true),
        reduce_dtype: Dtype::Fp32,
        fsdp_size: -1,
        remove_padding: cfg.use_remove_padding,
        ulysses: usize::try_from(cfg.engine.ulysses.max(1)).unwrap_or(1),
        main_dtype,
    });
    let mut optim = match typed::<OptimConfig>(root, "optim", l) {
        Some(o) => optim_spec("optim", &o, None, false, l),
        None => super::lower::default_optim(cfg.lr),
    };
    let schedule = match cfg.lr_scheduler_type.as_deref() {
        Some("wsd") => VerlSchedule::Wsd {
            min_lr_ratio: 0.0,
            num_cycles: 0.5,
            stable_ratio: 0.9,
        },
        // Other names are F012's.
        _ => VerlSchedule::Cosine {
            min_lr_ratio: 0.0,
            num_cycles: 0.5,
        },
    };
    optim.schedule = ScheduleSpec::Verl {
        schedule,
        lr_warmup_steps: -1,
        lr_warmup_steps_ratio: get("optim.lr_warmup_steps_ratio")
            .and_then(Node::as_f64)
            .unwrap_or(0.0),
        zero_indexed_step: true,
    };
    let lora = lora_keys
        .as_ref()
        .and_then(|m| lora_of_keys(m, "model", false, l));
    // The legacy trainer computes in bf16 whatever model_dtype says (its FSDP mixed
    // precision and autocast are fixed in its code).
    let binding = Binding {
        strategy: StrategyKind::Fsdp,
        precision: Dtype::Bf16,
    };
    let mut data = data(cfg, root, l);
    data.padding = SftPadding::Right;
    data.enable_thinking_default = None;
    let multiturn = get("data.multiturn.enable")
        .and_then(Node::as_bool)
        .unwrap_or(false);
    if !multiturn {
        data.format = SftFormat::SingleTurn(single_turn_keys(root, l));
    }
    SftSpec {
        binding,
        strategy,
        world,
        data,
        model: SftModelSpec {
            path: cfg.model_path.clone(),
            tokenizer_path: cfg.model_path.clone(),
            seed: 42,
            engine,
            optim,
            lora,
            config_overrides: Default::default(),
        },
        batching: SftBatching {
            global_batch: l_count(l, "data.train_batch_size", cfg.train_batch_size),
            micro_batch: l_count(
                l,
                "data.micro_batch_size_per_gpu",
                cfg.micro_batch_size_per_gpu,
            ),
            token_budget: None,
        },
        run: run(cfg, root),
        release,
        trainer: SftTrainerKind::Legacy {
            balance_dp_token: get("data.balance_dp_token")
                .and_then(Node::as_bool)
                .unwrap_or(false),
        },
    }
}

/// The LoRA keys of the legacy `model` section.
fn legacy_lora(root: &Node, l: &mut Lowering) -> Option<LoraKeys> {
    let mut m = serde_json::Map::new();
    for key in [
        "lora_rank",
        "lora_alpha",
        "target_modules",
        "lora_adapter_path",
    ] {
        if let Some(n) = root.get_path(&["model", key]) {
            m.insert(key.into(), n.to_json());
        }
    }
    match serde_json::from_value(serde_json::Value::Object(m)) {
        Ok(v) => Some(v),
        Err(e) => {
            l.unsupported(
                "model.lora_rank",
                format!("the LoRA keys of `model` do not have the form verlc's trainer reads: {e}"),
                "an integer rank and alpha, target_modules `all-linear` or a list of names",
            );
            None
        }
    }
}

/// `data.prompt_key`/`response_key` (a column, or a one-column list) and their dict keys.
fn single_turn_keys(root: &Node, l: &mut Lowering) -> SingleTurnKeys {
    let mut column = |name: &str, default: &str| -> String {
        let key = format!("data.{name}");
        match root.get_path(&["data", name]).map(Node::to_json) {
            None | Some(serde_json::Value::Null) => default.to_owned(),
            Some(serde_json::Value::String(s)) => s,
            Some(serde_json::Value::Array(items)) if items.len() == 1 => {
                items[0].as_str().unwrap_or(default).to_owned()
            }
            Some(other) => {
                l.unsupported(
                    &key,
                    format!("`{key}` must name one column, got {other}"),
                    "name one column (its cell may be a dict: then add the dict keys)",
                );
                default.to_owned()
            }
        }
    };
    let prompt_key = column("prompt_key", "prompt");
    let response_key = column("response_key", "response");
    let list = |name: &str| -> Vec<String> {
        match root.get_path(&["data", name]).map(Node::to_json) {
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            Some(serde_json::Value::String(s)) => vec![s],
            _ => Vec::new(),
        }
    };
    SingleTurnKeys {
        prompt_key,
        response_key,
        prompt_dict_keys: list("prompt_dict_keys"),
        response_dict_keys: list("response_dict_keys"),
    }
}

/// The `B006`/`B018` verdicts of the legacy keys the user set.
pub(super) fn verdicts(root: &Node, users: &dyn Fn(Option<&Origin>) -> bool) -> Vec<Diagnostic> {
    let mut l = Lowering::new(root, AlgoRelease::NEWEST);
    no_effect_verdicts(root, users, "", NO_EFFECT, &mut l);
    unsupported_verdicts(root, users, UNSUPPORTED, &mut l);
    l.into_diagnostics()
}

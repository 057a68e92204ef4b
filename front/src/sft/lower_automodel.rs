//! The SFT trainer's AutoModel engine (`engine=automodel`, `optim=automodel`, verl 0.9's NeMo
//! AutoModel integration) lowered as the FSDP2 engine it is when it uses no other parallelism:
//! - `distributed_strategy: fsdp2` with `tp_size`, `pp_size`, `cp_size`, `ep_size` and
//!   `dp_replicate_size` of 1 shards the model over every rank; `mp_param_dtype` is the
//!   compute precision, `mp_reduce_dtype` the gradient reduction's, `model_dtype` the shards'
//!   (fp32, or bf16 under bf16 compute); `activation_checkpointing` recomputes each layer;
//!   `param_offload`/`optimizer_offload` keep their meaning;
//! - the optimizer `AdamW` of `torch.optim` (with the section's `eps`); the schedule is
//!   verl's choice for this engine, Megatron's `OptimizerParamScheduler` from
//!   `lr × init_lr_ratio` (default 0.1) up to `lr` over the warm-up steps, then decaying to
//!   `lr × min_lr_ratio` (default 0.01) by `lr_scheduler_type` over the run.
//!
//! Refused at their keys (`B018`): other distributed strategies, tensor/pipeline/context/expert
//! parallelism, HSDP replication, sequence parallelism, FP8, other optimizers (TransformerEngine's
//! FusedAdam with its master-weight and bf16-moment options), optimizer state dtypes. AutoModel's
//! kernel back-ends have no effect here (`B006`, [`NO_EFFECT`]).

use verlc_spec::optim::{AdamWConfig, InnerConfig, LrDecayStyle, WdIncrStyle};
use verlc_spec::trainer::{
    Dtype, EngineSpec, FsdpEngineSpec, OptimSpec, ScheduleSpec, StrategyName,
};

use crate::load::node::Node;
use crate::plan::spec::Lowering;

use super::config::SftConfig;
use super::section::{betas, get, text};

/// Keys of the AutoModel engine section that change nothing in a verlc trainer, with why
/// (reported by [`super::lower::verdicts`] when the user set them).
pub(super) const NO_EFFECT: &[(&str, &str)] = &[
    (
        "defer_fsdp_grad_sync",
        "gradients are reduced once per step",
    ),
    ("enable_compile", "the engine runs eagerly"),
    ("use_torch_compile", "the engine runs eagerly"),
    ("attn_implementation", "verlc's kernels are its own"),
    ("backend_config", "verlc's kernels are its own"),
    ("moe_config", "verlc's kernels are its own"),
    (
        "mp_output_dtype",
        "the model's outputs are read in fp32 for the loss",
    ),
    (
        "full_determinism",
        "runs on CPU are deterministic for a given seed",
    ),
    (
        "entropy_from_logits_with_chunking",
        "the SFT loss needs no entropy",
    ),
    (
        "entropy_from_logits_chunk_size",
        "the SFT loss needs no entropy",
    ),
    ("entropy_checkpointing", "the SFT loss needs no entropy"),
];

/// (key, the value that is fine, why another cannot be honoured).
const UNSUPPORTED: &[(&str, &str, &str)] = &[
    (
        "distributed_strategy",
        "fsdp2",
        "verlc's AutoModel engine is FSDP2",
    ),
    (
        "tp_size",
        "1",
        "AutoModel's tensor parallelism is not implemented",
    ),
    (
        "pp_size",
        "1",
        "AutoModel's pipeline parallelism is not implemented",
    ),
    (
        "cp_size",
        "1",
        "AutoModel's context parallelism is not implemented",
    ),
    (
        "ep_size",
        "1",
        "AutoModel's expert parallelism is not implemented",
    ),
    (
        "dp_replicate_size",
        "1",
        "replicated FSDP groups (HSDP) are not implemented",
    ),
    (
        "sequence_parallel",
        "false",
        "AutoModel's sequence parallelism is not implemented",
    ),
    ("enable_fp8", "false", "FP8 training is not implemented"),
    ("forward_only", "false", "the SFT trainer trains its model"),
];

/// Optimizer keys whose setting changes the numbers in ways torch's AdamW does not.
const OPTIM_UNSUPPORTED: &[(&str, &str, &str)] = &[
    (
        "master_weights",
        "false",
        "FusedAdam's master weights are not implemented",
    ),
    (
        "store_param_remainders",
        "false",
        "FusedAdam's parameter remainders are not implemented",
    ),
    (
        "exp_avg_dtype",
        "",
        "the moments are kept in the shards' dtype",
    ),
    (
        "exp_avg_sq_dtype",
        "",
        "the moments are kept in the shards' dtype",
    ),
    (
        "master_weight_dtype",
        "",
        "the shards are the master weights",
    ),
];

/// Reports each of `keys` under `section` whose value is not the fine one (null counts as
/// fine for an empty fine value).
fn refuse(root: &Node, section: &str, keys: &[(&str, &str, &str)], l: &mut Lowering) {
    for (key, fine, why) in keys {
        let Some(n) = get(root, section, key) else {
            continue;
        };
        let ok = if fine.is_empty() {
            n.is_null()
        } else {
            n.is_null() || text(n).eq_ignore_ascii_case(fine)
        };
        if !ok {
            let key = format!("{section}.{key}");
            let fix = if fine.is_empty() {
                format!("remove `{key}`")
            } else {
                format!("set `{key}` to {fine}")
            };
            l.unsupported(
                &key,
                format!("`{key}` cannot be honoured by a verlc trainer: {why}"),
                fix,
            );
        }
    }
}

fn dtype(root: &Node, key: &str, default: Dtype, l: &mut Lowering) -> Dtype {
    match get(root, "engine", key).map(text).as_deref() {
        None | Some("") => default,
        Some("fp32" | "float32") => Dtype::Fp32,
        Some("bf16" | "bfloat16") => Dtype::Bf16,
        Some(other) => {
            let key = format!("engine.{key}");
            l.unsupported(
                &key,
                format!("`{key}` {other}: the engine computes in fp32 or bf16"),
                "use fp32 or bf16",
            );
            default
        }
    }
}

/// The engine spec, strategy and compute precision of an AutoModel engine section.
pub(super) fn engine(
    root: &Node,
    cfg: &SftConfig,
    l: &mut Lowering,
) -> (StrategyName, EngineSpec, Dtype) {
    refuse(root, "engine", UNSUPPORTED, l);
    let flag = |k: &str| {
        get(root, "engine", k)
            .and_then(Node::as_bool)
            .unwrap_or(false)
    };
    let precision = dtype(root, "mp_param_dtype", Dtype::Bf16, l);
    let reduce = dtype(root, "mp_reduce_dtype", Dtype::Fp32, l);
    let main = match dtype(root, "model_dtype", Dtype::Fp32, l) {
        Dtype::Bf16 if precision == Dtype::Bf16 => Dtype::Bf16,
        Dtype::Bf16 => {
            l.unsupported(
                "engine.model_dtype",
                "model_dtype bf16 with fp32 compute: the engine steps fp32 main parameters, or bf16 ones when it also computes in bf16",
                "use model_dtype fp32",
            );
            Dtype::Fp32
        }
        d => d,
    };
    let spec = FsdpEngineSpec {
        param_offload: flag("param_offload"),
        optimizer_offload: flag("optimizer_offload"),
        reshard_after_forward: true,
        gradient_checkpointing: flag("activation_checkpointing"),
        reduce_dtype: reduce,
        fsdp_size: -1,
        remove_padding: cfg.use_remove_padding,
        ulysses: 1,
        main_dtype: main,
    };
    (StrategyName::Fsdp2, EngineSpec::Fsdp(spec), precision)
}

/// AutoModel's optimizer section: torch's AdamW with Megatron's scheduler (module docs).
pub(super) fn optim(root: &Node, lr: f64, offload: bool, l: &mut Lowering) -> OptimSpec {
    refuse(root, "optim", OPTIM_UNSUPPORTED, l);
    let num = |k: &str| get(root, "optim", k).and_then(Node::as_f64);
    let name = get(root, "optim", "optimizer")
        .map(text)
        .unwrap_or_default();
    let implementation = get(root, "optim", "optimizer_impl")
        .map(text)
        .unwrap_or_default();
    if !name.eq_ignore_ascii_case("adamw") || !matches!(implementation.as_str(), "" | "torch.optim")
    {
        l.unsupported(
            "optim.optimizer",
            format!(
                "the optimizer `{implementation}.{name}` is not implemented by verlc's engines"
            ),
            "use AdamW of torch.optim",
        );
    }
    let style = get(root, "optim", "lr_scheduler_type")
        .map(text)
        .unwrap_or_default();
    let lr_decay_style = match style.as_str() {
        "constant" => LrDecayStyle::Constant,
        "linear" => LrDecayStyle::Linear,
        "cosine" => LrDecayStyle::Cosine,
        "inverse-square-root" => LrDecayStyle::InverseSquareRoot,
        other => {
            l.unsupported(
                "optim.lr_scheduler_type",
                format!("the `{other}` decay is not implemented by verlc's schedulers"),
                "use constant, linear, cosine or inverse-square-root",
            );
            LrDecayStyle::Constant
        }
    };
    let wd_incr_style = match get(root, "optim", "wd_incr_style").map(text).as_deref() {
        Some("linear") => WdIncrStyle::Linear,
        Some("cosine") => WdIncrStyle::Cosine,
        _ => WdIncrStyle::Constant,
    };
    let (beta1, beta2) = betas(root);
    OptimSpec {
        inner: InnerConfig::AdamW(AdamWConfig {
            beta1,
            beta2,
            eps: num("eps").unwrap_or(1e-8),
        }),
        lr,
        weight_decay: num("weight_decay").unwrap_or(0.01),
        clip_grad: num("clip_grad").unwrap_or(1.0),
        offload,
        offload_fraction: 0.0,
        schedule: ScheduleSpec::Megatron {
            init_lr: lr * num("init_lr_ratio").unwrap_or(0.1),
            min_lr: lr * num("min_lr_ratio").unwrap_or(0.01),
            lr_warmup_steps: get(root, "optim", "lr_warmup_steps")
                .and_then(Node::as_i64)
                .filter(|w| *w > 0),
            lr_warmup_steps_ratio: num("lr_warmup_steps_ratio").unwrap_or(0.0),
            lr_decay_steps: None,
            lr_decay_style,
            wd_incr_style,
        },
        freeze_vision_tower: false,
    }
}

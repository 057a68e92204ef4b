//! The SFT trainer's VeOmni engine (`engine=veomni`, `optim=veomni`) lowered as the FSDP2
//! engine it equals, by the same reading as an RL role's (`crate::veomni`):
//! - `param_offload`/`optimizer_offload` keep their meaning; `enable_fsdp_offload` is FSDP2's
//!   offload policy (both); `ulysses_parallel_size` is the Ulysses degree; `fsdp_size` counts
//!   data-parallel ranks, a shard group being `fsdp_size × ulysses` ranks;
//! - `mixed_precision: true` is FSDP's default (fp32 shards, bf16 compute, fp32 reductions);
//!   `false` trains in bf16 throughout (shards, optimizer state and reductions);
//! - the optimizer `adamw` is torch's AdamW; the cosine schedule is verl's FSDP cosine with
//!   `min_lr_ratio = lr_min / lr`, the constant one FSDP's; warm-up by
//!   `lr_warmup_steps_ratio` (VeOmni never reads `lr_warmup_steps`).
//!
//! Refused at their keys (`B018`): expert parallelism, router replay, VeOmni's other
//! optimizers, a linear schedule, `lr_start`, `lr_decay_ratio`, padding to a length, QAT,
//! activation offload. VeOmni's kernel and loading switches have no effect here (`B006`).

use verlc_spec::optim::{AdamWConfig, InnerConfig, VerlSchedule};
use verlc_spec::trainer::{
    Dtype, EngineSpec, FsdpEngineSpec, OptimSpec, ScheduleSpec, StrategyName,
};

use crate::load::node::Node;
use crate::plan::spec::Lowering;

use super::config::SftConfig;
use super::section::{betas, get, text};

/// Keys of the VeOmni engine section that change nothing in a verlc trainer, with why
/// (reported by [`super::lower::verdicts`] when the user set them).
pub(super) const NO_EFFECT: &[(&str, &str)] = &[
    ("init_device", "the model is built where it trains"),
    (
        "ckpt_manager",
        "checkpoints are verlc's own (Hugging Face weights and optimizer state)",
    ),
    (
        "load_checkpoint_path",
        "a run resumes from trainer.resume_mode's checkpoint",
    ),
    ("forward_prefetch", "the engine gathers one unit at a time"),
    ("use_torch_compile", "the engine runs eagerly"),
    (
        "entropy_from_logits_with_chunking",
        "the SFT loss needs no entropy",
    ),
    ("entropy_checkpointing", "the SFT loss needs no entropy"),
    ("enable_reentrant", "recompute is the engine's own"),
    ("attn_implementation", "verlc's kernels are its own"),
    ("moe_implementation", "verlc's kernels are its own"),
    (
        "cross_entropy_loss_implementation",
        "verlc's kernels are its own",
    ),
    ("rms_norm_implementation", "verlc's kernels are its own"),
    ("swiglu_mlp_implementation", "verlc's kernels are its own"),
    (
        "rotary_pos_emb_implementation",
        "verlc's kernels are its own",
    ),
    (
        "rms_norm_gated_implementation",
        "verlc's kernels are its own",
    ),
    (
        "causal_conv1d_implementation",
        "verlc's kernels are its own",
    ),
    (
        "chunk_gated_delta_rule_implementation",
        "verlc's kernels are its own",
    ),
    (
        "load_balancing_loss_implementation",
        "verlc's kernels are its own",
    ),
    ("dsa_indexer_implementation", "verlc's kernels are its own"),
    (
        "dsa_attention_implementation",
        "verlc's kernels are its own",
    ),
    ("mhc_implementation", "verlc's kernels are its own"),
    (
        "force_use_huggingface",
        "verlc's model families are compiled in",
    ),
    ("basic_modules", "the FSDP engine wraps each decoder layer"),
    (
        "full_determinism",
        "runs on CPU are deterministic for a given seed",
    ),
    (
        "pad_to_length_bucket",
        "micro-batches are packed or padded to their longest row",
    ),
];

/// (key, the value that is fine, why another cannot be honoured).
const UNSUPPORTED: &[(&str, &str, &str)] = &[
    (
        "expert_parallel_size",
        "1",
        "VeOmni's expert parallelism is not implemented",
    ),
    (
        "router_replay.mode",
        "disabled",
        "router replay is not implemented for SFT",
    ),
    (
        "pad_to_length",
        "false",
        "micro-batches are packed or padded to their longest row",
    ),
    (
        "qat_implementation",
        "none",
        "quantization-aware training is not implemented",
    ),
    (
        "enable_async_activation_offload",
        "false",
        "activations stay where they are computed",
    ),
    ("forward_only", "false", "the SFT trainer trains its model"),
];

fn flag(root: &Node, key: &str) -> bool {
    get(root, "engine", key)
        .and_then(Node::as_bool)
        .unwrap_or(false)
}

/// The engine spec, strategy and compute precision of a VeOmni engine section.
pub(super) fn engine(
    root: &Node,
    cfg: &SftConfig,
    checkpointing: bool,
    l: &mut Lowering,
) -> (StrategyName, EngineSpec, Dtype) {
    for (key, fine, why) in UNSUPPORTED {
        if let Some(n) = get(root, "engine", key)
            && !n.is_null()
            && text(n) != *fine
        {
            let key = format!("engine.{key}");
            l.unsupported(
                &key,
                format!("`{key}` cannot be honoured by a verlc trainer: {why}"),
                format!("set `{key}` to {fine}"),
            );
        }
    }
    let policy = flag(root, "enable_fsdp_offload");
    let ulysses = usize::try_from(cfg.engine.ulysses.max(1)).unwrap_or(1);
    // VeOmni's fsdp_size counts data-parallel ranks; its shard groups span the Ulysses ranks.
    let fsdp_size = match get(root, "engine", "fsdp_size").and_then(Node::as_i64) {
        Some(n) if n > 0 => n.saturating_mul(ulysses as i64),
        _ => -1,
    };
    let mixed = get(root, "engine", "mixed_precision")
        .and_then(Node::as_bool)
        .unwrap_or(true);
    let (main_dtype, reduce_dtype) = if mixed {
        (Dtype::Fp32, Dtype::Fp32)
    } else {
        (Dtype::Bf16, Dtype::Bf16)
    };
    let spec = FsdpEngineSpec {
        param_offload: flag(root, "param_offload") || policy,
        optimizer_offload: flag(root, "optimizer_offload") || policy,
        reshard_after_forward: get(root, "engine", "enable_full_shard")
            .and_then(Node::as_bool)
            .unwrap_or(true),
        gradient_checkpointing: checkpointing,
        reduce_dtype,
        fsdp_size,
        remove_padding: cfg.use_remove_padding,
        ulysses,
        main_dtype,
    };
    (StrategyName::Fsdp2, EngineSpec::Fsdp(spec), Dtype::Bf16)
}

/// VeOmni's optimizer section as FSDP's AdamW and schedule.
pub(super) fn optim(root: &Node, lr: f64, offload: bool, l: &mut Lowering) -> OptimSpec {
    let num = |k: &str, d: f64| get(root, "optim", k).and_then(Node::as_f64).unwrap_or(d);
    let name = get(root, "optim", "optimizer")
        .map(text)
        .unwrap_or_default();
    if !name.eq_ignore_ascii_case("adamw") {
        l.unsupported(
            "optim.optimizer",
            format!("VeOmni's optimizer `{name}` is not implemented by verlc's engines"),
            "use adamw",
        );
    }
    for (key, fine) in [("lr_start", 0.0), ("lr_decay_ratio", 1.0)] {
        if (num(key, fine) - fine).abs() > 0.0 {
            let key = format!("optim.{key}");
            l.unsupported(
                &key,
                format!("`{key}` shapes VeOmni's schedule in a way verl's FSDP schedules do not"),
                format!("set `{key}` to {fine}"),
            );
        }
    }
    let kind = get(root, "optim", "lr_scheduler_type")
        .map(text)
        .unwrap_or_default();
    let schedule = match kind.as_str() {
        "constant" => VerlSchedule::Constant,
        "cosine" => VerlSchedule::Cosine {
            min_lr_ratio: if lr > 0.0 {
                num("lr_min", 0.0) / lr
            } else {
                0.0
            },
            num_cycles: 0.5,
        },
        other => {
            l.unsupported(
                "optim.lr_scheduler_type",
                format!("VeOmni's `{other}` schedule is not implemented by verlc's engines"),
                "use cosine or constant",
            );
            VerlSchedule::Constant
        }
    };
    let (beta1, beta2) = betas(root);
    OptimSpec {
        inner: InnerConfig::AdamW(AdamWConfig {
            beta1,
            beta2,
            eps: 1e-8,
        }),
        lr,
        weight_decay: num("weight_decay", 0.01),
        clip_grad: num("clip_grad", 1.0),
        offload,
        offload_fraction: 0.0,
        schedule: ScheduleSpec::Verl {
            schedule,
            lr_warmup_steps: -1,
            lr_warmup_steps_ratio: num("lr_warmup_steps_ratio", 0.0),
            zero_indexed_step: true,
        },
        freeze_vision_tower: false,
    }
}

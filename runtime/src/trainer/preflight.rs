//! What a run needs from this machine, checked before any rank allocates a model: every model
//! the spec names has its weights where the spec says (each safetensors header read: the
//! tensors' names and shapes), and on CPU ranks the weights, gradients and optimizer state of
//! the trained models fit in the host's available memory. A run that cannot work here stops
//! with the reason instead of being killed by the kernel minutes later.
//!
//! The memory bound is a floor, not an estimate: one copy of each trained model's parameters,
//! gradients and AdamW moments (16 bytes a parameter in every precision verlc binds: fp32
//! weights and gradients, or bf16/fp16 ones with fp32 main weights) and one copy of each frozen
//! model's weights, however the ranks shard them (ranks of one node share its memory).
//! Activations, rollout caches and replicated copies come on top, so a refused run could never
//! have fitted.

use std::path::PathBuf;

use verlc_spec::{Dtype, TrainerSpec};

use crate::model::Checkpoint;
use crate::model::pretrained::ModelSource;

/// Bytes per trained parameter: weights, gradients and AdamW's two fp32 moments (fp32
/// throughout, or half-precision weights and gradients beside fp32 main weights).
const TRAINED_BYTES: u64 = 16;

/// Why a run cannot start on this machine.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("`{key}` ({path}): {source}")]
    Weights {
        key: &'static str,
        path: String,
        #[source]
        source: Box<crate::model::ModelError>,
    },
    #[error(
        "`{key}` ({path}): its config.json's `eos_token_id` {eos} is outside its vocabulary of {vocab}: generation would never stop on it"
    )]
    EosOutsideVocabulary {
        key: &'static str,
        path: String,
        eos: i64,
        vocab: i64,
    },
    #[error(
        "this run needs at least {need_gib:.1} GiB of host memory for its models ({parts}), and this machine has {available_gib:.1} GiB available: the ranks would be killed while loading. `verlc explain` estimates the whole per-rank need; to fit, train a smaller model (`{model_key}`), train adapters only (`{lora_key}`), or run on GPUs"
    )]
    Memory {
        need_gib: f64,
        available_gib: f64,
        parts: String,
        /// The key naming the trained model, and the one that trains adapters only.
        model_key: &'static str,
        lora_key: &'static str,
    },
}

/// A model the run loads and how many bytes a parameter of it costs at the least.
struct Need {
    what: &'static str,
    key: &'static str,
    path: String,
    bytes_per_param: u64,
}

fn param_bytes(d: Dtype) -> u64 {
    match d {
        Dtype::Fp32 => 4,
        Dtype::Bf16 | Dtype::Fp16 => 2,
    }
}

fn needs(spec: &TrainerSpec) -> Vec<Need> {
    let frozen = param_bytes(spec.binding.precision);
    let actor_bytes = if spec.actor.lora.is_some() {
        frozen
    } else {
        TRAINED_BYTES
    };
    let mut out = vec![Need {
        what: "actor",
        key: "actor_rollout_ref.model.path",
        path: spec.actor.model_path.clone(),
        bytes_per_param: actor_bytes,
    }];
    // A LoRA actor's reference is its base weights, held once.
    if let Some(r) = spec
        .reference
        .as_ref()
        .filter(|_| spec.actor.lora.is_none())
    {
        out.push(Need {
            what: "reference",
            key: "actor_rollout_ref.model.path",
            path: r.model_path.clone(),
            bytes_per_param: frozen,
        });
    }
    if let Some(c) = &spec.critic {
        out.push(Need {
            what: "critic",
            key: "critic.model.path",
            path: c.model_path.clone(),
            bytes_per_param: TRAINED_BYTES,
        });
    }
    if let Some(rm) = &spec.reward_model {
        out.push(Need {
            what: "reward model",
            key: "reward_model.model.path",
            path: rm.model_path.clone(),
            bytes_per_param: frozen,
        });
    }
    for t in spec.distillation.iter().flat_map(|d| &d.teachers) {
        out.push(Need {
            what: "teacher",
            key: "distillation.teacher_models",
            path: t.model_path.clone(),
            bytes_per_param: frozen,
        });
    }
    out
}

/// Checks the spec's models against this machine: their weights, and on CPU the host's
/// available memory (`available_bytes`; `None` skips the memory check).
pub fn check(spec: &TrainerSpec, available_bytes: Option<u64>) -> Result<(), PreflightError> {
    check_needs(
        needs(spec),
        available_bytes,
        (
            "actor_rollout_ref.model.path",
            "actor_rollout_ref.model.lora_rank",
        ),
    )
}

/// [`check`] for an SFT run: its one trained model (adapters only under LoRA), named by
/// `model.path` (verl 0.7.0's legacy config: `model.partial_pretrain`).
pub fn check_sft(
    spec: &verlc_spec::sft::SftSpec,
    available_bytes: Option<u64>,
) -> Result<(), PreflightError> {
    let key = if spec.trainer.is_legacy() {
        "model.partial_pretrain"
    } else {
        "model.path"
    };
    let bytes_per_param = if spec.model.lora.is_some() {
        param_bytes(spec.binding.precision)
    } else {
        TRAINED_BYTES
    };
    check_needs(
        vec![Need {
            what: "model",
            key,
            path: spec.model.path.clone(),
            bytes_per_param,
        }],
        available_bytes,
        (key, "model.lora_rank"),
    )
}

fn check_needs(
    needs: Vec<Need>,
    available_bytes: Option<u64>,
    (model_key, lora_key): (&'static str, &'static str),
) -> Result<(), PreflightError> {
    let mut need = 0u64;
    let mut parts: Vec<String> = Vec::new();
    for n in needs {
        let weights = |source| PreflightError::Weights {
            key: n.key,
            path: n.path.clone(),
            source: Box::new(source),
        };
        let source = ModelSource::parse(&n.path).map_err(weights)?;
        let config = source.config().map_err(weights)?;
        let eos = match config.extra.get("eos_token_id") {
            Some(serde_json::Value::Array(ids)) => {
                ids.iter().filter_map(serde_json::Value::as_i64).collect()
            }
            Some(v) => v.as_i64().into_iter().collect(),
            None => Vec::new(),
        };
        if let Some(&bad) = eos.iter().find(|&&id| id < 0 || id >= config.vocab_size) {
            return Err(PreflightError::EosOutsideVocabulary {
                key: n.key,
                path: n.path.clone(),
                eos: bad,
                vocab: config.vocab_size,
            });
        }
        let dir: PathBuf = match source {
            ModelSource::Builtin(_) => continue,
            ModelSource::Dir(dir) => dir,
        };
        let shapes = Checkpoint::open(&dir)
            .and_then(|c| c.tensor_shapes())
            .map_err(weights)?;
        let params: u64 = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<u64>())
            .fold(0u64, u64::saturating_add);
        let bytes = params.saturating_mul(n.bytes_per_param);
        need = need.saturating_add(bytes);
        parts.push(format!(
            "{} {:.2}B parameters x {} bytes",
            n.what,
            params as f64 / 1e9,
            n.bytes_per_param
        ));
    }
    if let Some(available) = available_bytes
        && need > available
    {
        const GIB: f64 = (1u64 << 30) as f64;
        return Err(PreflightError::Memory {
            need_gib: need as f64 / GIB,
            available_gib: available as f64 / GIB,
            parts: parts.join(", "),
            model_key,
            lora_key,
        });
    }
    Ok(())
}

/// The host's available memory (`MemAvailable` of `/proc/meminfo`; `None` where there is none).
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

//! `rollout.name: vllm`, verl's hybrid engine in server mode: the trainer starts vLLM's
//! OpenAI-compatible server as a child process ([`server`]), hands it the policy's weights
//! after every update (safetensors in shared memory + `reload_weights` + a prefix-cache
//! reset), and generates through `/v1/completions` with token ids in and out ([`client`]);
//! a vision-language policy's prompts go to vLLM's token-in/token-out
//! endpoint with their images and videos ([`media`]).
//!
//! One server serves the whole run: the main rank starts it and writes the weights, the other
//! ranks learn its address by broadcast and send their own prompts, which vLLM batches
//! together (continuous batching). Each prompt is one request with its own seed, derived from
//! the prompt's sampling stream, so a prompt's samples do not depend on how the batch was
//! split over ranks.

pub mod client;
pub mod http;
pub mod media;
pub mod reaper;
pub mod server;

use std::path::PathBuf;

pub use client::{MidBatchWeights, VERSION_TOLD_LATER, VisionServing, VllmRollout};
pub use server::{Launch, VllmServer};
pub use verlc_spec::trainer::VllmSpec;

use crate::model::Dtype;

/// Errors of the vLLM rollout; each names what the server said where it said anything.
#[derive(Debug, thiserror::Error)]
pub enum VllmError {
    #[error(
        "could not start the vLLM server with `{python}`: {source} (set $VERLC_VLLM_PYTHON to a Python that has vllm, e.g. the project's .venv/bin/python-vllm from `scripts/setup --vllm`)"
    )]
    Spawn {
        python: String,
        source: std::io::Error,
    },
    #[error(
        "the vLLM server exited {when} ({status}); the last lines of {log}:\n{tail}",
        log = log.display()
    )]
    Exited {
        when: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "the vLLM server did not answer /health within {secs} s ($VERLC_VLLM_STARTUP_TIMEOUT_S); the last lines of {log}:\n{tail}",
        log = log.display()
    )]
    StartTimeout {
        secs: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("port {port} was taken before the vLLM server could bind it")]
    PortTaken { port: u16 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("the vLLM server answered {path} with {status}: {body}")]
    Refused {
        path: String,
        status: u16,
        body: String,
    },
    #[error("the vLLM server's answer to {path} is not what verlc expects: {msg}")]
    Protocol { path: String, msg: String },
    #[error("the vLLM server on the main rank is not available: {0}")]
    Remote(String),
    #[error("{0}")]
    Model(String),
}

/// The interpreter that runs vLLM: `$VERLC_VLLM_PYTHON`; else `python-vllm` beside the
/// reward functions' interpreter (what `scripts/setup --vllm` writes into the project venv:
/// the venv's python with vLLM's packages on its path); else that interpreter itself.
pub fn default_python() -> String {
    if let Ok(p) = std::env::var("VERLC_VLLM_PYTHON")
        && !p.is_empty()
    {
        return p;
    }
    let python = crate::pyproc::default_python();
    let beside = std::path::Path::new(&python).with_file_name("python-vllm");
    if beside.is_file() {
        return beside.display().to_string();
    }
    python
}

/// What of the served model decides a server flag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServedModel {
    /// It has linear-attention layers (Qwen3.5, Qwen3-Next).
    pub hybrid: bool,
    /// Its prompts carry images and videos (see [`media`]).
    pub multimodal: bool,
}

/// The server's command-line flags for `spec` (verl's rollout keys) on `device`: what verl's
/// vLLM server sets from the same keys, token ids in and out (`--skip-tokenizer-init`, but a
/// multimodal server loads the tokenizer, which vLLM's multimodal processor needs, and serves
/// the endpoint that takes images), and log-probs after temperature (`processed_logprobs`,
/// verl's default) so they compare with the trainer's.
pub fn flags(
    spec: &VllmSpec,
    dtype: Dtype,
    seed: u64,
    cuda: bool,
    model: ServedModel,
) -> Vec<String> {
    let mut f: Vec<String> = vec![
        "--served-model-name".into(),
        "verlc-policy".into(),
        "--dtype".into(),
        match dtype {
            Dtype::Bf16 => "bfloat16",
            Dtype::Fp16 => "float16",
            Dtype::Fp32 => "float32",
        }
        .into(),
        "--logprobs-mode".into(),
        spec.logprobs_mode.clone(),
        "--seed".into(),
        seed.to_string(),
        "--tensor-parallel-size".into(),
        spec.tensor_parallel.to_string(),
        "--data-parallel-size".into(),
        spec.data_parallel.to_string(),
        "--max-num-seqs".into(),
        spec.max_num_seqs.to_string(),
        "--max-num-batched-tokens".into(),
        spec.max_num_batched_tokens
            .max(spec.max_model_len)
            .to_string(),
        "--max-model-len".into(),
        spec.max_model_len.to_string(),
    ];
    let switch = |f: &mut Vec<String>, on: bool, yes: &str, no: &str| {
        f.push(if on { yes } else { no }.to_owned());
    };
    // On CPU, vLLM 0.32 fails a seeded request whose prompt is prefilled in parts (its CPU
    // generator cannot rewind, `set_offset`); every request here is seeded, so prompts are
    // prefilled whole there. The tokens are the same either way.
    switch(
        &mut f,
        spec.enable_chunked_prefill && cuda,
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
    );
    // vLLM caches a linear-attention layer's state for prefix caching only with chunked
    // prefill: a hybrid model's server refuses to start with prefix caching on CPU, so its
    // prefixes are not cached there (the tokens are the same either way).
    switch(
        &mut f,
        spec.enable_prefix_caching && (cuda || !model.hybrid),
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
    );
    if model.multimodal {
        f.push("--enable-scale-out".into());
        // No processed-image cache between the front end and the engine (it is keyed by the
        // image, and the engine's encoder cache is reset at every reload): the first run
        // without this and without that reset failed at step 20 with vLLM 0.32's "Encoder
        // cache miss"; with both, the example's 80 steps ran. Processing an image again costs
        // little beside generating.
        f.extend(["--mm-processor-cache-gb".into(), "0".into()]);
    } else {
        f.push("--skip-tokenizer-init".into());
    }
    if spec.enforce_eager {
        f.push("--enforce-eager".into());
    }
    if spec.expert_parallel > 1 {
        f.push("--enable-expert-parallel".into());
    }
    if spec.disable_log_stats {
        f.push("--disable-log-stats".into());
    }
    if cuda {
        f.push("--gpu-memory-utilization".into());
        f.push(spec.gpu_memory_utilization.to_string());
        if spec.sleep_between_steps {
            f.push("--enable-sleep-mode".into());
        }
    }
    for (key, value) in &spec.engine_kwargs {
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            serde_json::Value::Bool(true) => f.push(flag),
            serde_json::Value::Bool(false) | serde_json::Value::Null => {}
            serde_json::Value::String(s) => f.extend([flag, s.clone()]),
            other => f.extend([flag, other.to_string()]),
        }
    }
    f
}

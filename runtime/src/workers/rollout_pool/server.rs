//! The replica process's side: connect to the rank's socket, build the rollout model the
//! rank describes, then answer weight syncs and generation calls until told to stop or the
//! socket closes.

use std::io::{BufReader, BufWriter};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde_json::{Value, json};
use tch::{Device, Tensor};

use super::{PoolError, decode_images, device_of, encode_output, wire};
use crate::model::{Dtype, ModelConfig};
use crate::rollout::{
    GenerateInput, PromptStream, RolloutError, SamplingParams, StopTokens, generate_interruptible,
};
use crate::workers::rollout::RolloutWorker;

/// Set (to the socket's path) in a process started as a rollout replica.
pub const REPLICA_ENV: &str = "VERLC_ROLLOUT_REPLICA";

/// In a process started as a rollout replica (`$VERLC_ROLLOUT_REPLICA` set), serves the rank
/// that started it and returns how that ended; `None` in any other process. A trainer
/// binary's `main` calls this first.
pub fn serve_if_replica() -> Option<Result<(), PoolError>> {
    let socket = std::env::var_os(REPLICA_ENV)?;
    Some(serve(Path::new(&socket)))
}

fn serve(socket: &Path) -> Result<(), PoolError> {
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets this process's parent-death signal: the
    // replica must not outlive the rank that started it (a killed trainer runs no destructor).
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let stream = UnixStream::connect(socket)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = BufWriter::new(stream);
    let mut worker: Option<RolloutWorker> = None;
    while let Some((request, blobs)) = wire::read(&mut reader)? {
        let op = request["op"].as_str().unwrap_or_default();
        if op == "stop" {
            return Ok(());
        }
        let answer = match op {
            "start" => start(&request).map(|(w, h)| {
                worker = Some(w);
                (h, Vec::new())
            }),
            "weights" => match worker.as_mut() {
                Some(w) => load(w, &request, &blobs)
                    .map(|()| (json!({"bound": request["version"]}), Vec::new())),
                None => Err(PoolError::Protocol("weights before start".into())),
            },
            "generate" => match worker.as_ref() {
                Some(w) => generate(w, &request, &blobs, &mut reader, &mut writer),
                None => Err(PoolError::Protocol("generate before start".into())),
            },
            other => Err(PoolError::Protocol(format!("unknown request `{other}`"))),
        };
        match answer {
            Ok((h, blobs)) => wire::write(&mut writer, &h, &blobs)?,
            // A failed request is answered with why; the rank decides what happens next.
            Err(e) => wire::write(&mut writer, &json!({"error": e.to_string()}), &[])?,
        }
    }
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(v: &Value, key: &str) -> Result<T, PoolError> {
    serde_json::from_value(v[key].clone()).map_err(|e| PoolError::Protocol(format!("`{key}`: {e}")))
}

fn start(request: &Value) -> Result<(RolloutWorker, Value), PoolError> {
    let config: ModelConfig = parse(request, "config")?;
    let dtype: Dtype = parse(request, "dtype")?;
    let threads: usize = parse(request, "threads")?;
    let device = device_of(request["device"].as_str().unwrap_or("cpu"))?;
    if let Device::Cuda(i) = device
        && tch::Cuda::device_count() <= i as i64
    {
        return Err(PoolError::Remote(format!(
            "its device cuda:{i} is not there: libtorch sees {} CUDA device(s) (the trainer's ranks take the first ones, the pool the next)",
            tch::Cuda::device_count()
        )));
    }
    tch::set_num_threads(threads.max(1) as i32);
    let worker =
        RolloutWorker::new(&config, dtype, device).map_err(|e| PoolError::Remote(e.to_string()))?;
    let vision = worker.vision_tokens().map(|v| {
        json!({
            "image_token_id": v.image_token_id,
            "video_token_id": v.video_token_id,
            "vision_start_token_id": v.vision_start_token_id,
            "spatial_merge_size": v.spatial_merge_size,
            "tokens_per_second": v.tokens_per_second,
            "timestamped_videos": v.timestamped_videos,
        })
    });
    Ok((worker, json!({ "vision": vision })))
}

fn load(worker: &mut RolloutWorker, request: &Value, blobs: &[Vec<u8>]) -> Result<(), PoolError> {
    worker
        .update_weights(&weights(request, blobs)?)
        .map_err(|e| PoolError::Remote(e.to_string()))
}

/// The tensors of a weights frame.
fn weights(request: &Value, blobs: &[Vec<u8>]) -> Result<Vec<(String, Tensor)>, PoolError> {
    let entries = request["params"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if entries.len() != blobs.len() {
        return Err(PoolError::Protocol(format!(
            "{} weights with {} blobs",
            entries.len(),
            blobs.len()
        )));
    }
    entries
        .iter()
        .zip(blobs)
        .map(|(e, b)| {
            let name = e["name"].as_str().unwrap_or_default().to_owned();
            Ok((name, wire::to_tensor(&e["tensor"], b)?))
        })
        .collect()
}

/// Between two tokens: the weights frame the rank sent while this batch decodes (partial
/// rollout), bound and acknowledged; `None` when none is waiting.
fn newer_weights(
    worker: &RolloutWorker,
    reader: &mut BufReader<UnixStream>,
    writer: &mut BufWriter<UnixStream>,
) -> Result<Option<u64>, PoolError> {
    if !wire::readable(reader, std::time::Duration::ZERO)? {
        return Ok(None);
    }
    let Some((request, blobs)) = wire::read(reader)? else {
        return Err(PoolError::Protocol(
            "the rank closed the socket during a generation".into(),
        ));
    };
    let version = match (request["op"].as_str(), request["version"].as_u64()) {
        (Some("weights"), Some(v)) => v,
        _ => {
            return Err(PoolError::Protocol(
                "a request other than versioned weights during a generation".into(),
            ));
        }
    };
    worker
        .bind_newer(&weights(&request, &blobs)?)
        .map_err(|e| PoolError::Remote(e.to_string()))?;
    wire::write(writer, &json!({"bound": version}), &[])?;
    Ok(Some(version))
}

fn generate(
    worker: &RolloutWorker,
    request: &Value,
    blobs: &[Vec<u8>],
    reader: &mut BufReader<UnixStream>,
    writer: &mut BufWriter<UnixStream>,
) -> Result<(Value, Vec<Vec<u8>>), PoolError> {
    let prompts: Vec<Vec<i64>> = parse(request, "prompts")?;
    let streams: Vec<[u64; 2]> = parse(request, "streams")?;
    let streams: Vec<PromptStream> = streams
        .into_iter()
        .map(|[seed, index]| PromptStream { seed, index })
        .collect();
    let params: SamplingParams = parse(request, "params")?;
    let stop = StopTokens {
        eos: parse(&request["stop"], "eos")?,
        pad: parse(&request["stop"], "pad")?,
    };
    let images = decode_images(request, blobs)?;
    let width: Option<usize> = parse(request, "prompt_width")?;
    let model = match worker.model() {
        Some(m) if worker.is_loaded() => m,
        _ => return Err(PoolError::Protocol("generate before weights".into())),
    };
    let input = GenerateInput {
        prompts: &prompts,
        images: &images,
        streams: &streams,
        prompt_width: width,
    };
    let mut swap =
        || newer_weights(worker, reader, writer).map_err(|e| RolloutError::Batch(e.to_string()));
    let out = tch::no_grad(|| generate_interruptible(model, input, &params, &stop, &mut swap))
        .map_err(|e| PoolError::Remote(e.to_string()))?;
    encode_output(&out)
}

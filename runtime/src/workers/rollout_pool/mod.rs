//! verl's separate rollout pool with the built-in engine (`separate_async`): each trainer rank
//! drives one or more rollout replicas in processes of their own ([`RankPool`]), which hold
//! their own copy of the policy and generate on their own cores (or device) while the rank
//! trains; a rank with several splits each generation call's prompts among them.
//!
//! The replica is the trainer's own binary started with [`REPLICA_ENV`] naming a Unix socket
//! ([`server::serve_if_replica`] runs it before anything else). The rank's side,
//! [`RolloutReplica`] (started by [`RankPool::start`]), sends it the model's config at start, the policy's whole tensors by
//! name at every weight sync, and each generation call's prompts (with their images),
//! sampling streams and settings; the replica answers with the generated batch, the same
//! tensors a rollout in the rank's own process would have made (it runs the same worker).
//!
//! The replica dies with the rank (the kernel's parent-death signal), ends when its socket
//! closes, and a replica that exits or stops answering is an error naming how it ended.

pub mod server;
pub mod wire;

use std::ffi::OsString;
use std::io::{BufReader, BufWriter};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tch::{Device, Tensor};

use crate::engine::batch::RowImages;
use crate::model::vision::{MropeTokens, ProcessedImage};
use crate::model::{Dtype, ModelConfig};
use crate::rollout::{
    NewerWeights, PromptStream, RolloutOutput, RowVersions, SamplingParams, StopTokens,
};

pub use server::{REPLICA_ENV, serve_if_replica};

/// Failures of the pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("the rollout replica process: {0}")]
    Io(#[from] std::io::Error),
    #[error("the rollout replica process: {0}")]
    Protocol(String),
    #[error("the rollout replica process failed: {0}")]
    Remote(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// How to start a replica: a program (the trainer binary, or a test binary that serves in a
/// test function) and its arguments ([`REPLICA_ENV`] is added), and how long a request may
/// go unanswered before the replica counts as hung.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub answer_timeout: Duration,
}

impl ReplicaCommand {
    /// This process's own executable, without arguments (a trainer binary).
    pub fn this_binary() -> std::io::Result<ReplicaCommand> {
        Ok(ReplicaCommand::new(std::env::current_exe()?, Vec::new()))
    }

    /// `program` with `args`, answering within [`answer_timeout`].
    pub fn new(program: PathBuf, args: Vec<OsString>) -> ReplicaCommand {
        ReplicaCommand {
            program,
            args,
            answer_timeout: answer_timeout(),
        }
    }
}

/// `$VERLC_ROLLOUT_REPLICA_TIMEOUT_S` (positive seconds), else 1800: the longest a replica
/// may take to start, sync or generate one batch before the run ends with an error.
pub fn answer_timeout() -> Duration {
    let secs = std::env::var("VERLC_ROLLOUT_REPLICA_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1800.0);
    Duration::from_secs_f64(secs)
}

struct Connection {
    child: Child,
    reader: BufReader<UnixStream>,
    writer: BufWriter<UnixStream>,
}

/// A rank's rollout replica process.
pub struct RolloutReplica {
    conn: Mutex<Connection>,
    /// The longest a request may go unanswered.
    timeout: Duration,
    /// A vision-language model's vision tokens, as the replica's model has them.
    vision: Option<MropeTokens>,
    /// The socket's directory, removed with the replica.
    _dir: SocketDir,
}

/// A directory removed when dropped.
struct SocketDir(PathBuf);

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::fmt::Debug for RolloutReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutReplica").finish_non_exhaustive()
    }
}

impl RolloutReplica {
    /// The vision tokens of a vision-language model.
    pub fn vision_tokens(&self) -> Option<&MropeTokens> {
        self.vision.as_ref()
    }

    /// Sends one request and waits for its answer; an answer with `error` is the replica's
    /// failure, a closed socket the process's end (with its exit status).
    fn call(&self, header: &Value, blobs: &[Vec<u8>]) -> Result<(Value, Vec<Vec<u8>>), PoolError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| PoolError::Protocol("a previous call panicked".into()))?;
        let sent = wire::write(&mut conn.writer, header, blobs);
        let answer = match sent {
            Ok(()) => wire::read(&mut conn.reader),
            Err(e) => Err(e),
        };
        match answer {
            Ok(Some((h, blobs))) => match h.get("error").and_then(Value::as_str) {
                Some(msg) => Err(PoolError::Remote(msg.to_owned())),
                None => Ok((h, blobs)),
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(PoolError::Remote(format!(
                    "it did not answer within {} s (VERLC_ROLLOUT_REPLICA_TIMEOUT_S)",
                    self.timeout.as_secs_f64()
                )))
            }
            Ok(None) | Err(_) => Err(ended(&mut conn.child)),
        }
    }

    /// Generates `params.n` responses for each prompt, with each prompt's sampling stream and
    /// images (`images[i]` those of `prompts[i]`; empty: none has any).
    /// `prompt_width`: left-pad the prompts to this width (`None`: to the longest), so that
    /// the parts of one call generated by several replicas stack.
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
        prompt_width: Option<usize>,
    ) -> Result<RolloutOutput, PoolError> {
        let request = GenerateRequest {
            prompts,
            images,
            streams,
            params,
            stop,
            prompt_width,
        };
        self.generate_forwarding(&request, None).map(|(out, _)| out)
    }

    /// [`RolloutReplica::generate`] that passes on the weights `forward` gets while the
    /// replica decodes (it takes them between two tokens: partial rollout); also returns the
    /// last version it passed on.
    fn generate_forwarding(
        &self,
        request: &GenerateRequest<'_>,
        forward: Option<&Forward>,
    ) -> Result<(RolloutOutput, Option<u64>), PoolError> {
        let GenerateRequest {
            prompts,
            images,
            streams,
            params,
            stop,
            prompt_width,
        } = *request;
        let mut blobs = Vec::new();
        let images: Vec<Vec<Value>> = images
            .iter()
            .map(|row| {
                row.iter()
                    .map(|img| {
                        blobs.push(wire::f32_blob(&img.pixel_values));
                        json!({
                            "grid_thw": img.grid_thw,
                            "seconds_per_grid": img.seconds_per_grid,
                            "timestamps": img.timestamps,
                            "blob": blobs.len() - 1,
                        })
                    })
                    .collect()
            })
            .collect();
        let streams: Vec<[u64; 2]> = streams.iter().map(|s| [s.seed, s.index]).collect();
        let request = json!({
            "op": "generate",
            "prompts": prompts,
            "images": images,
            "streams": streams,
            "params": params,
            "stop": {"eos": stop.eos, "pad": stop.pad},
            "prompt_width": prompt_width,
        });
        let ((answer, blobs), sent) = match forward {
            None => (self.call(&request, &blobs)?, None),
            Some(forward) => self.call_forwarding(&request, &blobs, forward)?,
        };
        Ok((decode_output(&answer, &blobs)?, sent))
    }

    /// [`RolloutReplica::call`] of a generation request, sending the replica the newer weights
    /// `forward` gets until it answers. Each weights frame is acknowledged (`bound`) once, by
    /// the replica between two tokens or, when it had finished, after its answer; the call
    /// reads every acknowledgement, so the socket holds nothing when it returns.
    fn call_forwarding(
        &self,
        header: &Value,
        blobs: &[Vec<u8>],
        forward: &Forward,
    ) -> Result<(Answer, Option<u64>), PoolError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| PoolError::Protocol("a previous call panicked".into()))?;
        if wire::write(&mut conn.writer, header, blobs).is_err() {
            return Err(ended(&mut conn.child));
        }
        let (mut sent, mut acks_due, mut answer) = (None, 0usize, None);
        let mut last_frame = Instant::now();
        loop {
            if answer.is_some() && acks_due == 0 {
                break;
            }
            if answer.is_none()
                && let Some((version, frame)) = forward.newer_than(sent)
            {
                let mut h = frame.0.clone();
                h["version"] = json!(version);
                if wire::write(&mut conn.writer, &h, &frame.1).is_err() {
                    return Err(ended(&mut conn.child));
                }
                sent = Some(version);
                acks_due += 1;
            }
            if !wire::readable(&conn.reader, Duration::from_millis(20))? {
                if last_frame.elapsed() > self.timeout {
                    return Err(PoolError::Remote(format!(
                        "it did not answer within {} s (VERLC_ROLLOUT_REPLICA_TIMEOUT_S)",
                        self.timeout.as_secs_f64()
                    )));
                }
                continue;
            }
            let (h, b) = match wire::read(&mut conn.reader) {
                Ok(Some(frame)) => frame,
                Ok(None) | Err(_) => return Err(ended(&mut conn.child)),
            };
            last_frame = Instant::now();
            if let Some(msg) = h.get("error").and_then(Value::as_str) {
                return Err(PoolError::Remote(msg.to_owned()));
            }
            if h.get("bound").is_some() {
                acks_due = acks_due.saturating_sub(1);
            } else {
                answer = Some((h, b));
            }
        }
        let answer = answer.ok_or_else(|| PoolError::Protocol("no answer".into()))?;
        Ok((answer, sent))
    }
}

/// One generation call's inputs, as [`RolloutReplica::generate`] takes them.
#[derive(Clone, Copy)]
struct GenerateRequest<'a> {
    prompts: &'a [Vec<i64>],
    images: &'a [RowImages],
    streams: &'a [PromptStream],
    params: &'a SamplingParams,
    stop: &'a StopTokens,
    prompt_width: Option<usize>,
}

/// A frame's header and blobs.
type Answer = (Value, Vec<Vec<u8>>);

/// A weights frame written once for every replica.
type Frame = Arc<Answer>;

/// The newest weights published while a call generates, for each of its replicas to pass on.
#[derive(Default)]
struct Forward {
    latest: Mutex<Option<(u64, Frame)>>,
}

impl Forward {
    fn set(&self, version: u64, frame: Frame) {
        *self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((version, frame));
    }

    /// The newest weights when they are newer than `sent`.
    fn newer_than(&self, sent: Option<u64>) -> Option<(u64, Frame)> {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        latest
            .as_ref()
            .filter(|(v, _)| sent.is_none_or(|s| *v > s))
            .map(|(v, f)| (*v, Arc::clone(f)))
    }
}

/// A replica process started, not yet connected. The process is started on the caller's
/// thread: its parent-death signal follows the thread that started it, so a replica started
/// on a short-lived thread would die with that thread. One that is dropped before it is
/// connected (it failed, or a sibling did) is killed.
struct Spawned {
    child: Option<Child>,
    listener: UnixListener,
    dir: Option<SocketDir>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Spawned {
    fn spawn(command: &ReplicaCommand, place: &ReplicaPlace) -> Result<Spawned, PoolError> {
        let threads = place.threads.max(1);
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "verlc-rollout-replica-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let dir = SocketDir(dir);
        let socket = dir.0.join("replica.sock");
        let listener = UnixListener::bind(&socket)?;
        listener.set_nonblocking(true)?;
        let child = Command::new(&command.program)
            .args(&command.args)
            .env(REPLICA_ENV, &socket)
            .env("OMP_NUM_THREADS", threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                PoolError::Protocol(format!("starting {}: {e}", command.program.display()))
            })?;
        Ok(Spawned {
            child: Some(child),
            listener,
            dir: Some(dir),
        })
    }

    /// Waits for the replica to connect and build its model (any thread may wait), within
    /// `command`'s timeout.
    fn connect(
        mut self,
        command: &ReplicaCommand,
        config: &ModelConfig,
        dtype: Dtype,
        place: &ReplicaPlace,
    ) -> Result<RolloutReplica, PoolError> {
        let timeout = command.answer_timeout;
        let started = Instant::now();
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(status) = self
                .child
                .as_mut()
                .map(Child::try_wait)
                .transpose()?
                .flatten()
            {
                return Err(PoolError::Remote(format!(
                    "it exited ({status}) before it connected"
                )));
            }
            if started.elapsed() > timeout {
                return Err(PoolError::Remote(format!(
                    "it did not connect within {} s (VERLC_ROLLOUT_REPLICA_TIMEOUT_S)",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        stream.set_nonblocking(false)?;
        // A replica that stops answering (hung, not exited) ends the call with an error.
        stream.set_read_timeout(Some(timeout))?;
        let (reader, writer) = (BufReader::new(stream.try_clone()?), BufWriter::new(stream));
        let (Some(child), Some(dir)) = (self.child.take(), self.dir.take()) else {
            return Err(PoolError::Protocol("a replica connected twice".into()));
        };
        // From here the replica's own drop stops it.
        let mut replica = RolloutReplica {
            conn: Mutex::new(Connection {
                child,
                reader,
                writer,
            }),
            timeout,
            vision: None,
            _dir: dir,
        };
        let hello = json!({
            "op": "start",
            "config": config,
            "dtype": dtype,
            "threads": place.threads.max(1),
            "device": device_name(place.device),
        });
        let (answer, _) = replica.call(&hello, &[])?;
        replica.vision = match &answer["vision"] {
            Value::Null => None,
            v => Some(MropeTokens {
                image_token_id: int(v, "image_token_id")?,
                video_token_id: int(v, "video_token_id")?,
                vision_start_token_id: int(v, "vision_start_token_id")?,
                spatial_merge_size: int(v, "spatial_merge_size")?,
                tokens_per_second: v["tokens_per_second"].as_f64().unwrap_or(2.0),
                timestamped_videos: v["timestamped_videos"].as_bool().unwrap_or(false),
            }),
        };
        Ok(replica)
    }
}

/// Where a replica runs: its device and intra-op threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaPlace {
    pub device: Device,
    pub threads: usize,
}

/// A trainer rank's replicas of the rollout pool.
#[derive(Debug)]
pub struct RankPool {
    replicas: Vec<RolloutReplica>,
}

impl RankPool {
    /// Starts a replica at each of `places` (at least one), side by side.
    pub fn start(
        command: &ReplicaCommand,
        config: &ModelConfig,
        dtype: Dtype,
        places: &[ReplicaPlace],
    ) -> Result<RankPool, PoolError> {
        if places.is_empty() {
            return Err(PoolError::Protocol("a rank's pool without replicas".into()));
        }
        // Started here (see `Spawned`), connected side by side while each builds its model.
        let spawned = places
            .iter()
            .map(|p| Spawned::spawn(command, p))
            .collect::<Result<Vec<_>, _>>()?;
        let started: Vec<Result<RolloutReplica, PoolError>> = std::thread::scope(|s| {
            let handles: Vec<_> = spawned
                .into_iter()
                .zip(places)
                .map(|(sp, p)| s.spawn(move || sp.connect(command, config, dtype, p)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(PoolError::Protocol("a start panicked".into())))
                })
                .collect()
        });
        Ok(RankPool {
            replicas: started.into_iter().collect::<Result<_, _>>()?,
        })
    }

    /// The vision tokens of a vision-language model.
    pub fn vision_tokens(&self) -> Option<&MropeTokens> {
        self.replicas
            .first()
            .and_then(RolloutReplica::vision_tokens)
    }

    /// Binds the policy's whole tensors to every replica (written once, sent to each).
    pub fn update_weights(&self, params: &[(String, Tensor)]) -> Result<(), PoolError> {
        let (header, blobs) = weights_frame(params)?;
        let (header, blobs) = (&header, &blobs);
        std::thread::scope(|s| {
            let calls: Vec<_> = self
                .replicas
                .iter()
                .map(|r| s.spawn(move || r.call(header, blobs).map(drop)))
                .collect();
            calls.into_iter().try_for_each(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(PoolError::Protocol("a sync panicked".into())))
            })
        })
    }

    /// Generates as [`RolloutReplica::generate`], the prompts split into contiguous parts, one
    /// per replica, padded to the longest prompt of the call and stacked back in order: each
    /// prompt keeps its sampling stream, so its tokens do not depend on the split.
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput, PoolError> {
        let k = self.replicas.len().min(prompts.len()).max(1);
        if k == 1 {
            return self.replicas[0].generate(prompts, images, streams, params, stop, None);
        }
        self.generate_parts(prompts, images, streams, params, stop, None)
            .map(|(out, _)| out)
    }

    /// [`RankPool::generate`] while `newer` may bring new weights (verl's partial rollout in
    /// `separate_async`: the pool's requests in flight at a weight sync resume with the new
    /// weights): they are passed on to the replicas, which take them between two tokens, and
    /// afterwards bound to any replica that had finished before them.
    pub fn generate_swapping(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
        newer: &mut NewerWeights<'_>,
    ) -> Result<RolloutOutput, PoolError> {
        let forward = Forward::default();
        let (out, sent) = std::thread::scope(|s| {
            let call = s.spawn(|| {
                self.generate_parts(prompts, images, streams, params, stop, Some(&forward))
            });
            // This thread takes the published weights while the replicas generate.
            let mut failed = None;
            while !call.is_finished() {
                match newer() {
                    Ok(Some((version, params))) => match weights_frame(&params) {
                        Ok(frame) => forward.set(version, Arc::new(frame)),
                        Err(e) => failed = Some(e),
                    },
                    Ok(None) => {}
                    Err(e) => failed = Some(PoolError::Protocol(e)),
                }
                if failed.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let result = call
                .join()
                .unwrap_or_else(|_| Err(PoolError::Protocol("a generation call panicked".into())));
            match failed {
                Some(e) => Err(e),
                None => result,
            }
        })?;
        // Replicas that answered before the newest weights came take them now.
        if let Some((version, frame)) = forward.newer_than(None) {
            let mut header = frame.0.clone();
            header["version"] = json!(version);
            for (replica, got) in self
                .replicas
                .iter()
                .zip(sent.iter().chain(std::iter::repeat(&None)))
            {
                if *got != Some(version) {
                    replica.call(&header, &frame.1)?;
                }
            }
        }
        Ok(out)
    }

    /// The prompts split into contiguous parts, one per replica (see [`RankPool::generate`]),
    /// each replica passing on `forward`'s weights; also the last version each was sent.
    fn generate_parts(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
        forward: Option<&Forward>,
    ) -> Result<(RolloutOutput, Vec<Option<u64>>), PoolError> {
        let k = self.replicas.len().min(prompts.len()).max(1);
        if streams.len() != prompts.len() || !(images.is_empty() || images.len() == prompts.len()) {
            return Err(PoolError::Protocol(format!(
                "{} prompts with {} streams and {} image rows",
                prompts.len(),
                streams.len(),
                images.len()
            )));
        }
        let width = prompts.iter().map(Vec::len).max();
        let n = prompts.len();
        let parts: Vec<std::ops::Range<usize>> =
            (0..k).map(|c| c * n / k..(c + 1) * n / k).collect();
        let outputs: Vec<Result<(RolloutOutput, Option<u64>), PoolError>> =
            std::thread::scope(|s| {
                let calls: Vec<_> = parts
                    .iter()
                    .zip(&self.replicas)
                    .map(|(part, r)| {
                        let request = GenerateRequest {
                            prompts: &prompts[part.clone()],
                            images: images.get(part.clone()).unwrap_or(&[]),
                            streams: &streams[part.clone()],
                            params,
                            stop,
                            prompt_width: width,
                        };
                        s.spawn(move || r.generate_forwarding(&request, forward))
                    })
                    .collect();
                calls
                    .into_iter()
                    .map(|c| {
                        c.join().unwrap_or_else(|_| {
                            Err(PoolError::Protocol("a generation call panicked".into()))
                        })
                    })
                    .collect()
            });
        let (outputs, sent): (Vec<_>, Vec<_>) = outputs
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let out = stack(parts.iter().map(|p| p.start).zip(outputs).collect())?;
        Ok((out, sent))
    }
}

/// The parts of one generation call, each with the index of its first prompt, as one output
/// (the parts share their prompt width and response length).
fn stack(parts: Vec<(usize, RolloutOutput)>) -> Result<RolloutOutput, PoolError> {
    let cat = |pick: fn(&RolloutOutput) -> &Tensor| -> Result<Tensor, PoolError> {
        let ts: Vec<&Tensor> = parts.iter().map(|(_, o)| pick(o)).collect();
        Ok(Tensor::f_cat(&ts, 0)?)
    };
    let mut out = RolloutOutput {
        prompts: cat(|o| &o.prompts)?,
        responses: cat(|o| &o.responses)?,
        input_ids: cat(|o| &o.input_ids)?,
        attention_mask: cat(|o| &o.attention_mask)?,
        position_ids: cat(|o| &o.position_ids)?,
        response_mask: cat(|o| &o.response_mask)?,
        rollout_log_probs: cat(|o| &o.rollout_log_probs)?,
        response_lengths: Vec::new(),
        finished: Vec::new(),
        prompt_index: Vec::new(),
        decoded_rows: 0,
        num_turns: Vec::new(),
        tool_calls: Vec::new(),
        tool_failures: Vec::new(),
        tool_rewards: Vec::new(),
        turn_scores: Vec::new(),
        loop_scores: Vec::new(),
        versions: Vec::new(),
    };
    let swapped = parts.iter().any(|(_, o)| !o.versions.is_empty());
    for (first, o) in parts {
        if swapped {
            let rows = o.response_lengths.len();
            let mut v = o.versions;
            v.resize(rows, RowVersions::default());
            out.versions.extend(v);
        }
        out.response_lengths.extend(o.response_lengths);
        out.finished.extend(o.finished);
        out.prompt_index
            .extend(o.prompt_index.into_iter().map(|i| i + first));
        out.decoded_rows += o.decoded_rows;
        out.num_turns.extend(o.num_turns);
        out.tool_calls.extend(o.tool_calls);
        out.tool_failures.extend(o.tool_failures);
        out.tool_rewards.extend(o.tool_rewards);
        out.turn_scores.extend(o.turn_scores);
        out.loop_scores.extend(o.loop_scores);
    }
    Ok(out)
}

/// The request that binds `params` (whole tensors by name) to a replica's model.
fn weights_frame(params: &[(String, Tensor)]) -> Result<(Value, Vec<Vec<u8>>), PoolError> {
    let mut names = Vec::with_capacity(params.len());
    let mut blobs = Vec::with_capacity(params.len());
    for (name, t) in params {
        let (desc, blob) = wire::tensor(t)?;
        names.push(json!({"name": name, "tensor": desc}));
        blobs.push(blob);
    }
    Ok((json!({"op": "weights", "params": names}), blobs))
}

/// A device as the wire names it.
fn device_name(d: Device) -> String {
    match d {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".into(),
    }
}

/// The device of a wire name.
pub(crate) fn device_of(name: &str) -> Result<Device, PoolError> {
    match name.strip_prefix("cuda:") {
        None if name == "cpu" => Ok(Device::Cpu),
        Some(i) => i
            .parse()
            .map(Device::Cuda)
            .map_err(|_| PoolError::Protocol(format!("device `{name}`"))),
        None => Err(PoolError::Protocol(format!("device `{name}`"))),
    }
}

impl Drop for RolloutReplica {
    fn drop(&mut self) {
        let Ok(mut conn) = self.conn.lock() else {
            return;
        };
        // Asked to stop, the replica exits at once; one that does not is killed.
        let _ = wire::write(&mut conn.writer, &json!({"op": "stop"}), &[]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = conn.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = conn.child.kill();
        let _ = conn.child.wait();
    }
}

/// Why the replica stopped answering: its exit status when it has exited.
fn ended(child: &mut Child) -> PoolError {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return PoolError::Remote(format!("it exited ({status}) during a request"));
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => return PoolError::Remote("it closed its socket during a request".into()),
        }
    }
}

fn int(v: &Value, key: &str) -> Result<i64, PoolError> {
    v[key]
        .as_i64()
        .ok_or_else(|| PoolError::Protocol(format!("`{key}` is missing")))
}

/// The tensors of a [`RolloutOutput`], in wire order.
const OUTPUT_TENSORS: [&str; 7] = [
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "rollout_log_probs",
];

/// `out` as a header and blobs.
pub(crate) fn encode_output(out: &RolloutOutput) -> Result<(Value, Vec<Vec<u8>>), PoolError> {
    let tensors = [
        &out.prompts,
        &out.responses,
        &out.input_ids,
        &out.attention_mask,
        &out.position_ids,
        &out.response_mask,
        &out.rollout_log_probs,
    ];
    let mut descs = Vec::new();
    let mut blobs = Vec::new();
    for t in tensors {
        let (d, b) = wire::tensor(t)?;
        descs.push(d);
        blobs.push(b);
    }
    let header = json!({
        "tensors": descs,
        "response_lengths": out.response_lengths,
        "finished": out.finished,
        "prompt_index": out.prompt_index,
        "decoded_rows": out.decoded_rows,
        "num_turns": out.num_turns,
        "tool_calls": out.tool_calls,
        "tool_failures": out.tool_failures,
        "tool_rewards": out.tool_rewards,
        "turn_scores": out.turn_scores,
        "loop_scores": out.loop_scores,
        "versions": out.versions.iter().map(|v| [v.first, v.last]).collect::<Vec<_>>(),
    });
    Ok((header, blobs))
}

/// The [`RolloutOutput`] of a header and its blobs.
fn decode_output(h: &Value, blobs: &[Vec<u8>]) -> Result<RolloutOutput, PoolError> {
    let descs = h["tensors"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if descs.len() != OUTPUT_TENSORS.len() || blobs.len() != OUTPUT_TENSORS.len() {
        return Err(PoolError::Protocol(format!(
            "a generated batch with {} tensors and {} blobs",
            descs.len(),
            blobs.len()
        )));
    }
    let mut t = descs
        .iter()
        .zip(blobs)
        .map(|(d, b)| wire::to_tensor(d, b))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    let mut next = || {
        t.next()
            .ok_or_else(|| PoolError::Protocol("a tensor is missing".into()))
    };
    fn field<T: serde::de::DeserializeOwned>(h: &Value, key: &str) -> Result<T, PoolError> {
        serde_json::from_value(h[key].clone())
            .map_err(|e| PoolError::Protocol(format!("`{key}` of a generated batch: {e}")))
    }
    Ok(RolloutOutput {
        prompts: next()?,
        responses: next()?,
        input_ids: next()?,
        attention_mask: next()?,
        position_ids: next()?,
        response_mask: next()?,
        rollout_log_probs: next()?,
        response_lengths: field(h, "response_lengths")?,
        finished: field(h, "finished")?,
        prompt_index: field(h, "prompt_index")?,
        decoded_rows: field(h, "decoded_rows")?,
        num_turns: field(h, "num_turns")?,
        tool_calls: field(h, "tool_calls")?,
        tool_failures: field(h, "tool_failures")?,
        tool_rewards: field(h, "tool_rewards")?,
        turn_scores: field(h, "turn_scores")?,
        loop_scores: field(h, "loop_scores")?,
        versions: field::<Option<Vec<[Option<u64>; 2]>>>(h, "versions")?
            .unwrap_or_default()
            .into_iter()
            .map(|[first, last]| RowVersions { first, last })
            .collect(),
    })
}

/// The images of a generation request.
pub(crate) fn decode_images(h: &Value, blobs: &[Vec<u8>]) -> Result<Vec<RowImages>, PoolError> {
    let rows = h["images"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    rows.iter()
        .map(|row| {
            let images = row
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .map(|img| {
                    let grid: [i64; 3] = serde_json::from_value(img["grid_thw"].clone())
                        .map_err(|e| PoolError::Protocol(format!("an image's grid: {e}")))?;
                    let blob = img["blob"]
                        .as_u64()
                        .and_then(|i| blobs.get(i as usize))
                        .ok_or_else(|| PoolError::Protocol("an image without pixels".into()))?;
                    Ok(ProcessedImage {
                        pixel_values: wire::blob_f32(blob)?,
                        grid_thw: grid,
                        seconds_per_grid: img["seconds_per_grid"].as_f64(),
                        timestamps: serde_json::from_value(img["timestamps"].clone()).map_err(
                            |e| PoolError::Protocol(format!("a video's timestamps: {e}")),
                        )?,
                    })
                })
                .collect::<Result<Vec<_>, PoolError>>()?;
            Ok(RowImages::from(images))
        })
        .collect()
}

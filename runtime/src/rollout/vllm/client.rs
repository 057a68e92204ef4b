//! The trainer's side of the vLLM rollout: weight sync and generation through the server.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tch::Tensor;

use crate::data::image::ImageProcessorConfig;
use crate::data::video::VideoProcessor;
use crate::engine::batch::RowImages;
use crate::model::vision::{MropeTokens, ProcessedImage, Vision};
use crate::model::{Dtype, ModelConfig, SaveOptions, TorchKind};
use crate::parallel::dist::ProcessGroup;
use crate::rng::Rng;
use crate::rollout::engine::{
    RolloutOutput, RowVersions, StopTokens, from_token_rows, with_response_positions,
};
use crate::rollout::{MaskedTokens, NewerWeights, PromptStream, RolloutError, SamplingParams};

use super::server::{Launch, VllmServer};
use super::{VllmError, VllmSpec, http, media};

/// The vLLM rollout of one rank.
pub struct VllmRollout {
    config: ModelConfig,
    dtype: Dtype,
    spec: VllmSpec,
    seed: u64,
    cuda: bool,
    /// The world group when there are several ranks: rank 0 runs the server.
    group: Option<ProcessGroup>,
    /// Rank 0's server (behind a lock: generation reads its exit status through `&self`).
    server: std::sync::Mutex<Option<VllmServer>>,
    /// The server's address, once every rank knows it.
    addr: Option<SocketAddr>,
    /// The directory the weights are written to (shared memory where there is some).
    dir: PathBuf,
    python: String,
    /// A port to try first (else `$VERLC_VLLM_PORT`, else a free one).
    port: Option<u16>,
    request_timeout: Duration,
    startup_timeout: Duration,
    /// True while the server sleeps ([`VllmRollout::sleep`]).
    asleep: bool,
    /// The server runs while the trainer computes (see [`VllmRollout::share_cores`]).
    shares_cores: bool,
    /// A vision-language policy's server, the model's vision tokens and its tokenizer (see
    /// [`VllmRollout::serve_images`]).
    vision: Option<(VisionServing, MropeTokens, crate::tokenizer::Tokenizer)>,
    /// The tokens this rank last had the server mask ([`VllmRollout::mask_tokens`]).
    masked: std::sync::Mutex<MaskedTokens>,
}

/// What a vision-language policy's server reads beside its weights: vLLM's multimodal
/// processor wants the tokenizer and the image and video processors' settings (it expands the
/// placeholders from the images and videos).
#[derive(Debug, Clone)]
pub struct VisionServing {
    /// The trainer's tokenizer (`tokenizer_path`), saved beside the weights.
    pub tokenizer_path: String,
    /// The image processor verlc prepared the images with.
    pub processor: ImageProcessorConfig,
    /// The video processor verlc prepared the videos with.
    pub video: VideoProcessor,
}

impl VisionServing {
    pub fn new(
        tokenizer_path: String,
        processor: ImageProcessorConfig,
        video: VideoProcessor,
    ) -> Self {
        VisionServing {
            tokenizer_path,
            processor,
            video,
        }
    }
}

/// Where one prompt's requests go: `/v1/completions` (text only), or vLLM's token-in/token-out
/// endpoint with the prompt's images and videos ([`media`]), whose sampling fields are nested.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Completions,
    Generate,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => media::GENERATE_PATH,
        }
    }

    /// The body's sampling fields.
    fn params(self, body: &mut Value) -> &mut Value {
        match self {
            Endpoint::Completions => body,
            Endpoint::Generate => &mut body["sampling_params"],
        }
    }

    fn prompt_key(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            Endpoint::Generate => "token_ids",
        }
    }

    fn parse(self, v: &Value, n: usize) -> Result<Vec<Choice>, String> {
        match self {
            Endpoint::Completions => parse_choices(v, n),
            Endpoint::Generate => parse_generated(v, n),
        }
    }
}

impl std::fmt::Debug for VllmRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VllmRollout")
            .field("addr", &self.addr)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// `<pid>` for the process's first rollout, `<pid>-<k>` for later ones (tests start several).
fn instance_tag() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = std::process::id();
    if k == 0 {
        pid.to_string()
    } else {
        format!("{pid}-{k}")
    }
}

fn env_secs(name: &str, default: u64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(default);
    Duration::from_secs(secs.max(1))
}

impl VllmRollout {
    /// A rollout that starts its server at the first [`VllmRollout::update_weights`].
    pub fn new(
        config: &ModelConfig,
        dtype: Dtype,
        spec: VllmSpec,
        seed: u64,
        cuda: bool,
        group: Option<ProcessGroup>,
    ) -> Self {
        let shm = PathBuf::from("/dev/shm");
        let base = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        VllmRollout {
            config: config.clone(),
            dtype,
            spec,
            seed,
            cuda,
            group,
            server: std::sync::Mutex::new(None),
            addr: None,
            dir: base.join(format!("verlc-vllm-{}", instance_tag())),
            python: super::default_python(),
            port: std::env::var("VERLC_VLLM_PORT")
                .ok()
                .and_then(|p| p.parse().ok()),
            request_timeout: env_secs("VERLC_VLLM_REQUEST_TIMEOUT_S", 1800),
            startup_timeout: env_secs("VERLC_VLLM_STARTUP_TIMEOUT_S", 600),
            asleep: false,
            shares_cores: false,
            vision: None,
            masked: std::sync::Mutex::new(MaskedTokens::default()),
        }
    }

    /// The policy is a vision-language model whose prompts carry images and videos: its server
    /// gets the whole model, the tokenizer and the processors' settings, and serves the
    /// token-in/token-out endpoint ([`media`]). Errors when the model has no vision tokens or
    /// the tokenizer does not load.
    pub fn serve_images(&mut self, vision: VisionServing) -> Result<(), VllmError> {
        let tokens = Vision::tokens_of(&self.config).map_err(VllmError::Model)?;
        let tok = crate::tokenizer::Tokenizer::from_pretrained(&vision.tokenizer_path)
            .map_err(|e| VllmError::Model(format!("the vision-language tokenizer: {e}")))?;
        self.vision = Some((vision, tokens, tok));
        Ok(())
    }

    /// The model's vision tokens when its prompts carry images.
    pub fn vision_tokens(&self) -> Option<&MropeTokens> {
        self.vision.as_ref().map(|(_, tokens, _)| tokens)
    }

    /// The server generates while the trainer computes (the asynchronous modes' rollout
    /// pool): it gets half the cores (at least one), instead of every core (or the user's
    /// `OMP_NUM_THREADS`, which is the trainer's then).
    pub fn share_cores(&mut self) {
        self.shares_cores = true;
    }

    /// Asks the server to listen on `port` when it is free (a taken port falls back to a free
    /// one, with a notice).
    pub fn prefer_port(&mut self, port: u16) {
        self.port = Some(port);
    }

    /// Runs the server with `python` instead of [`super::default_python`].
    pub fn set_python(&mut self, python: String) {
        self.python = python;
    }

    /// The server's address, once it serves.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Whether this rank runs the server (rank 0 of the group, or the only process).
    pub fn is_main(&self) -> bool {
        self.group.as_ref().is_none_or(|g| g.rank() == 0)
    }

    /// The server's process id (on the main rank, once started).
    pub fn server_pid(&self) -> Option<u32> {
        self.lock_server().as_ref().map(VllmServer::pid)
    }

    /// The server's log file (on the main rank, once started).
    pub fn server_log(&self) -> Option<PathBuf> {
        self.lock_server().as_ref().map(|s| s.log().to_path_buf())
    }

    fn lock_server(&self) -> std::sync::MutexGuard<'_, Option<VllmServer>> {
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands `params` (full tensors by Hugging Face name; only the main rank's are read) to
    /// the server: written as `model.safetensors`, then reloaded in place; the first call
    /// starts the server on them. Collective over the group: every rank returns once the
    /// server serves the new weights.
    pub fn update_weights(&mut self, params: &[(String, Tensor)]) -> Result<(), VllmError> {
        let outcome = if self.is_main() {
            self.sync_main(params)
        } else {
            Ok(0)
        };
        // Rank 0 says whether it worked (the port, or -1) so no rank waits on a dead server.
        let port = match &outcome {
            Ok(p) => i64::from(*p),
            Err(_) => -1,
        };
        let port = self.broadcast(port)?;
        outcome?;
        if port < 0 {
            return Err(VllmError::Remote(
                "its weight sync failed (rank 0 reports why)".into(),
            ));
        }
        self.addr = Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port as u16)));
        Ok(())
    }

    /// Returns once every rank of the group has called it (no-op in one process).
    pub fn barrier(&self) -> Result<(), VllmError> {
        self.broadcast(0).map(drop)
    }

    fn broadcast(&self, v: i64) -> Result<i64, VllmError> {
        let Some(g) = &self.group else { return Ok(v) };
        let t = Tensor::from_slice(&[v]).to_device(g.device());
        g.broadcast(&t, 0)
            .map_err(|e| VllmError::Remote(format!("broadcasting the server's port: {e}")))?;
        Ok(t.int64_value(&[0]))
    }

    fn sync_main(&mut self, params: &[(String, Tensor)]) -> Result<u16, VllmError> {
        self.write_weights(params)?;
        let running = self.lock_server().as_ref().map(|s| s.addr);
        match running {
            None => {
                let launch = Launch {
                    python: self.python.clone(),
                    model_dir: self.dir.clone(),
                    flags: self.flags(),
                    env: server_env(
                        &self.dir,
                        !self.cuda,
                        self.shares_cores,
                        self.spec.tensor_parallel * self.spec.data_parallel == 1,
                        self.spec.enforce_eager,
                    ),
                    port: self.port,
                    startup_timeout: self.startup_timeout,
                    log: std::env::temp_dir().join(format!(
                        "{}.log",
                        self.dir.file_name().map_or_else(
                            || "verlc-vllm".into(),
                            |n| n.to_string_lossy().into_owned()
                        )
                    )),
                };
                let server = VllmServer::start(&launch)?;
                let port = server.addr.port();
                *self.lock_server() = Some(server);
                Ok(port)
            }
            Some(addr) => {
                if self.asleep {
                    // Weights back in place first; the reload then overwrites them.
                    self.post(addr, "/wake_up", &json!({}))?;
                    self.asleep = false;
                }
                self.reload(addr)?;
                Ok(addr.port())
            }
        }
    }

    /// The server's flags ([`super::flags`]) for this model.
    fn flags(&self) -> Vec<String> {
        let model = super::ServedModel {
            hybrid: self.config.has_linear_layers(),
            multimodal: self.vision.is_some(),
        };
        super::flags(&self.spec, self.dtype, self.seed, self.cuda, model)
    }

    /// The server reads the weights written last, in place.
    fn reload(&self, addr: SocketAddr) -> Result<(), VllmError> {
        let dir = self.dir.display().to_string();
        self.post(
            addr,
            "/collective_rpc",
            &json!({"method": "reload_weights", "kwargs": {"weights_path": dir}}),
        )?;
        // vLLM 0.32 on CPU leaves reloaded experts in the checkpoint's layout, not its kernel's
        // (server.rs, WORKER_EXTENSION).
        if !self.cuda && self.config.moe.num_experts > 0 {
            self.post(
                addr,
                "/collective_rpc",
                &json!({"method": "verlc_repack_cpu_experts"}),
            )?;
        }
        // Otherwise prompts that share a prefix with earlier ones are served from the old
        // weights' KV blocks.
        self.post(addr, "/reset_prefix_cache", &json!({}))?;
        // And an image seen before from the old tower's embeddings.
        if self.vision.is_some() {
            self.post(addr, "/reset_encoder_cache", &json!({}))?;
        }
        // vLLM 0.32 reloads into the same model, whose masked logits stay; a server that
        // rebuilt it would lose them, so the mask goes again before any rank is told the
        // weights are in place.
        let masked = self
            .masked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if masked != MaskedTokens::default() {
            self.post_mask(addr, &masked)?;
        }
        Ok(())
    }

    /// `params` written where the server reads its weights from.
    fn write_weights(&self, params: &[(String, Tensor)]) -> Result<(), VllmError> {
        // A Qwen3.5 checkpoint's server gets the text model when it is sent text prompts
        // only: its tower would be dead weight.
        let text_params: Vec<(String, Tensor)>;
        let text_model = match &self.vision {
            Some(_) => None,
            None => crate::model::save::text_model_of(&self.config, params),
        };
        let (config, params) = match text_model {
            Some((text, named)) => {
                text_params = named;
                (text, text_params.as_slice())
            }
            None => (self.config.clone(), params),
        };
        let arch = config.arch().map_err(VllmError::Model)?.causal_lm_class();
        let opts = SaveOptions {
            dtype: Some(self.dtype.kind()),
            ..SaveOptions::default()
        };
        // vLLM 0.32's in-place reload breaks a tied LM head: the head keeps the weights the
        // server started with (seen on CPU with Qwen2). So vLLM gets the model untied, with
        // the head an explicit copy of the embedding: the same logits, reloaded as a whole.
        let mut config = config;
        let mut untied: Vec<(String, Tensor)>;
        let params = if config.tie_word_embeddings {
            config.tie_word_embeddings = false;
            untied = params
                .iter()
                .filter(|(n, _)| n != "lm_head.weight")
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect();
            let embed = params
                .iter()
                .find(|(n, _)| n.ends_with("embed_tokens.weight"))
                .ok_or_else(|| {
                    VllmError::Model("a tied model without `embed_tokens.weight`".into())
                })?;
            untied.push(("lm_head.weight".into(), embed.1.shallow_clone()));
            untied.as_slice()
        } else {
            params
        };
        crate::model::save::save_named(params, &config, arch, &self.dir, &opts)
            .map_err(|e| VllmError::Model(format!("writing the weights for vLLM: {e}")))?;
        if let Some((vision, _, tok)) = &self.vision
            && !self.dir.join("preprocessor_config.json").is_file()
        {
            let failed = |e: String| {
                VllmError::Model(format!("writing the vision-language server's files: {e}"))
            };
            tok.save(&self.dir).map_err(|e| failed(e.to_string()))?;
            vision.processor.save(&self.dir, None).map_err(failed)?;
            vision
                .video
                .save(&self.dir, &vision.processor)
                .map_err(failed)?;
        }
        Ok(())
    }

    /// After generating: on CUDA with `free_cache_engine` (`--enable-sleep-mode`) the server
    /// sleeps at level 1 (weights offloaded, KV cache freed) until the next
    /// [`VllmRollout::update_weights`] wakes it; otherwise nothing (vLLM has no sleep mode on
    /// CPU). Collective like the sync: only the main rank talks to the server.
    pub fn sleep(&mut self) -> Result<(), VllmError> {
        if !(self.cuda && self.spec.sleep_between_steps) || self.addr.is_none() {
            return Ok(());
        }
        // Every rank has finished its requests before the server sleeps.
        self.broadcast(0)?;
        if self.asleep || !self.is_main() {
            return Ok(());
        }
        if let Some(addr) = self.addr {
            self.post(addr, "/sleep?level=1", &json!({}))?;
            self.asleep = true;
        }
        Ok(())
    }

    /// A POST to the server; a refused request or a dead server is an error naming what it
    /// said.
    fn post(&self, addr: SocketAddr, path: &str, body: &Value) -> Result<Value, VllmError> {
        let answer = http::request(addr, "POST", path, Some(body), self.request_timeout);
        self.answer(path, answer)
    }

    fn answer(
        &self,
        path: &str,
        answer: std::io::Result<http::Response>,
    ) -> Result<Value, VllmError> {
        let r = match answer {
            Ok(r) => r,
            Err(e) => return Err(self.failure(path, e)),
        };
        if r.status != 200 {
            return Err(VllmError::Refused {
                path: path.into(),
                status: r.status,
                body: r.body.chars().take(2000).collect(),
            });
        }
        if r.body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&r.body).map_err(|e| VllmError::Protocol {
            path: path.into(),
            msg: format!("{e}: {}", r.body.chars().take(300).collect::<String>()),
        })
    }

    /// The error for a request that got no answer: the server's exit (with its log) when it
    /// died, else the I/O error.
    fn failure(&self, path: &str, e: std::io::Error) -> VllmError {
        if let Some(server) = self.lock_server().as_mut()
            && let Some(status) = server.exited()
        {
            return VllmError::Exited {
                when: format!("during {path}"),
                status,
                log: server.log.clone(),
                tail: server.tail(30),
            };
        }
        let timed_out = matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        );
        VllmError::Io {
            what: if timed_out {
                format!(
                    "the vLLM server did not answer {path} within {} s ($VERLC_VLLM_REQUEST_TIMEOUT_S)",
                    self.request_timeout.as_secs()
                )
            } else {
                format!("the vLLM server did not answer {path}")
            },
            source: e,
        }
    }

    /// Generates `params.n` responses per prompt; `streams[i]` is prompt `i`'s sampling stream
    /// (its request seed).
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput, RolloutError> {
        self.generate_swapping(prompts, &[], streams, params, stop, None)
    }

    /// [`VllmRollout::generate`] of a vision-language policy's prompts: `images[i]` are those
    /// of `prompts[i]` (empty: none has any), whose placeholders they fill; the output's
    /// `position_ids` are multimodal, `(N, P + R, 3)`, as the built-in engine's.
    pub fn generate_images(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput, RolloutError> {
        self.generate_swapping(prompts, images, streams, params, stop, None)
    }

    /// [`VllmRollout::generate_images`] as verl's partial rollout runs it. `weights` (the main
    /// rank's: it owns the server) says when the trainer paused the rollout and brings the
    /// weights published while the batch generates: the server is then paused with its
    /// requests aborted (each comes back with its tokens so far; vLLM queues new ones while
    /// paused), given the new weights and resumed. Every rank resubmits its own aborted
    /// samples as the prompt and tokens so far, for the rest of the sample's budget, and joins
    /// the answers. A resubmitted row's `versions.last` is the version it was resumed with,
    /// or, on a rank that does not own the server, [`VERSION_TOLD_LATER`].
    pub fn generate_swapping(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
        weights: Option<&mut MidBatchWeights<'_>>,
    ) -> Result<RolloutOutput, RolloutError> {
        params.validate().map_err(RolloutError::Params)?;
        let addr = self.addr.ok_or_else(|| {
            RolloutError::Batch("the vLLM rollout has no weights yet (update_weights first)".into())
        })?;
        self.mask_tokens(addr, &params.masked)
            .map_err(|e| RolloutError::Batch(e.to_string()))?;
        let requests = self.requests(prompts, images, streams, params, stop)?;
        let asked = if params.is_greedy() { 1 } else { params.n };
        // The version the server's weights have had since the last mid-batch sync.
        let current = std::sync::atomic::AtomicU64::new(VERSION_TOLD_LATER);
        let current = &current;
        // One request per prompt, all in flight at once: vLLM batches them continuously.
        let (answers, synced) = std::thread::scope(|scope| {
            let handles: Vec<_> = requests
                .iter()
                .map(|request| scope.spawn(move || self.complete(addr, request, asked, current)))
                .collect();
            let synced = match weights {
                Some(weights) => self.sync_while(addr, &handles, weights, current),
                None => Ok(()),
            };
            let answers: Vec<Result<Vec<Sample>, VllmError>> = handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(VllmError::Remote("a request thread panicked".into()))
                    })
                })
                .collect();
            (answers, synced)
        });
        synced.map_err(|e| RolloutError::Batch(e.to_string()))?;
        let (mut tokens, mut logps, mut versions) = (Vec::new(), Vec::new(), Vec::new());
        for answer in answers {
            let samples = answer.map_err(|e| RolloutError::Batch(e.to_string()))?;
            for sample in samples {
                for _ in 0..params.n / asked {
                    tokens.push(sample.tokens.clone());
                    logps.push(sample.log_probs.clone());
                    versions.push(sample.versions);
                }
            }
        }
        let mut out = from_token_rows(prompts, &tokens, &logps, params, stop)?;
        if versions.iter().any(|v| v.last.is_some()) {
            out.versions = versions;
        }
        if let Some(vision) = self.vision_tokens() {
            out.position_ids = multimodal_positions(&out, vision, images, params.n)?;
        }
        Ok(out)
    }

    /// Has the server mask `masked` from now on (its worker extension, [`super::server`]),
    /// unless this rank already did. Each rank asks before its own requests, so none is
    /// served under an older mask; asking again with the same mask changes nothing.
    fn mask_tokens(&self, addr: SocketAddr, masked: &MaskedTokens) -> Result<(), VllmError> {
        let mut installed = self
            .masked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *installed == *masked {
            return Ok(());
        }
        self.post_mask(addr, masked)?;
        *installed = masked.clone();
        Ok(())
    }

    fn post_mask(&self, addr: SocketAddr, masked: &MaskedTokens) -> Result<(), VllmError> {
        let mask = json!({"from": masked.from, "ids": masked.ids}).to_string();
        self.post(
            addr,
            "/collective_rpc",
            &json!({"method": "verlc_mask_logits", "kwargs": {"mask": mask}}),
        )?;
        Ok(())
    }

    /// Each prompt's request: text prompts go to `/v1/completions`, prompts with images or
    /// videos to the endpoint that takes them ([`media`]).
    fn requests(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<Vec<Request>, RolloutError> {
        if !images.is_empty() && images.len() != prompts.len() {
            return Err(RolloutError::Batch(format!(
                "images for {} prompts, {} prompts",
                images.len(),
                prompts.len()
            )));
        }
        prompts
            .iter()
            .zip(streams)
            .enumerate()
            .map(|(i, (prompt, stream))| {
                let body = request_body(prompt, stream, params, stop);
                let Some(row) = images.get(i).filter(|row| !row.is_empty()) else {
                    return Ok(Request {
                        endpoint: Endpoint::Completions,
                        body,
                        expanded: None,
                    });
                };
                let Some((vision, tokens, tok)) = &self.vision else {
                    return Err(RolloutError::Batch(
                        "prompts with images need the vLLM server of a vision-language model"
                            .into(),
                    ));
                };
                let failed = |e: String| RolloutError::Batch(format!("prompt {i}: {e}"));
                let parts = media::content_parts(row, &vision.processor, tokens.timestamped_videos)
                    .map_err(failed)?;
                let collapsed =
                    media::collapsed_prompt(prompt, row, tokens, tok).map_err(failed)?;
                Ok(Request {
                    endpoint: Endpoint::Generate,
                    body: media::generate_body(&body, collapsed, parts),
                    expanded: Some(prompt.clone()),
                })
            })
            .collect()
    }

    /// The main rank's side of a partial rollout while `handles` run: pause the server when
    /// the trainer pauses the rollout, and give it the weights published meanwhile.
    fn sync_while<T>(
        &self,
        addr: SocketAddr,
        handles: &[std::thread::ScopedJoinHandle<'_, T>],
        weights: &mut MidBatchWeights<'_>,
        current: &std::sync::atomic::AtomicU64,
    ) -> Result<(), VllmError> {
        let mut paused = false;
        let result = self.sync_loop(addr, handles, weights, current, &mut paused);
        // Requests queued on a paused server would wait for ever: a failed sync resumes it
        // too (its requests then finish with the weights it has).
        if paused {
            let resumed = self.post(addr, "/resume", &json!({}));
            result?;
            resumed?;
            return Ok(());
        }
        result
    }

    fn sync_loop<T>(
        &self,
        addr: SocketAddr,
        handles: &[std::thread::ScopedJoinHandle<'_, T>],
        weights: &mut MidBatchWeights<'_>,
        current: &std::sync::atomic::AtomicU64,
        paused: &mut bool,
    ) -> Result<(), VllmError> {
        while !handles.iter().all(|h| h.is_finished()) {
            if !*paused && (weights.paused)() {
                // verl's `abort_all_requests`: the in-flight requests end with their tokens
                // so far, and the rank's request threads queue their continuations.
                self.post(addr, "/pause?mode=abort", &json!({}))?;
                *paused = true;
            }
            // Blocks while the trainer keeps the rollout paused.
            match (weights.newer)().map_err(VllmError::Remote)? {
                Some((version, params)) => {
                    current.store(version, std::sync::atomic::Ordering::SeqCst);
                    if !*paused {
                        self.post(addr, "/pause?mode=abort", &json!({}))?;
                        *paused = true;
                    }
                    self.write_weights(&params)?;
                    self.reload(addr)?;
                    self.post(addr, "/resume", &json!({}))?;
                    *paused = false;
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        Ok(())
    }

    /// One prompt's request and the continuations of its aborted samples.
    fn complete(
        &self,
        addr: SocketAddr,
        request: &Request,
        asked: usize,
        current: &std::sync::atomic::AtomicU64,
    ) -> Result<Vec<Sample>, VllmError> {
        let endpoint = request.endpoint;
        let path = endpoint.path();
        let protocol = |msg: String| VllmError::Protocol {
            path: path.into(),
            msg: format!("the completion is not what verlc expects: {msg}"),
        };
        // `so_far`: the tokens a resumed sample already has, after the prompt.
        let send = |b: &Value, so_far: &[i64]| {
            let answer = http::request(addr, "POST", path, Some(b), self.request_timeout);
            let answer = self.answer(path, answer)?;
            if let Some(expanded) = &request.expanded {
                media::check_expanded(&answer, &[expanded.as_slice(), so_far].concat()).map_err(
                    |msg| VllmError::Protocol {
                        path: path.into(),
                        msg,
                    },
                )?;
            }
            Ok::<_, VllmError>(answer)
        };
        let mut body = request.body.clone();
        let prompt: Vec<i64> = body[endpoint.prompt_key()]
            .as_array()
            .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        let sampling = endpoint.params(&mut body);
        let budget = sampling["max_tokens"].as_u64().unwrap_or(0) as usize;
        let seed = sampling["seed"].as_u64().unwrap_or(0);
        let mut samples = Vec::with_capacity(asked);
        // The versions synced before the request was sent and before its answer came (the
        // sentinel: none during this batch). A request sent after a sync runs wholly with the
        // new weights; one that reached the server while it was paused for a sync, without
        // being aborted, may have either: counted as spanning both (the answer does not say
        // which weights made it).
        let version = |v: u64| (v != VERSION_TOLD_LATER).then_some(v);
        let sent_at = version(current.load(std::sync::atomic::Ordering::SeqCst));
        let answer = send(&body, &[])?;
        let answered_at = version(current.load(std::sync::atomic::Ordering::SeqCst));
        for (j, mut choice) in endpoint
            .parse(&answer, asked)
            .map_err(protocol)?
            .into_iter()
            .enumerate()
        {
            let mut resumed_with = answered_at;
            let mut resumes = 0u64;
            while choice.reason == "abort" && choice.tokens.len() < budget {
                // Resumed as the prompt and the tokens so far, for the rest of the budget,
                // with a seed of its own (n samples resumed from one seed would repeat).
                resumes += 1;
                let mut again = body.clone();
                let mut ids = prompt.clone();
                ids.extend(&choice.tokens);
                again[endpoint.prompt_key()] = json!(ids);
                let sampling = endpoint.params(&mut again);
                sampling["n"] = json!(1);
                sampling["max_tokens"] = json!(budget - choice.tokens.len());
                sampling["seed"] =
                    json!(Rng::derive(seed, (j as u64) << 32 | resumes).next_u64() >> 1);
                let more = endpoint
                    .parse(&send(&again, &choice.tokens)?, 1)
                    .map_err(protocol)?
                    .pop()
                    .ok_or_else(|| protocol("no choice".into()))?;
                choice.tokens.extend(more.tokens);
                choice.log_probs.extend(more.log_probs);
                choice.reason = more.reason;
                resumed_with = Some(current.load(std::sync::atomic::Ordering::SeqCst));
            }
            samples.push(Sample {
                tokens: choice.tokens,
                log_probs: choice.log_probs,
                versions: RowVersions {
                    first: sent_at,
                    last: resumed_with,
                },
            });
        }
        Ok(samples)
    }
}

/// What the main rank's vLLM rollout asks while a batch generates: whether the trainer has
/// paused the rollout, and the weights published since (blocking while it is paused).
pub struct MidBatchWeights<'a> {
    pub paused: &'a mut dyn FnMut() -> bool,
    pub newer: &'a mut NewerWeights<'a>,
}

/// The `versions.last` of a row resumed on a rank that does not own the server: a later
/// version than the batch began with, which the rank learns when the batch ends.
pub const VERSION_TOLD_LATER: u64 = u64::MAX;

/// One prompt's request: its endpoint and body, and, for the endpoint that expands images
/// and videos, the prompt's ids as verlc expanded them (the server's expansion must equal
/// them).
struct Request {
    endpoint: Endpoint,
    body: Value,
    expanded: Option<Vec<i64>>,
}

/// One generated sample: its tokens and log-probs, and the versions that may have made them
/// (`None`: the batch's first).
struct Sample {
    tokens: Vec<i64>,
    log_probs: Vec<f32>,
    versions: RowVersions,
}

impl Drop for VllmRollout {
    /// Stops the server, then frees the weights it read (shared memory outlives processes).
    fn drop(&mut self) {
        drop(self.lock_server().take());
        if self.is_main() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The server's environment where the user's has none: `VLLM_CPU_KVCACHE_SPACE` (GiB of KV
/// cache on CPU) 1, about a million tokens of a small model (vLLM's default is 4 GiB); and
/// `OMP_NUM_THREADS` every core, since the trainer waits while the server generates (vLLM
/// otherwise drops to one thread), or, when it does not (`shares_cores`), half of them (this
/// overrides the user's `OMP_NUM_THREADS`: that one is the trainer's; pinning the server to
/// the other half measured no better on 2 cores); `TORCHINDUCTOR_CACHE_DIR` inside the
/// server's `dir`. A
/// server of one worker (`one_worker`) on CPU (`cpu`) runs its model in the engine's process
/// (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, vLLM's in-process executor): one Python process
/// fewer to start, some 10 s of a 40 s start on a 2-core machine, the same tokens. An eager
/// server (`enforce_eager`) on CPU runs without torch.compile at all (`TORCHDYNAMO_DISABLE`):
/// `enforce_eager` stops vLLM compiling the model, but its sampler's helpers (the logprob
/// ranks, top-k/top-p) still compile a C++ kernel with g++ at the first request, ~15 s of CPU
/// on a 2-core EPYC at every fresh start and a C++ compiler the machine must have. On CPU
/// the launcher has vLLM's model registry inspect the model's class in its own
/// process ([`super::server::INSPECT_IN_PROCESS_VAR`]).
fn server_env(
    dir: &Path,
    cpu: bool,
    shares_cores: bool,
    one_worker: bool,
    enforce_eager: bool,
) -> Vec<(String, String)> {
    let all = std::thread::available_parallelism().map_or(1, usize::from);
    // Sharing the machine with a trainer that computes meanwhile, half the cores whatever the
    // user's environment says (its OMP_NUM_THREADS is the trainer's).
    let half = shares_cores.then(|| ("OMP_NUM_THREADS".to_owned(), all.div_ceil(2).to_string()));
    let in_process =
        (cpu && one_worker).then(|| ("VLLM_ENABLE_V1_MULTIPROCESSING", "0".to_owned()));
    let no_compile = (cpu && enforce_eager).then(|| ("TORCHDYNAMO_DISABLE", "1".to_owned()));
    let inspect_here = cpu.then(|| (super::server::INSPECT_IN_PROCESS_VAR, "1".to_owned()));
    [
        ("VLLM_CPU_KVCACHE_SPACE", "1".to_owned()),
        ("OMP_NUM_THREADS", all.to_string()),
        // Its own torch.compile cache (vLLM's sampler compiles a C++ kernel at the first
        // request even in eager mode): in the shared default, two servers starting together on
        // one machine write the same file and one can load it half-written ("file too short").
        (
            "TORCHINDUCTOR_CACHE_DIR",
            dir.join("inductor-cache").display().to_string(),
        ),
    ]
    .into_iter()
    .chain(in_process)
    .chain(no_compile)
    .chain(inspect_here)
    .filter(|(k, _)| std::env::var_os(k).is_none() && !(shares_cores && *k == "OMP_NUM_THREADS"))
    .map(|(k, v)| (k.to_owned(), v))
    .chain(half)
    .collect()
}

/// The request seed of a prompt's stream: its `n` samples follow from it (vLLM seeds each
/// of a request's samples from the request's seed).
fn request_seed(s: &PromptStream) -> u64 {
    // Within i64 range: vLLM's seed is a signed integer.
    Rng::derive(s.seed, s.index).next_u64() >> 1
}

/// The `/v1/completions` body of one prompt.
fn request_body(
    prompt: &[i64],
    stream: &PromptStream,
    params: &SamplingParams,
    stop: &StopTokens,
) -> Value {
    let greedy = params.is_greedy();
    let mut body = json!({
        "model": "verlc-policy",
        "prompt": prompt,
        // vLLM refuses n > 1 when greedy; the n greedy samples are one, repeated.
        "n": if greedy { 1 } else { params.n },
        "max_tokens": params.max_new_tokens,
        "temperature": if greedy { 0.0 } else { params.temperature },
        "top_p": if greedy { 1.0 } else { params.top_p },
        "top_k": if greedy || params.top_k <= 0 { -1 } else { params.top_k },
        "logprobs": 0,
        "return_tokens_as_token_ids": true,
        // The stop set is exactly `stop.eos` (the trainer's tokenizer's), as on the native
        // engine: vLLM's own EOS (the checkpoint's) is ignored, `stop_token_ids` stop.
        "ignore_eos": true,
        "skip_special_tokens": false,
        "seed": request_seed(stream),
    });
    if !params.ignore_eos && !stop.eos.is_empty() {
        body["stop_token_ids"] = json!(stop.eos);
    }
    body
}

/// One choice of a completion: its token ids, their log-probs and why it ended.
#[derive(Debug, PartialEq)]
struct Choice {
    tokens: Vec<i64>,
    log_probs: Vec<f32>,
    reason: String,
}

/// Token ids, log-probs and finish reason of each choice of a `/v1/completions` answer, in
/// sample order.
fn parse_choices(v: &Value, n: usize) -> Result<Vec<Choice>, String> {
    choices_with(v, n, |c| {
        let lp = c.get("logprobs").ok_or("a choice without `logprobs`")?;
        let ids = lp
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or("a choice without `logprobs.tokens`")?
            .iter()
            .map(|t| {
                t.as_str()
                    .and_then(|s| s.strip_prefix("token_id:"))
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| format!("token {t} is not `token_id:<id>`"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let logps = lp
            .get("token_logprobs")
            .and_then(Value::as_array)
            .ok_or("a choice without `logprobs.token_logprobs`")?
            .iter()
            .map(log_prob)
            .collect();
        Ok((ids, logps))
    })
}

/// [`parse_choices`] of the token-in/token-out endpoint's answer.
fn parse_generated(v: &Value, n: usize) -> Result<Vec<Choice>, String> {
    choices_with(v, n, |c| {
        let ids = c
            .get("token_ids")
            .and_then(Value::as_array)
            .ok_or("a choice without `token_ids`")?
            .iter()
            .map(|t| t.as_i64().ok_or_else(|| format!("token {t} is not an id")))
            .collect::<Result<Vec<_>, _>>()?;
        let logps = c
            .pointer("/logprobs/content")
            .and_then(Value::as_array)
            .ok_or("a choice without `logprobs.content`")?
            .iter()
            .map(|x| log_prob(&x["logprob"]))
            .collect();
        Ok((ids, logps))
    })
}

/// A log-prob as vLLM writes it: -inf comes as a very negative number or null; both mean
/// "impossible".
fn log_prob(x: &Value) -> f32 {
    x.as_f64().map_or(f32::NEG_INFINITY, |f| f as f32)
}

/// The `n` choices of an answer, each's token ids and log-probs read by `read`, in index
/// order.
fn choices_with(
    v: &Value,
    n: usize,
    read: impl Fn(&Value) -> Result<(Vec<i64>, Vec<f32>), String>,
) -> Result<Vec<Choice>, String> {
    let choices = v
        .get("choices")
        .and_then(Value::as_array)
        .ok_or("no `choices`")?;
    if choices.len() != n {
        return Err(format!("{} choices for n = {n}", choices.len()));
    }
    let mut rows: Vec<(usize, Choice)> = Vec::with_capacity(n);
    for c in choices {
        let index = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let (tokens, log_probs) = read(c)?;
        if log_probs.len() != tokens.len() {
            return Err(format!(
                "{} tokens with {} log-probs",
                tokens.len(),
                log_probs.len()
            ));
        }
        let reason = c
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        rows.push((
            index,
            Choice {
                tokens,
                log_probs,
                reason,
            },
        ));
    }
    rows.sort_by_key(|r| r.0);
    Ok(rows.into_iter().map(|(_, c)| c).collect())
}

/// A vision-language batch's multimodal positions as the built-in engine lays them out: the
/// prompts' from their images (`images[i]` those of prompt `i`, its `n` rows in a row), then
/// the responses' ([`with_response_positions`]).
fn multimodal_positions(
    out: &RolloutOutput,
    tokens: &MropeTokens,
    images: &[RowImages],
    n: usize,
) -> Result<Tensor, RolloutError> {
    let width = out.prompts.size()[1];
    let prompt_mask = out.attention_mask.narrow(1, 0, width);
    let items: Vec<&ProcessedImage> = images
        .iter()
        .flat_map(|row| std::iter::repeat_n(row, n))
        .flat_map(|row| row.iter())
        .collect();
    let (prompt_pos, _) = tokens
        .item_positions(&out.prompts, &prompt_mask, &items)
        .map_err(|e| RolloutError::Batch(format!("multimodal positions: {e}")))?;
    Ok(with_response_positions(
        &prompt_pos,
        out.responses.size()[1],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_choices_in_index_order() {
        let v = json!({"choices": [
            {"index": 1, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}},
            {"index": 0, "logprobs": {"tokens": ["token_id:7", "token_id:1"], "token_logprobs": [-1.0, null]}},
        ]});
        let rows = parse_choices(&v, 2).unwrap();
        assert_eq!(rows[0].tokens, vec![7, 1]);
        assert_eq!(rows[0].log_probs[1], f32::NEG_INFINITY);
        assert_eq!(
            (rows[1].tokens.as_slice(), rows[1].log_probs.as_slice()),
            (&[5i64][..], &[-0.5f32][..])
        );
        assert!(parse_choices(&v, 3).unwrap_err().contains("2 choices"));
        let bad = json!({"choices": [{"index": 0, "logprobs": {"tokens": ["x"], "token_logprobs": [0.0]}}]});
        assert!(parse_choices(&bad, 1).unwrap_err().contains("token_id"));
    }

    #[test]
    fn greedy_requests_ask_for_argmax_and_stop_ids() {
        let s = PromptStream { seed: 1, index: 2 };
        let stop = StopTokens {
            eos: vec![1, 2],
            pad: 0,
        };
        let b = request_body(&[5, 6], &s, &SamplingParams::greedy(8), &stop);
        assert_eq!(b["temperature"], json!(0.0));
        assert_eq!(b["top_k"], json!(-1));
        assert_eq!(b["stop_token_ids"], json!([1, 2]));
        assert_eq!(b["max_tokens"], json!(8));
        let other = request_body(
            &[5, 6],
            &PromptStream { seed: 1, index: 3 },
            &SamplingParams::greedy(8),
            &stop,
        );
        assert_ne!(b["seed"], other["seed"]);
    }

    #[test]
    fn cpu_servers_run_in_process_eager_and_inspect_in_their_own_process() {
        use super::super::server::{INSPECT_IN_PROCESS_VAR, WATCHDOG};
        let value = |env: &[(String, String)], key: &str| {
            env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
        };
        let dir = Path::new("/nonexistent/server");
        let cpu = server_env(dir, true, false, true, true);
        let gpu = server_env(dir, false, false, true, true);
        for (key, want) in [
            ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
            ("TORCHDYNAMO_DISABLE", "1"),
            (INSPECT_IN_PROCESS_VAR, "1"),
        ] {
            if std::env::var_os(key).is_none() {
                assert_eq!(value(&cpu, key).as_deref(), Some(want), "{key}");
            }
            assert_eq!(value(&gpu, key), None, "{key}");
        }
        // Two workers keep vLLM's engine processes; a compiled server keeps torch.compile.
        let env = server_env(dir, true, false, false, false);
        assert_eq!(value(&env, "VLLM_ENABLE_V1_MULTIPROCESSING"), None);
        assert_eq!(value(&env, "TORCHDYNAMO_DISABLE"), None);
        // The launcher reads the variable under the same name.
        assert!(WATCHDOG.contains(&format!("'{INSPECT_IN_PROCESS_VAR}'")));
    }
}

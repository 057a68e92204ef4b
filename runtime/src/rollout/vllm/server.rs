//! The vLLM server process: started as the trainer's child in a process group of its own (vLLM
//! forks engine-core workers; stopping the group stops them all), its output kept in a log
//! file whose last lines every error quotes, and stopped on drop, on SIGINT/SIGTERM/SIGHUP
//! ([`super::reaper`]), and on the trainer's death however it dies: the server's stdin is a pipe
//! whose only writer is the trainer, and a thread started before vLLM is imported ends the whole
//! group when that pipe closes ([`WATCHDOG`]). (A parent-death signal to the API process alone
//! left its engine core running after a `kill -9` of the trainer.)

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{VllmError, http, reaper};
use crate::pyproc::fork_client::{self, ForkedChild, ServerFork};

/// How to launch the server.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The interpreter that imports `vllm`.
    pub python: String,
    /// `--model`: a directory in Hugging Face layout.
    pub model_dir: PathBuf,
    /// Server flags after `--model DIR --host --port` (see [`super::flags`]).
    pub flags: Vec<String>,
    /// Extra environment (`VLLM_CPU_KVCACHE_SPACE`, ...).
    pub env: Vec<(String, String)>,
    /// A port to try first (`$VERLC_VLLM_PORT`); taken or absent: a free one.
    pub port: Option<u16>,
    /// Longest wait for `/health` after the start.
    pub startup_timeout: Duration,
    /// Where the server's stdout and stderr go.
    pub log: PathBuf,
}

/// Set (to `1`) in the environment of a server on CPU: [`WATCHDOG`] then has vLLM's model
/// registry inspect a model class in the server's own process. vLLM does that in a new Python
/// process (a whole vLLM import: 10-25 s of CPU on 2 cores, once per architecture while its
/// cache is cold) only so that the server never initialises CUDA, and a CPU server has none.
pub const INSPECT_IN_PROCESS_VAR: &str = "VERLC_VLLM_INSPECT_IN_PROCESS";

/// What the server runs (`python -c WATCHDOG <vLLM's api_server flags>`): a thread that waits
/// for its stdin to close, then kills the server's process group, and then vLLM's OpenAI API
/// server as `python -m` would run it. One guard first: vLLM 0.32 builds its structured
/// decisions endpoint (`/v1/systemone`, which verlc never calls) at start-up for Qwen3.5's
/// image-text architectures and catches only a ValueError there; a tokenizer that cannot spell
/// its labels (a tiny test model's) raises an IndexError and would end the server, so any
/// error there turns the endpoint off instead. And one media type of verlc's own
/// ([`super::media::VIDEO_FRAMES_TYPE`]): a video's frames with the metadata vLLM's processor
/// takes (its frame-list type, `video/jpeg`, takes no per-video times). On CPU, vLLM's model
/// registry inspects in-process ([`INSPECT_IN_PROCESS_VAR`]). Forked by a test run's fork server
/// ([`fork`]), its engine processes are forked there too ([`FORKED_ENGINE`]).
pub const WATCHDOG: &str = "\
import os, signal, sys, threading
def _watch():
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except Exception:
        pass
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=_watch, daemon=True).start()
try:
    from vllm.entrypoints.generate.structured_decisions import api_router as _decisions
    _init_decisions = _decisions.init_structured_decisions_state
    def _guarded_decisions(engine_client, state, *args, **kwargs):
        try:
            _init_decisions(engine_client, state, *args, **kwargs)
        except Exception as e:
            print('verlc: /v1/systemone is off:', repr(e), file=sys.stderr)
            state.serving_structured_decisions = None
    _decisions.init_structured_decisions_state = _guarded_decisions
except ImportError:
    pass
try:
    import base64 as _b64, json as _json
    import numpy as _np
    from vllm.multimodal.media import video as _video_io
    _load_video = _video_io.VideoMediaIO.load_base64
    def _verlc_frames(self, media_type, data):
        if media_type.lower() != 'video/x-verlc-frames':
            return _load_video(self, media_type, data)
        head, _, body = data.partition(',')
        meta = _json.loads(_b64.b64decode(head))
        if meta.pop('encoding') == 'f32':
            array = _np.frombuffer(_b64.b64decode(body), dtype='<f4').reshape(meta.pop('shape')).copy()
        else:
            array = _np.stack([_np.asarray(self.image_io.load_base64('image/png', f)) for f in body.split(',')])
        meta.update(video_backend='verlc', do_sample_frames=False)
        meta['duration'] = meta['total_num_frames'] / meta['fps']
        return _video_io.MediaWithBytes((array, meta), data.encode())
    _video_io.VideoMediaIO.load_base64 = _verlc_frames
except ImportError:
    pass
if os.environ.pop('VERLC_VLLM_INSPECT_IN_PROCESS', None) == '1':
    from vllm.model_executor.models import registry as _registry
    _registry._run_in_subprocess = lambda fn: fn()
    print('verlc: vLLM inspects model classes in this process (CPU)', file=sys.stderr)
if os.environ.get('VERLC_PYTHON_FORK_PARENT'):
    import verlc_forked_engine as _forked
    from vllm.v1.engine import utils as _engine_utils
    _mp_context = _engine_utils.get_mp_context
    _engine_utils.get_mp_context = lambda: _forked.Context(_mp_context())
    print('verlc: the fork server forks vLLM engine processes', file=sys.stderr)
import runpy
runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', alter_sys=True)
";

/// The module of verlc's worker extension (`--worker-extension-cls`): methods vLLM's workers
/// gain, called by name through `/collective_rpc`. `verlc_mask_logits` sets the masked
/// tokens' logits to minus infinity in every logits the model computes from then on (verl
/// patches the same method; vLLM samples from those logits and takes its log-probs from them
/// as well). A later call replaces the mask; the mask's JSON is `{"from": id or null, "ids":
/// [...]}` (`MaskedTokens`). `verlc_repack_cpu_experts` lays a mixture-of-experts model's expert
/// weights out again for vLLM's CPU kernel after an in-place reload: vLLM 0.32 repacks them
/// when it first loads the model only, so a reload leaves the new weights in the checkpoint's
/// layout where the kernel reads its own (the rollout then generates from scrambled experts).
const WORKER_EXTENSION: &str = "\
import json
from types import MethodType

import torch


class VerlcWorker:
    def verlc_mask_logits(self, mask):
        mask = json.loads(mask)
        model = self.model_runner.model
        unmasked = model.__dict__.get('_verlc_unmasked_logits') or model.compute_logits
        model._verlc_unmasked_logits = unmasked
        start = mask.get('from')
        index = torch.tensor(mask.get('ids') or [], dtype=torch.long)

        def compute_logits(this, *args, **kwargs):
            nonlocal index
            logits = unmasked(*args, **kwargs)
            if logits is None:
                return logits
            if start is not None:
                logits[..., start:] = float('-inf')
            if index.numel():
                if index.device != logits.device:
                    index = index.to(logits.device)
                logits.index_fill_(-1, index, float('-inf'))
            return logits

        model.compute_logits = MethodType(compute_logits, model)

    def verlc_repack_cpu_experts(self):
        from vllm.model_executor.layers.fused_moe.experts import cpu_moe
        repacked = 0
        for module in self.model_runner.model.modules():
            kernel = getattr(getattr(module, 'quant_method', None), 'moe_kernel', None)
            experts = getattr(kernel, 'fused_experts', None)
            if experts is not None and type(experts).__module__ == cpu_moe.__name__:
                experts.process_weights_after_loading(module)
                repacked += 1
        return repacked
";

/// The module of the engine processes a fork server forks (`forked_engine.py`): installed by
/// [`WATCHDOG`] where the server was forked by one (`VERLC_PYTHON_FORK_PARENT`).
const FORKED_ENGINE: &str = include_str!("forked_engine.py");
const FORKED_ENGINE_FILE: &str = "verlc_forked_engine.py";

/// The importable name of [`WORKER_EXTENSION`]'s class, and the file it is written to inside
/// the directory the server's `PYTHONPATH` starts with.
const WORKER_EXTENSION_CLASS: &str = "verlc_vllm_worker.VerlcWorker";
const WORKER_EXTENSION_FILE: &str = "verlc_vllm_worker.py";

/// Writes the worker extension's module into `dir` (created), for the server's workers to
/// import: they run in processes vLLM starts, which take the module by name.
fn write_worker_extension(dir: &Path) -> Result<(), VllmError> {
    let io = |e| VllmError::Io {
        what: format!("writing vLLM's worker extension into {}", dir.display()),
        source: e,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join(FORKED_ENGINE_FILE), FORKED_ENGINE).map_err(io)?;
    std::fs::write(dir.join(WORKER_EXTENSION_FILE), WORKER_EXTENSION).map_err(io)
}

/// `PYTHONPATH` with `dir` first.
fn python_path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// What the API server's and its engine process's interpreter imports first: forked from an
/// interpreter that has (where a test run provides a fork server, `crate::pyproc`'s), a server
/// and its engine start without those 10-15 s of CPU each.
const PRELOAD: &[&str] = &["vllm.entrypoints.openai.api_server", "vllm.v1.engine.core"];

/// The server's API process: started here, or forked by the test run's fork server.
enum ServerProcess {
    Spawned(Child),
    Forked(ForkedChild),
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (how, pid) = match self {
            ServerProcess::Spawned(c) => ("spawned", c.id()),
            ServerProcess::Forked(c) => ("forked", c.pid()),
        };
        write!(f, "{how} {pid}")
    }
}

impl ServerProcess {
    fn id(&self) -> u32 {
        match self {
            ServerProcess::Spawned(c) => c.id(),
            ServerProcess::Forked(c) => c.pid(),
        }
    }

    /// How it ended, once it has.
    fn try_wait(&mut self) -> Option<String> {
        match self {
            ServerProcess::Spawned(c) => c.try_wait().ok().flatten().map(|s| s.to_string()),
            ServerProcess::Forked(c) => c
                .try_wait()
                .map(|s| s.map_or_else(|e| e, |s| s.to_string())),
        }
    }

    fn wait(&mut self) {
        match self {
            ServerProcess::Spawned(c) => {
                let _ = c.wait();
            }
            ServerProcess::Forked(c) => {
                let _ = c.wait();
            }
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct VllmServer {
    child: ServerProcess,
    /// The write end of the server's stdin: closed when the trainer ends, which ends the server
    /// ([`WATCHDOG`]). Never written.
    _lifeline: Option<OwnedFd>,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

/// How often a start is retried when the chosen port was taken between choosing and binding.
const PORT_ATTEMPTS: usize = 3;

impl VllmServer {
    /// Starts the server and waits until it answers `/health`.
    pub fn start(launch: &Launch) -> Result<VllmServer, VllmError> {
        let mut last = None;
        for attempt in 0..PORT_ATTEMPTS {
            let wanted = if attempt == 0 { launch.port } else { None };
            let port = choose_port(wanted)?;
            match Self::start_on(launch, port) {
                Err(VllmError::PortTaken { port }) => last = Some(VllmError::PortTaken { port }),
                other => return other,
            }
        }
        Err(last.unwrap_or(VllmError::PortTaken { port: 0 }))
    }

    fn start_on(launch: &Launch, port: u16) -> Result<VllmServer, VllmError> {
        let log = std::fs::File::create(&launch.log).map_err(|e| VllmError::Io {
            what: format!("creating the vLLM log {}", launch.log.display()),
            source: e,
        })?;
        let log_err = log.try_clone().map_err(|e| VllmError::Io {
            what: "duplicating the log handle".into(),
            source: e,
        })?;
        // A directory of its own inside the model's: vLLM reads only the files it knows there.
        let extension_dir = launch.model_dir.join("verlc-python");
        write_worker_extension(&extension_dir)?;
        let port_text = port.to_string();
        let mut args: Vec<OsString> = vec!["--model".into(), launch.model_dir.clone().into()];
        args.extend(["--host", "127.0.0.1", "--port", &port_text].map(OsString::from));
        args.extend(launch.flags.iter().map(OsString::from));
        args.extend(["--worker-extension-cls", WORKER_EXTENSION_CLASS].map(OsString::from));
        let mut env: Vec<(&str, &str)> = vec![
            // `/collective_rpc` (weight reload) and `/reset_prefix_cache` are dev-mode routes.
            ("VLLM_SERVER_DEV_MODE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("VLLM_LOGGING_COLOR", "0"),
        ];
        env.extend(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let spawned = Instant::now();
        let (child, lifeline) = match fork(launch, &args, &env, &extension_dir, &log, &log_err) {
            Some(forked) => forked,
            None => {
                let mut cmd = Command::new(&launch.python);
                cmd.args(["-c", WATCHDOG])
                    .args(&args)
                    .env("PYTHONPATH", python_path_with(&extension_dir))
                    .envs(env.iter().copied())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::from(log))
                    .stderr(Stdio::from(log_err))
                    .process_group(0);
                let mut child = cmd.spawn().map_err(|e| VllmError::Spawn {
                    python: launch.python.clone(),
                    source: e,
                })?;
                let lifeline = child.stdin.take().map(OwnedFd::from);
                (ServerProcess::Spawned(child), lifeline)
            }
        };
        reaper::register(child.id() as i32);
        let mut server = VllmServer {
            child,
            _lifeline: lifeline,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            log: launch.log.clone(),
        };
        let deadline = spawned + launch.startup_timeout;
        loop {
            if let Some(status) = server.child.try_wait() {
                let tail = log_tail(&server.log, 30);
                if tail.contains("Address already in use") || tail.contains("[Errno 98]") {
                    return Err(VllmError::PortTaken { port });
                }
                return Err(VllmError::Exited {
                    when: "while starting".into(),
                    status,
                    log: server.log.clone(),
                    tail,
                });
            }
            let healthy =
                http::request(server.addr, "GET", "/health", None, Duration::from_secs(5))
                    .is_ok_and(|r| r.status == 200);
            if healthy {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                return Err(VllmError::StartTimeout {
                    secs: launch.startup_timeout.as_secs(),
                    log: server.log.clone(),
                    tail: log_tail(&server.log, 30),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(reason)` when the server process has ended.
    pub fn exited(&mut self) -> Option<String> {
        self.child.try_wait()
    }

    /// The server's log file (its stdout and stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `n` lines of the server's log.
    pub fn tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }

    /// Stops the server and every process it started: SIGTERM to its group, SIGKILL after
    /// a grace period.
    pub fn stop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: signals a process group this struct created; no memory is touched.
        unsafe { libc::kill(-pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The engine-core workers may outlive the API process: the group goes either way.
        // SAFETY: as above.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        self.child.wait();
        reaper::unregister(pid);
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The server forked through the test run's fork server ([`fork_client::SOCKET_VAR`]), its
/// worker extension's directory first on its module path; `None` (the caller starts it) where
/// there is none, or it declined or failed.
fn fork(
    launch: &Launch,
    args: &[OsString],
    env: &[(&str, &str)],
    extension_dir: &Path,
    log: &std::fs::File,
    log_err: &std::fs::File,
) -> Option<(ServerProcess, Option<OwnedFd>)> {
    let socket = std::env::var_os(fork_client::SOCKET_VAR).filter(|s| !s.is_empty())?;
    let extension = extension_dir.to_str()?;
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    let request = ServerFork {
        python: &launch.python,
        script: WATCHDOG,
        args: &args,
        env,
        path_first: &[extension],
        preload: PRELOAD,
        stdout: log,
        stderr: log_err,
    };
    match fork_client::fork_server_process(Path::new(&socket), &request) {
        Ok(Some((child, stdin))) => {
            Some((ServerProcess::Forked(child), Some(OwnedFd::from(stdin))))
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!(
                "verlc: the fork server could not start the vLLM server ({e}); starting it directly"
            );
            None
        }
    }
}

/// `wanted` when it is free to bind on loopback, else a port the kernel picks.
fn choose_port(wanted: Option<u16>) -> Result<u16, VllmError> {
    if let Some(p) = wanted {
        if TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok() {
            return Ok(p);
        }
        eprintln!("verlc: port {p} ($VERLC_VLLM_PORT) is in use; the vLLM server takes a free one");
    }
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| VllmError::Io {
        what: "finding a free port for the vLLM server".into(),
        source: e,
    })?;
    l.local_addr().map(|a| a.port()).map_err(|e| VllmError::Io {
        what: "finding a free port for the vLLM server".into(),
        source: e,
    })
}

/// The last `n` lines of a log file (empty when unreadable).
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(f) = std::fs::File::open(path) else {
        return String::new();
    };
    let mut lines = VecDeque::with_capacity(n);
    for line in BufReader::new(f).lines().map_while(Result::ok) {
        if lines.len() == n {
            lines.pop_front();
        }
        lines.push_back(line);
    }
    Vec::from(lines).join("\n")
}

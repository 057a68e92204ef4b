//! The entry point of verlc-generated trainers.
//!
//! A generated `main.rs` is one `verlc_macros::bind_trainer!` call; it expands to
//! `fn main() { verlc_runtime::binding::main::<S, P>(EMBEDDED_CONFIG, BuildInfo { .. }) }` with
//! marker types for the strategy ([`Fsdp`], [`Megatron`]) and the precision
//! ([`Fp32`], [`Bf16Mixed`], [`Fp16Mixed`]). Each combination is its own monomorphized
//! program; combinations outside verlc's support table (`verlc_spec::binding`) do not compile,
//! and the strategy marker runs its own engines ([`Strategy::train`]), so a binary holds no
//! other strategy's engine code. The precision marker supplies the loss-scaling code
//! ([`Precision::LOSS_SCALER`]): only fp16 binaries link a grad scaler. Offload is not a marker:
//! where each role's parameters, gradients and optimizer state live is data of its engine spec
//! (as PyTorch's `CPUOffload` and Megatron's `optimizer_cpu_offload` are constructor
//! arguments), so one binary runs every placement and offload keys may be overridden at run
//! time.
//!
//! What runs is the [`TrainerSpec`] `verlc build` lowered and embedded ([`BuildInfo::spec`]);
//! the runtime takes its typed settings and never re-derives them from verl's config.
//!
//! [`main`] is the binary's command line ([`args`]):
//! - prints the build info (verlc version, config hash, binding) at start-up;
//! - `key=value` overrides (Hydra grammar) are checked by the same rules as `verlc check` and
//!   lowered by the same lowering as `verlc build` into the spec that runs; an override that
//!   changes a statically bound key (one that decided the strategy, precision or device) is refused with "rebuild with verlc";
//! - `--print-config` / `--print-spec` print the resolved config / the spec and exit;
//! - ranks: under torchrun/SLURM (`RANK`, `WORLD_SIZE`, … or `SLURM_PROCID`, …) this process
//!   is one rank; otherwise `trainer.nnodes × trainer.n_gpus_per_node` ranks are spawned on
//!   this node (`--nproc-per-node N` sets `trainer.n_gpus_per_node=N`); on
//!   `trainer.device=cpu` they are CPU processes talking over Gloo;
//! - then every rank calls [`train`] — the RL loop's entry point.

mod args;

use std::ffi::OsString;
use std::process::ExitCode;

use verlc_front::check::CheckOptions;
use verlc_front::compile::{Mode, compile};
use verlc_front::diag::Diagnostic;
use verlc_front::load::compose::{ConfigText, LoadRequest};
use verlc_front::load::node::{Node, split_key};
use verlc_front::load::version::BuiltinRelease;
use verlc_front::plan::{self, Binding, BoundKey, Planned};
use verlc_spec::TrainerSpec;
use verlc_spec::sft::SftSpec;
use verlc_spec::trainer::{DeviceKind, WorldSpec};

use crate::optim::LossScaling;
use crate::parallel::dist::{
    Backend, DistEnv, DistError, InitOptions, LocalLauncher, ProcessGroup,
};

pub use verlc_front::plan::{Dtype, StrategyKind};

mod sealed {
    pub trait Sealed {}
}

/// The parallel engine a binary is built around. Each marker runs the trainer on its own
/// engines ([`Strategy::train`]), so a binary instantiates only its bound strategy's engine
/// code; the others are never monomorphized and do not reach the executable.
pub trait Strategy: sealed::Sealed + Send + Sync + 'static {
    const KIND: StrategyKind;

    /// The RL loop of one rank on this strategy's engines.
    fn train(
        spec: &TrainerSpec,
        ctx: &RankContext,
        opts: &crate::trainer::RunOptions,
    ) -> Result<(), TrainError>;

    /// The SFT loop of one rank on this strategy's engines.
    fn train_sft(
        spec: &SftSpec,
        ctx: &RankContext,
        opts: &crate::trainer::RunOptions,
    ) -> Result<(), TrainError>;
}

/// Fully sharded data parallel (verl's `fsdp` and `fsdp2`; [`BuildPlan::config_strategy`]
/// tells which wrapping the config asked for).
pub struct Fsdp;
/// Megatron-core style tensor/pipeline/context parallelism with a distributed optimizer.
pub struct Megatron;

/// Numerics of training.
pub trait Precision: sealed::Sealed + Send + Sync + 'static {
    const KIND: Dtype;
    /// The dtype forward and backward run in.
    const COMPUTE: tch::Kind;
    /// The grad (loss) scaler code this precision links: fp16's only, so the executables of
    /// other precisions carry no loss-scaling code (`cli/tests/build_matrix.rs` checks).
    const LOSS_SCALER: LossScaling;
}

/// Everything in fp32.
pub struct Fp32;
/// bf16 compute; fp32 main weights, reductions and optimizer state.
pub struct Bf16Mixed;
/// fp16 compute with dynamic loss scaling; fp32 main weights and optimizer state.
pub struct Fp16Mixed;

macro_rules! markers {
    (Strategy { $($t:ident;)+ }) => {$(
        impl sealed::Sealed for $t {}
        impl Strategy for $t {
            const KIND: StrategyKind = StrategyKind::$t;
            fn train(spec: &TrainerSpec, ctx: &RankContext, opts: &crate::trainer::RunOptions) -> Result<(), TrainError> {
                strategies::$t(spec, ctx, opts)
            }
            fn train_sft(spec: &SftSpec, ctx: &RankContext, opts: &crate::trainer::RunOptions) -> Result<(), TrainError> {
                strategies::sft::$t(spec, ctx, opts)
            }
        }
    )+};
    ($trait:ident :: $kind:ident { $($t:ident => $k:ident $(, $c:ident, $s:ident)?;)+ }) => {$(
        impl sealed::Sealed for $t {}
        impl $trait for $t {
            const KIND: $kind = $kind::$k;
            $(
                const COMPUTE: tch::Kind = tch::Kind::$c;
                const LOSS_SCALER: LossScaling = LossScaling::$s;
            )?
        }
    )+};
}

/// The trainer of each strategy marker.
#[allow(non_snake_case)]
mod strategies {
    use super::{RankContext, TrainError, TrainerSpec};
    use crate::trainer::RunOptions;
    use crate::trainer::parallel::{FsdpRoles, MegatronRoles};

    fn failed(e: crate::trainer::TrainerError) -> TrainError {
        TrainError::Trainer(Box::new(e))
    }

    /// FSDP over the world group. On one rank without parameter offload the single engine
    /// computes the same update, without a process group.
    pub(super) fn Fsdp(
        spec: &TrainerSpec,
        ctx: &RankContext,
        opts: &RunOptions,
    ) -> Result<(), TrainError> {
        // Parameter offload is the FSDP engine's (the single engine keeps parameters in
        // place), for the actor or the critic: placement is each role's own.
        let offloads = |e: &verlc_spec::trainer::EngineSpec| match e {
            verlc_spec::trainer::EngineSpec::Fsdp(f) => f.param_offload,
            verlc_spec::trainer::EngineSpec::Megatron(_) => false,
        };
        let params_offloaded = offloads(&spec.actor.engine)
            || spec.critic.as_ref().is_some_and(|c| offloads(&c.engine));
        if ctx.dist.world_size == 1 && !params_offloaded {
            return crate::trainer::run(spec, opts).map(|_| ()).map_err(failed);
        }
        let world = super::world_group(ctx)?;
        crate::trainer::run_with(spec, opts, FsdpRoles { world })
            .map(|_| ())
            .map_err(failed)
    }

    /// Megatron (its own parameter groups even on one rank: no weight decay on biases and
    /// norms).
    pub(super) fn Megatron(
        spec: &TrainerSpec,
        ctx: &RankContext,
        opts: &RunOptions,
    ) -> Result<(), TrainError> {
        let world = if ctx.dist.world_size == 1 {
            None
        } else {
            Some(super::world_group(ctx)?)
        };
        crate::trainer::run_with(spec, opts, MegatronRoles { world })
            .map(|_| ())
            .map_err(failed)
    }

    /// The SFT loop on each strategy's engines, as the RL loop's above.
    pub(super) mod sft {
        use super::super::{RankContext, SftSpec, TrainError};
        use super::failed;
        use crate::trainer::RunOptions;
        use crate::trainer::parallel::{FsdpRoles, MegatronRoles};

        pub(in super::super) fn Fsdp(
            spec: &SftSpec,
            ctx: &RankContext,
            opts: &RunOptions,
        ) -> Result<(), TrainError> {
            let offloads = matches!(&spec.model.engine,
                verlc_spec::trainer::EngineSpec::Fsdp(f) if f.param_offload);
            if ctx.dist.world_size == 1 && !offloads {
                return crate::sft::run(spec, opts).map(|_| ()).map_err(failed);
            }
            let world = super::super::world_group(ctx)?;
            crate::sft::run_with(spec, opts, FsdpRoles { world })
                .map(|_| ())
                .map_err(failed)
        }

        pub(in super::super) fn Megatron(
            spec: &SftSpec,
            ctx: &RankContext,
            opts: &RunOptions,
        ) -> Result<(), TrainError> {
            let world = if ctx.dist.world_size == 1 {
                None
            } else {
                Some(super::super::world_group(ctx)?)
            };
            crate::sft::run_with(spec, opts, MegatronRoles { world })
                .map(|_| ())
                .map_err(failed)
        }
    }
}

/// The world process group of this rank (Gloo on CPU, NCCL on CUDA); a world of one gets a
/// fresh local port.
fn world_group(ctx: &RankContext) -> Result<ProcessGroup, TrainError> {
    let mut env = ctx.dist.clone();
    if env.world_size == 1 {
        env.master_port = crate::parallel::dist::free_port(&env.master_addr)
            .map_err(|e| TrainError::Trainer(Box::new(e)))?;
    }
    let backend = if ctx.device.is_cuda() {
        Backend::Nccl
    } else {
        Backend::Gloo
    };
    Ok(ProcessGroup::init(
        &env,
        &InitOptions {
            backend,
            ..InitOptions::default()
        },
    )?)
}
markers!(Strategy { Fsdp; Megatron; });
markers!(Precision::Dtype {
    Fp32 => Fp32, Float, NONE;
    Bf16Mixed => Bf16, BFloat16, NONE;
    Fp16Mixed => Fp16, Half, LINKED;
});

/// The binding of a monomorphized trainer as data.
pub fn binding<S: Strategy, P: Precision>() -> Binding {
    Binding {
        strategy: S::KIND,
        precision: P::KIND,
    }
}

/// What `verlc build` stamped into the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    pub verlc_version: &'static str,
    /// `sha256:<hex>` of the embedded config text.
    pub config_hash: &'static str,
    /// The config file the binary was built from (as given to `verlc build`).
    pub source: &'static str,
    /// The trainer spec `verlc build` lowered from the embedded config (JSON); empty in
    /// hand-written instantiations, which then lower the config themselves.
    pub spec: &'static str,
    /// The keys whose values decided the binding (JSON list of `plan::BoundKey`), as
    /// `verlc build` found them; empty in hand-written instantiations (then found by lowering
    /// the embedded config).
    pub bound_keys: &'static str,
    /// The verl release `verlc build` judged the config against (`0.9.1`): run-time overrides
    /// are judged against the same one. Empty in hand-written instantiations (the newest).
    pub verl_release: &'static str,
    /// The `--config-dir` tree the config was built from (a
    /// [`verlc_front::load::carried_tree::CarriedTree`] as JSON): run-time overrides are composed
    /// and judged against it. Empty when the build used verlc's built-in tree.
    pub verl_tree: &'static str,
}

/// Everything a rank knows before training starts.
#[derive(Clone, Debug)]
pub struct RankContext {
    /// Rank, world size, local rank and the rendezvous address (`ProcessGroup::init` takes it).
    pub dist: DistEnv,
    /// `cpu`, or `cuda:<local rank>`.
    pub device: tch::Device,
}

/// Why a training run failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error("{0}")]
    Trainer(Box<dyn std::error::Error + Send + Sync>),
}

/// The RL training loop of one rank: the trainer's entry point.
///
/// Called on every rank with the spec the binary embeds (or the one lowered from it with
/// run-time overrides); `ctx` says where this rank sits. The bound strategy `S` runs its own
/// engines ([`Strategy::train`]); precision is the binding's (`P`), which the spec states as
/// well; placement is the spec's. Returns `Ok(())` when training finished; the binary exits 0 when
/// every rank did.
pub fn train<S: Strategy, P: Precision>(
    spec: &TrainerSpec,
    ctx: &RankContext,
) -> Result<(), TrainError> {
    let opts = rank_options::<S, P>(spec.binding, ctx)?;
    S::train(spec, ctx, &opts)
}

/// This rank's run options, once the spec's binding is the binary's.
fn rank_options<S: Strategy, P: Precision>(
    spec_binding: Binding,
    ctx: &RankContext,
) -> Result<crate::trainer::RunOptions, TrainError> {
    let compiled = binding::<S, P>();
    if spec_binding != compiled {
        return Err(TrainError::Trainer(
            format!("the spec binds `{spec_binding}` but this binary is `{compiled}`").into(),
        ));
    }
    Ok(crate::trainer::RunOptions {
        device: ctx.device,
        console_lines: ctx.dist.rank == 0,
        ..crate::trainer::RunOptions::new(P::LOSS_SCALER)
    })
}

/// The SFT loop of one rank (see [`train`]).
pub fn train_sft<S: Strategy, P: Precision>(
    spec: &SftSpec,
    ctx: &RankContext,
) -> Result<(), TrainError> {
    let opts = rank_options::<S, P>(spec.binding, ctx)?;
    S::train_sft(spec, ctx, &opts)
}

/// What a trainer binary runs: verl's RL loop or its SFT loop, with their specs.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    Rl(Box<TrainerSpec>),
    Sft(Box<SftSpec>),
}

impl Workload {
    /// The spec document a binary embeds (`verlc_front::plan::Planned::spec_json`).
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        let v: serde_json::Value = serde_json::from_str(text)?;
        match v.get(verlc_front::plan::SFT_SPEC_KEY) {
            Some(sft) => Ok(Workload::Sft(Box::new(serde_json::from_value(
                sft.clone(),
            )?))),
            None => Ok(Workload::Rl(Box::new(serde_json::from_value(v)?))),
        }
    }

    pub fn world(&self) -> WorldSpec {
        match self {
            Workload::Rl(s) => s.world,
            Workload::Sft(s) => s.world,
        }
    }

    fn to_json_pretty(&self) -> Result<String, serde_json::Error> {
        match self {
            Workload::Rl(s) => serde_json::to_string_pretty(s),
            Workload::Sft(s) => serde_json::to_string_pretty(
                &serde_json::json!({ verlc_front::plan::SFT_SPEC_KEY: serde_json::to_value(s)? }),
            ),
        }
    }
}

/// Set in ranks spawned by this binary's own launcher (they stay quiet at start-up).
const LAUNCHED_ENV: &str = "VERLC_TRAINER_LAUNCHED";

/// Exit codes: 0 success, 1 config errors or a failed run, 2 usage.
const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// The binary's `main`: parse the command line, resolve and check the config, launch ranks,
/// train.
pub fn main<S: Strategy, P: Precision>(embedded_config: &str, build_info: BuildInfo) -> ExitCode {
    const {
        assert!(
            verlc_front::plan::binding::validate(S::KIND, P::KIND).is_ok(),
            "unsupported strategy/precision binding (see verlc_front::plan::binding)"
        )
    };
    crate::host_alloc::keep_freed_memory();
    let code = exit_code::<S, P>(embedded_config, build_info);
    // Everything `run` owned is dropped by now; libtorch's static destructors are all that is
    // left, and skipping them saves a fifth of a short process's CPU (crate::process_exit).
    crate::process_exit::exit_skipping_destructors(code)
}

fn exit_code<S: Strategy, P: Precision>(embedded_config: &str, build_info: BuildInfo) -> u8 {
    // Started as a rank's rollout replica (separate_async's pool): serve it, nothing else.
    if let Some(served) = crate::workers::rollout_pool::serve_if_replica() {
        return match served {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                EXIT_FAILED
            }
        };
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run::<S, P>(embedded_config, build_info, &args) {
        Ok(()) | Err(Exit::Done) => 0,
        Err(Exit::Usage(msg)) => {
            eprint!("{msg}");
            EXIT_USAGE
        }
        Err(Exit::Failed(msg)) => {
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            EXIT_FAILED
        }
    }
}

enum Exit {
    /// Bad command line.
    Usage(String),
    /// Config errors (already printed, then the message) or a failed run.
    Failed(String),
    /// Finished early on purpose (`--help`, `--print-config`).
    Done,
}

fn run<S: Strategy, P: Precision>(
    embedded: &str,
    info: BuildInfo,
    raw: &[OsString],
) -> Result<(), Exit> {
    let compiled = binding::<S, P>();
    let mut args = match args::parse(raw) {
        Ok(a) => a,
        Err(args::Stop::Help(text)) => {
            print!("{text}");
            return Err(Exit::Done);
        }
        Err(args::Stop::Usage(text)) => return Err(Exit::Usage(text)),
    };
    let launched = std::env::var_os(LAUNCHED_ENV).is_some();
    let env = DistEnv::from_env().map_err(|e| Exit::Failed(e.to_string()))?;
    let quiet = launched || env.as_ref().is_some_and(|e| e.rank != 0);
    if args.version {
        println!("{}", banner(&info, &compiled));
        return Err(Exit::Done);
    }
    if !quiet {
        eprintln!("{}", banner(&info, &compiled));
    }

    if let Some(n) = args.nproc_per_node {
        let key = "trainer.n_gpus_per_node";
        if let Some(o) = args.overrides.iter().find(|o| {
            o.split_once('=')
                .is_some_and(|(k, v)| k.trim_start_matches('+') == key && v != n.to_string())
        }) {
            return Err(Exit::Usage(format!(
                "error: --nproc-per-node {n} contradicts the override `{o}`\n"
            )));
        }
        args.overrides.push(format!("{key}={n}"));
    }

    let resolved = resolve(embedded, &info, &compiled, &args.overrides, quiet)?;
    if args.print_config {
        print!("{}", resolved.yaml);
        return Err(Exit::Done);
    }
    let spec = resolved.spec;
    if args.print_spec {
        let text = spec
            .to_json_pretty()
            .map_err(|e| Exit::Failed(format!("cannot print the spec: {e}")))?;
        println!("{text}");
        return Err(Exit::Done);
    }
    if args.check_only {
        println!(
            "ok: config is valid for this binary ({compiled}); {} rank(s)",
            spec.world().size()
        );
        return Err(Exit::Done);
    }

    let spec_world = spec.world();
    let world = spec_world.size();
    let cuda = spec_world.device == DeviceKind::Cuda;
    // Before any rank allocates a model: the weights are there, and CPU ranks' models fit
    // (the ranks this process launches skip what it checked).
    if !launched {
        let available = (!cuda)
            .then(crate::trainer::preflight::host_available_bytes)
            .flatten();
        match &spec {
            Workload::Rl(rl) => crate::trainer::preflight::check(rl, available),
            Workload::Sft(sft) => crate::trainer::preflight::check_sft(sft, available),
        }
        .map_err(|e| Exit::Failed(e.to_string()))?;
    }
    if cuda {
        let local = env
            .as_ref()
            .map_or(spec_world.n_gpus_per_node, |e| e.local_world_size);
        let found = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
        if found < local {
            return Err(Exit::Failed(format!(
                "trainer.device=cuda with {local} rank(s) on this node, but libtorch sees {found} CUDA device(s); \
                 run on a machine with {local} GPU(s), or build a CPU trainer (`verlc build … trainer.device=cpu`)"
            )));
        }
        // separate_async's built-in rollout pool takes the GPUs after the trainer's.
        let pool = rollout_processes(&spec) / spec_world.nnodes.max(1);
        if pool > 0 && found < local + pool {
            return Err(Exit::Failed(format!(
                "separate_async's rollout pool takes {pool} GPU(s) of this node after the trainer's {local}, but libtorch sees {found} CUDA device(s); \
                 size the pool with actor_rollout_ref.rollout.nnodes × n_gpus_per_node"
            )));
        }
        if !launched && matches!(spec, Workload::Rl(_)) {
            // The per-rank estimate `verlc explain` prints against the node's smallest GPU.
            match crate::trainer::gpu_memory::smallest_device_bytes(local) {
                Ok(bytes) => check_device_memory(embedded, &info, &args.overrides, bytes)?,
                Err(why) => eprintln!(
                    "note: the run's memory estimate was not checked against the GPUs ({why})"
                ),
            }
        }
    }
    let dist = match env {
        Some(env) => {
            if env.world_size != world {
                return Err(Exit::Failed(format!(
                    "the launcher started WORLD_SIZE={} ranks, but trainer.nnodes × trainer.n_gpus_per_node = {} × {} = {world}; \
                     pass `trainer.nnodes=… trainer.n_gpus_per_node=…` matching the launch so the batch rules are checked for it",
                    env.world_size, spec_world.nnodes, spec_world.n_gpus_per_node
                )));
            }
            env
        }
        None if world == 1 => DistEnv::single(),
        None if spec_world.nnodes > 1 => {
            return Err(Exit::Failed(format!(
                "trainer.nnodes={} needs a launcher on every node (torchrun or srun) that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
                spec_world.nnodes
            )));
        }
        None => {
            let what = if cuda {
                "processes, one per GPU"
            } else {
                "CPU processes over Gloo"
            };
            eprintln!("launching {world} local ranks ({what})");
            let mut launcher = LocalLauncher::new(world).env(LAUNCHED_ENV, "1");
            if std::env::var_os("OMP_NUM_THREADS").is_none() {
                // As torchrun: ranks share the cores instead of each taking all of them, and
                // with separate_async's built-in pool, with their rollout replicas.
                let cores = std::thread::available_parallelism().map_or(1, usize::from);
                let share = (cores / (world + rollout_processes(&spec))).max(1);
                launcher = launcher.env("OMP_NUM_THREADS", share.to_string());
            }
            let ranks = launcher.spawn().map_err(|e| Exit::Failed(e.to_string()))?;
            return match ranks.wait(None) {
                Ok(_) => Ok(()),
                Err(DistError::RankFailed { rank, status }) => {
                    Err(Exit::Failed(format!("rank {rank} failed ({status})")))
                }
                Err(e) => Err(Exit::Failed(e.to_string())),
            };
        }
    };
    let device = if cuda {
        tch::Device::Cuda(dist.local_rank)
    } else {
        tch::Device::Cpu
    };
    let ctx = RankContext { dist, device };
    match &spec {
        Workload::Rl(rl) => train::<S, P>(rl, &ctx),
        Workload::Sft(sft) => train_sft::<S, P>(sft, &ctx),
    }
    .map_err(|e| Exit::Failed(format!("rank {}: {e}", ctx.dist.rank)))
}

/// Refuses a run whose trained roles `verlc explain` estimates at more memory per rank than a
/// GPU of `device_bytes` has, naming both numbers and the keys that would lower it. The
/// estimate needs the model's `config.json` (a run without one is not checked).
/// The processes of separate_async's built-in rollout pool (0 for any other run).
fn rollout_processes(spec: &Workload) -> usize {
    match spec {
        Workload::Rl(s) => s.run.asynchronous.map_or(0, |a| a.rollout_processes),
        _ => 0,
    }
}

fn check_device_memory(
    embedded: &str,
    info: &BuildInfo,
    overrides: &[String],
    device_bytes: u64,
) -> Result<(), Exit> {
    let req = embedded_request(embedded, info, overrides)?;
    let checked = verlc_front::check::check(&req, &CheckOptions::default());
    let (Some(cfg), Some(dims)) = (checked.config.as_ref(), checked.model.as_ref()) else {
        return Ok(());
    };
    let Ok(e) = verlc_front::explain::explain(cfg, Some(dims)) else {
        return Ok(());
    };
    match verlc_front::explain::device_shortfall(cfg, &e, device_bytes) {
        Some(short) => Err(Exit::Failed(format!("{short}; nothing was run"))),
        None => Ok(()),
    }
}

fn banner(info: &BuildInfo, b: &Binding) -> String {
    format!(
        "verlc trainer: built by verlc {} from {} (config {}); {}",
        info.verlc_version, info.source, info.config_hash, b
    )
}

/// What this run executes.
struct Resolved {
    /// The resolved config (for `--print-config`).
    yaml: String,
    spec: Workload,
}

/// The spec this run executes: the embedded one as built, or, with overrides, the embedded
/// config plus the overrides checked like `verlc check` and lowered by the same lowering.
/// Overrides of statically bound keys are refused first, whatever else is wrong.
fn resolve(
    embedded: &str,
    info: &BuildInfo,
    compiled: &Binding,
    overrides: &[String],
    quiet: bool,
) -> Result<Resolved, Exit> {
    if overrides.is_empty() && !info.spec.is_empty() {
        let spec = Workload::from_json(info.spec)
            .map_err(|e| Exit::Failed(format!("embedded trainer spec: {e}")))?;
        let yaml = embedded
            .lines()
            .skip_while(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        return Ok(Resolved { yaml, spec });
    }
    let (bound, device) = embedded_binding(embedded, info)?;
    let req = embedded_request(embedded, info, overrides)?;
    // What this binary cannot run are errors here, not `check`'s warnings. The embedded
    // config's verdicts were reported by `verlc build`; only the overridden keys' count now.
    let out = compile(&req, &CheckOptions::default(), Mode::Overrides(overrides));
    let checked = &out.checked;
    refuse_bound_changes(
        &bound,
        device,
        &checked.composed.root,
        overrides,
        compiled,
        info,
    )?;

    let shown: Vec<Diagnostic> = checked
        .diagnostics
        .iter()
        .filter(|d| d.is_error() || !quiet)
        .cloned()
        .collect();
    if !shown.is_empty() {
        eprint!(
            "{}",
            verlc_front::render::human(&shown, &checked.composed.sources, false)
        );
    }
    if checked.has_errors() {
        let n = checked.diagnostics.iter().filter(|d| d.is_error()).count();
        return Err(Exit::Failed(format!(
            "the config has {n} error(s); nothing was run"
        )));
    }
    let Some(planned) = out.planned else {
        return Err(Exit::Failed(
            "the config did not pass its checks; nothing was run".into(),
        ));
    };
    if let Planned::Rl(plan) = &planned {
        // Overrides may name other models (or add a role, with verl's default path): the
        // trainer never downloads, so what it cannot load from this machine is an error
        // before any rank starts, at the key that names it.
        let env = verlc_hub::HubEnv::from_env();
        let problems: Vec<Diagnostic> = plan::models::model_problems(&plan.spec, &env)
            .iter()
            .map(|p| p.diagnostic(&checked.composed.root))
            .collect();
        if !problems.is_empty() {
            eprint!(
                "{}",
                verlc_front::render::human(&problems, &checked.composed.sources, false)
            );
            return Err(Exit::Failed(format!(
                "{} model(s) cannot be loaded; nothing was run",
                problems.len()
            )));
        }
    }
    if planned.binding() != *compiled {
        return Err(Exit::Failed(format!(
            "the overrides change the binding to `{}` but this binary is `{compiled}`; rebuild with verlc: `verlc build {} {} -o <trainer>`",
            planned.binding(),
            info.source,
            overrides.join(" ")
        )));
    }
    let yaml = plan::embed::to_yaml(&checked.composed.root);
    let spec = match planned {
        Planned::Rl(plan) => Workload::Rl(Box::new(plan.spec)),
        Planned::Sft(plan) => Workload::Sft(Box::new(plan.spec)),
    };
    Ok(Resolved { yaml, spec })
}

/// The embedded config with `overrides`, composed as the build composed it: named after the
/// file it was built from (for diagnostics), on the tree the build was judged against (the
/// `--config-dir` tree the binary carries, else the built-in tree of its release).
fn embedded_request(
    embedded: &str,
    info: &BuildInfo,
    overrides: &[String],
) -> Result<LoadRequest, Exit> {
    Ok(LoadRequest {
        config_text: Some(ConfigText {
            name: embedded_name(info),
            text: embedded.to_owned(),
        }),
        overrides: overrides.to_vec(),
        cwd: std::env::current_dir().unwrap_or_default(),
        config_dir: carried_tree(info)?,
        builtin: BuiltinRelease::same_minor(info.verl_release).unwrap_or_default(),
        ..LoadRequest::default()
    })
}

/// The keys that decided the binding and the device, as `verlc build` embedded them; a
/// hand-written instantiation (no embedded spec) lowers its config to find them.
fn embedded_binding(embedded: &str, info: &BuildInfo) -> Result<(Vec<BoundKey>, DeviceKind), Exit> {
    if !info.bound_keys.is_empty() && !info.spec.is_empty() {
        let keys: Vec<BoundKey> = serde_json::from_str(info.bound_keys)
            .map_err(|e| Exit::Failed(format!("embedded bound keys: {e}")))?;
        let spec = Workload::from_json(info.spec)
            .map_err(|e| Exit::Failed(format!("embedded trainer spec: {e}")))?;
        return Ok((keys, spec.world().device));
    }
    let planned = embedded_plan(embedded, info)?;
    let device = if planned.cuda() {
        DeviceKind::Cuda
    } else {
        DeviceKind::Cpu
    };
    Ok((planned.bound_keys().to_vec(), device))
}

/// The plan of the embedded config as `verlc build` makes it (its bound keys and their
/// values), for a hand-written instantiation that embeds no spec.
fn embedded_plan(embedded: &str, info: &BuildInfo) -> Result<Planned, Exit> {
    let out = compile(
        &embedded_request(embedded, info, &[])?,
        &CheckOptions::default(),
        Mode::Build {
            deny_warnings: false,
        },
    );
    out.planned.ok_or_else(|| {
        let errors: Vec<Diagnostic> = out
            .checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .cloned()
            .collect();
        Exit::Failed(format!(
            "the embedded config does not build:\n{}",
            verlc_front::render::human(&errors, &out.checked.composed.sources, false)
        ))
    })
}

/// Refuse overrides that change a key the binary was compiled for.
fn refuse_bound_changes(
    bound: &[BoundKey],
    device: DeviceKind,
    after: &Node,
    overrides: &[String],
    compiled: &Binding,
    info: &BuildInfo,
) -> Result<(), Exit> {
    let mut refused = Vec::new();
    for text in overrides {
        let key = plan::override_key(text);
        let changed = bound.iter().any(|b| {
            plan::keys_overlap(&b.key, key)
                && after
                    .get_path(&split_key(&b.key))
                    .map_or(serde_json::Value::Null, Node::to_json)
                    != b.value
        });
        if changed {
            refused.push(format!("`{text}`"));
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    let device = match device {
        DeviceKind::Cpu => "cpu",
        DeviceKind::Cuda => "cuda",
    };
    Err(Exit::Failed(format!(
        "{} {} this binary binds at compile time ({compiled}; device {device}); rebuild with verlc: `verlc build {} {} -o <trainer>`",
        refused.join(", "),
        if refused.len() == 1 {
            "changes a key"
        } else {
            "change keys"
        },
        info.source,
        overrides.join(" ")
    )))
}

/// The `--config-dir` tree the binary carries, written out (once per tree, under the
/// system's temporary directory) for composition; `None` when it was built on verlc's
/// built-in tree.
fn carried_tree(info: &BuildInfo) -> Result<Option<std::path::PathBuf>, Exit> {
    if info.verl_tree.trim().is_empty() {
        return Ok(None);
    }
    let tree: verlc_front::load::carried_tree::CarriedTree =
        serde_json::from_str(info.verl_tree)
            .map_err(|e| Exit::Failed(format!("the embedded verl config tree: {e}")))?;
    // Named by its content, so every rank (and every run) of this binary shares one copy.
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    info.verl_tree.hash(&mut h);
    let root = std::env::temp_dir().join(format!("verlc-verl-tree-{:016x}", h.finish()));
    tree.materialize(&root)
        .map(Some)
        .map_err(|e| Exit::Failed(format!("writing the embedded verl config tree: {e}")))
}

/// The name diagnostics give the embedded config: `<source stem>.resolved.yaml` (embedded
/// in this binary), after the config `verlc build` read.
fn embedded_name(info: &BuildInfo) -> String {
    let stem = std::path::Path::new(info.source)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("config");
    format!("{stem}.resolved.yaml (embedded)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU run's embedded config with a 7B model's `config.json`: refused on one 80 GiB GPU
    /// with the estimate, the GPU's memory and the keys that lower it; accepted once the
    /// overrides offload the optimizer and weights; a run whose model has no `config.json` to
    /// estimate from (a built-in model) is not refused.
    #[test]
    fn a_gpu_run_over_the_devices_memory_is_refused_with_what_fits_it() {
        let dir = std::env::temp_dir().join(format!("verlc-gpu-fit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
            "intermediate_size": 18944, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        let embedded = format!(
            "algorithm:\n  adv_estimator: grpo\ndata:\n  train_batch_size: 8\n  max_prompt_length: 512\n  max_response_length: 512\n\
             actor_rollout_ref:\n  model:\n    path: {}\n  actor:\n    ppo_mini_batch_size: 8\n    ppo_micro_batch_size_per_gpu: 1\n\
             \x20 rollout:\n    name: vllm\n    log_prob_micro_batch_size_per_gpu: 1\n  ref:\n    log_prob_micro_batch_size_per_gpu: 1\n\
             trainer:\n  device: cuda\n  n_gpus_per_node: 1\n",
            dir.display()
        );
        let info = BuildInfo {
            verlc_version: "test",
            config_hash: "",
            source: "gpu.yaml",
            spec: "",
            bound_keys: "",
            verl_release: "0.7.0",
            verl_tree: "",
        };
        let gpu = 80 * (1u64 << 30);
        let Err(Exit::Failed(msg)) = check_device_memory(&embedded, &info, &[], gpu) else {
            panic!("a 7B update fits one 80 GiB GPU?");
        };
        eprintln!("{msg}");
        assert!(
            msg.contains("the actor needs about")
                && msg.contains("the GPU has 80.0 GiB")
                && msg.contains("optimizer_offload=True"),
            "{msg}"
        );
        let offloaded = [
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True".to_owned(),
            "actor_rollout_ref.actor.fsdp_config.param_offload=True".to_owned(),
        ];
        assert!(check_device_memory(&embedded, &info, &offloaded, gpu).is_ok());
        let builtin = ["actor_rollout_ref.model.path=builtin://tiny".to_owned()];
        assert!(check_device_memory(&embedded, &info, &builtin, 1).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn markers_carry_their_kinds() {
        let b = binding::<Fsdp, Fp16Mixed>();
        assert_eq!(b.to_string(), "strategy = Fsdp, precision = Fp16Mixed");
        for (linked, kind) in [
            (Fp32::LOSS_SCALER.is_linked(), Fp32::KIND),
            (Bf16Mixed::LOSS_SCALER.is_linked(), Bf16Mixed::KIND),
            (Fp16Mixed::LOSS_SCALER.is_linked(), Fp16Mixed::KIND),
        ] {
            assert_eq!(linked, kind.loss_scaling(), "{kind:?}");
        }
        assert_eq!(Bf16Mixed::COMPUTE, tch::Kind::BFloat16);
        assert_eq!(<Megatron as Strategy>::KIND, StrategyKind::Megatron);
    }
}

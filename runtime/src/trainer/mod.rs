//! The RL training loop: verl's `RayPPOTrainer.fit()` (docs/training-loop.md) in one
//! process, over the engine interface and the worker roles.
//!
//! One step, in verl's order: generate (the rollout worker, `rollout.n` samples per prompt)
//! → reward (rule scorers or the user's Python function) → old log-probs and entropy (actor)
//! → reference log-probs → values (critic) → advantages (with the in-reward KL penalty and
//! its fixed/adaptive controller when `use_kl_in_reward`) → critic update → actor update
//! (from `trainer.critic_warmup` on) → weight sync to the rollout → validation
//! (`test_freq`) → checkpoint (`save_freq`) → metrics with verl's names to `trainer.logger`.
//!
//! Everything random is drawn from seeded streams ([`crate::rng`]) keyed by the step, and
//! the sampler position, model, optimizer, scheduler and KL-controller state are
//! checkpointed, so a resumed run repeats an uninterrupted one exactly.
//!
//! Entry point: [`run`] (also what `verlc_runtime::binding::train` calls for one rank).

pub mod agent;
pub mod background;
pub mod checkpoint;
mod fit;
pub mod gpu_memory;
pub mod metrics;
pub mod parallel;
pub mod preflight;
mod prompts;
pub mod replay;

use std::time::Duration;

use tch::Device;
use verlc_spec::TrainerSpec;

use crate::engine::Metrics;
use crate::optim::LossScaling;

pub use fit::Trainer;
pub(crate) use fit::{absolute, lora_config};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    #[error(transparent)]
    Worker(#[from] crate::workers::WorkerError),
    #[error(transparent)]
    Reward(#[from] crate::workers::reward::RewardError),
    /// A reward error on one response: where its prompt came from and what was scored.
    #[error(
        "{file}: row {row}: scoring the response to this prompt (data_source={data_source:?}, ground_truth={ground_truth}, response {response:?}): {source}"
    )]
    RewardSample {
        file: String,
        row: usize,
        data_source: String,
        ground_truth: String,
        /// The decoded response, at most 300 characters of it.
        response: String,
        source: Box<crate::workers::reward::RewardError>,
    },
    #[error(transparent)]
    Algo(#[from] crate::algo::AlgoError),
    #[error(transparent)]
    Log(#[from] crate::logging::LogError),
    #[error("checkpoint {}: {msg}", path.display())]
    Checkpoint {
        path: std::path::PathBuf,
        msg: String,
    },
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// How this process runs the spec: what the rank's place and the environment decide (the
/// binding and every setting come from the [`TrainerSpec`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    pub device: Device,
    /// Interpreter of `custom_reward_function` (default: `$VERLC_PYTHON`, the active
    /// virtualenv's python, or `python3`).
    pub reward_python: Option<String>,
    /// Longest wait for the reward module to import.
    pub reward_startup_timeout: Duration,
    /// Longest wait for one batch of scores (`$VERLC_REWARD_TIMEOUT_S`, default 600 s).
    pub reward_call_timeout: Duration,
    /// Longest wait for `rollout.multi_turn`'s tools to load
    /// (`$VERLC_TOOL_STARTUP_TIMEOUT_S`, default 120 s).
    pub tool_startup_timeout: Duration,
    /// Longest wait for one round of tool calls (`$VERLC_TOOL_TIMEOUT_S`, default 60 s).
    pub tool_call_timeout: Duration,
    /// Print verl's console lines (the `console` logger).
    pub console_lines: bool,
    /// The grad scaler code the engines may use: a trainer binary passes its precision's
    /// (only fp16 links one); the default links it.
    pub loss_scaling: LossScaling,
    /// How `separate_async`'s built-in rollout replicas start (`None`: this process's own
    /// executable, a trainer binary, whose `main` serves as a replica first; a test binary
    /// names itself and a test function that serves).
    pub rollout_replica: Option<crate::workers::rollout_pool::ReplicaCommand>,
    /// The asynchronous modes' partial rollout (verl's: a batch in flight at a weight sync
    /// goes on with the new weights). Where it falls in a batch depends on timing, so a run
    /// with it is not repeatable; without it (`$VERLC_PARTIAL_ROLLOUT=0`) every batch is
    /// generated with the weights it began with and a run repeats exactly.
    pub partial_rollout: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions::new(LossScaling::LINKED)
    }
}

impl RunOptions {
    /// The default options with `loss_scaling` (a binary that calls this instead of
    /// [`Default::default`] links only the scaler code it names).
    pub fn new(loss_scaling: LossScaling) -> Self {
        // A positive number of seconds from the environment, else `default`.
        let seconds = |var: &str, default: f64| {
            let s = std::env::var(var)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| *s > 0.0)
                .unwrap_or(default);
            Duration::from_secs_f64(s)
        };
        RunOptions {
            device: Device::Cpu,
            reward_python: None,
            reward_startup_timeout: Duration::from_secs(120),
            reward_call_timeout: seconds("VERLC_REWARD_TIMEOUT_S", 600.0),
            tool_startup_timeout: seconds("VERLC_TOOL_STARTUP_TIMEOUT_S", 120.0),
            tool_call_timeout: seconds("VERLC_TOOL_TIMEOUT_S", 60.0),
            console_lines: true,
            loss_scaling,
            rollout_replica: None,
            partial_rollout: std::env::var("VERLC_PARTIAL_ROLLOUT").map_or(true, |v| v != "0"),
        }
    }

    /// The interpreter of reward functions and tools: `reward_python`, else
    /// [`PythonSettings::default_python`](crate::workers::reward::python::PythonSettings::default_python).
    pub fn python(&self) -> String {
        self.reward_python
            .clone()
            .unwrap_or_else(crate::workers::reward::python::PythonSettings::default_python)
    }
}

/// What a finished run reports.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// The metrics logged at each step (including the validation before training at the
    /// start step), in order.
    pub history: Vec<(u64, Metrics)>,
    /// The step training resumed from (0: from scratch).
    pub resumed_from: u64,
    /// The last step trained.
    pub last_step: u64,
}

/// Trains `spec` in this process (one rank, world size 1, the single engine).
pub fn run(spec: &TrainerSpec, opts: &RunOptions) -> Result<RunSummary, TrainerError> {
    let mut trainer = Trainer::new(spec, opts)?;
    trainer.fit()
}

/// Trains `spec` as one rank of `roles`' world (every rank calls it).
pub fn run_with<R: parallel::Roles>(
    spec: &TrainerSpec,
    opts: &RunOptions,
    roles: R,
) -> Result<RunSummary, TrainerError> {
    let mut trainer = Trainer::with_roles(spec, opts, roles)?;
    trainer.fit()
}

//! The run itself: `trainer` (cluster size, length, logging, validation, checkpoints,
//! resume), and the launch-level nodes `ray_kwargs` and `transfer_queue`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{OneOrMany, OpenDict};

/// A metrics logging backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LoggerBackend {
    /// Print metrics to standard output.
    #[serde(rename = "console")]
    Console,
    /// Weights & Biases.
    #[serde(rename = "wandb")]
    Wandb,
    /// Deprecated spelling of `wandb`.
    #[serde(rename = "tracking")]
    Tracking,
    /// TensorBoard event files.
    #[serde(rename = "tensorboard")]
    Tensorboard,
    /// MLflow.
    #[serde(rename = "mlflow")]
    Mlflow,
    /// SwanLab.
    #[serde(rename = "swanlab")]
    Swanlab,
    /// Volcengine ML platform's W&B service.
    #[serde(rename = "vemlp_wandb")]
    VemlpWandb,
    /// ClearML.
    #[serde(rename = "clearml")]
    Clearml,
    /// Trackio.
    #[serde(rename = "trackio")]
    Trackio,
    /// JSON lines written to a local file.
    #[serde(rename = "file")]
    File,
}

/// How a run picks up an earlier checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ResumeMode {
    /// Resume from the latest checkpoint in `default_local_dir`, if any.
    #[serde(rename = "auto")]
    Auto,
    /// Always start from scratch.
    #[serde(rename = "disable")]
    Disable,
    /// Resume from `resume_from_path`.
    #[serde(rename = "resume_path")]
    ResumePath,
}

/// Accelerator kind of the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Device {
    /// NVIDIA GPUs.
    #[serde(rename = "cuda")]
    Cuda,
    /// Ascend NPUs.
    #[serde(rename = "npu")]
    Npu,
    /// CPU only.
    #[serde(rename = "cpu")]
    Cpu,
}

/// Choice between verl's legacy per-backend workers and the newer engine-based workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LegacyWorkerImpl {
    /// Let verl decide.
    #[serde(rename = "auto")]
    Auto,
    /// Use the legacy workers.
    #[serde(rename = "enable")]
    Enable,
    /// Use the engine-based workers.
    #[serde(rename = "disable")]
    Disable,
}

/// The training run: cluster size, length, logging, validation, checkpoints and resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    /// Reorder each batch so every data-parallel rank gets a similar number of tokens.
    pub balance_batch: bool,
    /// Passes over the training data.
    #[schemars(range(min = 1))]
    pub total_epochs: i64,
    /// Stop after this many steps; null runs `total_epochs` epochs.
    #[schemars(range(min = 1))]
    pub total_training_steps: Option<i64>,
    /// Project name for loggers and the checkpoint folder.
    #[serde(deserialize_with = "super::common::name_or_number")]
    #[schemars(with = "super::common::NameOrNumber")]
    pub project_name: String,
    /// Experiment name for loggers and the checkpoint folder.
    #[serde(deserialize_with = "super::common::name_or_number")]
    #[schemars(with = "super::common::NameOrNumber")]
    pub experiment_name: String,
    /// Logging backend(s).
    pub logger: OneOrMany<LoggerBackend>,
    /// Validation samples logged as a table; 0 logs none.
    #[schemars(range(min = 0))]
    pub log_val_generations: i64,
    /// Folder where training rollouts are dumped as JSON lines; null disables.
    pub rollout_data_dir: Option<String>,
    /// Folder where validation generations are dumped as JSON lines; null disables.
    #[serde(default)]
    pub validation_data_dir: Option<String>,
    /// Number of nodes.
    #[schemars(range(min = 1))]
    pub nnodes: i64,
    /// Accelerators per node.
    #[schemars(range(min = 1))]
    pub n_gpus_per_node: i64,
    /// Save a checkpoint every this many steps; 0 or less saves none (except before the
    /// capacity expires, see `esi_redundant_time`).
    pub save_freq: i64,
    /// Extra safety margin, in seconds, when saving ahead of a capacity-block expiry.
    #[schemars(range(min = 0))]
    pub esi_redundant_time: i64,
    /// Resume behaviour.
    pub resume_mode: ResumeMode,
    /// Checkpoint folder (`…/global_step_N`) used with `resume_mode: resume_path`.
    pub resume_from_path: Option<String>,
    /// Validate once before the first training step.
    pub val_before_train: bool,
    /// Only validate, then exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_only: Option<bool>,
    /// Validate every this many steps; 0 or less validates only at the end.
    pub test_freq: i64,
    /// Steps during which only the critic is trained.
    #[schemars(range(min = 0))]
    pub critic_warmup: i64,
    /// HDFS folder checkpoints are copied to; null disables.
    pub default_hdfs_dir: Option<String>,
    /// Delete the local checkpoint after it has been loaded.
    pub del_local_ckpt_after_load: bool,
    /// Local checkpoint folder.
    pub default_local_dir: String,
    /// Keep at most this many actor checkpoints; null keeps all.
    #[schemars(range(min = 1))]
    pub max_actor_ckpt_to_keep: Option<i64>,
    /// Keep at most this many critic checkpoints; null keeps all.
    #[schemars(range(min = 1))]
    pub max_critic_ckpt_to_keep: Option<i64>,
    /// How long the driver waits for workers to register, in seconds.
    #[schemars(range(min = 1))]
    pub ray_wait_register_center_timeout: i64,
    /// Accelerator kind.
    pub device: Device,
    /// Worker implementation.
    pub use_legacy_worker_impl: LegacyWorkerImpl,

    /// Deprecated: use `max_actor_ckpt_to_keep` / `max_critic_ckpt_to_keep` set to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub remove_previous_ckpt_in_save: Option<bool>,
    /// HTTP(S) proxy used by the wandb logger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wandb_proxy: Option<String>,
    /// verl 0.9+: run the v1 trainer (`trainer.v1`) instead of the legacy Ray trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_v1: Option<bool>,
    /// verl 0.9+: the v1 trainer's mode and the settings of each mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1: Option<TrainerV1Config>,
}

/// verl 0.9's v1 trainer: synchronous PPO, or asynchronous (off-policy) with the rollout
/// colocated or on separate devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerV1Config {
    /// Which trainer runs.
    pub trainer_mode: TrainerMode,
    /// Settings of the synchronous trainer (none so far).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<super::common::OpenDict>,
    /// Settings of the asynchronous trainer with a colocated rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colocate_async: Option<ColocateAsyncConfig>,
    /// Settings of the asynchronous trainer with a separate rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separate_async: Option<SeparateAsyncConfig>,
}

/// `trainer.v1.trainer_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrainerMode {
    /// Generate, then train on what was generated (what verlc's trainer runs).
    Sync,
    /// Rollout and training interleaved on the same devices, training on older samples.
    ColocateAsync,
    /// Rollout on its own devices, weights synchronised every `parameter_sync_step` steps.
    SeparateAsync,
}

/// `trainer.v1.colocate_async`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ColocateAsyncConfig {
    /// Batches generated before training starts (fractions in whole generation batches).
    #[schemars(range(min = 0))]
    pub num_warmup_batches: f64,
}

/// `trainer.v1.separate_async`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SeparateAsyncConfig {
    /// Batches generated before training starts.
    #[schemars(range(min = 0))]
    pub num_warmup_batches: f64,
    /// Training steps between weight synchronisations to the rollout.
    #[schemars(range(min = 1))]
    pub parameter_sync_step: i64,
    /// Lending idle trainer devices to the rollout (`HybridRolloutSwitchConfig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid_rollout: Option<super::common::OpenDict>,
}

/// Arguments of `ray.init`; `num_cpus` is typed, anything else is passed through.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RayInitConfig {
    /// CPUs Ray may use; null uses all (set a number under SLURM to avoid hangs).
    #[schemars(range(min = 1))]
    pub num_cpus: Option<i64>,
    /// Any other `ray.init` keyword argument (e.g. `runtime_env`).
    #[serde(flatten)]
    pub extra: OpenDict,
}

/// Ray launch settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RayKwargs {
    /// Arguments of `ray.init`.
    pub ray_init: RayInitConfig,
    /// File a Ray timeline trace is written to; null disables.
    pub timeline_json_file: Option<String>,
}

/// The experimental TransferQueue data plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferQueueConfig {
    /// Move batches between roles through TransferQueue.
    pub enable: bool,
}

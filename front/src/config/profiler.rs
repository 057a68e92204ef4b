//! Profiling: the per-role `profiler` node (actor, ref, rollout, critic, reward model) and the
//! top-level `global_profiler` node that chooses the tool and the steps to profile.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::OpenDict;

/// A profiling tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProfilerTool {
    /// NVIDIA Nsight Systems.
    #[serde(rename = "nsys")]
    Nsys,
    /// Ascend NPU profiler.
    #[serde(rename = "npu")]
    Npu,
    /// `torch.profiler`.
    #[serde(rename = "torch")]
    Torch,
    /// CUDA caching-allocator memory snapshots.
    #[serde(rename = "torch_memory")]
    TorchMemory,
}

/// Profiling settings of one role. The tool and output folder normally come from
/// `global_profiler`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfilerConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Tool used for this role; null disables profiling. Mirrors `global_profiler.tool`.
    pub tool: Option<ProfilerTool>,
    /// Profile this role at the steps listed in `global_profiler.steps`.
    pub enable: bool,
    /// Profile every rank of the role instead of only those in `ranks`.
    pub all_ranks: bool,
    /// Global ranks to profile when `all_ranks` is false.
    pub ranks: Vec<i64>,
    /// Folder the traces are written to. Mirrors `global_profiler.save_path`.
    pub save_path: Option<String>,
    /// Per-tool options; null where the role copies a missing node from the actor.
    pub tool_config: Option<ProfilerToolConfig>,
}

/// Options of every profiling tool for one role; only the chosen tool's entry is used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfilerToolConfig {
    /// Nsight Systems options.
    pub nsys: NsysToolConfig,
    /// Ascend NPU profiler options.
    pub npu: NpuToolConfig,
    /// `torch.profiler` options.
    pub torch: TorchToolConfig,
    /// Memory snapshot options.
    pub torch_memory: TorchMemoryToolConfig,
}

/// Nsight Systems options of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NsysToolConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// One trace per task (rollout, log-prob, update) instead of one per step. Mirrors
    /// `global_profiler.global_tool_config.nsys.discrete`; null when that is absent.
    pub discrete: Option<bool>,
}

/// Kinds of data the Ascend NPU profiler can collect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NpuProfileContent {
    /// Device-side activity.
    #[serde(rename = "npu")]
    Npu,
    /// Host-side activity.
    #[serde(rename = "cpu")]
    Cpu,
    /// Memory usage.
    #[serde(rename = "memory")]
    Memory,
    /// Tensor shapes.
    #[serde(rename = "shapes")]
    Shapes,
    /// Module hierarchy.
    #[serde(rename = "module")]
    Module,
    /// Python call stacks.
    #[serde(rename = "stack")]
    Stack,
}

/// Detail level of the Ascend NPU profiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NpuProfileLevel {
    /// Framework events only.
    #[serde(rename = "level_none")]
    LevelNone,
    /// Basic operator timing.
    #[serde(rename = "level0")]
    Level0,
    /// Adds AscendCL and AI Core metrics.
    #[serde(rename = "level1")]
    Level1,
    /// Adds the most detailed runtime events.
    #[serde(rename = "level2")]
    Level2,
}

/// Ascend NPU profiler options of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NpuToolConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What to collect; empty means the tool's default set.
    pub contents: Vec<NpuProfileContent>,
    /// How much detail to record.
    pub level: NpuProfileLevel,
    /// Run the offline analysis after collection.
    pub analysis: bool,
    /// One trace per task instead of one per step.
    pub discrete: bool,
}

/// `torch.profiler` options of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TorchToolConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// First profiled step inside a profiled task.
    pub step_start: i64,
    /// Step after the last profiled one; null profiles to the end.
    pub step_end: Option<i64>,
}

/// Memory snapshot options of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TorchMemoryToolConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Size of the allocation history ring buffer, in events.
    #[schemars(range(min = 1))]
    pub trace_alloc_max_entries: i64,
    /// Number of stack frames kept per allocation event.
    #[schemars(range(min = 1))]
    pub stack_depth: i64,
}

/// Profiling for the whole run: which tool, which steps, and the defaults of every role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobalProfilerConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Tool used by every role that enables profiling; null disables profiling.
    pub tool: Option<ProfilerTool>,
    /// Training steps (1-based) to profile; null profiles none.
    pub steps: Option<Vec<i64>>,
    /// Record consecutive profiled steps into one trace instead of one trace per step.
    pub profile_continuous_steps: bool,
    /// Folder traces are written to.
    pub save_path: Option<String>,
    /// Options shared by all roles, per tool.
    pub global_tool_config: GlobalToolConfig,
}

/// Run-wide options per profiling tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobalToolConfig {
    /// Nsight Systems options.
    pub nsys: GlobalNsysConfig,
    /// Memory snapshot options.
    pub torch_memory: GlobalTorchMemoryConfig,
}

/// Run-wide Nsight Systems options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobalNsysConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// One trace per task instead of one per step (copied into every role).
    pub discrete: bool,
    /// `nsys` command-line options for the driver process (option name -> value).
    pub controller_nsight_options: OpenDict,
    /// `nsys` command-line options for worker processes (option name -> value); needed
    /// whenever `steps` is set with the `nsys` tool.
    pub worker_nsight_options: OpenDict,
}

/// What each recorded allocation event keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum MemoryHistoryContext {
    /// Keep the state of live allocations only.
    #[serde(rename = "state")]
    State,
    /// Also keep allocation events.
    #[serde(rename = "alloc")]
    Alloc,
    /// Keep allocation and free events.
    #[serde(rename = "all")]
    All,
}

/// Which stacks each recorded allocation event keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum MemoryHistoryStacks {
    /// Python frames only.
    #[serde(rename = "python")]
    Python,
    /// Python, C++ and TorchScript frames.
    #[serde(rename = "all")]
    All,
}

/// Run-wide memory snapshot options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobalTorchMemoryConfig {
    /// Size of the allocation history ring buffer, in events.
    #[schemars(range(min = 1))]
    pub trace_alloc_max_entries: i64,
    /// Number of stack frames kept per allocation event.
    #[schemars(range(min = 1))]
    pub stack_depth: i64,
    /// Which events are recorded.
    pub context: MemoryHistoryContext,
    /// Which stacks are recorded.
    pub stacks: MemoryHistoryStacks,
    /// Extra keyword arguments for the memory-history recorder.
    pub kw_args: OpenDict,
}

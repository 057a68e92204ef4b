//! Agentic and multi-turn rollout settings: `rollout.multi_turn`, `rollout.agent` and
//! `rollout.trace`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which side of an over-long tool response is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TruncateSide {
    /// Keep the end (verl 0.8+; verl 0.7 kept the beginning under this name).
    #[serde(rename = "left")]
    Left,
    /// Keep the beginning (verl 0.8+; verl 0.7 kept the end under this name).
    #[serde(rename = "right")]
    Right,
    /// Keep the beginning and the end, cut the middle.
    #[serde(rename = "middle")]
    Middle,
}

/// How strictly incremental tokenization of a conversation is compared with tokenizing it in
/// one go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TokenizationSanityCheckMode {
    /// No check.
    #[serde(rename = "disable")]
    Disable,
    /// Any difference is reported.
    #[serde(rename = "strict")]
    Strict,
    /// Differences in strippable whitespace are tolerated.
    #[serde(rename = "ignore_strippable")]
    IgnoreStrippable,
}

/// Tool-call syntax the model emits: a name of verl's tool-parser registry (0.7 has `hermes`
/// and `gpt-oss`; 0.8 adds `qwen3_coder` and `gemma4`, 0.9 `glm`, `seed`, `minimax`, `kimi`
/// and `deepseek_v4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ToolCallFormat {
    /// Hermes-style `<tool_call>` JSON blocks (Qwen2.5, Qwen3).
    #[serde(rename = "hermes")]
    Hermes,
    /// The gpt-oss (harmony) format.
    #[serde(rename = "gpt-oss")]
    GptOss,
    /// XML-style `<function=...>` calls in `<tool_call>` blocks (Qwen3-Coder, Qwen3.5).
    #[serde(rename = "qwen3_coder")]
    Qwen3Coder,
    /// Gemma 4's call tokens.
    #[serde(rename = "gemma4")]
    Gemma4,
    /// GLM's `<arg_key>`/`<arg_value>` calls.
    #[serde(rename = "glm")]
    Glm,
    /// Seed-OSS's format.
    #[serde(rename = "seed")]
    Seed,
    /// MiniMax's format.
    #[serde(rename = "minimax")]
    Minimax,
    /// Kimi's format.
    #[serde(rename = "kimi")]
    Kimi,
    /// DeepSeek-V4's format.
    #[serde(rename = "deepseek_v4")]
    DeepseekV4,
}

impl ToolCallFormat {
    /// verl's registry name.
    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::GptOss => "gpt-oss",
            ToolCallFormat::Qwen3Coder => "qwen3_coder",
            ToolCallFormat::Gemma4 => "gemma4",
            ToolCallFormat::Glm => "glm",
            ToolCallFormat::Seed => "seed",
            ToolCallFormat::Minimax => "minimax",
            ToolCallFormat::Kimi => "kimi",
            ToolCallFormat::DeepseekV4 => "deepseek_v4",
        }
    }
}

/// Multi-turn generation with tool calls and interactions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiTurnConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Generate conversations of several turns instead of one response.
    pub enable: bool,
    /// Maximum assistant turns per conversation; null means no limit besides length.
    #[schemars(range(min = 1))]
    pub max_assistant_turns: Option<i64>,
    /// YAML file describing the tools the model may call.
    pub tool_config_path: Option<String>,
    /// Maximum user (interaction) turns per conversation; null means no limit.
    #[schemars(range(min = 1))]
    pub max_user_turns: Option<i64>,
    /// Tool calls executed in parallel within one turn.
    #[schemars(range(min = 1))]
    pub max_parallel_calls: i64,
    /// Tool responses longer than this many characters are truncated.
    #[schemars(range(min = 1))]
    pub max_tool_response_length: i64,
    /// Which part of an over-long tool response is dropped.
    pub tool_response_truncate_side: TruncateSide,
    /// YAML file describing simulated-user interactions.
    pub interaction_config_path: Option<String>,
    /// Format the conversation with the inference chat template (keeping e.g. reasoning
    /// tokens) rather than the training one.
    pub use_inference_chat_template: bool,
    /// Check that turn-by-turn tokenization matches whole-conversation tokenization.
    pub tokenization_sanity_check_mode: TokenizationSanityCheckMode,
    /// Tool-call syntax.
    pub format: ToolCallFormat,
    /// Repeat each multi-turn rollout this many times; null means once.
    #[schemars(range(min = 1))]
    pub num_repeat_rollouts: Option<i64>,
    /// verl 0.9+: a Python file whose `@function_tool` functions are tools too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_tool_path: Option<String>,
}

/// A user-provided asynchronous generation server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomAsyncServerConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Python file defining the server class.
    pub path: Option<String>,
    /// Class name inside that file.
    pub name: Option<String>,
}

/// The agent loop that drives generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentLoopConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Agent-loop worker processes.
    #[schemars(range(min = 1))]
    pub num_workers: i64,
    /// Registered agent loop used when a sample names none (e.g. `single_turn_agent`,
    /// `tool_agent`).
    pub default_agent_loop: String,
    /// YAML file registering extra agent loops.
    pub agent_loop_config_path: Option<String>,
    /// Custom generation server.
    pub custom_async_server: CustomAsyncServerConfig,
    /// Import path of a replacement agent-loop manager class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_loop_manager_class: Option<String>,
}

/// Tracing backend for rollouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TraceBackend {
    /// Weights & Biases Weave.
    #[serde(rename = "weave")]
    Weave,
    /// MLflow tracing.
    #[serde(rename = "mlflow")]
    Mlflow,
}

/// Tracing of individual rollouts (prompts, tool calls, responses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Tracing backend; null disables tracing.
    pub backend: Option<TraceBackend>,
    /// Decode token ids to text in the traces.
    pub token2text: bool,
    /// Traced samples per step and worker; null traces all.
    #[schemars(range(min = 0))]
    pub max_samples_per_step_per_worker: Option<i64>,
}

//! Multi-turn rollouts with tools (`rollout.multi_turn`, verl's `tool_agent` loop): the loop
//! ([`turns`]), the call formats ([`format`]: [`hermes`], [`qwen3_coder`]), how tool rounds become tokens
//! ([`context`], verl 0.9's continuous-token layout), the truncation of tool responses
//! ([`truncate`]) and the tools themselves, in a Python helper process ([`tools`]); the user's
//! own agent loops run in Python too, served by verlc's rollout ([`python_loops`]).

pub mod context;
pub mod format;
pub mod hermes;
pub mod python_loops;
pub mod qwen3_coder;
pub mod tools;
pub mod truncate;
pub mod turns;

pub use context::{ContextDelta, ContextError, ContextTokens};
pub use format::ToolCallFormat;
pub use hermes::{FunctionCall, ParsedTurn};
pub use truncate::TruncateSide;
pub use turns::{
    AgentError, Answer, GeneratedTurn, Immediate, ToolOutcome, ToolRunner, Trajectory,
    TurnGenerator, TurnLimits, UserReply, run, tool_failed, unknown_tool,
};

//! `rollout.multi_turn.format`: how a turn's calls are written, as verl's parser registry
//! names them.

use serde_json::Value;

use super::hermes::{self, ParsedTurn};
use super::qwen3_coder;

/// A tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCallFormat {
    /// JSON in `<tool_call>` blocks (Qwen2.5, Qwen3, Hermes; verl's default).
    #[default]
    Hermes,
    /// XML-style `<function=...><parameter=...>` in `<tool_call>` blocks (Qwen3-Coder,
    /// Qwen3.5).
    Qwen3Coder,
}

impl ToolCallFormat {
    /// The formats verlc parses, by verl's names.
    pub const NAMES: [&'static str; 2] = ["hermes", "qwen3_coder"];

    /// The format verl registers as `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" => Some(ToolCallFormat::Hermes),
            "qwen3_coder" => Some(ToolCallFormat::Qwen3Coder),
            _ => None,
        }
    }

    /// The calls in one turn's decoded text; `tools` are the offered schemas (the XML format
    /// types its parameters by them).
    pub fn parse(self, text: &str, tools: &[Value]) -> ParsedTurn {
        match self {
            ToolCallFormat::Hermes => hermes::parse(text),
            ToolCallFormat::Qwen3Coder => qwen3_coder::parse(text, tools),
        }
    }
}

//! The `hermes` tool-call format (`rollout.multi_turn.format: hermes`, verl's default parser):
//! calls are JSON objects `{"name": ..., "arguments": ...}` between `<tool_call>` and
//! `</tool_call>` in the decoded turn (special tokens kept).
//!
//! As verl 0.9's parser: every block is tried; a block whose JSON does not parse or lacks
//! `name`/`arguments` is skipped (no call), and the content left for the assistant message is
//! the text with every block removed, valid or not. Arguments are re-serialised the way
//! Python's `json.dumps(..., ensure_ascii=False)` writes them.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

use crate::tokenizer::chat::python_json;

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text (any JSON value; tools expect an object).
    pub arguments: String,
}

/// What a turn says: its text without the call blocks, and the calls in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedTurn {
    pub content: String,
    pub calls: Vec<FunctionCall>,
}

fn block() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // `(?s)`: a call may span lines; `.*?`: each block ends at its own closing tag.
    RE.get_or_init(|| Regex::new(r"(?s)<tool_call>(.*?)</tool_call>").expect("a valid pattern"))
}

/// Parses the decoded text of one assistant turn.
pub fn parse(text: &str) -> ParsedTurn {
    if !text.contains("<tool_call>") || !text.contains("</tool_call>") {
        return ParsedTurn {
            content: text.to_owned(),
            calls: Vec::new(),
        };
    }
    let calls = block()
        .captures_iter(text)
        .filter_map(|c| {
            let body: Value = serde_json::from_str(c.get(1)?.as_str()).ok()?;
            // A name that is not a string fails verl's FunctionCall model: no call.
            let name = body.get("name")?.as_str()?.to_owned();
            let arguments = python_json(body.get("arguments")?);
            Some(FunctionCall { name, arguments })
        })
        .collect();
    ParsedTurn {
        content: block().replace_all(text, "").into_owned(),
        calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_parsed_and_removed_from_the_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\":1,\"b\":[2, \"x\"]}}\n</tool_call>\n<tool_call>{bad json}</tool_call><tool_call>{\"name\": \"f\"}</tool_call><|im_end|>";
        let p = parse(text);
        assert_eq!(
            p.calls,
            vec![FunctionCall {
                name: "calc".into(),
                arguments: "{\"a\": 1, \"b\": [2, \"x\"]}".into()
            }]
        );
        assert_eq!(p.content, "Let me check.\n\n<|im_end|>");
    }

    #[test]
    fn text_without_both_tags_is_all_content() {
        let p = parse("no call <tool_call> here");
        assert!(p.calls.is_empty());
        assert_eq!(p.content, "no call <tool_call> here");
    }
}

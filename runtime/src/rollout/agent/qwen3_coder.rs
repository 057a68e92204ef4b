//! The `qwen3_coder` tool-call format (`rollout.multi_turn.format: qwen3_coder`: Qwen3-Coder
//! and Qwen3.5 chat templates): XML-style calls
//! `<tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>`.
//!
//! As verl 0.9's parser: nothing is a call unless the text has `<tool_call>`; a block may be
//! left open at the end of the turn (the model stopped inside it), and without any complete
//! or open block the whole text is searched for `<function=` sections. A parameter's value
//! loses one leading and one trailing newline and is converted by the type the tool's schema
//! gives it (string as is; integers, numbers, booleans, objects, Python-style literals; a
//! value that does not convert stays a string, `null` is null). A function without a `>`
//! after its name is skipped. The content is the text before the first `<tool_call>`.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::hermes::{FunctionCall, ParsedTurn};
use crate::tokenizer::chat::python_json;

fn tool_call() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?s)<tool_call>(.*?)</tool_call>|<tool_call>(.*?)$").expect("a valid pattern")
    })
}

fn function() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?s)<function=(.*?)</function>|<function=(.*)$").expect("a valid pattern")
    })
}

fn parameter() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?s)<parameter=(.*?)</parameter>|<parameter=(.*?)$").expect("a valid pattern")
    })
}

/// The first or second alternative's text of each match of `re` in `text`.
fn alternatives<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
    re.captures_iter(text)
        .filter_map(|c| c.get(1).or_else(|| c.get(2)).map(|m| m.as_str()))
        .collect()
}

/// Parses the decoded text of one assistant turn; `tools` are the OpenAI function schemas
/// offered (they give the parameters' types).
pub fn parse(text: &str, tools: &[Value]) -> ParsedTurn {
    let Some(start) = text.find("<tool_call>") else {
        return ParsedTurn {
            content: text.to_owned(),
            calls: Vec::new(),
        };
    };
    let mut blocks = alternatives(tool_call(), text);
    if blocks.is_empty() {
        blocks = vec![text];
    }
    let sections: Vec<&str> = blocks
        .iter()
        .flat_map(|b| alternatives(function(), b))
        .collect();
    if sections.is_empty() {
        return ParsedTurn {
            content: text.to_owned(),
            calls: Vec::new(),
        };
    }
    let calls = sections
        .iter()
        .filter_map(|s| parse_function(s, tools))
        .collect();
    ParsedTurn {
        content: text[..start].to_owned(),
        calls,
    }
}

/// `properties` of the schema of the function `name` (empty when it is not offered).
fn properties<'a>(tools: &'a [Value], name: &str) -> Option<&'a Map<String, Value>> {
    tools
        .iter()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
        .filter_map(|t| t.get("function"))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|f| f.get("parameters"))
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object)
}

fn parse_function(section: &str, tools: &[Value]) -> Option<FunctionCall> {
    let end = section.find('>')?;
    let name = &section[..end];
    let props = properties(tools, name);
    let mut args = Map::new();
    for m in alternatives(parameter(), &section[end + 1..]) {
        let Some(idx) = m.find('>') else { continue };
        let pname = &m[..idx];
        let mut value = &m[idx + 1..];
        value = value.strip_prefix('\n').unwrap_or(value);
        value = value.strip_suffix('\n').unwrap_or(value);
        args.insert(pname.to_owned(), convert(value, pname, props));
    }
    Some(FunctionCall {
        name: name.to_owned(),
        arguments: python_json(&Value::Object(args)),
    })
}

/// A parameter's value by its declared type.
fn convert(value: &str, name: &str, props: Option<&Map<String, Value>>) -> Value {
    if value.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let Some(decl) = props.and_then(|p| p.get(name)) else {
        return Value::String(value.to_owned());
    };
    let ty = decl
        .get("type")
        .map(|t| match t {
            Value::String(s) => s.trim().to_ascii_lowercase(),
            other => other.to_string().trim().to_ascii_lowercase(),
        })
        .unwrap_or_else(|| "string".into());
    let text = || Value::String(value.to_owned());
    if matches!(
        ty.as_str(),
        "string" | "str" | "text" | "varchar" | "char" | "enum"
    ) {
        return text();
    }
    if ["int", "uint", "long", "short", "unsigned"]
        .iter()
        .any(|p| ty.starts_with(p))
    {
        return python_int(value).map_or_else(text, Value::from);
    }
    if ty.starts_with("num") || ty.starts_with("float") {
        return python_float(value).map_or_else(text, |f| {
            // Whole numbers become integers (as verl's `int(x)` when the fraction is 0).
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                Value::from(f as i64)
            } else {
                serde_json::Number::from_f64(f).map_or_else(text, Value::Number)
            }
        });
    }
    if matches!(ty.as_str(), "boolean" | "bool" | "binary") {
        return Value::Bool(value.eq_ignore_ascii_case("true"));
    }
    if ty == "object" || ty.starts_with("dict") {
        // Any JSON value, as verl's `json.loads` takes it.
        if let Ok(v) = serde_json::from_str::<Value>(value) {
            return v;
        }
    }
    python_literal(value).unwrap_or_else(text)
}

/// Python's `int(s)`: optional sign, digits (underscores between digits), surrounding space.
fn python_int(s: &str) -> Option<i64> {
    let t = s.trim();
    let digits = t.trim_start_matches(['+', '-']);
    if digits.is_empty()
        || t.len() - digits.len() > 1
        || digits.starts_with('_')
        || digits.ends_with('_')
    {
        return None;
    }
    if !digits.chars().all(|c| c.is_ascii_digit() || c == '_') || digits.contains("__") {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// Python's `float(s)` for the finite forms a model writes (verl keeps `inf` and `nan` as
/// strings: its whole-number check `int(x)` fails on them).
fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let body = t.trim_start_matches(['+', '-']);
    if body.is_empty()
        || t.len() - body.len() > 1
        || !body
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-' | '_'))
    {
        return None;
    }
    t.replace('_', "")
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
}

/// `ast.literal_eval` for what JSON can hold: JSON itself, and Python's spelling of
/// `True`/`False`/`None` and single-quoted strings in lists and dicts.
fn python_literal(s: &str) -> Option<Value> {
    let t = s.trim();
    if let Ok(v) = serde_json::from_str::<Value>(t) {
        return Some(v);
    }
    let json = python_to_json(t)?;
    serde_json::from_str(&json).ok()
}

/// Rewrites a Python literal's quotes and constants into JSON (strings kept intact).
fn python_to_json(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                let quote = c;
                out.push('"');
                loop {
                    let ch = chars.next()?;
                    match ch {
                        '\\' => {
                            let esc = chars.next()?;
                            if esc == '\'' {
                                out.push('\'');
                            } else {
                                out.push('\\');
                                out.push(esc);
                            }
                        }
                        ch if ch == quote => break,
                        '"' => out.push_str("\\\""),
                        ch => out.push(ch),
                    }
                }
                out.push('"');
            }
            c if c.is_ascii_alphabetic() => {
                let mut word = String::from(c);
                while let Some(&n) = chars.peek() {
                    if n.is_ascii_alphanumeric() || n == '_' {
                        word.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(match word.as_str() {
                    "True" => "true",
                    "False" => "false",
                    "None" => "null",
                    _ => return None,
                });
            }
            '(' => out.push('['),
            ')' => out.push(']'),
            c => out.push(c),
        }
    }
    Some(out)
}

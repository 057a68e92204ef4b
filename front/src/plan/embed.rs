//! The resolved config as the YAML text a generated binary embeds and `--print-config`
//! prints.
//!
//! The text is block-style YAML that verlc's loader reads back to the same tree: strings that
//! would resolve to another type (or contain YAML syntax) are single-quoted, floats keep a
//! form OmegaConf reads as float, and literal `${` is escaped so nothing is interpolated
//! twice. The embedded file starts with `defaults: [_self_]`, so loading it composes nothing
//! else: the tree is exactly the one `verlc build` checked.

use crate::load::node::{Node, Scalar, Value};
use crate::load::yaml::resolve_plain;

/// Flow-style lists of scalars up to this width stay on one line.
const FLOW_WIDTH: usize = 72;

/// The resolved tree as YAML (no header).
pub fn to_yaml(root: &Node) -> String {
    let mut out = String::new();
    match &root.value {
        Value::Map(m) if !m.is_empty() => emit_map(m, 0, &mut out),
        _ => {
            out.push_str(&inline(root).unwrap_or_else(|| "{}".into()));
            out.push('\n');
        }
    }
    out
}

/// The embedded file: a comment header, `defaults: [_self_]`, then the tree.
pub fn embedded_file(root: &Node, header: &str) -> String {
    let mut out = String::new();
    for line in header.lines() {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("defaults: [_self_]\n\n");
    out.push_str(&to_yaml(root));
    out
}

fn emit_map(m: &crate::load::node::Map, indent: usize, out: &mut String) {
    for (k, e) in m {
        pad(indent, out);
        out.push_str(&key(k));
        out.push(':');
        emit_value(&e.node, indent, out);
    }
}

/// After `key:` or `-`: the value inline, or on the following lines.
fn emit_value(n: &Node, indent: usize, out: &mut String) {
    if let Some(s) = inline(n) {
        out.push(' ');
        out.push_str(&s);
        out.push('\n');
        return;
    }
    match &n.value {
        Value::Map(m) => {
            out.push('\n');
            emit_map(m, indent + 2, out);
        }
        Value::Seq(items) => {
            out.push('\n');
            for item in items {
                pad(indent + 2, out);
                out.push('-');
                match &item.value {
                    Value::Map(m) if !m.is_empty() => {
                        // `- k: v` with the rest of the map aligned under `k`.
                        let mut first = true;
                        for (k, e) in m.iter() {
                            if first {
                                out.push(' ');
                                first = false;
                            } else {
                                pad(indent + 4, out);
                            }
                            out.push_str(&key(k));
                            out.push(':');
                            emit_value(&e.node, indent + 4, out);
                        }
                    }
                    _ => emit_value(item, indent + 2, out),
                }
            }
        }
        Value::Scalar(_) => {}
    }
}

/// A one-line rendering: scalars, empty containers, short lists of scalars.
fn inline(n: &Node) -> Option<String> {
    match &n.value {
        Value::Scalar(s) => Some(scalar(s)),
        Value::Map(m) if m.is_empty() => Some("{}".into()),
        Value::Seq(items) if items.is_empty() => Some("[]".into()),
        Value::Seq(items) => {
            let parts: Option<Vec<String>> = items
                .iter()
                .map(|i| match &i.value {
                    Value::Scalar(s) => Some(flow_scalar(s)),
                    _ => None,
                })
                .collect();
            let s = format!("[{}]", parts?.join(", "));
            (s.len() <= FLOW_WIDTH).then_some(s)
        }
        Value::Map(_) => None,
    }
}

fn pad(n: usize, out: &mut String) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn key(k: &str) -> String {
    if plain_ok(k, false) {
        k.to_owned()
    } else {
        quote(k)
    }
}

fn scalar(s: &Scalar) -> String {
    match s {
        Scalar::Null => "null".into(),
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => float(*f),
        Scalar::Str(t) => string(t, false),
    }
}

fn flow_scalar(s: &Scalar) -> String {
    match s {
        Scalar::Str(t) => string(t, true),
        other => scalar(other),
    }
}

fn float(f: f64) -> String {
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            ".inf".into()
        } else {
            "-.inf".into()
        };
    }
    for candidate in [
        format!("{f:?}"),
        crate::load::node::format_float(f),
        format!("{f:e}"),
    ] {
        if matches!(resolve_plain(&candidate), Scalar::Float(g) if g == f) {
            return candidate;
        }
    }
    format!("{f:?}")
}

fn string(t: &str, in_flow: bool) -> String {
    // `${` was `\${` in the source: keep it literal when read back.
    let escaped = t.replace("${", "\\${");
    if escaped == t && plain_ok(t, in_flow) && matches!(resolve_plain(t), Scalar::Str(_)) {
        t.to_owned()
    } else if escaped.contains(['\n', '\r', '\t']) || escaped.chars().any(char::is_control) {
        serde_json::to_string(&escaped).unwrap_or_else(|_| quote(&escaped))
    } else {
        quote(&escaped)
    }
}

fn quote(t: &str) -> String {
    format!("'{}'", t.replace('\'', "''"))
}

/// Whether `t` can be written as a plain YAML scalar (ignoring type resolution).
fn plain_ok(t: &str, in_flow: bool) -> bool {
    let Some(first) = t.chars().next() else {
        return false;
    };
    if t.starts_with(' ') || t.ends_with(' ') {
        return false;
    }
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) {
        // `-x` and `:x`-style plain scalars are legal but easy to misread; quote them.
        return false;
    }
    if t.contains(": ") || t.contains(" #") || t.ends_with(':') || t.contains(['\n', '\r', '\t']) {
        return false;
    }
    if in_flow && t.contains([',', '[', ']', '{', '}']) {
        return false;
    }
    !t.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::yaml;
    use crate::source::{Source, SourceId, SourceKind};

    /// Parse and resolve interpolations, as loading a config does.
    fn parse(text: &str) -> Node {
        let src = Source::new("t.yaml", text, SourceKind::File);
        let mut n = match yaml::parse(&src, SourceId(0)) {
            Ok(n) => n,
            Err(d) => panic!("{text}\n{d:?}"),
        };
        let diags = crate::load::interp::resolve_all(&mut n);
        assert!(diags.is_empty(), "{diags:?}");
        n
    }

    #[test]
    fn awkward_scalars_round_trip() {
        let text = r#"
a: 'true'
b: '1e-5'
c: ''
d: 'null'
e: 3.0e-4
f: 1.0e-20
g: 'x: y'
h: '#hash'
i: [1, 'two', 'a,b', null]
j: {}
k: []
l: -3
m: 'it''s'
n: "line\nbreak"
o: '~'
p: .inf
q: '\${not.interp}'
r:
  - name: a
    value: [1, 2]
  - plain
  - - nested
s: 'yes'
t: '0755'
"#;
        let tree = parse(text);
        let emitted = to_yaml(&tree);
        let back = parse(&emitted);
        assert_eq!(tree.to_json(), back.to_json(), "emitted:\n{emitted}");
    }
}

//! YAML text -> [`Node`] with spans, read the way OmegaConf reads it: YAML 1.1 scalars
//! (PyYAML's SafeLoader: `yes`/`off` are booleans, `0o17`-style octal, `1_000` ints) plus
//! OmegaConf's float rule (`1e-6` is a float), no timestamps, duplicate keys rejected,
//! anchors, aliases and `<<` merge keys expanded.
//!
//! Hostile input is bounded: nesting deeper than [`MAX_DEPTH`] and alias expansion past
//! [`MAX_NODES`] are errors, so an alias bomb cannot exhaust memory.

use indexmap::IndexMap;
use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use super::node::{Entry, Map, Node, Scalar, Value};
use crate::codes;
use crate::diag::Diagnostic;
use crate::source::{Origin, Source, SourceId};

pub const MAX_DEPTH: usize = 64;
/// Upper bound on nodes in one document after alias expansion.
pub const MAX_NODES: usize = 1_000_000;

/// Parse one YAML document. An empty document is an empty map, as in OmegaConf.
pub fn parse(source: &Source, id: SourceId) -> Result<Node, Diagnostic> {
    if let Some(d) = unacceptable_char(source, id) {
        return Err(d);
    }
    // ASCII text (verl's files are) has none: the check costs a byte scan, not a char search.
    let yaml11_breaks = !source.text.is_ascii() && source.text.contains(YAML11_BREAKS);
    if !yaml11_breaks && let Some(n) = super::yaml_block::parse(&source.text, id) {
        return Ok(n);
    }
    let mut b = Builder::new(source, id);
    let node = b.run()?;
    if yaml11_breaks {
        b.check_yaml11_breaks()?;
    }
    Ok(node)
}

/// [`parse`] with the general YAML parser only.
#[cfg(test)]
fn parse_general(source: &Source, id: SourceId) -> Result<Node, Diagnostic> {
    let mut b = Builder::new(source, id);
    b.run()
}

/// The end of the character that starts at byte `at` (a one-character span).
pub(crate) fn next_boundary(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text[at..].chars().next().map_or(at, |c| at + c.len_utf8())
}

/// Characters PyYAML reads as line breaks and YAML 1.2 (saphyr) does not: NEL, LS, PS.
const YAML11_BREAKS: [char; 3] = ['\u{85}', '\u{2028}', '\u{2029}'];

/// PyYAML's reader refuses any character outside YAML's printable set, wherever it is
/// (comments and quoted strings too); OmegaConf then fails to load the file.
fn is_printable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

/// Whether every byte is printable ASCII or a tab/line break: whole chunks at a time (no early
/// exit inside one), which the compiler vectorizes.
fn all_printable_ascii(text: &[u8]) -> bool {
    text.chunks(64).all(|chunk| {
        chunk.iter().fold(true, |ok, &b| {
            ok & ((0x20..0x7f).contains(&b) | (b == b'\t') | (b == b'\n') | (b == b'\r'))
        })
    })
}

fn unacceptable_char(source: &Source, id: SourceId) -> Option<Diagnostic> {
    let text: &str = &source.text;
    if all_printable_ascii(text.as_bytes()) {
        return None;
    }
    let at = if text.is_ascii() {
        text.bytes().position(|b| !is_printable(b as char))?
    } else {
        text.char_indices().find(|(_, c)| !is_printable(*c))?.0
    };
    let c = text[at..].chars().next()?;
    Some(
        Diagnostic::error(
            codes::YAML_SYNTAX,
            format!(
                "unacceptable character #x{:04x} in {}: special characters are not allowed",
                c as u32, source.name
            ),
        )
        .with_primary(
            Some(Origin::new(id, at..at + c.len_utf8())),
            "not a printable character",
        )
        .with_help("OmegaConf (PyYAML) refuses the whole file; write it as an escape in a double-quoted string (`\"\\x00\"`)"),
    )
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    source: &'a Source,
    id: SourceId,
    /// Byte offset of each char, only for non-ASCII text (saphyr counts chars).
    char_bytes: Option<Vec<usize>>,
    anchors: IndexMap<usize, (Node, usize)>,
    nodes: usize,
    /// Byte spans of quoted scalars, where PyYAML keeps NEL/LS/PS as characters.
    quoted: Vec<std::ops::Range<usize>>,
}

impl<'a> Builder<'a> {
    fn new(source: &'a Source, id: SourceId) -> Self {
        let text: &'a str = &source.text;
        let char_bytes = (!text.is_ascii()).then(|| {
            let mut v: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
            v.push(text.len());
            v
        });
        Builder {
            parser: Parser::new_from_str(text),
            source,
            id,
            char_bytes,
            anchors: IndexMap::default(),
            nodes: 0,
            quoted: Vec::new(),
        }
    }

    /// A NEL/LS/PS outside a quoted string ends the line for PyYAML but not for saphyr: the
    /// two would read different configs, so it is refused.
    fn check_yaml11_breaks(&self) -> Result<(), Diagnostic> {
        let text: &str = &self.source.text;
        for (at, c) in text.match_indices(YAML11_BREAKS) {
            if self.quoted.iter().any(|q| q.start <= at && at < q.end) {
                continue;
            }
            let ch = c.chars().next().map_or(0, |c| c as u32);
            return Err(Diagnostic::error(
                codes::YAML_SYNTAX,
                format!(
                    "U+{ch:04X} outside a quoted string in {}: OmegaConf (PyYAML, YAML 1.1) reads it as a line break",
                    self.source.name
                ),
            )
            .with_primary(Some(Origin::new(self.id, at..at + c.len())), "a line break to OmegaConf")
            .with_help("end the line with a newline, or put the character inside a quoted string"));
        }
        Ok(())
    }

    fn byte(&self, char_index: usize) -> usize {
        match &self.char_bytes {
            Some(v) => v.get(char_index).copied().unwrap_or(self.source.text.len()),
            None => char_index.min(self.source.text.len()),
        }
    }

    fn origin(&self, span: Span) -> Origin {
        let start = self.byte(span.start.index());
        let end = self.byte(span.end.index()).max(start);
        Origin::new(self.id, start..end)
    }

    fn point(&self, span: Span) -> Origin {
        let start = self.byte(span.start.index());
        Origin::new(self.id, start..next_boundary(&self.source.text, start))
    }

    fn err(&self, origin: Origin, code: crate::diag::Code, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::error(code, msg).with_primary(Some(origin), "here")
    }

    fn next(&mut self) -> Result<(Event<'a>, Span), Diagnostic> {
        match self.parser.next_event() {
            Some(Ok(ev)) => Ok(ev),
            Some(Err(e)) => {
                let m = e.marker();
                let at = self.byte(m.index());
                let end = next_boundary(&self.source.text, at);
                Err(Diagnostic::error(
                    codes::YAML_SYNTAX,
                    format!("invalid YAML in {}: {}", self.source.name, e.info()),
                )
                .with_primary(Some(Origin::new(self.id, at..end)), e.info().to_string()))
            }
            None => Err(Diagnostic::error(
                codes::YAML_SYNTAX,
                format!("unexpected end of YAML in {}", self.source.name),
            )),
        }
    }

    fn run(&mut self) -> Result<Node, Diagnostic> {
        let mut doc: Option<Node> = None;
        loop {
            let (ev, span) = self.next()?;
            match ev {
                Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
                Event::StreamEnd => break,
                Event::DocumentStart(_) => {
                    if doc.is_some() {
                        return Err(self.err(
                            self.point(span),
                            codes::YAML_UNSUPPORTED,
                            format!("{} holds more than one YAML document; a config file must hold exactly one", self.source.name),
                        ));
                    }
                    let (ev, span) = self.next()?;
                    if matches!(ev, Event::DocumentEnd) {
                        doc = Some(Node::empty_map(Some(self.point(span))));
                    } else {
                        doc = Some(self.node(ev, span, 0)?);
                    }
                }
                _ => doc = Some(self.node(ev, span, 0)?),
            }
        }
        let doc = doc.unwrap_or_else(|| Node::empty_map(None));
        match doc.value {
            Value::Map(_) => Ok(doc),
            Value::Scalar(Scalar::Null) => Ok(Node::empty_map(doc.origin)),
            _ => Err(self.err(
                doc.origin.clone().unwrap_or(Origin::new(self.id, 0..0)),
                codes::YAML_UNSUPPORTED,
                format!(
                    "{} must hold a mapping (key: value pairs) at the top level",
                    self.source.name
                ),
            )),
        }
    }

    fn count(&mut self, n: usize, span: Span) -> Result<(), Diagnostic> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            return Err(self.err(
                self.point(span),
                codes::YAML_LIMIT,
                format!(
                    "{} has more than {MAX_NODES} values (aliases counted as often as they are used)",
                    self.source.name
                ),
            ));
        }
        Ok(())
    }

    fn node(&mut self, ev: Event<'a>, span: Span, depth: usize) -> Result<Node, Diagnostic> {
        if depth > MAX_DEPTH {
            return Err(self.err(
                self.point(span),
                codes::YAML_LIMIT,
                format!("{} nests deeper than {MAX_DEPTH} levels", self.source.name),
            ));
        }
        let before = self.nodes;
        let (node, anchor) = match ev {
            Event::Scalar(text, style, anchor, tag) => {
                self.count(1, span)?;
                let origin = self.origin(span);
                if style != ScalarStyle::Plain {
                    self.quoted.push(origin.span.clone());
                }
                let scalar = match tag {
                    Some(t) if t.handle == "tag:yaml.org,2002:" || t.handle == "!!" => {
                        match t.suffix.as_str() {
                            "str" => Scalar::Str(text.to_string()),
                            "null" => Scalar::Null,
                            "bool" | "int" | "float" => resolve_plain(&text),
                            other => {
                                return Err(self.err(
                                    origin,
                                    codes::YAML_UNSUPPORTED,
                                    format!("unsupported YAML tag `!!{other}`"),
                                ));
                            }
                        }
                    }
                    Some(t) => {
                        return Err(self.err(
                            origin,
                            codes::YAML_UNSUPPORTED,
                            format!(
                                "unsupported YAML tag `{}{}`: OmegaConf cannot construct it",
                                t.handle, t.suffix
                            ),
                        ));
                    }
                    None if style == ScalarStyle::Plain => resolve_plain(&text),
                    None => Scalar::Str(text.to_string()),
                };
                (Node::scalar(scalar, Some(origin)), anchor)
            }
            Event::SequenceStart(anchor, _) => {
                self.count(1, span)?;
                let mut items = Vec::new();
                loop {
                    let (ev, sp) = self.next()?;
                    if matches!(ev, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(ev, sp, depth + 1)?);
                }
                (Node::new(Value::Seq(items), Some(self.point(span))), anchor)
            }
            Event::MappingStart(anchor, _) => {
                self.count(1, span)?;
                (self.mapping(span, depth)?, anchor)
            }
            Event::Alias(id) => {
                let Some((node, size)) = self.anchors.get(&id).cloned() else {
                    return Err(self.err(
                        self.origin(span),
                        codes::YAML_SYNTAX,
                        "alias to an unknown anchor",
                    ));
                };
                self.count(size, span)?;
                let mut node = node;
                node.via = Some(Box::new(self.origin(span)));
                return Ok(node);
            }
            _ => {
                return Err(self.err(
                    self.point(span),
                    codes::YAML_SYNTAX,
                    "unexpected YAML event",
                ));
            }
        };
        if anchor != 0 {
            let size = self.nodes - before;
            self.anchors.insert(anchor, (node.clone(), size));
        }
        Ok(node)
    }

    fn mapping(&mut self, start: Span, depth: usize) -> Result<Node, Diagnostic> {
        let mut map = Map::default();
        // Keys brought in by `<<`; explicit keys always win over them.
        let mut merged: Vec<(String, Entry)> = Vec::new();
        loop {
            let (ev, kspan) = self.next()?;
            if matches!(ev, Event::MappingEnd) {
                break;
            }
            let key_origin = self.origin(kspan);
            let key_is_alias = matches!(ev, Event::Alias(_));
            let (key, is_merge) = match &ev {
                Event::Scalar(text, style, _, _) => {
                    let merge = *style == ScalarStyle::Plain && text == "<<";
                    let key = match (style, resolve_plain(text)) {
                        (ScalarStyle::Plain, Scalar::Null) => {
                            return Err(self.err(
                                key_origin,
                                codes::YAML_UNSUPPORTED,
                                "a null key is not allowed in a config",
                            ));
                        }
                        (ScalarStyle::Plain, s) => s.to_string(),
                        _ => text.to_string(),
                    };
                    (key, merge)
                }
                Event::Alias(_) => {
                    let n = self.node(ev.clone(), kspan, depth + 1)?;
                    match n.value {
                        Value::Scalar(Scalar::Null) | Value::Map(_) | Value::Seq(_) => {
                            return Err(self.err(
                                key_origin,
                                codes::YAML_UNSUPPORTED,
                                "config keys must be scalars",
                            ));
                        }
                        Value::Scalar(s) => (s.to_string(), false),
                    }
                }
                _ => {
                    return Err(self.err(
                        key_origin,
                        codes::YAML_UNSUPPORTED,
                        "config keys must be scalars (strings or numbers)",
                    ));
                }
            };
            if !key_is_alias {
                self.count(1, kspan)?;
            }
            let (vev, vspan) = self.next()?;
            let value = self.node(vev, vspan, depth + 1)?;
            if is_merge {
                let sources: Vec<Node> = match value.value {
                    Value::Map(_) => vec![value],
                    Value::Seq(items) => items,
                    _ => {
                        return Err(self.err(
                            key_origin,
                            codes::YAML_SYNTAX,
                            "`<<` must be followed by a mapping or a list of mappings",
                        ));
                    }
                };
                for src in sources {
                    let Value::Map(m) = src.value else {
                        return Err(self.err(
                            key_origin,
                            codes::YAML_SYNTAX,
                            "`<<` can only merge mappings",
                        ));
                    };
                    for (k, e) in *m {
                        if !merged.iter().any(|(mk, _)| *mk == k) {
                            merged.push((k, e));
                        }
                    }
                }
                continue;
            }
            if let Some(prev) = map.get(&key) {
                let d =
                    Diagnostic::error(codes::YAML_DUPLICATE_KEY, format!("duplicate key `{key}`"))
                        .with_primary(Some(key_origin), "written again here")
                        .with_secondary(prev.key_origin.clone(), "first written here")
                        .with_help("OmegaConf rejects duplicate keys; keep one of them");
                return Err(d);
            }
            map.insert(
                key,
                Entry {
                    key_origin: Some(key_origin),
                    node: value,
                },
            );
        }
        if !merged.is_empty() {
            let mut out = Map::default();
            for (k, e) in merged {
                if !map.contains_key(&k) {
                    out.insert(k, e);
                }
            }
            // Explicit keys keep their written order after the merged ones.
            for (k, e) in map {
                out.insert(k, e);
            }
            map = out;
        }
        Ok(Node::new(
            Value::Map(Box::new(map)),
            Some(self.point(start)),
        ))
    }
}

/// Resolve an untagged plain scalar the way OmegaConf's YAML loader does.
pub fn resolve_plain(s: &str) -> Scalar {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Scalar::Bool(true);
        }
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Scalar::Bool(false);
        }
        _ => {}
    }
    if let Some(f) = yaml11_float(s) {
        return Scalar::Float(f);
    }
    if let Some(i) = yaml11_int(s) {
        return Scalar::Int(i);
    }
    Scalar::Str(s.to_string())
}

fn split_sign(s: &str) -> (bool, &str) {
    match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    }
}

fn digits_us(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c == '_' || c.is_digit(radix))
}

/// YAML 1.1 int: decimal, 0b binary, 0 octal, 0x hex, base-60 (`1:30`), underscores allowed.
fn yaml11_int(s: &str) -> Option<i64> {
    let (neg, body) = split_sign(s);
    let parse = |digits: &str, radix: u32| -> Option<i64> {
        let clean: String = digits.chars().filter(|c| *c != '_').collect();
        if clean.is_empty() {
            return None;
        }
        let v = i128::from_str_radix(&clean, radix).ok()?;
        let v = if neg { -v } else { v };
        i64::try_from(v).ok()
    };
    if let Some(b) = body.strip_prefix("0b") {
        return if digits_us(b, 2) { parse(b, 2) } else { None };
    }
    if let Some(h) = body.strip_prefix("0x") {
        return if digits_us(h, 16) { parse(h, 16) } else { None };
    }
    if body == "0" {
        return Some(0);
    }
    if let Some(o) = body.strip_prefix('0') {
        return if digits_us(o, 8) { parse(o, 8) } else { None };
    }
    let first = body.chars().next()?;
    if !('1'..='9').contains(&first) {
        return None;
    }
    if body.contains(':') {
        let mut parts = body.split(':');
        let head = parts.next()?;
        if !digits_us(head, 10) {
            return None;
        }
        let mut v: i128 = head.replace('_', "").parse().ok()?;
        for p in parts {
            if !sexagesimal_part(p) {
                return None;
            }
            v = v.checked_mul(60)?.checked_add(p.parse::<i128>().ok()?)?;
        }
        let v = if neg { -v } else { v };
        return i64::try_from(v).ok();
    }
    if digits_us(body, 10) {
        parse(body, 10)
    } else {
        None
    }
}

fn sexagesimal_part(p: &str) -> bool {
    let b = p.as_bytes();
    match b.len() {
        1 => b[0].is_ascii_digit(),
        2 => (b'0'..=b'5').contains(&b[0]) && b[1].is_ascii_digit(),
        _ => false,
    }
}

/// PyYAML's float rule plus OmegaConf's addition (exponent without a dot, optional sign).
fn yaml11_float(s: &str) -> Option<f64> {
    let (neg, body) = split_sign(s);
    let signed = |v: f64| if neg { -v } else { v };
    match body {
        ".inf" | ".Inf" | ".INF" => return Some(signed(f64::INFINITY)),
        ".nan" | ".NaN" | ".NAN" if s == body => return Some(f64::NAN),
        _ => {}
    }
    // mantissa [exponent]
    let (mant, exp) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    if let Some(e) = exp {
        let (_, ed) = split_sign(e);
        if ed.is_empty() || !ed.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
    }
    let ok = if let Some(dot) = mant.find('.') {
        let (int, frac) = (&mant[..dot], &mant[dot + 1..]);
        let frac_ok = frac.chars().all(|c| c == '_' || c.is_ascii_digit());
        if int.is_empty() {
            // `.5`: PyYAML requires a signed exponent here; a leading sign is not allowed.
            s == body
                && !frac.is_empty()
                && frac_ok
                && exp.is_none_or(|e| e.starts_with(['+', '-']))
        } else if int.contains(':') {
            exp.is_none() && frac_ok && {
                let mut parts = int.split(':');
                let head = parts.next().unwrap_or("");
                head.starts_with(|c: char| c.is_ascii_digit())
                    && digits_us(head, 10)
                    && parts.all(sexagesimal_part)
            }
        } else {
            int.starts_with(|c: char| c.is_ascii_digit()) && digits_us(int, 10) && frac_ok
        }
    } else {
        // No dot: only OmegaConf's `1e-6` form.
        exp.is_some() && mant.starts_with(|c: char| c.is_ascii_digit()) && digits_us(mant, 10)
    };
    if !ok {
        return None;
    }
    if mant.contains(':') {
        let mut v = 0.0f64;
        let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
        for p in int.split(':') {
            v = v * 60.0 + p.replace('_', "").parse::<f64>().ok()?;
        }
        let frac: String = frac.chars().filter(|c| *c != '_').collect();
        if !frac.is_empty() {
            v += format!("0.{frac}").parse::<f64>().ok()?;
        }
        return Some(signed(v));
    }
    let clean: String = body.chars().filter(|c| *c != '_').collect();
    let clean = if clean.ends_with('.') {
        format!("{clean}0")
    } else {
        clean
    };
    let clean = clean.replace(".e", ".0e").replace(".E", ".0E");
    clean.parse::<f64>().ok().map(signed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceKind;

    /// Every YAML file of the repository (and verl's installed tree, when the venv has it).
    fn repository_yaml() -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            entries.sort();
            for p in entries {
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml")
                    && let Ok(text) = std::fs::read_to_string(&p)
                {
                    out.push((p.display().to_string(), text));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        for d in [
            "defaults",
            "../examples",
            "../tests/fixtures",
            "../.venv/lib/python3.11/site-packages/verl/trainer/config",
        ] {
            walk(&root.join(d), &mut out);
        }
        out
    }

    /// Where the block reader accepts a text, the general parser gives the same tree, spans
    /// included.
    fn assert_agree(name: &str, text: &str) -> bool {
        let src = Source::new(name, text, SourceKind::File);
        let Some(fast) = crate::load::yaml_block::parse(text, SourceId(0)) else {
            return false;
        };
        match parse_general(&src, SourceId(0)) {
            Ok(general) => {
                if fast != general {
                    let (a, b) = (format!("{fast:?}"), format!("{general:?}"));
                    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
                    let from = at.saturating_sub(300);
                    panic!(
                        "{name}: the block reader differs\n fast:    …{}\n general: …{}\n{text}",
                        &a[from..(at + 100).min(a.len())],
                        &b[from..(at + 100).min(b.len())]
                    );
                }
            }
            Err(d) => panic!(
                "{name}: the block reader accepts what YAML rejects ({}):\n{text}",
                d.message
            ),
        }
        true
    }

    #[test]
    fn block_reader_agrees_with_the_general_parser() {
        let files = repository_yaml();
        assert!(files.len() > 50, "only {} YAML files found", files.len());
        for (name, text) in &files {
            assert_agree(name, text);
        }
        // verlc's own defaults must take the fast path, or `verlc check` pays for it.
        for (name, text) in BUILTIN_FILES_FOR_TEST.iter() {
            assert!(assert_agree(name, text), "{name} needs the general parser");
        }
        // Edits of the built-in files: each content line gets a few of these.
        let values = [
            "'single ''quoted'''",
            "\"double\"",
            "\"esc\\n\"",
            "[a, 'b', 3, -1.5e-3]",
            "[]",
            "{}",
            "{a: 1}",
            "",
            "null",
            "~",
            "-7",
            "x: y",
            "[a, [b]]",
            "&anchor v",
            "*alias",
            "!!str 5",
            "| block",
            "foo # comment",
            "foo#bar",
            "'open",
            "a, b",
            "${oc.select:a,b}",
            ": x",
            "- item",
            "yes",
            "0o17",
            "1_000",
            "0x1F",
            "[a,b]",
            "[ a , b ]",
            "[a, ]",
            "'a' # c",
            "\"a\"x",
            "[x] y",
            "- ",
            "?",
            "-",
            "@at",
            "%pct",
            "`tick`",
            ".inf",
        ];
        let mut accepted = 0;
        let mut tried = 0;
        for (name, text) in BUILTIN_FILES_FOR_TEST.iter() {
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let mut variants = Vec::new();
                if let Some((k, _)) = line.split_once(": ") {
                    for j in 0..4 {
                        variants.push(format!("{k}: {}", values[(i * 4 + j) % values.len()]));
                    }
                }
                if let Some(k) = line.strip_suffix(':') {
                    variants.push(format!("{k}:  # note"));
                    variants.push(format!("{k}: {}", values[i % values.len()]));
                }
                variants.push(format!("{line}  # note"));
                variants.push(format!("  {line}"));
                variants.push(format!("{line}\n"));
                variants.push(String::new());
                for v in variants {
                    let mut edited = lines.clone();
                    edited[i] = &v;
                    let edited = edited.join("\n");
                    tried += 1;
                    if assert_agree(name, &edited) {
                        accepted += 1;
                    }
                }
            }
        }
        assert!(
            accepted * 3 > tried,
            "the block reader took only {accepted} of {tried} edits"
        );
    }

    const BUILTIN_FILES_FOR_TEST: &[(&str, &str)] = crate::config::BUILTIN_FILES;

    fn load(text: &str) -> Result<Node, Diagnostic> {
        let src = Source::new("t.yaml", text, SourceKind::File);
        parse(&src, SourceId(0))
    }

    #[test]
    fn scalars_follow_omegaconf() {
        assert_eq!(resolve_plain("1e-6"), Scalar::Float(1e-6));
        assert_eq!(resolve_plain("1.0e-06"), Scalar::Float(1e-6));
        assert_eq!(resolve_plain("100_000"), Scalar::Int(100000));
        assert_eq!(resolve_plain("0x1F"), Scalar::Int(31));
        assert_eq!(resolve_plain("017"), Scalar::Int(15));
        assert_eq!(resolve_plain("1:30"), Scalar::Int(90));
        assert_eq!(resolve_plain("off"), Scalar::Bool(false));
        assert_eq!(resolve_plain("~"), Scalar::Null);
        assert_eq!(resolve_plain("-.inf"), Scalar::Float(f64::NEG_INFINITY));
        assert_eq!(resolve_plain("1."), Scalar::Float(1.0));
        assert_eq!(
            resolve_plain("2001-12-14"),
            Scalar::Str("2001-12-14".into())
        );
        assert_eq!(resolve_plain("1e"), Scalar::Str("1e".into()));
        assert_eq!(
            resolve_plain("token-mean"),
            Scalar::Str("token-mean".into())
        );
        assert_eq!(
            resolve_plain("99999999999999999999"),
            Scalar::Str("99999999999999999999".into())
        );
    }

    #[test]
    fn merge_keys_and_aliases_expand() {
        let n = load("base: &b\n  lr: 1\n  kind: adamw\nactor:\n  <<: *b\n  lr: 2\ncritic: *b\n")
            .unwrap();
        assert_eq!(
            n.get_path(&["actor", "lr"]).unwrap().value,
            Value::Scalar(Scalar::Int(2))
        );
        assert_eq!(
            n.get_path(&["actor", "kind"]).unwrap().as_str(),
            Some("adamw")
        );
        assert_eq!(
            n.get_path(&["critic", "lr"]).unwrap().value,
            Value::Scalar(Scalar::Int(1))
        );
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let e = load("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e.code, codes::YAML_DUPLICATE_KEY);
    }

    #[test]
    fn alias_bomb_is_bounded() {
        let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            y.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n", p = i - 1));
        }
        let e = load(&y).unwrap_err();
        assert_eq!(e.code, codes::YAML_LIMIT);
    }

    #[test]
    fn deep_nesting_is_bounded() {
        // Flow nesting: the parser's own limit or ours, an error either way.
        let y = format!("a: {}1{}\n", "[".repeat(5000), "]".repeat(5000));
        let e = load(&y).unwrap_err();
        assert!(
            e.code == codes::YAML_LIMIT || e.code == codes::YAML_SYNTAX,
            "{e:?}"
        );
        // Block nesting is only bounded by us.
        let y: String = (0..300)
            .map(|i| format!("{}k:\n", "  ".repeat(i)))
            .collect();
        assert_eq!(load(&y).unwrap_err().code, codes::YAML_LIMIT);
    }

    #[test]
    fn empty_document_is_empty_map() {
        assert_eq!(load("").unwrap().as_map().map(|m| m.len()), Some(0));
        assert_eq!(
            load("# only a comment\n")
                .unwrap()
                .as_map()
                .map(|m| m.len()),
            Some(0)
        );
    }
}

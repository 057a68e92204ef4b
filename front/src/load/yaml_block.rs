//! A fast reader for the plain block-style YAML that config files are written in.
//!
//! verl's config files (and verlc's own) use a small part of YAML: block mappings and
//! sequences indented with spaces, one-line plain or quoted scalars, one-line flow lists
//! and `{}`, and comments. Reading those line by line is several times faster than a general
//! YAML parser, and parsing YAML was most of `verlc check`'s time. Anything outside that part
//! (anchors, tags, block scalars, multi-line scalars or flow collections, escapes, tabs,
//! several documents, odd indentation, duplicate keys) returns `None`, and the caller reads
//! the file with the general parser instead, which also reports the errors.
//!
//! The result must equal the general parser's to the byte, spans included:
//! `yaml::tests::block_reader_agrees_with_the_general_parser` checks that on every YAML file
//! of the repository and on edits of them.

use super::node::{Entry, Map, Node, Scalar, Value};
use super::yaml::{MAX_DEPTH, MAX_NODES, resolve_plain};
use crate::source::{Origin, SourceId};

/// The tree of `text`, or `None` when it uses YAML beyond the plain block style.
pub fn parse(text: &str, id: SourceId) -> Option<Node> {
    if memchr::memchr2(b'\t', b'\r', text.as_bytes()).is_some() {
        return None;
    }
    let lines = content_lines(text)?;
    if lines.is_empty() || lines[0].indent != 0 {
        return None;
    }
    let mut r = Reader {
        text,
        bytes: text.as_bytes(),
        id,
        lines,
        pos: 0,
        nodes: std::cell::Cell::new(0),
    };
    let first = r.lines[0].content;
    if r.starts_item(first) {
        return None;
    }
    let root = r.mapping(0, first, 0)?;
    // Past the node bound the general parser reports it (Y004) at its place.
    (r.pos == r.lines.len() && !r.over_limit()).then_some(root)
}

/// A line with something besides spaces and a comment.
#[derive(Clone, Copy)]
struct Line {
    indent: usize,
    /// Byte offset of the first non-space character.
    content: usize,
    /// Byte offset of the line's end (its `\n`, or the text's end).
    end: usize,
}

fn content_lines(text: &str) -> Option<Vec<Line>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        let end = memchr_newline(bytes, start);
        let indent = bytes[start..end].iter().take_while(|b| **b == b' ').count();
        let content = start + indent;
        if content < end && bytes[content] != b'#' {
            // Document markers and directives belong to the general parser.
            let line = &text[content..end];
            if indent == 0
                && (line.starts_with('%') || line.starts_with("---") || line.starts_with("..."))
            {
                return None;
            }
            out.push(Line {
                indent,
                content,
                end,
            });
        }
        start = end + 1;
    }
    Some(out)
}

fn memchr_newline(bytes: &[u8], from: usize) -> usize {
    memchr::memchr(b'\n', &bytes[from..]).map_or(bytes.len(), |p| from + p)
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    id: SourceId,
    lines: Vec<Line>,
    pos: usize,
    /// Nodes made so far (every node gets an origin): bounded by [`MAX_NODES`].
    nodes: std::cell::Cell<usize>,
}

impl Reader<'_> {
    fn origin(&self, start: usize, end: usize) -> Option<Origin> {
        self.nodes.set(self.nodes.get() + 1);
        Some(Origin::new(self.id, start..end))
    }

    fn over_limit(&self) -> bool {
        self.nodes.get() > MAX_NODES
    }

    fn point(&self, at: usize) -> Option<Origin> {
        self.origin(at, super::yaml::next_boundary(self.text, at))
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.bytes.get(at).copied()
    }

    /// `-` followed by a space or the line's end: a block sequence item.
    fn starts_item(&self, at: usize) -> bool {
        self.byte(at) == Some(b'-') && matches!(self.byte(at + 1), None | Some(b' ' | b'\n'))
    }

    /// Whether the line holds nothing but spaces and a comment from `from` to `end`.
    fn rest_is_blank(&self, from: usize, end: usize) -> bool {
        let mut i = from;
        while i < end && self.bytes[i] == b' ' {
            i += 1;
        }
        i == end || (self.bytes[i] == b'#' && (i == 0 || self.bytes[i - 1] == b' '))
    }

    /// The node starting on the current line at column `indent`.
    fn block(&mut self, indent: usize, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        let line = self.lines[self.pos];
        if line.indent != indent {
            return None;
        }
        if self.starts_item(line.content) {
            self.sequence(indent, depth, false)
        } else {
            self.mapping(indent, line.content, depth)
        }
    }

    /// A block mapping whose keys sit at column `col`; the first key starts at `first` on
    /// the current line (after `- ` for a mapping inside a sequence item).
    fn mapping(&mut self, col: usize, first: usize, depth: usize) -> Option<Node> {
        if self.over_limit() {
            return None;
        }
        if depth > MAX_DEPTH {
            return None;
        }
        let mut map = Map::default();
        let mut at = first;
        loop {
            let line = self.lines[self.pos];
            let colon = self.key(at, line.end)?;
            let key_text = &self.text[at..colon];
            let key_scalar = resolve_plain(key_text);
            if key_text == "<<" || key_scalar == Scalar::Null {
                return None;
            }
            let key_name = key_scalar.to_string();
            if map.contains_key(&key_name) {
                return None;
            }
            let key_origin = self.origin(at, colon);
            let value = if self.rest_is_blank(colon + 1, line.end) {
                self.pos += 1;
                match self.lines.get(self.pos).copied() {
                    Some(next) if next.indent > col => self.block(next.indent, depth + 1)?,
                    Some(next) if next.indent == col && self.starts_item(next.content) => {
                        self.sequence(col, depth + 1, true)?
                    }
                    _ => Node::scalar(Scalar::Null, self.origin(colon, colon)),
                }
            } else {
                let v = self.skip_spaces(colon + 1);
                let node = self.inline(v, line.end)?;
                self.pos += 1;
                // A more indented line here continues a multi-line scalar.
                if self.lines.get(self.pos).is_some_and(|n| n.indent > col) {
                    return None;
                }
                node
            };
            map.insert(
                key_name,
                Entry {
                    key_origin,
                    node: value,
                },
            );
            match self.lines.get(self.pos) {
                Some(next) if next.indent == col && !self.starts_item(next.content) => {
                    at = next.content;
                }
                Some(next) if next.indent > col => return None,
                _ => break,
            }
        }
        Some(Node::new(Value::Map(Box::new(map)), self.point(first)))
    }

    /// A block sequence whose `-` sit at column `col`. Its span starts at the first `-`, or
    /// at the first item when the list is not indented under its key (as YAML's own
    /// parser reports it).
    fn sequence(&mut self, col: usize, depth: usize, indentless: bool) -> Option<Node> {
        if self.over_limit() {
            return None;
        }
        if depth > MAX_DEPTH {
            return None;
        }
        let mut items = Vec::new();
        let mut start = None;
        while let Some(line) = self.lines.get(self.pos).copied() {
            if line.indent != col || !self.starts_item(line.content) {
                break;
            }
            let item = self.skip_spaces(line.content + 1);
            if item >= line.end || self.byte(item) == Some(b'#') || self.starts_item(item) {
                return None;
            }
            start.get_or_insert(if indentless { item } else { line.content });
            let node = if self.key(item, line.end).is_some() {
                let item_col = item - (line.content - line.indent);
                self.mapping(item_col, item, depth + 1)?
            } else {
                let node = self.inline(item, line.end)?;
                self.pos += 1;
                if self.lines.get(self.pos).is_some_and(|n| n.indent > col) {
                    return None;
                }
                node
            };
            items.push(node);
        }
        if self.lines.get(self.pos).is_some_and(|n| n.indent > col) {
            return None;
        }
        Some(Node::new(Value::Seq(items), self.point(start?)))
    }

    fn skip_spaces(&self, mut i: usize) -> usize {
        while self.byte(i) == Some(b' ') {
            i += 1;
        }
        i
    }

    /// The index of the `:` ending a plain key at `at`, when the line holds `key:` followed
    /// by a space or the line's end.
    fn key(&self, at: usize, end: usize) -> Option<usize> {
        if self.indicator_at(at) {
            return None;
        }
        let mut i = at;
        while i < end {
            match self.bytes[i] {
                b':' if i + 1 == end || self.bytes[i + 1] == b' ' => {
                    // `key :` keeps a space the general parser would trim differently.
                    if i == at || self.bytes[i - 1] == b' ' {
                        return None;
                    }
                    return Some(i);
                }
                b'#' if i > at && self.bytes[i - 1] == b' ' => return None,
                b'[' | b']' | b'{' | b'}' | b',' | b'"' | b'\'' => return None,
                _ => {}
            }
            i += 1;
        }
        None
    }

    /// A one-line value starting at `v` (not at a comment); the rest of the line must be
    /// blank or a comment.
    fn inline(&self, v: usize, end: usize) -> Option<Node> {
        let (node, after) = match self.byte(v)? {
            b'[' => self.flow_list(v, end)?,
            b'{' => {
                if self.byte(v + 1) != Some(b'}') {
                    return None;
                }
                (Node::new(Value::Map(Box::default()), self.point(v)), v + 2)
            }
            b'\'' | b'"' => {
                let (s, after) = self.quoted(v, end)?;
                // YAML's parser spans a quoted value over what follows it up to the next
                // token: here the rest of the line, spaces and comment included.
                (Node::scalar(Scalar::Str(s), self.origin(v, end)), after)
            }
            _ if self.indicator_at(v) => return None,
            _ => {
                let stop = self.plain_end(v, end, false)?;
                let text = &self.text[v..stop];
                if text.ends_with(':') {
                    return None;
                }
                (
                    Node::scalar(resolve_plain(text), self.origin(v, stop)),
                    stop,
                )
            }
        };
        self.rest_is_blank(after, end).then_some(node)
    }

    /// The end of a plain scalar starting at `v` (trailing spaces dropped). In a flow list
    /// it also stops at `,` and `]`.
    fn plain_end(&self, v: usize, end: usize, in_flow: bool) -> Option<usize> {
        let mut i = v;
        let mut last = v;
        while i < end {
            let b = self.bytes[i];
            match b {
                b'#' if i > v && self.bytes[i - 1] == b' ' => break,
                b':' if i + 1 == end || self.bytes[i + 1] == b' ' => {
                    // `a: b: c` or a key-like value: the general parser decides.
                    return None;
                }
                b',' | b']' if in_flow => break,
                b'[' | b'{' | b'}' | b':' if in_flow => return None,
                _ => {}
            }
            if b != b' ' {
                last = i + 1;
            }
            i += 1;
        }
        (last > v).then_some(last)
    }

    /// A quoted scalar on one line: `(value, index after the closing quote)`. Double quotes
    /// with escapes go to the general parser.
    fn quoted(&self, v: usize, end: usize) -> Option<(String, usize)> {
        let q = self.bytes[v];
        let mut out = String::new();
        let mut i = v + 1;
        let mut run = i;
        while i < end {
            let b = self.bytes[i];
            if q == b'"' && b == b'\\' {
                return None;
            }
            if b == q {
                if q == b'\'' && self.byte(i + 1) == Some(b'\'') {
                    out.push_str(&self.text[run..=i]);
                    i += 2;
                    run = i;
                    continue;
                }
                out.push_str(&self.text[run..i]);
                return Some((out, i + 1));
            }
            i += 1;
        }
        None
    }

    /// `[a, 'b', 3]` on one line, items plain or quoted: `(list, index after ']')`.
    fn flow_list(&self, v: usize, end: usize) -> Option<(Node, usize)> {
        let mut items = Vec::new();
        let mut i = self.skip_spaces(v + 1);
        if self.byte(i) == Some(b']') {
            return Some((Node::new(Value::Seq(items), self.point(v)), i + 1));
        }
        loop {
            if self.over_limit() {
                return None;
            }
            let b = self.byte(i)?;
            let (node, after) = match b {
                b'\'' | b'"' => {
                    let (s, after) = self.quoted(i, end)?;
                    // The span runs over the spaces after the closing quote, as above.
                    let to = self.skip_spaces(after);
                    (Node::scalar(Scalar::Str(s), self.origin(i, to)), after)
                }
                _ if self.indicator_at(i) => return None,
                _ => {
                    let stop = self.plain_end(i, end, true)?;
                    let text = &self.text[i..stop];
                    (
                        Node::scalar(resolve_plain(text), self.origin(i, stop)),
                        stop,
                    )
                }
            };
            items.push(node);
            i = self.skip_spaces(after);
            match self.byte(i)? {
                b',' => {
                    i = self.skip_spaces(i + 1);
                    if matches!(self.byte(i), Some(b']' | b',')) {
                        return None;
                    }
                }
                b']' => return Some((Node::new(Value::Seq(items), self.point(v)), i + 1)),
                _ => return None,
            }
            if i >= end {
                return None;
            }
        }
    }
}

impl Reader<'_> {
    /// Whether a plain scalar cannot start at `at`: an indicator character, or `-`, `?`,
    /// `:` followed by a space (`-1` and `:x` are plain scalars).
    fn indicator_at(&self, at: usize) -> bool {
        match self.byte(at) {
            None => true,
            Some(b'-' | b'?' | b':') => matches!(self.byte(at + 1), None | Some(b' ' | b'\n')),
            Some(b) => is_indicator(b),
        }
    }
}

/// Characters that always start something other than a plain scalar.
fn is_indicator(b: u8) -> bool {
    matches!(
        b,
        b',' | b'['
            | b']'
            | b'{'
            | b'}'
            | b'#'
            | b'&'
            | b'*'
            | b'!'
            | b'|'
            | b'>'
            | b'\''
            | b'"'
            | b'%'
            | b'@'
            | b'`'
    )
}

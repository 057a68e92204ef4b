//! `verlc migrate`: a config written for verl 0.7.0's layout rewritten into 0.9.1's (the keys
//! verl moved or dropped, [`moves`]). A YAML file is edited as text: the blocks of moved keys
//! are cut out, with their values, inline comments and child lines, and written again at their
//! new place (under an existing section when the file has one, else as a new section at the
//! end); everything else keeps its lines, comments and formatting. Overrides are rewritten
//! key by key. What has no place in the new layout is dropped and reported.
//!
//! The file must be block-style YAML (what verl's configs and users' files are); a moved key
//! inside a flow mapping (`{...}`) is an error that names its line.

use std::collections::BTreeMap;

pub use crate::load::moves::{self, MOVES, Move, destination};

/// What happened to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub from: String,
    /// The new key; `None`: dropped.
    pub to: Option<String>,
    pub release: &'static str,
    pub note: &'static str,
    /// 1-based line of the key in the file (0 for an override).
    pub line: usize,
}

/// A migrated file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMigration {
    pub text: String,
    pub changes: Vec<Change>,
    /// The defaults list named `ppo_megatron_trainer` (a shim since verl 0.8: the file now
    /// extends `ppo_trainer` and selects `model_engine: megatron`).
    pub megatron_shim: bool,
}

/// Why a file could not be rewritten.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MigrateError {
    #[error("line {line}: `{key}` is inside a flow mapping; write it in block style to migrate it")]
    Flow { line: usize, key: String },
    #[error("line {line}: `{from}` moves to `{to}`, which the file already sets (line {existing})")]
    Conflict {
        line: usize,
        from: String,
        to: String,
        existing: usize,
    },
}

/// One mapping key of the file.
#[derive(Debug, Clone)]
struct Entry {
    path: String,
    indent: usize,
    /// 0-based first and last line of the key's block (its line and its value's lines).
    start: usize,
    end: usize,
    /// The text after `key:` on the key's line (value and inline comment), trimmed.
    inline: String,
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '/')
}

/// `(indent, key, rest)` of a block mapping line `  key: rest`.
fn key_line(line: &str) -> Option<(usize, &str, &str)> {
    let indent = line.len() - line.trim_start().len();
    let body = &line[indent..];
    if body.starts_with('#') || body.starts_with('-') {
        return None;
    }
    let (key, rest) = body.split_once(':')?;
    let key = key.trim_matches(|c| c == '"' || c == '\'');
    if key.is_empty() || !key.chars().all(is_key_char) {
        return None;
    }
    (rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')).then_some((
        indent,
        key,
        rest.trim(),
    ))
}

fn blank_or_comment(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#')
}

/// Every block mapping key of `lines` with its dotted path and block.
fn entries(lines: &[&str]) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((indent, key, rest)) = key_line(line) else {
            continue;
        };
        while stack.last().is_some_and(|(d, _)| *d >= indent) {
            stack.pop();
        }
        let path = stack
            .iter()
            .map(|(_, k)| k.as_str())
            .chain([key])
            .collect::<Vec<_>>()
            .join(".");
        stack.push((indent, key.to_owned()));
        out.push(Entry {
            path,
            indent,
            start: i,
            end: i,
            inline: rest.to_owned(),
        });
    }
    // A block runs to its last non-blank, non-comment line deeper than its key.
    for e in out.iter_mut() {
        let mut end = e.start;
        for (j, line) in lines.iter().enumerate().skip(e.start + 1) {
            if blank_or_comment(line) {
                continue;
            }
            let indent = line.len() - line.trim_start().len();
            if indent <= e.indent && !line.trim_start().starts_with('-') {
                break;
            }
            if indent < e.indent {
                break;
            }
            end = j;
        }
        e.end = end;
    }
    out
}

/// The child lines of the block `(start, end)` re-indented under a key at `indent` (their
/// relative indentation kept).
fn child_lines(lines: &[&str], (start, end): (usize, usize), indent: usize) -> Vec<String> {
    let children = &lines[start + 1..=end];
    let shallowest = children
        .iter()
        .filter(|l| !blank_or_comment(l))
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let pad = " ".repeat(indent + 2);
    children
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                let cut = (l.len() - l.trim_start().len()).min(shallowest);
                format!("{pad}{}", &l[cut..])
            }
        })
        .collect()
}

/// A key to write: its path segments under the anchor, inline value and child lines.
struct Insert {
    rest: Vec<String>,
    inline: String,
    /// The key's block in the original lines (its child lines are re-indented when written).
    source: (usize, usize),
}

/// Rewrites `text` (a config file in verl 0.7.0's layout) into 0.9.1's.
pub fn migrate_file(text: &str) -> Result<FileMigration, MigrateError> {
    let lines: Vec<&str> = text.lines().collect();
    let all = entries(&lines);
    for (i, line) in lines.iter().enumerate() {
        // A moved key inside `{...}` cannot be cut by lines.
        if let Some(open) = line.find('{')
            && !line.trim_start().starts_with('#')
        {
            for m in MOVES {
                let leaf = m
                    .from
                    .trim_end_matches(".*")
                    .rsplit('.')
                    .next()
                    .unwrap_or("");
                if line[open..].contains(&format!("{leaf}:")) {
                    let key = all
                        .iter()
                        .rev()
                        .find(|e| e.start <= i)
                        .map_or(leaf.to_owned(), |e| format!("{}.{leaf}", e.path));
                    if destination(&key).is_some() {
                        return Err(MigrateError::Flow { line: i + 1, key });
                    }
                }
            }
        }
    }
    let mut changes = Vec::new();
    let mut removed = vec![false; lines.len()];
    let mut inserts: Vec<(String, Insert, &Entry)> = Vec::new();
    let mut skip_until = None;
    for e in &all {
        if skip_until.is_some_and(|end| e.start <= end) {
            continue;
        }
        let Some((m, to)) = destination(&e.path) else {
            continue;
        };
        // A section whose keys include more specific moves is handled key by key.
        let finer = all.iter().any(|c| {
            c.start > e.start
                && c.start <= e.end
                && destination(&c.path).is_some_and(|(cm, _)| !std::ptr::eq(cm, m))
        });
        if finer {
            continue;
        }
        for r in removed.iter_mut().take(e.end + 1).skip(e.start) {
            *r = true;
        }
        skip_until = Some(e.end);
        changes.push(Change {
            from: e.path.clone(),
            to: to.clone(),
            release: m.release,
            note: m.note,
            line: e.start + 1,
        });
        if let Some(to) = to {
            inserts.push((
                to,
                Insert {
                    rest: Vec::new(),
                    inline: e.inline.clone(),
                    source: (e.start, e.end),
                },
                e,
            ));
        }
    }
    // Sections left without keys (every key moved) go too, innermost first.
    loop {
        let mut more = false;
        for e in &all {
            let emptied = !removed[e.start]
                && e.end > e.start
                && e.inline.is_empty()
                && moves::holds_moves(&e.path)
                && (e.start + 1..=e.end).all(|j| removed[j] || blank_or_comment(lines[j]));
            if emptied {
                for r in removed.iter_mut().take(e.end + 1).skip(e.start) {
                    *r = true;
                }
                more = true;
            }
        }
        if !more {
            break;
        }
    }
    // Where each new key goes: under the deepest section the file keeps.
    let kept: Vec<&Entry> = all.iter().filter(|e| !removed[e.start]).collect();
    let mut by_anchor: BTreeMap<Option<usize>, Vec<Insert>> = BTreeMap::new();
    for (to, mut ins, moved) in inserts {
        if let Some(existing) = kept.iter().find(|e| e.path == to) {
            return Err(MigrateError::Conflict {
                line: moved.start + 1,
                from: moved.path.clone(),
                to,
                existing: existing.start + 1,
            });
        }
        let segments: Vec<&str> = to.split('.').collect();
        let anchor = (1..segments.len()).rev().find_map(|n| {
            let prefix = segments[..n].join(".");
            kept.iter().position(|e| e.path == prefix).map(|k| (k, n))
        });
        let (key, n) = match anchor {
            Some((k, n)) => (Some(k), n),
            None => (None, 0),
        };
        ins.rest = segments[n..].iter().map(|s| s.to_string()).collect();
        by_anchor.entry(key).or_default().push(ins);
    }
    // Insert after each anchor's last kept line (the file's end for new top-level sections).
    let mut after: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut tail: Vec<String> = Vec::new();
    for (anchor, inserts) in by_anchor {
        let (indent, at) = match anchor {
            Some(k) => {
                let e = kept[k];
                let child = (e.start + 1..=e.end)
                    .filter(|&j| !removed[j] && !blank_or_comment(lines[j]))
                    .map(|j| lines[j].len() - lines[j].trim_start().len())
                    .min()
                    .unwrap_or(e.indent + 2);
                let last = (e.start..=e.end)
                    .rev()
                    .find(|&j| !removed[j] && !blank_or_comment(lines[j]))
                    .unwrap_or(e.start);
                (child, Some(last))
            }
            None => (0, None),
        };
        let rendered = render_tree(&lines, &inserts, indent);
        match at {
            Some(line) => after.entry(line).or_default().extend(rendered),
            None => tail.extend(rendered),
        }
    }
    let mut out: Vec<String> = Vec::with_capacity(lines.len() + tail.len());
    let mut megatron_shim = false;
    for (i, line) in lines.iter().enumerate() {
        if !removed[i] {
            let t = line.trim();
            if t == "- ppo_megatron_trainer" {
                megatron_shim = true;
                out.push(line.replacen("ppo_megatron_trainer", "ppo_trainer", 1));
                let indent = &line[..line.len() - line.trim_start().len()];
                out.push(format!("{indent}- override /model_engine: megatron"));
            } else {
                out.push((*line).to_owned());
            }
        }
        if let Some(extra) = after.get(&i) {
            out.extend(extra.iter().cloned());
        }
    }
    if !tail.is_empty() {
        if out.last().is_some_and(|l| !l.trim().is_empty()) {
            out.push(String::new());
        }
        out.push("# Moved by `verlc migrate` into verl 0.9.1's layout.".into());
        out.extend(tail);
    }
    // Removed sections leave their blank separators: no run of blank lines longer than the
    // file had.
    let longest = lines
        .split(|l| !l.trim().is_empty())
        .map(<[&str]>::len)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut run = 0;
    out.retain(|l| {
        run = if l.trim().is_empty() { run + 1 } else { 0 };
        run <= longest
    });
    let mut text_out = out.join("\n");
    if text.ends_with('\n') {
        text_out.push('\n');
    }
    Ok(FileMigration {
        text: text_out,
        changes,
        megatron_shim,
    })
}

/// The inserts as nested YAML at `indent`, sharing their common sections.
fn render_tree(lines: &[&str], inserts: &[Insert], indent: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Vec<String> = Vec::new();
    let mut sorted: Vec<&Insert> = inserts.iter().collect();
    sorted.sort_by(|a, b| a.rest.cmp(&b.rest));
    for ins in sorted {
        let common = open
            .iter()
            .zip(&ins.rest)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ins.rest.len() - 1);
        open.truncate(common);
        for (d, seg) in ins.rest[..ins.rest.len() - 1]
            .iter()
            .enumerate()
            .skip(common)
        {
            out.push(format!("{}{seg}:", " ".repeat(indent + 2 * d)));
            open.push(seg.clone());
        }
        let depth = ins.rest.len() - 1;
        let key_indent = indent + 2 * depth;
        let leaf = &ins.rest[depth];
        let sep = if ins.inline.is_empty() { "" } else { " " };
        out.push(format!(
            "{}{leaf}:{sep}{}",
            " ".repeat(key_indent),
            ins.inline
        ));
        out.extend(child_lines(lines, ins.source, key_indent));
    }
    out
}

/// Overrides rewritten: each `key=value` (with `+`, `++` or `~`) at its new key; dropped keys
/// are left out. Returns the new list and the changes.
/// The overrides `migrated` (already moved to their new keys) as Hydra needs them on the tree
/// of `release`: `+key=v` where that tree has the key now (Hydra refuses to add what exists),
/// and `+key=v` for a plain `key=v` the tree no longer lists inside a free-form map (an
/// engine's `engine_kwargs`, where a missing key must be added). Unchanged where the release
/// has no leaf table.
pub fn fit_to_release(migrated: Vec<String>, release: &str) -> Vec<String> {
    let Some(table) = crate::load::release_table::for_release(release) else {
        return migrated;
    };
    migrated
        .into_iter()
        .map(|o| {
            let Some((lhs, value)) = o.split_once('=') else {
                return o;
            };
            if lhs.starts_with("++") || lhs.starts_with('~') || lhs.contains('@') {
                return o;
            }
            match lhs.strip_prefix('+') {
                Some(key) if table.holds(key) => format!("{key}={value}"),
                Some(_) => o,
                None if !table.holds(lhs) && table.in_free_map(lhs) => format!("+{o}"),
                None => o,
            }
        })
        .collect()
}

pub fn migrate_overrides(overrides: &[String]) -> (Vec<String>, Vec<Change>) {
    let mut out = Vec::new();
    let mut changes = Vec::new();
    for o in overrides {
        let prefix_len = o.len() - o.trim_start_matches(['+', '~']).len();
        let (prefix, body) = o.split_at(prefix_len);
        let (key, value) = match body.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (body, None),
        };
        match destination(key) {
            Some((m, to)) => {
                changes.push(Change {
                    from: key.to_owned(),
                    to: to.clone(),
                    release: m.release,
                    note: m.note,
                    line: 0,
                });
                if let Some(to) = to {
                    out.push(match value {
                        Some(v) => format!("{prefix}{to}={v}"),
                        None => format!("{prefix}{to}"),
                    });
                }
            }
            None => out.push(o.clone()),
        }
    }
    (out, changes)
}

/// A line diff of `old` and `new` in unified style (`-`/`+` lines with two lines of context,
/// `@@ -a +b @@` headers).
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let (n, m) = (a.len(), b.len());
    // Longest common subsequence table, from the ends.
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // The edit script: (' ', '-', '+', line, old index, new index).
    let mut ops: Vec<(char, &str, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i], i, j));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i], i, j));
            i += 1;
        } else {
            ops.push(('+', b[j], i, j));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = String::new();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(2);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 4 {
            end = changed[k];
            k += 1;
        }
        let end = (end + 2).min(ops.len() - 1);
        let (oi, nj) = (ops[start].2 + 1, ops[start].3 + 1);
        out.push_str(&format!("@@ -{oi} +{nj} @@\n"));
        for op in &ops[start..=end] {
            out.push_str(&format!("{}{}\n", op.0, op.1));
        }
    }
    out
}

#[cfg(test)]
mod tests;

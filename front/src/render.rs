//! The only place diagnostics become text: rustc-style (annotate-snippets) or JSON. The CLI
//! and generated trainers (their run-time overrides) both render here.

use crate::diag::{Diagnostic, Severity};
use crate::source::SourceMap;
use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet};

/// The largest char boundary at or before `i` (clamped to the text).
fn floor_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest char boundary at or after `i` (clamped to the text).
fn ceil_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

pub fn human(diags: &[Diagnostic], sources: &SourceMap, color: bool) -> String {
    human_judged(diags, sources, color, None)
}

/// [`human`] for a check: its summary line names the verl release it judged against.
pub fn human_checked(checked: &crate::check::Checked, color: bool) -> String {
    human_judged(
        &checked.diagnostics,
        &checked.composed.sources,
        color,
        Some(&checked.release),
    )
}

/// [`json`] for a check: each diagnostic carries the verl release it judged against
/// (`"release"`).
pub fn json_checked(checked: &crate::check::Checked) -> String {
    let items: Vec<_> = checked
        .diagnostics
        .iter()
        .map(|d| {
            let mut v = d.to_json(&checked.composed.sources);
            v.release = Some(checked.release.clone());
            v
        })
        .collect();
    serde_json::to_string_pretty(&items).unwrap_or_else(|_| "[]".into())
}

fn human_judged(
    diags: &[Diagnostic],
    sources: &SourceMap,
    color: bool,
    release: Option<&str>,
) -> String {
    let renderer = if color {
        Renderer::styled()
    } else {
        Renderer::plain()
    };
    let mut out = String::new();
    for d in diags {
        out.push_str(&renderer.render(&group(d, sources)).to_string());
        out.push_str("\n\n");
    }
    let errors = diags.iter().filter(|d| d.is_error()).count();
    let warnings = diags.len() - errors;
    if errors > 0 || warnings > 0 {
        out.push_str(&format!(
            "{}: {} error{}, {} warning{}{}\n",
            if errors > 0 {
                "check failed"
            } else {
                "check passed"
            },
            errors,
            if errors == 1 { "" } else { "s" },
            warnings,
            if warnings == 1 { "" } else { "s" },
            release.map_or(String::new(), |r| format!(" (judged against verl {r})"))
        ));
    }
    out
}

fn group<'a>(d: &'a Diagnostic, sources: &'a SourceMap) -> Vec<Group<'a>> {
    let level = match d.severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
    };
    let mut title = Group::with_title(level.primary_title(d.message.as_str()).id(d.code.0));
    // One snippet per source, primary first.
    let mut order = Vec::new();
    if let Some(p) = &d.primary {
        order.push(p.origin.source);
    }
    for s in &d.secondary {
        if !order.contains(&s.origin.source) {
            order.push(s.origin.source);
        }
    }
    for src_id in order {
        let src = sources.get(src_id);
        let labels: Vec<_> = d
            .primary
            .iter()
            .map(|l| (l, AnnotationKind::Primary))
            .chain(d.secondary.iter().map(|l| (l, AnnotationKind::Context)))
            .filter(|(l, _)| l.origin.source == src_id)
            .collect();
        // Hand the renderer only the lines the labels touch, not the whole file: a file
        // with thousands of findings would otherwise be re-scanned for each one.
        let text: &str = &src.text;
        // Spans are byte ranges; one that ends inside a character (a one-byte "point" on a
        // multi-byte one) is widened to whole characters rather than sliced mid-character.
        let lo = floor_boundary(
            text,
            labels
                .iter()
                .map(|(l, _)| l.origin.span.start)
                .min()
                .unwrap_or(0),
        );
        let hi = ceil_boundary(
            text,
            labels
                .iter()
                .map(|(l, _)| l.origin.span.end)
                .max()
                .unwrap_or(0)
                .max(lo),
        );
        let win_start = text[..lo].rfind('\n').map_or(0, |i| i + 1);
        let win_end = text[hi..].find('\n').map_or(text.len(), |i| hi + i);
        let window = &text[win_start..win_end];
        let mut snip = Snippet::source(window)
            .line_start(src.line_col(win_start).0)
            .path(src.name.as_str());
        for (label, kind) in labels {
            let start = floor_boundary(text, label.origin.span.start.clamp(win_start, win_end));
            let mut end = ceil_boundary(text, label.origin.span.end.clamp(start, win_end));
            if start == end && end < win_end {
                end = ceil_boundary(text, end + 1);
            }
            let span = start - win_start..end - win_start;
            snip = snip.annotation(kind.span(span).label(label.message.as_str()));
        }
        title = title.element(snip);
    }
    if d.primary.is_none()
        && let Some(k) = &d.key_path
    {
        title = title.element(Level::NOTE.message(format!("key: {k}")));
    }
    if d.primary.is_none()
        && let Some(f) = &d.file
    {
        title = title.element(Level::NOTE.message(format!("file: {f}")));
    }
    for n in &d.notes {
        title = title.element(Level::NOTE.message(n.as_str()));
    }
    if let Some(h) = &d.help {
        title = title.element(Level::HELP.message(h.as_str()));
    }
    vec![title]
}

pub fn json(diags: &[Diagnostic], sources: &SourceMap) -> String {
    let items: Vec<_> = diags.iter().map(|d| d.to_json(sources)).collect();
    serde_json::to_string_pretty(&items).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes;
    use crate::source::{Origin, Source, SourceKind};

    /// Found by the fuzzer: a one-byte span on a multi-byte character (`�` from a lossy
    /// decoding) made the window slicing panic.
    #[test]
    fn spans_inside_a_character_are_widened_not_sliced() {
        let mut sources = SourceMap::new();
        let id = sources.add(Source::new(
            "t.yaml",
            "a:\n  \u{fffd}\u{fffd} b: 1\n",
            SourceKind::File,
        ));
        let d = |span: std::ops::Range<usize>| {
            Diagnostic::error(codes::SCHEMA_REQUIRED, "missing key")
                .with_primary(Some(Origin::new(id, span)), "here")
        };
        for span in [5..6, 6..7, 5..9, 4..4, 7..7] {
            let out = human(&[d(span.clone())], &sources, false);
            assert!(out.contains("\u{fffd}\u{fffd} b: 1"), "{span:?}: {out}");
        }
        let json = json(&[d(6..7)], &sources);
        assert!(json.contains("\"line\": 2"), "{json}");
    }
}

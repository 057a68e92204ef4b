//! Diagnostics as data: an id, a severity, a message, labelled spans, help and notes.
//! Nothing here formats text for a terminal; the CLI renders (human and JSON) in one place.

use serde::Serialize;

use crate::source::{Origin, SourceMap};

/// Most diagnostics one check reports: past them a file is not a config being edited (a
/// generated file of 450k unknown keys would print 160 MB).
pub const MAX_DIAGNOSTICS: usize = 1000;

/// A stable diagnostic id such as `V012`. All ids are listed in [`crate::codes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Code(pub &'static str);

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// A span with a short message ("set here", "mini batch set here").
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub origin: Origin,
    pub message: String,
}

impl Label {
    pub fn new(origin: Origin, message: impl Into<String>) -> Self {
        Label {
            origin,
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    /// Dotted config key the problem is about (`actor_rollout_ref.actor.optim.lr`).
    pub key_path: Option<String>,
    /// Where the offending value (or key) was written.
    pub primary: Option<Label>,
    /// The file the problem is about, for problems with no place in a text (a file that
    /// cannot be read, a model `config.json` that is not usable).
    pub file: Option<String>,
    /// Other places that take part (the other side of a mismatch).
    pub secondary: Vec<Label>,
    /// How to fix it.
    pub help: Option<String>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: Code, message: impl Into<String>) -> Self {
        Self::new(code, Severity::Error, message)
    }

    pub fn warning(code: Code, message: impl Into<String>) -> Self {
        Self::new(code, Severity::Warning, message)
    }

    fn new(code: Code, severity: Severity, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity,
            message: message.into(),
            key_path: None,
            primary: None,
            file: None,
            secondary: Vec::new(),
            help: None,
            notes: Vec::new(),
        }
    }

    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key_path = Some(key.into());
        self
    }

    pub fn with_primary(mut self, origin: Option<Origin>, message: impl Into<String>) -> Self {
        self.primary = origin.map(|o| Label::new(o, message));
        self
    }

    pub fn with_file(mut self, path: impl Into<String>) -> Self {
        self.file = Some(path.into());
        self
    }

    pub fn with_secondary(mut self, origin: Option<Origin>, message: impl Into<String>) -> Self {
        if let Some(o) = origin {
            self.secondary.push(Label::new(o, message));
        }
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The machine-readable form used by `--format json`.
    pub fn to_json(&self, sources: &SourceMap) -> JsonDiagnostic {
        let (file, line, column) = match &self.primary {
            Some(label) => {
                let src = sources.get(label.origin.source);
                let (l, c) = src.line_col(label.origin.span.start);
                (Some(src.name.clone()), Some(l), Some(c))
            }
            None => (self.file.clone(), None, None),
        };
        JsonDiagnostic {
            code: self.code,
            severity: self.severity,
            message: self.message.clone(),
            key: self.key_path.clone(),
            file,
            line,
            column,
            help: self.help.clone(),
            notes: self.notes.clone(),
            release: None,
        }
    }
}

/// One diagnostic as `verlc check --format json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct JsonDiagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub key: Option<String>,
    pub file: Option<String>,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub help: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The verl release the check judged against (`verlc check`'s output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
}

/// Closest candidate for a "did you mean" hint (Jaro-Winkler, like cargo and clap).
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    // Case slips first (`GRPO`, `vLLM`), then near spellings regardless of case.
    let candidates: Vec<&'a str> = candidates.into_iter().collect();
    if let Some(c) = candidates.iter().find(|c| c.eq_ignore_ascii_case(word)) {
        return Some(c);
    }
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&word, &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

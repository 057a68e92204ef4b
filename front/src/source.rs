//! Every piece of text a config value can come from: user files, verlc's built-in default
//! tree, and command-line overrides. Values keep an [`Origin`] into this map so a diagnostic
//! can quote the exact line, whatever the value's provenance.

use std::ops::Range;
use std::sync::Arc;

/// Index of a [`Source`] in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub u32);

/// Where a source's text came from; decides how it is named in diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// A file on disk (user config, group file from a `--config-dir` or search path).
    File,
    /// A group file of verlc's built-in verl-compatible default tree.
    Builtin,
    /// One command-line override, e.g. `data.train_batch_size=256`.
    Override,
}

#[derive(Clone, Debug)]
pub struct Source {
    /// Display name: a path for files, `<verlc defaults>/optim/fsdp.yaml` for built-ins,
    /// `<override 2>` for overrides.
    pub name: String,
    pub text: Arc<str>,
    pub kind: SourceKind,
    /// Byte offset of the start of each line (line 1 starts at 0), computed when a
    /// diagnostic first needs a line number: most sources are never pointed at.
    line_starts: std::sync::OnceLock<Vec<usize>>,
}

impl Source {
    pub fn new(name: impl Into<String>, text: impl Into<Arc<str>>, kind: SourceKind) -> Self {
        Source {
            name: name.into(),
            text: text.into(),
            kind,
            line_starts: std::sync::OnceLock::new(),
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line_starts = self.line_starts.get_or_init(|| {
            let mut starts = vec![0];
            starts.extend(
                self.text
                    .bytes()
                    .enumerate()
                    .filter(|(_, b)| *b == b'\n')
                    .map(|(i, _)| i + 1),
            );
            starts
        });
        let line = match line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = line_starts[line];
        let col = self
            .text
            .get(start..offset)
            .map_or(0, |s| s.chars().count());
        (line + 1, col + 1)
    }

    /// Byte offset of a character index (saphyr reports positions in characters).
    pub fn byte_of_char(&self, char_index: usize) -> usize {
        if self.text.is_ascii() {
            return char_index.min(self.text.len());
        }
        self.text
            .char_indices()
            .nth(char_index)
            .map_or(self.text.len(), |(b, _)| b)
    }
}

/// All sources of one compilation.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    sources: Vec<Source>,
    /// Sources by name, so adding one is not a scan of all (100k overrides are 100k sources).
    by_name: std::collections::HashMap<String, Vec<u32>>,
}

impl SourceMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, source: Source) -> SourceId {
        // Files are often loaded more than once (a group file used at two packages).
        let same = self.by_name.get(&source.name).and_then(|ids| {
            ids.iter().copied().find(|&i| {
                let s = &self.sources[i as usize];
                s.kind == source.kind && s.text == source.text
            })
        });
        if let Some(i) = same {
            return SourceId(i);
        }
        let id = self.sources.len() as u32;
        self.by_name
            .entry(source.name.clone())
            .or_default()
            .push(id);
        self.sources.push(source);
        SourceId(id)
    }

    pub fn get(&self, id: SourceId) -> &Source {
        &self.sources[id.0 as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = (SourceId, &Source)> {
        self.sources
            .iter()
            .enumerate()
            .map(|(i, s)| (SourceId(i as u32), s))
    }
}

/// A byte range in one source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    pub source: SourceId,
    pub span: Range<usize>,
}

impl Origin {
    pub fn new(source: SourceId, span: Range<usize>) -> Self {
        Origin { source, span }
    }
}

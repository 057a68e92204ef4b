//! Rows of a dataset address: a `.parquet`, `.json` (array of objects or JSON lines) or
//! `.jsonl` file, or a `builtin://` synthetic task.

use std::path::Path;

use serde_json::{Map, Value};

use crate::builtin_uri::BuiltinUri;
use crate::rng::Rng;

use super::{DataError, builtin, parquet};

/// The raw rows of `address`.
pub fn read_rows(address: &str) -> Result<Vec<Map<String, Value>>, DataError> {
    if let Some(uri) = BuiltinUri::parse(address) {
        let uri = uri.map_err(DataError::Builtin)?;
        return builtin::rows(&uri).map_err(DataError::Builtin);
    }
    let path = Path::new(address);
    match path.extension().and_then(|e| e.to_str()) {
        Some("parquet") => parquet::read_rows(path),
        Some("json" | "jsonl") => read_json(path),
        _ => Err(DataError::Format {
            file: path.to_owned(),
        }),
    }
}

/// One row of [`read_sampled`]: its file (or address), its number there, its columns.
pub type SourcedRow = (String, usize, Map<String, Value>);

/// The rows of every address in `files`, in order, cut to `max_samples` (`None`: all) as verl's
/// datasets do: the first rows, or with `shuffle` a seeded random choice kept in file order.
pub fn read_sampled(
    files: &[String],
    max_samples: Option<usize>,
    shuffle: bool,
    seed: u64,
) -> Result<Vec<SourcedRow>, DataError> {
    let mut rows: Vec<SourcedRow> = Vec::new();
    for f in files {
        rows.extend(
            read_rows(f)?
                .into_iter()
                .enumerate()
                .map(|(i, r)| (f.clone(), i, r)),
        );
    }
    if let Some(n) = max_samples.filter(|n| *n < rows.len()) {
        let mut idx: Vec<usize> = (0..rows.len()).collect();
        if shuffle {
            Rng::new(seed).shuffle(&mut idx);
        }
        idx.truncate(n);
        idx.sort_unstable();
        let mut keep = vec![false; rows.len()];
        idx.iter().for_each(|&i| keep[i] = true);
        let mut k = keep.into_iter();
        rows.retain(|_| k.next().unwrap_or(false));
    }
    Ok(rows)
}

fn read_json(path: &Path) -> Result<Vec<Map<String, Value>>, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError::Io {
        file: path.to_owned(),
        source: e,
    })?;
    let bad = |msg: String| DataError::Json {
        file: path.to_owned(),
        msg,
    };
    let values: Vec<Value> = if text.trim_start().starts_with('[') {
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?
    } else {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| bad(format!("line {}: {e}", i + 1))))
            .collect::<Result<_, _>>()?
    };
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Object(m) => Ok(m),
            other => Err(bad(format!("record {i} is not an object: {other}"))),
        })
        .collect()
}

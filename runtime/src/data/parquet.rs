//! Reading parquet files row by row without arrow (the `parquet` crate's record API); each row
//! becomes a JSON object with nested structs as objects and lists as arrays.

use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::{Map, Value};

use super::DataError;

/// All rows of `path`.
pub fn read_rows(path: &Path) -> Result<Vec<Map<String, Value>>, DataError> {
    let bad = |msg: String| DataError::Parquet {
        file: path.to_owned(),
        msg,
    };
    let file = std::fs::File::open(path).map_err(|e| DataError::Io {
        file: path.to_owned(),
        source: e,
    })?;
    let reader = SerializedFileReader::new(file).map_err(|e| bad(e.to_string()))?;
    let expected = reader.metadata().file_metadata().num_rows().max(0) as usize;
    let mut rows = Vec::with_capacity(expected);
    for (i, row) in reader.into_iter().enumerate() {
        let row = row.map_err(|e| bad(format!("row {i}: {e}")))?;
        match row.to_json_value() {
            Value::Object(m) => rows.push(m),
            other => return Err(bad(format!("row {i} is not a record: {other}"))),
        }
    }
    Ok(rows)
}

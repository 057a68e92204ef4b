//! Tests of `verlc_runtime::data` (mirrors runtime/src/data/). Parquet files are written by pyarrow
//! in verl's layout (tests/oracle/data_oracle.py, run once and cached).
#[path = "../oracle/run.rs"]
mod oracle;

mod builtin;
mod dataset;
mod image;
mod parquet;
mod sampler;
mod sft;
mod video;

use std::path::PathBuf;

/// Output directory of `data_oracle.py parquet`.
pub fn parquet_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| oracle::cached_with(&oracle::script_named("data_oracle.py"), "parquet", &[]))
        .clone()
}

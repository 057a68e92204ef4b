//! The dataset.

pub(crate) mod data_file_format_unsupported;

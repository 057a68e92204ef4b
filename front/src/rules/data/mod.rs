//! The dataset.

pub(crate) mod curriculum_sampler_with_workers;
pub(crate) mod data_file_format_unsupported;

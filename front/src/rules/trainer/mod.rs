//! The training run: engine mode, resume, loggers.

pub(crate) mod engine_needs_engine_workers;
pub(crate) mod gen_batch_size_overridden;
pub(crate) mod hybrid_engine_disabled;
pub(crate) mod logger_backend_unsupported;
pub(crate) mod resume_from_hdfs_unsupported;
pub(crate) mod resume_path_without_global_step;
pub(crate) mod separate_async_layout_invalid;

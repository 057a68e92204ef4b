//! Loader (in progress).

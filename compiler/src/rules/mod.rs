//! Semantic rules (in progress).

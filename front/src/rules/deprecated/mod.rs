//! Deprecated and renamed keys.

pub(crate) mod deprecated_key_set;
pub(crate) mod key_moved_in_newer_release;

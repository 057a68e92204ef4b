//! Deprecated and renamed keys.

pub(crate) mod deprecated_key_set;

//! Mandatory (`???`) values.

pub(crate) mod mandatory_value_unset;

//! Optimizers and learning-rate schedules.

pub(crate) mod optimizer_name_unknown;

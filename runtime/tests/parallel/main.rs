//! Tests of `verlc_runtime::parallel` (mirrors runtime/src/parallel/): process groups, collectives, the launcher, rank layouts.
#[path = "../common/mod.rs"]
mod common;

mod collectives;
mod env;
mod failure;
mod launch;
mod layout;
mod subgroups;
mod zygote;

//! Tests of `verlc_runtime::dist` (mirrors runtime/src/dist/).
#[path = "../common/mod.rs"]
mod common;

mod collectives;
mod env;
mod failure;
mod launch;
mod layout;
mod subgroups;

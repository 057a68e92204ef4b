//! verlc: a compiler for verl (Hydra-composed YAML) RL training configs.
//!
//! The library takes text in and gives data out: it composes a config the way Hydra does
//! ([`load`]), checks it against the JSON Schema of the typed model ([`config`], [`schema`])
//! and against verl's cross-field rules ([`rules`]), and reports problems as
//! [`diag::Diagnostic`] values. It never prints and never touches libtorch; the CLI
//! (the `verlc` binary's `cli` module) renders diagnostics and drives code generation.

// The loader returns a `Diagnostic` as its error (a value the caller renders, not a hot
// path), which clippy finds large.
#![allow(clippy::result_large_err)]

pub mod check;
pub mod codegen;
pub mod codes;
pub mod config;
pub mod diag;
pub mod explain;
pub mod load;
pub mod plan;
pub mod redact;
pub mod render;
pub mod rules;
pub mod schema;
pub mod source;

//! verlc: a compiler for verl (Hydra-composed YAML) RL training configs.
//!
//! The front end (package `verlc-front`, library `verlc_front`): it takes text in and gives data
//! out. It composes a config the way Hydra does ([`load`]), checks it against the JSON Schema
//! of the typed model ([`config`], [`schema`]) and against verl's cross-field rules
//! ([`rules`]), lowers it to the trainer spec ([`plan`]), and reports problems as
//! [`diag::Diagnostic`] values. It has no network, terminal or process code and never
//! touches libtorch: generated trainers link it (for their run-time overrides) without the
//! CLI's dependencies. The `verlc` package (`cli`) is the command line: argument
//! parsing, code generation and the cargo driver, Hub downloads, progress display.

// The loader returns a `Diagnostic` as its error (a value the caller renders, not a hot
// path), which clippy finds large.
#![allow(clippy::result_large_err)]

pub mod check;
pub mod codes;
pub mod compile;
pub mod config;
pub mod diag;
pub mod explain;
pub mod load;
pub mod migrate;
pub mod plan;
pub mod redact;
pub mod render;
mod reward;
mod role;
pub mod rules;
pub mod schema;
pub mod sft;
pub mod source;
pub mod veomni;

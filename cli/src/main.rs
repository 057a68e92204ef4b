//! `verlc`, the command line: check, explain, schema, rule, build, run, fetch.
//!
//! The layer above the front end (package `verlc-front`, library `verlc_front`), which it uses for
//! everything about configs. What only the tool needs lives here: argument parsing and the
//! exit-status contract ([`cli`]), the generated trainer crate and the cargo driver
//! ([`codegen`]), Hub downloads (`cli/fetch.rs`), progress display, the allocator ([`arena`]). Generated
//! trainers link the front end, never this crate.

mod arena;
mod cli;
mod codegen;

#[global_allocator]
static ALLOC: arena::Arena = arena::Arena::new();

fn main() -> std::process::ExitCode {
    cli::main()
}

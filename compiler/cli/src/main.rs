//! `verlc`: check, explain and schema for verl configs (and, later, build/run).

mod cli;
mod codegen;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}

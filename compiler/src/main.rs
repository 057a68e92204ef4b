//! `verlc`: check, explain and schema for verl configs (and, later, build/run).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

//! The subcommands: clap arguments ([`args`]), one file per subcommand, and what they share
//! at the process edge ([`output`]: exit statuses, usage errors, atomic output files).
//! Diagnostics are rendered by the front end's `verlc_front::render`.

mod args;
mod build;
mod check;
mod explain;
mod fetch;
mod migrate;
mod output;
mod release;
mod rule;
mod run;
mod schema;
mod smoke;
mod smoke_adapter;

use std::process::ExitCode;

use clap::Parser;

pub use args::{Cli, Command};

pub use output::{EXIT_ERRORS, EXIT_USAGE};

pub fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of our output goes away
    // (`verlc schema --print root | head`), instead of panicking on a closed pipe.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let code = match cli.command {
        Command::Check(a) => check::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Schema(a) => schema::run(a),
        Command::Rule(a) => rule::run(a),
        Command::Migrate(a) => migrate::run(a),
        // These run for minutes and free as they go: the system allocator reuses what they free.
        Command::Build(a) => {
            crate::arena::close();
            build::run(a)
        }
        Command::Run(a) => {
            crate::arena::close();
            run::run(a)
        }
        Command::Smoke(a) => {
            crate::arena::close();
            smoke::run(a)
        }
        Command::Fetch(a) => {
            crate::arena::close();
            fetch::run(a)
        }
    };
    ExitCode::from(code)
}

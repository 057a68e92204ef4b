//! Runs the single-process trainer on a config file (the quickstart by default), with
//! `key=value` overrides, printing verl's console lines; the learning-run benchmark of
//! issue 5:
//!
//! ```text
//! cargo run --release -p verlc-runtime --example train -- examples/quickstart.yaml [key=value ...]
//! ```
//!
//! Generated trainers (`verlc build`) reach the same loop through `verlc_runtime::binding::train`.

use std::path::PathBuf;
use std::process::ExitCode;

use verlc_front::compile::{SpecOutcome, lower_request};
use verlc_front::load::compose::LoadRequest;

fn main() -> ExitCode {
    verlc_runtime::host_alloc::keep_freed_memory();
    let mut args = std::env::args().skip(1);
    let file = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "examples/quickstart.yaml".into()),
    );
    let overrides: Vec<String> = args.collect();
    let req = LoadRequest {
        config_file: Some(file),
        overrides,
        cwd: std::env::current_dir().unwrap_or_default(),
        ..LoadRequest::default()
    };
    let spec = match lower_request(&req) {
        SpecOutcome::Ok { spec, .. } => *spec,
        SpecOutcome::Errors(checked) => {
            let errors: Vec<_> = checked
                .diagnostics
                .iter()
                .filter(|d| d.is_error())
                .cloned()
                .collect();
            eprint!(
                "{}",
                verlc_front::render::human(&errors, &checked.composed.sources, false)
            );
            return ExitCode::FAILURE;
        }
    };
    let start = std::time::Instant::now();
    match verlc_runtime::trainer::run(&spec, &verlc_runtime::trainer::RunOptions::default()) {
        Ok(summary) => {
            eprintln!(
                "trained {} steps in {:.1} s",
                summary.last_step - summary.resumed_from,
                start.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

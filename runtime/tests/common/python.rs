//! Runs a test oracle script to its end through `verlc_runtime::pyproc::run_file`: forked from the
//! suite's warm interpreter where scripts/run-tests.py started one (torch and transformers
//! imported once, not per oracle), else as `python -u SCRIPT ARGS`. Its output is printed
//! into the test's (shown when the test fails).

use std::path::Path;
use std::process::ExitStatus;

pub fn run_script(
    python: &Path,
    script: &Path,
    args: &[&Path],
    env: &[(&str, &str)],
) -> ExitStatus {
    let args: Vec<String> = args.iter().map(|a| a.display().to_string()).collect();
    let out = verlc_runtime::pyproc::run_file(&python.display().to_string(), script, &args, env)
        .unwrap_or_else(|e| {
            panic!(
                "running {} with {} (run scripts/setup first): {e}",
                script.display(),
                python.display()
            )
        });
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    out.status
}

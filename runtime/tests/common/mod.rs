//! Helpers shared by the runtime's integration tests: multi-rank re-execution of the test
//! binary and the PyTorch oracle (the venv's python).
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use verlc_runtime::parallel::dist::{InitOptions, LaunchedRanks, LocalLauncher, ProcessGroup};

const BODY_VAR: &str = "VERLC_TEST_RANK_BODY";

/// The libtest filter of a test: its path without the crate name.
pub fn test_filter(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{name}"),
        None => name.to_owned(),
    }
}

/// True inside a rank process spawned for test `filter`.
pub fn is_rank(filter: &str) -> bool {
    std::env::var(BODY_VAR).is_ok_and(|v| v == filter)
}

/// Re-executes this test binary as `world` ranks that run only test `filter`.
pub fn spawn_ranks(filter: &str, world: usize, env: &[(&str, String)]) -> LaunchedRanks {
    let mut l = LocalLauncher::new(world)
        .args([filter, "--exact", "--nocapture", "--test-threads=1"])
        .env(BODY_VAR, filter)
        .env("OMP_NUM_THREADS", "1");
    for (k, v) in env {
        l = l.env(k, v);
    }
    l.spawn().expect("spawn ranks")
}

/// Runs test function `entry` (libtest filter `filter`) as `world` rank processes with `env`,
/// forked by the zygote where there is one, else re-executed; panics if a rank fails or the
/// ranks outlive `timeout`.
pub fn launch_ranks(
    entry: fn(),
    filter: &str,
    world: usize,
    env: &[(&str, String)],
    timeout: Duration,
) {
    match zygote::launch(entry, filter, world, env, timeout) {
        Some(result) => result.expect("all ranks succeed"),
        None => spawn_ranks(filter, world, env)
            .wait(Some(timeout))
            .map(|_| ())
            .expect("all ranks succeed"),
    }
}

/// Runs `body` on `world` Gloo ranks (rank processes of test function `entry`) and fails if
/// any rank fails.
pub fn run_ranks(
    entry: fn(),
    filter: &str,
    world: usize,
    timeout: Duration,
    body: impl FnOnce(ProcessGroup),
) {
    if is_rank(filter) {
        tch::set_num_threads(1);
        let opts = InitOptions {
            timeout,
            ..InitOptions::default()
        };
        let pg = ProcessGroup::init_from_env(&opts).expect("init process group");
        body(pg);
        rank_passed();
    }
    launch_ranks(entry, filter, world, &[], Duration::from_secs(120));
}

/// Ends a rank process whose body returned: the parent reads only its exit status, and
/// libtorch's static destructors are a fifth of a short rank's CPU (`process_exit`). Call
/// once the rank's own values (its process group first) are dropped.
pub fn rank_passed() -> ! {
    verlc_runtime::process_exit::exit_skipping_destructors(0)
}

/// Declares a `#[test]` that runs its body on `$world` Gloo ranks.
#[macro_export]
macro_rules! rank_test {
    ($name:ident, $world:expr, |$pg:ident| $body:block) => {
        #[test]
        fn $name() {
            let filter = $crate::common::test_filter(module_path!(), stringify!($name));
            $crate::common::run_ranks(
                $name,
                &filter,
                $world,
                std::time::Duration::from_secs(60),
                |$pg| $body,
            );
        }
    };
}

pub mod python;
mod zygote;

/// The python with torch 2.13 (VERLC_PYTHON, else the repo's .venv).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("VERLC_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

/// A fresh temporary directory under the target dir (removed by the caller if wanted).
pub fn temp_dir(tag: &str) -> PathBuf {
    let base = std::env::temp_dir().join(format!("verlc-runtime-tests-{}", std::process::id()));
    let dir = base.join(tag);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

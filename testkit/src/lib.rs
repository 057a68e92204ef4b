//! Test skips as records. A test that cannot run here says why through [`skip`] (an optional
//! peer is absent) or [`missing_data`] (something `scripts/setup` provides is absent: a verl
//! release tree, the venv, libtorch). Both print the reason and append it to the file named by
//! `VERLC_SKIP_LOG`, which `scripts/test` prints at the end of the run, so a skipped test is
//! never mistaken for a passed one. Under `VERLC_REQUIRE_DATA=1` (`scripts/test`, CI) a
//! [`missing_data`] skip fails the test instead: the suite's own setup must provide it.

use std::fmt::Display;
use std::io::Write;

/// The running test's name: libtest names each test's thread after it; a rank process of a
/// multi-process test names itself through `VERLC_TEST_NAME` where its harness sets it.
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .map(str::to_owned)
        .or_else(|| std::env::var("VERLC_TEST_NAME").ok())
        .unwrap_or_else(|| "?".to_owned())
}

fn record(kind: &str, reason: &dyn Display) {
    let line = format!("{} [{kind}]: {reason}", test_name());
    eprintln!("skipped: {line}");
    if let Some(path) = std::env::var_os("VERLC_SKIP_LOG") {
        // One short write per line in append mode: concurrent tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// Skips the rest of the test for `reason` (an optional tool or peer this machine lacks);
/// recorded in the run's skip log. The caller returns after it.
pub fn skip(reason: impl Display) {
    record("optional", &reason);
}

/// Skips the rest of the test because data `scripts/setup` provides is absent; under
/// `VERLC_REQUIRE_DATA=1` the test fails instead. The caller returns after it.
pub fn missing_data(reason: impl Display) {
    if required() {
        panic!("{reason}: this run requires it (VERLC_REQUIRE_DATA=1; run scripts/setup)");
    }
    record("missing data", &reason);
}

/// Whether this run forbids skips for missing data (`VERLC_REQUIRE_DATA=1`).
pub fn required() -> bool {
    std::env::var("VERLC_REQUIRE_DATA").is_ok_and(|v| v == "1")
}

//! Ending a process that loaded libtorch without running libtorch's static destructors.
//!
//! libtorch registers every operator with its dispatcher when it loads and deregisters each one
//! again from its static destructors at exit. For a short process the exit is a large share of
//! its CPU: perf on a trainer binary's `--help` put 28% of its user time in `exit`'s handlers
//! (about 0.15 CPU-seconds per process on a 2-core Xeon), and a launch starts a process per rank,
//! a test suite hundreds. The destructors only tear down process-wide tables; the kernel
//! reclaims memory, sockets and files, so a process whose own Rust state is already dropped can
//! end with `_exit` once its buffered output is written.
//!
//! Exit handlers registered through `atexit` do not run either: nothing verlc links relies on
//! one to persist data (a coverage-instrumented build would lose its profile; set
//! `VERLC_FULL_EXIT=1` to end through `exit` as usual).

use std::io::Write;

/// Flushes Rust's and C's buffered standard streams and ends the process with `code`, skipping
/// static destructors and `atexit` handlers. Call only where every value that must be dropped
/// (files, child processes, process groups) has been dropped already.
pub fn exit_skipping_destructors(code: u8) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    if std::env::var_os("VERLC_FULL_EXIT").is_some_and(|v| v == "1") {
        std::process::exit(i32::from(code));
    }
    // SAFETY: fflush(NULL) flushes every open C stdio output stream and _exit ends the process;
    // neither touches Rust state, and no Rust destructor is owed anything after the caller's
    // values are dropped.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(i32::from(code))
    }
}

#[cfg(test)]
mod tests {
    use super::exit_skipping_destructors;

    const CHILD_ENV: &str = "VERLC_PROCESS_EXIT_TEST_CHILD";

    /// In the child: output Rust and C have buffered (no newline: a pipe's Rust stdout holds a
    /// partial line, C's stdio holds everything) must reach the parent, with the exit code.
    #[test]
    fn buffered_output_and_the_exit_code_survive_the_exit() {
        if std::env::var_os(CHILD_ENV).is_some() {
            print!("rust-partial-line");
            eprint!("rust-stderr");
            // SAFETY: a NUL-terminated format without conversions.
            unsafe { libc::printf(c"|c-buffered".as_ptr()) };
            exit_skipping_destructors(3);
        }
        let exe = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(exe)
            .args([
                "process_exit::tests::buffered_output_and_the_exit_code_survive_the_exit",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .expect("run the child");
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.ends_with("rust-partial-line|c-buffered"),
            "{stdout:?}"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).ends_with("rust-stderr"),
            "{out:?}"
        );
    }
}

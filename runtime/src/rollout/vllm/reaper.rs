//! Stops the vLLM servers' process groups when the trainer is interrupted: SIGINT, SIGTERM and
//! SIGHUP end a process without running destructors, and vLLM's engine-core workers would
//! outlive it. The handler kills every registered group, then lets the signal take its
//! default course (the exit status still says which signal it was).

use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};

/// Process groups to kill on a signal (0: free slot). A run has one server per process.
static GROUPS: [AtomicI32; 8] = [const { AtomicI32::new(0) }; 8];
static INSTALL: Once = Once::new();
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Adds the group led by `pid`, installing the handler on first use.
pub fn register(pid: i32) {
    INSTALL.call_once(install);
    for slot in &GROUPS {
        if slot
            .compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

/// Removes the group led by `pid` (it was stopped).
pub fn unregister(pid: i32) {
    for slot in &GROUPS {
        let _ = slot.compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    for slot in &GROUPS {
        let pid = slot.load(Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill, signal and raise are async-signal-safe.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
    // SAFETY: as above; restores the default action and re-delivers the signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install() {
    for sig in SIGNALS {
        // SAFETY: installs a handler that only calls async-signal-safe functions; a signal
        // the process ignores (e.g. SIGHUP under nohup) stays ignored.
        unsafe {
            let previous = libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            if previous == libc::SIG_IGN {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
    }
}

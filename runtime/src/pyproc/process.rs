//! A helper's process and its three pipes: started here (`python -u -c script args`), or
//! forked by the fork server a test run provides (`fork_client.rs`); either way killed with
//! everything under it, and waited for.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::ProcError;
use super::fork_client::{self, ForkedChild};

/// A started helper: its process and our ends of its standard streams.
pub(super) struct Started {
    pub process: HelperProcess,
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
}

pub(super) enum HelperProcess {
    Direct(Child),
    Forked(ForkedChild),
}

impl HelperProcess {
    pub fn id(&self) -> u32 {
        match self {
            HelperProcess::Direct(c) => c.id(),
            HelperProcess::Forked(f) => f.pid(),
        }
    }

    /// SIGKILL to the helper and every process under it.
    pub fn kill(&mut self) {
        match self {
            HelperProcess::Direct(c) => kill_tree(c),
            HelperProcess::Forked(f) => f.kill(),
        }
    }

    /// Waits for the helper to end; its status as `std::process::ExitStatus` shows it.
    pub fn wait(&mut self) -> String {
        match self {
            HelperProcess::Direct(c) => match c.wait() {
                Ok(s) => s.to_string(),
                Err(e) => format!("unknown status ({e})"),
            },
            HelperProcess::Forked(f) => f.wait(),
        }
    }
}

/// Starts `script` (the full text, channel included) on `python`: through the fork server
/// listening at `fork_server` when it takes the request, else directly.
pub(super) fn start(
    python: &str,
    script: &str,
    args: &[String],
    fork_server: Option<&Path>,
) -> Result<Started, ProcError> {
    if let Some(socket) = fork_server
        && let Some(started) = fork_client::try_fork(socket, python, script, args)
    {
        return Ok(started);
    }
    let spawn_error = |message: String| ProcError::Spawn {
        python: python.to_owned(),
        message,
    };
    let mut child = Command::new(python)
        .arg("-u")
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(e.to_string()))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_tree(&mut child);
        let _ = child.wait();
        return Err(spawn_error("its standard streams were not piped".into()));
    };
    Ok(Started {
        process: HelperProcess::Direct(child),
        stdin: File::from(OwnedFd::from(stdin)),
        stdout: File::from(OwnedFd::from(stdout)),
        stderr: File::from(OwnedFd::from(stderr)),
    })
}

/// Kills `child` and every process under it. The interpreter may be a wrapper (a shell
/// script, `conda run`, `time`) whose Python is a grandchild: killing only the direct child
/// would leave a helper stuck in user code running, holding the pipes.
fn kill_tree(child: &mut Child) {
    for pid in descendants(child.id()) {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: sends a signal; no memory is touched.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = child.kill();
}

/// Every process under `pid` (Linux's `/proc/<pid>/task/<tid>/children`; none elsewhere).
fn descendants(pid: u32) -> Vec<u32> {
    let mut pending = vec![pid];
    let mut below = Vec::new();
    while let Some(pid) = pending.pop() {
        for kid in children_of(pid) {
            below.push(kid);
            pending.push(kid);
        }
    }
    below
}

/// The processes `pid`'s threads started.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

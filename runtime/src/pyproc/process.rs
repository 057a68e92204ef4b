//! A helper's process and its three pipes: started here (`python -u -c CODE ARGS` or
//! `python -u FILE ARGS`), or forked by the fork server a test run provides
//! (`fork_client.rs`); either way killed with everything under it, and waited for.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

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

    /// Waits for the helper to end: its status, or why it is not known.
    pub fn wait(&mut self) -> Result<ExitStatus, String> {
        match self {
            HelperProcess::Direct(c) => c.wait().map_err(|e| format!("unknown status ({e})")),
            HelperProcess::Forked(f) => f.wait(),
        }
    }
}

/// What a helper runs, and how.
#[derive(Clone, Copy)]
pub(super) struct Launch<'a> {
    pub python: &'a str,
    pub program: Program<'a>,
    pub args: &'a [String],
    /// Set in the helper's environment on top of this process's.
    pub env: &'a [(&'a str, &'a str)],
}

#[derive(Clone, Copy)]
pub(super) enum Program<'a> {
    /// `python -u -c CODE ARGS...`
    Code(&'a str),
    /// `python -u FILE ARGS...`
    File(&'a Path),
}

/// Starts `launch`: through the fork server listening at `fork_server` when it takes the
/// request, else directly.
pub(super) fn start(launch: Launch<'_>, fork_server: Option<&Path>) -> Result<Started, ProcError> {
    if let Some(socket) = fork_server
        && let Some(started) = fork_client::try_fork(socket, launch)
    {
        return Ok(started);
    }
    let python = launch.python;
    let spawn_error = |message: String| ProcError::Spawn {
        python: python.to_owned(),
        message,
    };
    let mut command = Command::new(python);
    command.arg("-u");
    match launch.program {
        Program::Code(code) => command.arg("-c").arg(code),
        Program::File(file) => command.arg(file),
    };
    let mut child = command
        .args(launch.args)
        .envs(launch.env.iter().copied())
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

//! The client of `fork_server.py`: where `VERLC_PYTHON_FORK_SERVER` names a server's socket
//! (scripts/run-tests.py starts one for the suite), a helper is forked from an interpreter
//! that has imported torch and transformers already, instead of paying those imports again
//! (seconds of CPU per helper). The protocol is at the top of `fork_server.py`.
//!
//! A request whose environment the imports would read differently is sent on to the server
//! the first one starts with that environment. vLLM's API server ([`fork_server_process`])
//! is forked the same way, from a server of its own interpreter that imported vLLM. Any
//! failure to reach or use a server (not running, another interpreter asked for) falls back to
//! starting the helper directly, so the server can only make a helper start sooner, never
//! change what it runs.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::process::{HelperProcess, Launch, Program, Started};

/// Names the server's socket.
pub const SOCKET_VAR: &str = "VERLC_PYTHON_FORK_SERVER";

/// Longest wait for the server's answer to a request, and for a killed child's status.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// A helper the server forked: its pid, and the connection its status comes back on (and a
/// kill request goes out on).
pub(crate) struct ForkedChild {
    pid: u32,
    conn: BufReader<UnixStream>,
    status: Option<Result<ExitStatus, String>>,
}

impl ForkedChild {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Asks the server to SIGKILL the child and every process under it (the server, which
    /// reaps it, knows whether the pid is still the child's).
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.conn.get_mut().write_all(b"kill\n");
        }
    }

    /// The status when the child has ended (the server sent it), without waiting.
    pub fn try_wait(&mut self) -> Option<Result<ExitStatus, String>> {
        if let Some(s) = &self.status {
            return Some(s.clone());
        }
        if self.conn.get_ref().set_nonblocking(true).is_err() {
            return None;
        }
        // Something to read (the status line) or the end of the connection: either way
        // `wait` returns at once.
        let ready = !matches!(
            self.conn.fill_buf(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        let _ = self.conn.get_ref().set_nonblocking(false);
        ready.then(|| self.wait())
    }

    /// The child's status once the server has reaped it.
    pub fn wait(&mut self) -> Result<ExitStatus, String> {
        if let Some(s) = &self.status {
            return s.clone();
        }
        let status = match read_reply(&mut self.conn) {
            Ok(reply) => match reply
                .get("status")
                .and_then(Value::as_i64)
                .and_then(|s| i32::try_from(s).ok())
            {
                Some(raw) => Ok(ExitStatus::from_raw(raw)),
                None => Err(format!("unknown status (the fork server sent {reply})")),
            },
            Err(e) => Err(format!("unknown status (the fork server: {e})")),
        };
        self.status = Some(status.clone());
        status
    }
}

/// Forks the helper through the server at `socket` if it takes it; `None`: start it here.
pub(super) fn try_fork(socket: &Path, launch: Launch<'_>) -> Option<Started> {
    match fork(socket, launch) {
        Ok(Some(started)) => Some(started),
        Ok(None) => None,
        Err(e) => {
            warn_once(&format!(
                "the fork server at {} failed ({e}); starting helpers directly",
                socket.display()
            ));
            None
        }
    }
}

fn warn_once(message: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("warning: {message}");
    }
}

/// The request's common part: interpreter, arguments, this process's working directory, and
/// its environment with `env` on top. Every variable goes over as text; `None` where one is
/// not (the process is then started directly).
fn base_request(
    python: &str,
    args: &[String],
    env: &[(&str, &str)],
) -> std::io::Result<Option<Value>> {
    let mut all = serde_json::Map::new();
    for (k, v) in std::env::vars_os() {
        let (Ok(k), Ok(v)) = (k.into_string(), v.into_string()) else {
            return Ok(None);
        };
        all.insert(k, Value::String(v));
    }
    for (k, v) in env {
        all.insert((*k).to_owned(), Value::String((*v).to_owned()));
    }
    let Some(cwd) = std::env::current_dir()?.to_str().map(str::to_owned) else {
        return Ok(None);
    };
    Ok(Some(
        json!({ "python": python, "args": args, "cwd": cwd, "env": all }),
    ))
}

fn fork(socket: &Path, launch: Launch<'_>) -> std::io::Result<Option<Started>> {
    let Some(mut request) = base_request(launch.python, launch.args, launch.env)? else {
        return Ok(None);
    };
    match launch.program {
        Program::Code(code) => request["script"] = json!(code),
        Program::File(file) => match file.to_str() {
            Some(f) => request["file"] = json!(f),
            None => return Ok(None),
        },
    }
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let child_ends = [
        stdin_r.as_raw_fd(),
        stdout_w.as_raw_fd(),
        stderr_w.as_raw_fd(),
    ];
    let forked = send(socket, &request.to_string(), &child_ends)?;
    // The child's ends now live in the child (or nowhere); ours would keep its stdout from
    // ever reaching its end.
    drop((stdin_r, stdout_w, stderr_w));
    Ok(forked.map(|child| Started {
        process: HelperProcess::Forked(child),
        stdin: File::from(stdin_w),
        stdout: File::from(stdout_r),
        stderr: File::from(stderr_r),
    }))
}

/// A long-running Python server (vLLM's) to fork rather than start: `script` run as
/// `python -c` would, in a process group of its own, with `path_first` first on its module
/// path and its stdout and stderr the files given, forked from a server of `python` that
/// imported `preload` already (started on the first such request).
pub(crate) struct ServerFork<'a> {
    pub python: &'a str,
    pub script: &'a str,
    pub args: &'a [String],
    pub env: &'a [(&'a str, &'a str)],
    pub path_first: &'a [&'a str],
    pub preload: &'a [&'a str],
    pub stdout: &'a File,
    pub stderr: &'a File,
}

/// Forks `server` through the fork server at `socket`: the child and the write end of its
/// stdin; `None` where the server declined (the caller starts the process itself).
pub(crate) fn fork_server_process(
    socket: &Path,
    server: &ServerFork<'_>,
) -> std::io::Result<Option<(ForkedChild, File)>> {
    let Some(mut request) = base_request(server.python, server.args, server.env)? else {
        return Ok(None);
    };
    request["script"] = json!(server.script);
    request["path_first"] = json!(server.path_first);
    request["preload"] = json!(server.preload);
    request["own_group"] = json!(true);
    let (stdin_r, stdin_w) = pipe()?;
    let child_ends = [
        stdin_r.as_raw_fd(),
        server.stdout.as_raw_fd(),
        server.stderr.as_raw_fd(),
    ];
    let forked = send(socket, &request.to_string(), &child_ends)?;
    drop(stdin_r);
    Ok(forked.map(|child| (child, File::from(stdin_w))))
}

/// Sends `request` with the child's three standard streams and follows one redirect (the
/// first server may hand the request to one of its own: another start-up environment or
/// interpreter): the forked child; `None` when declined.
fn send(
    socket: &Path,
    request: &str,
    child_ends: &[RawFd],
) -> std::io::Result<Option<ForkedChild>> {
    let mut target = socket.to_path_buf();
    for _ in 0..2 {
        let (conn, reply) = send_request(&target, request.as_bytes(), child_ends)?;
        if let Some(sub) = reply.get("redirect").and_then(Value::as_str) {
            target = PathBuf::from(sub);
            wait_for(&target)?;
            continue;
        }
        if reply.get("declined").is_some() {
            return Ok(None);
        }
        let Some(pid) = reply
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
        else {
            return Err(std::io::Error::other(format!("unexpected reply {reply}")));
        };
        return Ok(Some(ForkedChild {
            pid,
            conn,
            status: None,
        }));
    }
    Err(std::io::Error::other("redirected more than once"))
}

/// Sends the request with the child's pipe ends to the server at `socket`; the connection
/// and the first reply.
fn send_request(
    socket: &Path,
    request: &[u8],
    child_ends: &[RawFd],
) -> std::io::Result<(BufReader<UnixStream>, Value)> {
    let mut conn = UnixStream::connect(socket)?;
    conn.set_read_timeout(Some(REPLY_TIMEOUT))?;
    send_with_fds(&conn, &(request.len() as u64).to_le_bytes(), child_ends)?;
    conn.write_all(request)?;
    let mut conn = BufReader::new(conn);
    let reply = read_reply(&mut conn)?;
    Ok((conn, reply))
}

/// Waits (a bounded time) for a server that is starting to listen at `socket`.
fn wait_for(socket: &Path) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + REPLY_TIMEOUT;
    while !socket.exists() {
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "{} did not come up",
                socket.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn read_reply(replies: &mut BufReader<UnixStream>) -> std::io::Result<Value> {
    let mut line = String::new();
    if replies.read_line(&mut line)? == 0 {
        return Err(std::io::Error::other("it closed the connection"));
    }
    serde_json::from_str(&line)
        .map_err(|e| std::io::Error::other(format!("a reply that is not JSON ({e}): {line:?}")))
}

/// A pipe whose ends close on exec (so no other process this one starts inherits them).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS): the server receives copies of them.
fn send_with_fds(conn: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    let fd_len = u32::try_from(fd_bytes).map_err(std::io::Error::other)?;
    // SAFETY: CMSG_SPACE / CMSG_LEN only compute sizes.
    let (space, len) = unsafe { (libc::CMSG_SPACE(fd_len), libc::CMSG_LEN(fd_len)) };
    // u64 words keep the control buffer aligned for `cmsghdr`.
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: a zeroed msghdr is valid (null pointers, zero lengths); the fields set below
    // point at `iov` and `control`, which outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `control` holds CMSG_SPACE(fd_len) bytes, room for one header and the fds;
    // CMSG_FIRSTHDR of a msghdr with that buffer is non-null and points into it.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = len as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), fd_bytes);
        libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    match usize::try_from(sent) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(std::io::Error::other(format!(
            "sent {n} of the header's {} bytes",
            bytes.len()
        ))),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

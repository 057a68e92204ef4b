//! A zygote for the test binaries' rank processes.
//!
//! A rank process re-executed from a test binary spends about 0.3 s of CPU before its test
//! starts (libtorch registering its operators, the dynamic linker resolving its symbols), and
//! the distributed tests start hundreds. The zygote is this test binary started once, which
//! stops before `main` (a constructor: libtorch is loaded and initialised by then, nothing has
//! run) and forks each rank from that state: a rank then costs a fork.
//!
//! The rank runs its test function, which finds itself a rank (`is_rank`) as a re-executed
//! one does. The function travels as its offset from [`anchor`]: the zygote is the same
//! executable (checked by device and inode; another build answers `mismatch` and the ranks
//! are re-executed), so the offset names the same function there.
//!
//! Protocol (one Unix connection per launch, lines): the test sends
//! `OFFSET WORLD MASTER_PORT DEV INO`, then `KEY=VALUE` environment lines and an empty line;
//! the zygote forks a handler that forks the ranks (torchrun's variables as `LocalLauncher`
//! sets them, `parallel::dist::rank_env`) and answers `pid RANK PID` for each, then `exit RANK CODE` (`signal RANK N`) as they
//! end. The test kills ranks itself on failure or timeout. The zygote ends when the test
//! binary does (its stdin, a pipe from the test process, closes).
//!
//! `VERLC_TEST_ZYGOTE=0` in the tests' environment turns it off (ranks are re-executed).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Set (to its socket's path) only in the zygote's own environment.
const SOCKET_ENV: &str = "VERLC_TEST_ZYGOTE_SOCKET";
/// `0` in the tests' environment: no zygote.
const SWITCH_ENV: &str = "VERLC_TEST_ZYGOTE";
/// Where the ranks meet (`LocalLauncher`'s default).
const MASTER_ADDR: &str = "127.0.0.1";

/// Runs in every process of a test binary before `main`; only a process started as the
/// zygote stays in it (and never reaches `main`).
#[used]
#[unsafe(link_section = ".init_array")]
static START_IF_ZYGOTE: extern "C" fn() = start_if_zygote;

extern "C" fn start_if_zygote() {
    let Some(path) = std::env::var_os(SOCKET_ENV) else {
        return;
    };
    // SAFETY: before main, one thread; the ranks and whatever they start must not be zygotes.
    // Rust's runtime ignores SIGPIPE before `main` (a write to a closed pipe is then an
    // error, not the process's death); the ranks never pass through it, so it is done here.
    unsafe {
        std::env::remove_var(SOCKET_ENV);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let served = std::panic::catch_unwind(|| serve(Path::new(&path)));
    // SAFETY: ends the zygote (it never returns to the constructor's caller).
    unsafe { libc::_exit(if served.is_ok() { 0 } else { 101 }) }
}

/// The address functions are sent relative to.
fn anchor() {}

/// The executable's identity, as `/proc/self/exe` maps it (the inode even if the file was
/// replaced since).
fn exe_identity() -> Option<(u64, u64)> {
    std::fs::metadata("/proc/self/exe")
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn serve(path: &Path) {
    // Bound under another name and renamed once listening: whoever sees `path` can connect.
    let binding = path.with_extension("binding");
    let Ok(listener) = UnixListener::bind(&binding) else {
        return;
    };
    if std::fs::rename(&binding, path).is_err() {
        return;
    }
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        reap_handlers();
        if n < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            return; // the test binary ended (its end of our stdin closed)
        }
        if fds[0].revents == 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        // SAFETY: one thread here; the child only handles this connection and exits.
        match unsafe { libc::fork() } {
            0 => {
                drop(listener);
                let code = i32::from(std::panic::catch_unwind(|| handle(conn)).is_err());
                // SAFETY: the handler's work is done; nothing of it needs destructors.
                unsafe { libc::_exit(code) }
            }
            _ => drop(conn),
        }
    }
}

fn reap_handlers() {
    // SAFETY: reaps finished children of this single-threaded process.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// In a handler: fork the ranks of one launch and report them.
fn handle(conn: UnixStream) {
    let Ok(reader) = conn.try_clone() else { return };
    let mut lines = BufReader::new(reader).lines();
    let Some(Ok(head)) = lines.next() else { return };
    let head: Vec<u64> = head.split(' ').filter_map(|w| w.parse().ok()).collect();
    let &[offset, world, port, dev, ino] = head.as_slice() else {
        return;
    };
    let (Ok(offset), Ok(world), Ok(port)) = (
        usize::try_from(offset),
        usize::try_from(world),
        u16::try_from(port),
    ) else {
        return;
    };
    if exe_identity() != Some((dev, ino)) {
        // Another build of the test binary: the offset would name something else here.
        let _ = writeln!(&conn, "mismatch");
        return;
    }
    let mut env = Vec::new();
    for line in lines.by_ref() {
        let Ok(line) = line else { return };
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once('=') {
            env.push((k.to_owned(), v.to_owned()));
        }
    }
    let mut out = conn;
    let mut pids = Vec::with_capacity(world);
    for rank in 0..world {
        // SAFETY: the handler is single-threaded; the child runs the rank and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // The launch's connection is the handler's alone: a rank holding it would keep the
            // test from seeing the handler end.
            drop(lines);
            drop(out);
            run_rank(offset, rank, world, port, &env);
        }
        if pid < 0 || writeln!(out, "pid {rank} {pid}").is_err() {
            for &p in &pids {
                // SAFETY: our own children.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            return;
        }
        pids.push(pid);
    }
    for _ in 0..world {
        let mut status = 0;
        // SAFETY: waits for one of this handler's children.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        let Some(rank) = pids.iter().position(|&p| p == pid) else {
            return;
        };
        let line = if libc::WIFEXITED(status) {
            format!("exit {rank} {}", libc::WEXITSTATUS(status))
        } else {
            format!("signal {rank} {}", libc::WTERMSIG(status))
        };
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
}

/// In a forked rank: its environment, then its test function (which ends the process).
fn run_rank(offset: usize, rank: usize, world: usize, port: u16, env: &[(String, String)]) -> ! {
    let torchrun = verlc_runtime::parallel::dist::rank_env(rank, world, MASTER_ADDR, port);
    // SAFETY: one thread (just forked); the rank's environment as the launcher sets it.
    unsafe {
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        for (k, v) in torchrun {
            std::env::set_var(k, v);
        }
    }
    let address = (anchor as fn() as usize).wrapping_add(offset);
    // SAFETY: the test process sent this function's offset from `anchor` in the same
    // executable (the zygote checked its identity before starting), so the address is a
    // `fn()` of this binary.
    let entry: fn() = unsafe { std::mem::transmute::<usize, fn()>(address) };
    let code = match std::panic::catch_unwind(entry) {
        Ok(()) => 0,
        Err(_) => 101, // the panic hook printed it, as libtest's child would have
    };
    verlc_runtime::process_exit::exit_skipping_destructors(code)
}

/// The running zygote of this test process: its socket, and the process (its stdin held
/// open for the test process's life).
struct Zygote {
    socket: PathBuf,
    child: Child,
}

static ZYGOTE: OnceLock<Option<Mutex<Zygote>>> = OnceLock::new();

fn zygote() -> Option<&'static Mutex<Zygote>> {
    ZYGOTE.get_or_init(start).as_ref()
}

/// At the test process's exit: close the zygote's stdin and wait for it, so that its CPU and
/// its ranks' count as this process's (a test runner's rusage sees them).
extern "C" fn wait_for_zygote() {
    if let Some(Some(zygote)) = ZYGOTE.get()
        && let Ok(mut z) = zygote.lock()
    {
        drop(z.child.stdin.take());
        let _ = z.child.wait();
        if let Some(dir) = z.socket.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn start() -> Option<Mutex<Zygote>> {
    if std::env::var_os(SWITCH_ENV).is_some_and(|v| v == "0") {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let dir = std::env::temp_dir().join(format!("verlc-zygote-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let socket = dir.join("sock");
    let _ = std::fs::remove_file(&socket);
    let child = Command::new(&exe)
        .env(SOCKET_ENV, &socket)
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if Instant::now() > deadline {
            eprintln!("zygote: did not start; ranks are re-executed");
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: registers a plain function to run at exit.
    unsafe { libc::atexit(wait_for_zygote) };
    Some(Mutex::new(Zygote { socket, child }))
}

/// Runs test function `entry` (whose libtest filter is `filter`) as `world` ranks forked by
/// the zygote, with `env`; `None` when there is no zygote (the caller re-executes the ranks).
/// `Some(Err)` names the first rank that failed or the timeout; the others are killed.
pub fn launch(
    entry: fn(),
    filter: &str,
    world: usize,
    env: &[(&str, String)],
    timeout: Duration,
) -> Option<Result<(), String>> {
    // The protocol is lines of KEY=VALUE: anything else is re-executed.
    if env
        .iter()
        .any(|(k, v)| k.contains(['=', '\n']) || v.contains('\n'))
    {
        return None;
    }
    let zygote = zygote()?;
    let socket = zygote.lock().ok()?.socket.clone();
    let (dev, ino) = exe_identity()?;
    let port = verlc_runtime::parallel::dist::free_port(MASTER_ADDR).ok()?;
    let mut conn = UnixStream::connect(&socket).ok()?;
    let offset = (entry as usize).wrapping_sub(anchor as fn() as usize);
    let mut request = format!("{offset} {world} {port} {dev} {ino}\n");
    let fixed = [
        ("VERLC_TEST_RANK_BODY", filter.to_owned()),
        ("OMP_NUM_THREADS", "1".to_owned()),
    ];
    for (k, v) in fixed
        .iter()
        .map(|(k, v)| (*k, v))
        .chain(env.iter().map(|(k, v)| (*k, v)))
    {
        request.push_str(&format!("{k}={v}\n"));
    }
    request.push('\n');
    conn.write_all(request.as_bytes()).ok()?;
    let started = Instant::now();
    let mut pids = vec![0i32; world];
    let mut ended = 0;
    let reader = conn.try_clone().ok()?;
    let mut lines = BufReader::new(reader).lines();
    let kill_all = |pids: &[i32]| {
        for &p in pids.iter().filter(|&&p| p > 0) {
            // SAFETY: signals the ranks this launch started and has not heard end (the
            // handler reports a rank's end after reaping it, and only then is its pid free).
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    };
    while ended < world {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            kill_all(&pids);
            return Some(Err(format!(
                "{filter}: ranks timed out after {timeout:?}, killed"
            )));
        }
        let line = match lines.next() {
            Some(Ok(line)) if line == "mismatch" => return None,
            Some(Ok(line)) => line,
            Some(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                kill_all(&pids);
                return Some(Err(format!(
                    "{filter}: ranks timed out after {timeout:?}, killed"
                )));
            }
            other => {
                kill_all(&pids);
                return Some(Err(format!(
                    "{filter}: the zygote's handler ended: {other:?}"
                )));
            }
        };
        let words: Vec<&str> = line.split(' ').collect();
        let (Some(kind), Some(rank), Some(value)) = (
            words.first(),
            words.get(1).and_then(|r| r.parse::<usize>().ok()),
            words.get(2).and_then(|v| v.parse::<i32>().ok()),
        ) else {
            continue;
        };
        match *kind {
            "pid" if rank < world => pids[rank] = value,
            "exit" if value == 0 => {
                ended += 1;
                if rank < world {
                    pids[rank] = 0;
                }
            }
            _ => {
                // Reaped already: its pid may be another process's by now.
                if rank < world {
                    pids[rank] = 0;
                }
                kill_all(&pids);
                return Some(Err(format!("{filter}: rank {rank} failed ({line})")));
            }
        }
    }
    Some(Ok(()))
}

//! Helpers started through a real fork server (`fork_server.py` on the project's Python)
//! behave as helpers started directly: arguments, working directory, environment, replies,
//! exit status and stderr, kills of a stuck helper and the processes under it; and requests
//! the server declines, or a server that is not there, start the helper directly.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{JsonLinesProcess, ProcError, default_python, run_file_with_fork_server};

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/pyproc/fork_server.py");

/// A fork server in its own directory, stopped (SIGTERM) when dropped.
struct Server {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Server {
    /// Preloads only `json`: what is under test is the forking, not the imports.
    fn start(name: &str) -> Server {
        Server::start_with(name, &[])
    }

    /// With `env` set in the server's environment (the helpers' callers do not have it).
    fn start_with(name: &str, env: &[(&str, &str)]) -> Server {
        let dir = std::env::temp_dir().join(format!("verlc-fork-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("s");
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(default_python())
            .args(["-u", SERVER])
            .arg(&socket)
            .arg("json")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "no server: {}",
                Server::log_of(&dir)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, dir, socket }
    }

    fn log_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("log")).unwrap_or_default()
    }

    fn log(&self) -> String {
        Server::log_of(&self.dir)
    }

    fn spawn(&self, python: &str, script: &str, args: &[String]) -> JsonLinesProcess {
        JsonLinesProcess::spawn_with_fork_server(python, script, args, "t", Some(&self.socket))
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: sends a signal; no memory is touched.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An executable script at `path` that runs the project's Python, with `packages` first on
/// `PYTHONPATH` when given (as `.venv/bin/python-vllm` does): another interpreter path.
fn write_wrapper(path: &Path, packages: Option<&Path>) {
    let path_var = packages
        .map(|p| {
            format!(
                "PYTHONPATH=\"{}${{PYTHONPATH:+:$PYTHONPATH}}\" ",
                p.display()
            )
        })
        .unwrap_or_default();
    let text = format!("#!/bin/sh\n{path_var}exec {} \"$@\"\n", default_python());
    std::fs::write(path, text).unwrap();
    let mut perms = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms).unwrap();
}

const SECOND: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(60);

/// Replies to its first request with what a `python -u -c` process sees of itself.
const INTROSPECT: &str = r#"
import os, sys
send = protocol_sender()
req = __import__("json").loads(sys.stdin.readline())
send({
    "echo": req, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
    "name": __name__, "path_var": os.environ.get("PATH"), "pid": os.getpid(),
    "ppid": os.getppid(),
})
"#;

fn introspect(p: &mut JsonLinesProcess) -> serde_json::Map<String, Value> {
    p.request(&json!({"x": [1, 2]}), LONG, "introspecting")
        .unwrap()
}

fn alive(pid: u64) -> bool {
    // A zombie has exited; only its parent's reaping is left.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

fn gone_within(pid: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_forked_helper_sees_what_python_c_would() {
    let server = Server::start("introspect");
    let args = vec!["first".to_owned(), "sec ond".to_owned()];
    let mut p = server.spawn(&default_python(), INTROSPECT, &args);
    let mut direct =
        JsonLinesProcess::spawn_with_fork_server(&default_python(), INTROSPECT, &args, "t", None)
            .unwrap();
    let (forked, plain) = (introspect(&mut p), introspect(&mut direct));
    assert!(server.log().contains("forked"), "{}", server.log());
    assert_eq!(
        forked["ppid"],
        json!(server.child.id()),
        "forked by the server"
    );
    for key in ["echo", "argv", "cwd", "path0", "name", "path_var"] {
        assert_eq!(forked[key], plain[key], "{key}");
    }
    assert_eq!(forked["argv"], json!(["-c", "first", "sec ond"]));
    assert_eq!(forked["name"], json!("__main__"));
}

#[test]
fn a_forked_helpers_exit_status_and_stderr_reach_the_caller() {
    let server = Server::start("exit");
    let mut p = server.spawn(
        &default_python(),
        "import sys\nprint('it went wrong', file=sys.stderr)\nsys.exit(3)\n",
        &[],
    );
    let err = p.read(LONG, "waiting").unwrap_err();
    let ProcError::Exited { status, tail, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(status, "exit status: 3");
    assert!(tail.contains("it went wrong"), "{tail}");

    let mut p = server.spawn(&default_python(), "raise ValueError('no good')\n", &[]);
    let err = p.read(LONG, "waiting").unwrap_err().to_string();
    assert!(err.contains("exit status: 1"), "{err}");
    assert!(err.contains("ValueError: no good"), "{err}");
}

#[test]
fn a_stuck_forked_helper_is_killed_with_the_processes_under_it() {
    let server = Server::start("stuck");
    let script = r#"
import subprocess, time
send = protocol_sender()
sleeper = subprocess.Popen(["sleep", "300"])
send({"sleeper": sleeper.pid})
time.sleep(300)
"#;
    let mut p = server.spawn(&default_python(), script, &[]);
    let helper = p.process.id() as u64;
    let sleeper = p
        .read(LONG, "starting")
        .unwrap()
        .get("sleeper")
        .and_then(Value::as_u64)
        .unwrap();
    let err = p.read(SECOND, "the stuck call").unwrap_err();
    assert!(matches!(err, ProcError::Timeout { .. }), "{err}");
    assert!(gone_within(helper, LONG), "helper {helper} still runs");
    assert!(gone_within(sleeper, LONG), "its child {sleeper} still runs");
    assert_eq!(p.process.wait().unwrap().to_string(), "signal: 9 (SIGKILL)");
    // Every later request fails with the first reason.
    let later = p.request(&json!({}), SECOND, "later").unwrap_err();
    assert!(matches!(later, ProcError::Dead(_)), "{later}");
}

#[test]
fn a_stopped_server_takes_its_helpers_with_it() {
    let server = Server::start("shutdown");
    let mut p = server.spawn(
        &default_python(),
        "import time\nsend = protocol_sender()\nsend({})\ntime.sleep(300)\n",
        &[],
    );
    p.read(LONG, "starting").unwrap();
    let helper = p.process.id() as u64;
    drop(server);
    assert!(
        gone_within(helper, LONG),
        "helper {helper} outlived its server"
    );
    let err = p.read(LONG, "after the server stopped").unwrap_err();
    assert!(matches!(err, ProcError::Exited { .. }), "{err}");
}

#[test]
fn declined_or_unreachable_servers_leave_helpers_to_start_directly() {
    let server = Server::start("declined");
    // Another interpreter path (a wrapper script of the same Python): the server declines.
    let wrapper = server.dir.join("python-wrapper");
    write_wrapper(&wrapper, None);
    let mut p = server.spawn(&wrapper.display().to_string(), INTROSPECT, &[]);
    let reply = introspect(&mut p);
    assert_ne!(reply["ppid"], json!(server.child.id()));
    assert!(
        server.log().contains("declined: another interpreter"),
        "{}",
        server.log()
    );

    let nowhere = server.dir.join("no-such-socket");
    let mut p = JsonLinesProcess::spawn_with_fork_server(
        &default_python(),
        INTROSPECT,
        &[],
        "t",
        Some(&nowhere),
    )
    .unwrap();
    assert_eq!(introspect(&mut p)["ppid"], json!(std::process::id()));
}

#[test]
fn another_start_up_environment_is_forked_by_a_server_started_with_it() {
    // The server's environment has a variable the Hub client reads as it is imported; the
    // callers' has not: a second server, started with the callers' environment, forks.
    let server = Server::start_with("redirect", &[("HF_HUB_OFFLINE", "1")]);
    let script = r#"
import os
send = protocol_sender()
send({"offline": os.environ.get("HF_HUB_OFFLINE"), "ppid": os.getppid()})
import time
time.sleep(300)
"#;
    let mut first = server.spawn(&default_python(), script, &[]);
    let reply = first.read(LONG, "starting").unwrap();
    assert_eq!(reply["offline"], Value::Null);
    let sub = reply["ppid"].as_u64().unwrap();
    assert_ne!(sub, u64::from(server.child.id()));
    let cmdline = std::fs::read(format!("/proc/{sub}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("--no-redirect"),
        "{}",
        server.log()
    );
    assert!(
        server
            .log()
            .contains("for the different start-up environment: HF_HUB_OFFLINE"),
        "{}",
        server.log()
    );
    // The next request of that environment goes to the same server.
    let mut second = server.spawn(&default_python(), script, &[]);
    assert_eq!(second.read(LONG, "starting").unwrap()["ppid"], json!(sub));
    let helpers = [first.process.id() as u64, second.process.id() as u64];
    let log = server.log();
    drop(server);
    for pid in [sub, helpers[0], helpers[1]] {
        if !gone_within(pid, LONG) {
            let proc = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
            panic!(
                "{pid} (sub-server {sub}, helpers {helpers:?}) outlived the first server: \
                 {:?}\n{:?}\nthe server's log before it stopped:\n{}",
                proc("cmdline"),
                proc("status"),
                log
            );
        }
    }
}

#[test]
fn a_forked_script_file_runs_as_python_file_would() {
    let server = Server::start("file");
    let dir = server.dir.join("scripts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sibling.py"),
        "VALUE = 'imported beside the script'\n",
    )
    .unwrap();
    let file = dir.join("oracle.py");
    std::fs::write(
        &file,
        r#"
import json, os, sys
import sibling
print(json.dumps({
    "argv": sys.argv, "file": __file__, "path0": sys.path[0], "name": __name__,
    "sibling": sibling.VALUE, "extra": os.environ.get("VERLC_TEST_EXTRA"),
    "stdin": sys.stdin.read(), "ppid": os.getppid(),
}))
print("to stderr", file=sys.stderr)
sys.exit(5)
"#,
    )
    .unwrap();
    let args = vec!["cmd".to_owned(), "out dir".to_owned()];
    let env = [("VERLC_TEST_EXTRA", "set for this run")];
    let run = |server: Option<&Path>| {
        let out = run_file_with_fork_server(&default_python(), &file, &args, &env, server).unwrap();
        let mut seen: serde_json::Map<String, Value> = serde_json::from_slice(&out.stdout).unwrap();
        let ppid = seen.remove("ppid").unwrap();
        (
            out.status.code(),
            seen,
            String::from_utf8(out.stderr).unwrap(),
            ppid,
        )
    };
    let forked = run(Some(&server.socket));
    let direct = run(None);
    assert_eq!(forked.3, json!(server.child.id()), "{}", server.log());
    assert_eq!(direct.3, json!(std::process::id()));
    assert_eq!(forked.0, Some(5));
    assert_eq!(
        (&forked.0, &forked.1, &forked.2),
        (&direct.0, &direct.1, &direct.2)
    );
    assert_eq!(forked.1["sibling"], json!("imported beside the script"));
    assert_eq!(forked.1["extra"], json!("set for this run"));
}

/// A server process (vLLM's API server, in the trainer) forked from an interpreter of another
/// path (a wrapper that puts its packages on `PYTHONPATH`) with the requested modules imported
/// once: the child leads its own process group, writes to the files given, finds the
/// `path_first` directory first and the wrapper's packages still on its path (for the
/// processes it spawns too), and ends when its stdin closes; a second one is forked from the
/// same interpreter.
#[test]
fn a_server_process_is_forked_from_its_interpreter_with_its_modules_imported() {
    use super::fork_client::{ServerFork, fork_server_process};

    let server = Server::start("servers");
    let wrapped = server.dir.join("wrapped");
    let extension = server.dir.join("extension");
    std::fs::create_dir_all(&wrapped).unwrap();
    std::fs::create_dir_all(&extension).unwrap();
    std::fs::write(
        wrapped.join("preloaded_mod.py"),
        "import os\nPID = os.getpid()\n",
    )
    .unwrap();
    std::fs::write(
        extension.join("ext_mod.py"),
        "VALUE = 'from the extension'\n",
    )
    .unwrap();
    let wrapper = server.dir.join("python-wrapped");
    write_wrapper(&wrapper, Some(&wrapped));
    let script = r#"
import json, os, sys
import preloaded_mod, ext_mod
print(json.dumps({
    "imported_by": preloaded_mod.PID, "pid": os.getpid(), "pgrp": os.getpgrp(),
    "argv": sys.argv, "pythonpath": os.environ.get("PYTHONPATH"), "ext": ext_mod.VALUE,
    "extra": os.environ.get("VERLC_TEST_EXTRA"),
}), flush=True)
sys.stdin.buffer.read()
sys.exit(3)
"#;
    let (python, extension_dir) = (
        wrapper.display().to_string(),
        extension.display().to_string(),
    );
    let start = |n: usize| {
        let out = server.dir.join(format!("out{n}"));
        let file = std::fs::File::create(&out).unwrap();
        let request = ServerFork {
            python: &python,
            script,
            args: &["a b".to_owned()],
            env: &[("VERLC_TEST_EXTRA", "set for the server")],
            path_first: &[extension_dir.as_str()],
            preload: &["preloaded_mod"],
            stdout: &file,
            stderr: &file,
        };
        let (child, stdin) = fork_server_process(&server.socket, &request)
            .unwrap()
            .unwrap_or_else(|| panic!("declined: {}", server.log()));
        let deadline = Instant::now() + LONG;
        let seen: Value = loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.starts_with('{')) {
                break serde_json::from_str(line).unwrap();
            }
            assert!(Instant::now() < deadline, "{text}\n{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        (child, stdin, seen)
    };
    let (mut child, stdin, seen) = start(1);
    assert_eq!(seen["pid"], json!(child.pid()));
    assert_eq!(seen["pgrp"], json!(child.pid()), "its own process group");
    assert_ne!(seen["imported_by"], seen["pid"], "imported before the fork");
    assert_eq!(seen["argv"], json!(["-c", "a b"]));
    assert_eq!(seen["ext"], json!("from the extension"));
    assert_eq!(seen["extra"], json!("set for the server"));
    let path = seen["pythonpath"].as_str().unwrap().to_owned();
    assert!(path.starts_with(&extension_dir), "{path}");
    assert!(path.contains(&wrapped.display().to_string()), "{path}");
    assert!(
        server.log().contains("with preloaded_mod imported"),
        "{}",
        server.log()
    );
    assert!(child.try_wait().is_none(), "ended early");
    // A second server comes from the same interpreter.
    let (mut second, second_stdin, again) = start(2);
    assert_eq!(again["imported_by"], seen["imported_by"]);
    // Its stdin closed (the trainer gone), the server ends with its status.
    drop(stdin);
    assert_eq!(child.wait().unwrap().code(), Some(3));
    assert!(matches!(child.try_wait(), Some(Ok(s)) if s.code() == Some(3)));
    drop(second_stdin);
    assert_eq!(second.wait().unwrap().code(), Some(3));
}

/// A process so forked (vLLM's API server) has the processes it starts through
/// multiprocessing's interface forked by the same server (`forked_engine.py`, vLLM's engine
/// processes): in its process group, with their exit codes, `terminate`, `join` and sentinels
/// as multiprocessing's processes have them.
#[test]
fn a_forked_server_has_its_processes_forked_as_multiprocessing_would_start_them() {
    use super::fork_client::{ServerFork, fork_server_process};

    let server = Server::start("calls");
    let extension = server.dir.join("extension");
    std::fs::create_dir_all(&extension).unwrap();
    std::fs::write(
        extension.join("forked_engine.py"),
        include_str!("../rollout/vllm/forked_engine.py"),
    )
    .unwrap();
    let wrapper = server.dir.join("python-wrapped");
    write_wrapper(&wrapper, None);
    let script = r#"
import json, multiprocessing, os, time
from multiprocessing import connection
import forked_engine
context = forked_engine.Context(multiprocessing.get_context("spawn"))
exits = context.Process(target=os._exit, args=(3,), name="exits")
exits.start()
connection.wait([exits.sentinel], timeout=60)
sleeps = context.Process(target=time.sleep, args=(300,))
sleeps.start()
with open(f"/proc/{sleeps.pid}/stat") as f:
    group = int(f.read().rsplit(")", 1)[1].split()[2])
alive = sleeps.is_alive()
sleeps.terminate()
sleeps.join(60)
print(json.dumps({
    "exit": exits.exitcode, "name": exits.name, "pids": [exits.pid, sleeps.pid],
    "me": os.getpid(), "group": group, "my_group": os.getpgrp(), "alive": alive,
    "terminated": sleeps.exitcode, "after": sleeps.is_alive(),
    "queue": type(context.Queue()).__name__,
}), flush=True)
"#;
    let out = server.dir.join("out");
    let file = std::fs::File::create(&out).unwrap();
    let python = wrapper.display().to_string();
    let extension_dir = extension.display().to_string();
    let request = ServerFork {
        python: &python,
        script,
        args: &[],
        env: &[],
        path_first: &[extension_dir.as_str()],
        preload: &["json"],
        stdout: &file,
        stderr: &file,
    };
    let (mut child, _stdin) = fork_server_process(&server.socket, &request)
        .unwrap()
        .unwrap_or_else(|| panic!("declined: {}", server.log()));
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(status.success(), "{status}: {text}\n{}", server.log());
    let seen: Value = serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(seen["exit"], json!(3));
    assert_eq!(seen["name"], json!("exits"));
    assert_eq!(seen["alive"], json!(true));
    assert_eq!(seen["terminated"], json!(-15));
    assert_eq!(seen["after"], json!(false));
    assert_eq!(
        seen["group"], seen["my_group"],
        "in the caller's process group"
    );
    assert_eq!(seen["my_group"], seen["me"]);
    assert_eq!(seen["queue"], json!("Queue"));
    for pid in seen["pids"].as_array().unwrap() {
        let pid = pid.as_u64().unwrap();
        assert_ne!(pid, seen["me"].as_u64().unwrap());
        // Forked by the server, not by the caller.
        assert!(
            server.log().contains(&format!("forked {pid}")),
            "{pid}: {}",
            server.log()
        );
    }
}

# verlc's fork server for Python helpers (runtime/src/pyproc/fork_client.rs is the other end).
#
#   python -u fork_server.py [--no-redirect [--python AS]] SOCKET_PATH [MODULE...]
#
# Imports MODULEs once (default: PRELOAD, what verl's classes import: seconds of CPU per
# interpreter), listens on a Unix socket, and for each connection forks a child that runs one
# helper script as `python -u -c SCRIPT ARGS...` would, on the three pipe ends the client
# passed (SCM_RIGHTS).
# A test suite starts dozens of helpers; each then costs a fork instead of those imports.
#
# Protocol, one connection per helper:
#   client -> server  one message: 8-byte little-endian length N, with the helper's stdin,
#                     stdout and stderr as ancillary fds; then N bytes of JSON
#                     {"python", "script" (run as `-c`) or "file" (run as a script file),
#                     "args", "cwd", "env"}, and optionally "preload" (modules: a request for
#                     another interpreter with them goes to a server of that interpreter
#                     which imported them), "path_first" (directories put first on the
#                     child's module path and `PYTHONPATH`, after the fork, so that they
#                     need no server of their own) and "own_group" (the child leads a new
#                     process group, as a server that stops its group's processes expects).
#                     A server started for "preload" also takes {"call" (a base64 pickle of
#                     (function, args, kwargs), which the child calls), "sys_path", "cwd",
#                     "env", "pgid" (the process group the child joins)} from the processes
#                     it forked:
#                     vLLM's API server has its engine process forked so (forked_engine.py in
#                     runtime/src/rollout/vllm); it finds this server in
#                     VERLC_PYTHON_FORK_PARENT.
#   server -> client  {"pid": PID} once forked; {"redirect": SOCKET_PATH}: a server of this
#                     one's started with the request's environment, which the imports would
#                     have read differently, forks it (the client sends the request there once
#                     that socket exists); or {"declined": WHY} (the client then starts the
#                     helper itself: another interpreter, or too many environments);
#                     later {"status": WAIT_STATUS} once reaped (waitpid's number).
#   client -> server  "kill\n" (or closing the connection): the child and every process under
#                     it get SIGKILL.
#
# The server is single-threaded (a selector loop), so a fork never copies a lock another
# thread holds. It reports (stderr) and exits when the imports leave threads running.

import builtins
import importlib
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import types

# Environment variables the interpreter or the preloaded modules read when they start: a
# request whose values differ goes to a server started with them. (tokenizers reads
# TOKENIZERS_PARALLELISM when it encodes, so that one may differ.)
STARTUP_PREFIXES = (
    "PYTHON",
    "LD_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "ONEDNN_",
    "DNNL_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH_",
    "CUDA",
    "VIRTUAL_ENV",
    # vLLM configures its logging as it is imported; torch._dynamo reads TORCHDYNAMO_DISABLE.
    "VLLM_",
    "TORCHDYNAMO_",
)

HEADER = struct.Struct("<Q")

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}

# Servers started for requests with other start-up environments (the smoke tests' offline Hub
# cache, for one) or interpreters with other modules imported (vLLM's), at most.
MAX_SUB_SERVERS = 6

# What the helpers' imports cost most (verl's datasets, reward managers and tools import
# them): torch, transformers with its model utilities, datasets with pandas.
PRELOAD = ["numpy", "torch", "transformers", "transformers.modeling_utils", "datasets", "pandas"]


def startup_env(env):
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def same_interpreter(python):
    import shutil

    found = python if os.sep in python else shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def read_exact(conn, n):
    chunks = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("the client closed the connection mid-request")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def send_line(conn, obj):
    conn.sendall((json.dumps(obj) + "\n").encode())


def descendants(pid):
    found, pending = [], [pid]
    while pending:
        p = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found.extend(kids)
            pending.extend(kids)
    return found


class Server:
    def __init__(self, path, modules, may_redirect, python):
        self.path, self.modules, self.may_redirect = path, modules, may_redirect
        # The interpreter requests name: a wrapper script that started this server, or this
        # server's own executable.
        self.python = python
        self.pid = os.getpid()  # a forked child is not the server
        self.subs = {}  # start-up environment -> (process, socket path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound under another name and renamed once listening: whoever sees `path` can connect.
        self.listener.bind(path + ".binding")
        self.listener.listen(64)
        os.rename(path + ".binding", path)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        # SIGCHLD wakes the selector through this pipe.
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "reap")
        self.by_pid = {}  # pid -> connection
        self.unreaped = set()
        self.labels = {}  # pid -> what it runs, for the CPU line at its reaping

    def serve(self):
        """Runs until a child is forked (then returns what it must run) or SIGTERM."""
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    run = self.accept()
                    if run is not None:
                        return run
                elif key.data == "reap":
                    self.reap()
                else:
                    self.from_client(key.fileobj, key.data)

    def accept(self):
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        fds = []
        try:
            msg, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            if len(msg) != HEADER.size or len(fds) != 3:
                raise ValueError("a request without its header and three descriptors")
            (n,) = HEADER.unpack(msg)
            req = json.loads(read_exact(conn, n))
            why = self.decline(req)
            if why is None:
                sub, why = self.redirect(req)
                if sub is not None:
                    send_line(conn, {"redirect": sub})
                    conn.close()
                    return None
            if why is not None:
                print(f"fork server: declined: {why}", file=sys.stderr)
                send_line(conn, {"declined": why})
                conn.close()
                return None
            # Blocked across the fork: a SIGTERM for the child that came before it reset its
            # handlers would run the server's (stopping every helper) or be lost.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            pid = os.fork()
            if pid == 0:
                try:
                    return self.child(conn, fds, req)
                except BaseException:
                    # Never back into the server's loop: this process is the helper.
                    import traceback

                    traceback.print_exc()
                    os._exit(127)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            # The group set on both sides of the fork, so that it is in place once the
            # client hears of the child (whoever stops that group then finds it there).
            group = pid if req.get("own_group") else req.get("pgid")
            if group is not None:
                try:
                    os.setpgid(pid, group)
                except OSError:
                    pass  # the child has set it (or will)
            print(f"fork server: forked {pid}", file=sys.stderr)
            self.labels[pid] = label(req)
            send_line(conn, {"pid": pid})
        except Exception as e:  # a broken request costs its client, never the server
            print(f"fork server: a request failed: {e!r}", file=sys.stderr)
            conn.close()
            return None
        finally:
            if os.getpid() == self.pid:
                for fd in fds:
                    os.close(fd)
        conn.setblocking(False)
        self.by_pid[pid] = conn
        self.unreaped.add(pid)
        self.selector.register(conn, selectors.EVENT_READ, pid)
        return None

    def decline(self, req):
        if "call" in req:
            if self.python is None:
                return "a call, which only a server started for preloaded modules forks"
            return None
        if self.python is not None:
            if req["python"] != self.python:
                return f"another interpreter ({req['python']}; this server runs {self.python})"
        elif not same_interpreter(req["python"]) and not (req.get("preload") and self.may_redirect):
            return f"another interpreter ({req['python']}; this server runs {sys.executable})"
        return None

    def redirect(self, req):
        """The socket of the server for the request's interpreter, preloaded modules and
        start-up environment, when it is not this one's (started here on first use); a reason
        when there cannot be one. A server this one started takes what it is sent."""
        if not self.may_redirect:
            return None, None
        mine, theirs = startup_env(os.environ), startup_env(req["env"])
        # Requests that name modules to preload (whatever their interpreter) go to a server of
        # theirs; a helper's interpreter is this one (`decline` saw to that).
        preloading = bool(req.get("preload"))
        if mine == theirs and not preloading:
            return None, None
        if preloading:
            why = f"interpreter {req['python']} with {', '.join(req['preload'])} imported"
            modules = list(req["preload"])
            python_args = ["--python", req["python"]]
        else:
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            why = "different start-up environment: " + ", ".join(keys)
            modules = self.modules
            python_args = []
        key = (req["python"] if preloading else None, tuple(modules), tuple(sorted(theirs.items())))
        if key not in self.subs:
            if len(self.subs) == MAX_SUB_SERVERS:
                return None, why
            import subprocess

            path = f"{self.path}.{len(self.subs) + 1}"
            python = req["python"] if preloading else sys.executable
            proc = subprocess.Popen(
                [python, "-u", os.path.abspath(__file__), "--no-redirect", *python_args, path, *modules],
                env=req["env"],
                stdin=subprocess.DEVNULL,
            )
            self.subs[key] = (proc, path)
            print(f"fork server: started {path} for the {why}", file=sys.stderr)
        return self.subs[key][1], None

    def child(self, conn, fds, req):
        """In the forked child: become the helper. Returns (code, globals) to run."""
        signal.set_wakeup_fd(-1)
        # The dispositions a fresh interpreter starts with.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        self.selector.close()
        for c in self.by_pid.values():
            c.close()
        conn.close()
        self.listener.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        if req.get("own_group"):
            os.setpgid(0, 0)
        elif "pgid" in req:
            os.setpgid(0, req["pgid"])
        os.chdir(req["cwd"])
        # A wrapper that started this server put its directories on PYTHONPATH: they stay.
        own_path = os.environ.get("PYTHONPATH")
        os.environ.clear()
        os.environ.update(req["env"])
        first = req.get("path_first") or []
        if first:
            rest = (own_path or req["env"].get("PYTHONPATH") or "").split(os.pathsep)
            os.environ["PYTHONPATH"] = os.pathsep.join(first + [p for p in rest if p])
        if self.python is not None and "call" not in req:
            os.environ["VERLC_PYTHON_FORK_PARENT"] = self.path
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # a fresh interpreter's global state
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        if "call" in req:
            # The caller's module path, as multiprocessing gives a spawned child its parent's.
            sys.path[:] = req.get("sys_path") or sys.path
            main.__dict__["_verlc_call"] = req["call"]
            code = "import base64, pickle\n_f, _a, _k = pickle.loads(base64.b64decode(_verlc_call))\n_f(*_a, **_k)\n"
            return compile(code, "<call>", "exec"), main.__dict__
        if "file" in req:
            # As `python FILE`: its directory first on the path (symbolic links resolved).
            path = req["file"]
            with open(path, encoding="utf-8") as f:
                source = f.read()
            sys.argv = [path, *req["args"]]
            sys.path[0] = os.path.dirname(os.path.realpath(path))
            main.__file__ = path
            return compile(source, path, "exec"), main.__dict__
        sys.argv = ["-c", *req["args"]]
        sys.path[0] = ""  # `python -c` puts the working directory first
        sys.path[1:1] = first
        return compile(req["script"], "<string>", "exec"), main.__dict__

    def from_client(self, conn, pid):
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or b"kill" in data:
            self.kill(pid)
        if not data:
            self.selector.unregister(conn)
            self.by_pid.pop(pid, None)
            conn.close()

    def kill(self, pid):
        if pid not in self.unreaped:
            return
        for p in [pid, *descendants(pid)]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def shutdown(self):
        """SIGTERM: no helper outlives the server."""
        for pid in list(self.unreaped):
            self.kill(pid)
        for proc, _ in self.subs.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in self.subs.values():
            try:
                os.waitpid(proc.pid, 0)  # its CPU then counts as this server's
            except ChildProcessError:
                pass  # reaped already
        sys.exit(0)

    def reap(self):
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.unreaped.discard(pid)
            # With what it reaped of its own children: where a test run's helper CPU goes.
            cpu = usage.ru_utime + usage.ru_stime
            print(f"fork server: helper took {cpu:.2f} CPU-s: {self.labels.pop(pid, '?')}", file=sys.stderr)
            conn = self.by_pid.pop(pid, None)
            if conn is None:
                continue
            try:
                conn.setblocking(True)
                send_line(conn, {"status": status})
            except OSError:
                pass
            self.selector.unregister(conn)
            conn.close()


def label(req):
    """A short name of what a request runs: its script file, or its inline script's first
    line that is not an import, and its first arguments. Never raises (it only names)."""
    try:
        return describe(req)
    except Exception:
        return "?"


def describe(req):
    if "call" in req:
        what = "a process forked for a forked server's child"
    elif "file" in req:
        what = os.path.basename(req["file"])
    else:
        lines = [l.strip() for l in str(req.get("script", "")).splitlines()]
        lines = [l for l in lines if l and not l.startswith(("import ", "from ", "#"))]
        what = (lines[0] if lines else "-c")[:60]
    args = " ".join(os.path.basename(str(a)) for a in req.get("args", [])[:3])
    return f"{what} {args}".strip()


def threads():
    return len(os.listdir("/proc/self/task"))


def main():
    args = sys.argv[1:]
    may_redirect = args[:1] != ["--no-redirect"]
    if not may_redirect:
        args = args[1:]
    python = None
    if args[:1] == ["--python"]:
        python, args = args[1], args[2:]
    path, modules = args[0], args[1:] or PRELOAD
    if not isinstance(sys.stdout.buffer, io.FileIO):
        print("fork server: run it with `python -u`, as helpers run", file=sys.stderr)
        return None
    # pyarrow's jemalloc starts a background purging thread when it loads (datasets and
    # pandas import pyarrow); without it the server stays single-threaded. The children only
    # purge freed memory in the allocating thread instead.
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # a module this venv lacks is imported by the helper or not at all
            print(f"fork server: not preloading {m}: {e!r}", file=sys.stderr)
    if threads() != 1:
        print(
            f"fork server: the imports left {threads()} threads; forking would copy their locks",
            file=sys.stderr,
        )
        return None
    server = Server(path, modules, may_redirect, python)
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown())
    print("fork server: ready", file=sys.stderr, flush=True)
    return server.serve()


run = main()
if run is None:
    sys.exit(1)
del main, Server
exec(run[0], run[1])

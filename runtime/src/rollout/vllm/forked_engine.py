# vLLM's engine-core process, forked by the fork server that forked this API server (an
# interpreter that imported vLLM once) instead of spawned as a new interpreter that imports
# vLLM again (10-15 s of CPU per server start on 2 cores). The launcher (server.rs, WATCHDOG)
# installs it only where VERLC_PYTHON_FORK_PARENT names that server, which only a test run's
# fork server sets (runtime/src/pyproc/fork_server.py, the "call" request); a user's server
# spawns its engine as vLLM does.
#
# The process object is what vLLM's engine manager uses of multiprocessing's: start, pid,
# name, sentinel (readable once the process ended), exitcode, is_alive, join, terminate,
# kill. The child joins this server's process group, so stopping the group stops it as
# before; the fork server kills it when this process's connection closes.

import base64
import json
import os
import select
import signal
import socket
import struct
import sys
from multiprocessing.reduction import ForkingPickler

PARENT_VAR = "VERLC_PYTHON_FORK_PARENT"
HEADER = struct.Struct("<Q")


class ForkedProcess:
    def __init__(self, fallback, group=None, target=None, name=None, args=(), kwargs=None, daemon=None):
        self._fallback_context = fallback
        self._spec = dict(group=group, target=target, name=name, args=args, kwargs=kwargs, daemon=daemon)
        self.name = name or "ForkedProcess"
        self.daemon = daemon
        self.pid = None
        self._conn = None
        self._status = None
        self._fallback = None

    def start(self):
        try:
            spec = self._spec
            call = (spec["target"], tuple(spec["args"]), dict(spec["kwargs"] or {}))
            payload = bytes(ForkingPickler.dumps(call))
        except Exception:
            # Something only a spawned child can inherit (a multiprocessing queue): spawn it.
            self._fallback = self._fallback_context.Process(**self._spec)
            self._fallback.start()
            self.pid = self._fallback.pid
            return
        request = json.dumps(
            {
                "python": "",
                "call": base64.b64encode(payload).decode(),
                "args": [],
                "sys_path": sys.path,
                "cwd": os.getcwd(),
                "env": dict(os.environ),
                "pgid": os.getpgrp(),
            }
        ).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(os.environ[PARENT_VAR])
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            socket.send_fds(conn, [HEADER.pack(len(request))], [stdin, 1, 2])
        finally:
            os.close(stdin)
        conn.sendall(request)
        reply = json.loads(self._line(conn) or b"{}")
        if "pid" not in reply:
            conn.close()
            raise RuntimeError(f"the fork server did not fork vLLM's engine process: {reply}")
        self.pid = reply["pid"]
        self._conn = conn

    @staticmethod
    def _line(conn):
        # Byte by byte: the status line that follows must stay unread until it is waited for.
        line = b""
        while not line.endswith(b"\n"):
            byte = conn.recv(1)
            if not byte:
                break
            line += byte
        return line

    def _poll(self, timeout):
        if self._status is not None or self._conn is None:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if ready:
            line = self._line(self._conn)
            # No status (the server went away): reported as killed.
            self._status = json.loads(line)["status"] if line.strip() else signal.SIGKILL

    @property
    def sentinel(self):
        if self._fallback is not None:
            return self._fallback.sentinel
        return self._conn.fileno()

    @property
    def exitcode(self):
        if self._fallback is not None:
            return self._fallback.exitcode
        self._poll(0)
        return None if self._status is None else os.waitstatus_to_exitcode(self._status)

    def is_alive(self):
        if self._fallback is not None:
            return self._fallback.is_alive()
        return self._conn is not None and self.exitcode is None

    def join(self, timeout=None):
        if self._fallback is not None:
            return self._fallback.join(timeout)
        self._poll(timeout)

    def _signal(self, sig):
        if self.pid is not None and self.is_alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self):
        if self._fallback is not None:
            return self._fallback.terminate()
        self._signal(signal.SIGTERM)

    def kill(self):
        if self._fallback is not None:
            return self._fallback.kill()
        self._signal(signal.SIGKILL)

    def close(self):
        if self._fallback is not None:
            return self._fallback.close()


class Context:
    """A multiprocessing context whose processes are forked by the fork server; everything
    else is the wrapped context's."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def Process(self, *args, **kwargs):
        return ForkedProcess(self._wrapped, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)

#!/usr/bin/env python3
"""Runs the workspace's compiled test binaries in two lanes (scripts/test).

`cargo test` runs one test binary after another. Many of ours spend part of their time
waiting (rank processes starting libtorch, a Python peer, a vLLM server, a trainer build's
linker), so one binary at a time leaves a quarter of a 2-core machine idle. This runner
takes the binaries `cargo test --no-run` built (their paths from cargo's JSON messages on
stdin), runs two at a time, longest first (the expected times below; unknown ones are
short), each as cargo would run it (in its package's directory, with cargo's environment),
and prints each binary's whole output when it ends, so outputs never interleave.

    cargo test --workspace --no-run --message-format=json | scripts/run-tests.py [ARGS...]

ARGS go to every test binary (a name filter, `--nocapture`). Exit status: 0 when every
binary passed, 1 otherwise (the failed ones are listed last).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

LANES = 2

# Seconds each job took in a cold run of the suite on a 2-core Intel Xeon (AMX), beside the
# other lane, with the fork server (2026-11-30, a slow host; the cargo jobs as they took
# before they were grouped, less the time they waited for cargo's lock): the order to start
# them in, longest first, so that the lanes end together (a long job left for last runs
# alone). Only the order depends on them.
EXPECTED = {
    "trainer[rest]": 194,
    "trainer[examples]": 177,
    "smoke": 170,
    # The vLLM jobs as they took once their servers were forked (2026-12-02).
    "rollout[vllm]": 100,
    "rollout[rest]": 30,
    "trainer[vllm]": 100,
    "megatron": 90,
    "fsdp": 77,
    "build_matrix": 70,
    "model": 56,
    "build_trainer": 52,
    "verl_releases": 31,
    # verlc-front's unit tests.
    "verlc_front": 29,
    "release_tables": 28,
    "hostile": 24,
    "cache_layout": 22,
    "malformed": 17,
    "hydra_parity": 14,
    "data": 14,
    "parallel": 8,
    "algo": 6,
    "tokenizer": 3,
    "lsp_completion": 4,
    "optim": 4,
}


# Binaries run as two jobs (each a libtest filter), so their halves can take both lanes: the
# runtime's `trainer` alone is longer than all the other binaries of a lane together. Only
# without filters of the caller's (libtest ORs filters).
SPLIT = {
    "trainer": [
        ("examples", ["examples::"]),
        ("vllm", ["vllm::"]),
        ("rest", ["--skip", "examples::", "--skip", "vllm::"]),
    ],
    # Its vLLM servers apart from its other tests, so that only the servers wait for the
    # `vllm` group.
    "rollout": [
        ("vllm", ["vllm::"]),
        ("rest", ["--skip", "vllm::"]),
    ],
}

# Jobs of one group never run at the same time: those that start vLLM servers (a server's
# engine process and its tokenizer workers take both cores while it loads; two loading at once
# took the rollout job from about 60 s to 160 s), and those that build trainers with cargo
# (one build at a time holds the shared target directory's lock: beside each other, the
# waiting job held a lane idle, build_matrix 64 s of its 122 s and build_trainer 18 s).
GROUPS = {
    "trainer[vllm]": "vllm",
    "rollout[vllm]": "vllm",
    "smoke": "cargo",
    "build_matrix": "cargo",
    "build_trainer": "cargo",
}


def binaries(messages):
    out = []
    for line in messages:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test"):
            continue
        exe = msg.get("executable")
        if not exe:
            continue
        target = msg["target"]
        manifest = msg["manifest_path"]
        package = msg["package_id"]
        out.append(
            {
                "exe": exe,
                "name": target["name"],
                "kind": target["kind"][0],
                "dir": os.path.dirname(manifest),
                "package": package,
            }
        )
    return out


def package_name(package_id):
    # `path+file:///dir#name@0.1.0`, or `path+file:///dir/name#0.1.0`.
    tail = package_id.rsplit("#", 1)[-1]
    if "@" in tail:
        return tail.split("@", 1)[0]
    return package_id.rsplit("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]


# The fork server for the tests' Python helpers (runtime/src/pyproc/fork_server.py): reward
# functions, reward managers, datasets, tools, agent loops and the tests' oracles start by the
# dozen, each importing torch and transformers (5 to 7 s of CPU) unless forked from an
# interpreter that has. Started with the environment the jobs get, so that it forks for them.
FORK_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime", "src", "pyproc", "fork_server.py")


def start_fork_server(env, workdir):
    """The server's process and its log, once it listens; None (and why, on stderr) when
    there is no interpreter to run it or it does not come up: helpers then start directly."""
    python = env.get("VERLC_PYTHON") or (
        os.path.join(env["VIRTUAL_ENV"], "bin", "python") if env.get("VIRTUAL_ENV") else ""
    )
    if not python or not os.path.isfile(python):
        print("run-tests: no VERLC_PYTHON or VIRTUAL_ENV; helpers start without the fork server", file=sys.stderr)
        return None
    socket_path = os.path.join(workdir, "fork-server.sock")
    log = open(os.path.join(workdir, "fork-server.log"), "w+")
    server = subprocess.Popen(
        [python, "-u", FORK_SERVER, socket_path],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 120
    while time.time() < deadline and server.poll() is None and not os.path.exists(socket_path):
        time.sleep(0.1)
    if not os.path.exists(socket_path):
        server.kill()
        server.wait()
        log.seek(0)
        print("run-tests: the fork server did not start; helpers start directly:\n" + log.read(), file=sys.stderr)
        return None
    env["VERLC_PYTHON_FORK_SERVER"] = socket_path
    return server, log, time.time()


def stop_fork_server(started):
    """Stops the server; its CPU (and its helpers'), its lifetime, and what it forked,
    declined or redirected."""
    server, log, since = started
    server.terminate()
    _, _, usage = os.wait4(server.pid, 0)
    log.seek(0)
    lines = log.read().splitlines()
    forked = sum(1 for line in lines if line.startswith("fork server: forked"))
    others = {}
    helpers = {}  # what a helper ran -> [CPU-seconds, count]
    took = "fork server: helper took "
    for line in lines:
        if line.startswith(took):
            cpu, _, what = line[len(took):].partition(" CPU-s: ")
            entry = helpers.setdefault(what, [0.0, 0])
            entry[0] += float(cpu)
            entry[1] += 1
        elif not line.startswith(("fork server: forked", "fork server: ready")):
            others[line] = others.get(line, 0) + 1
    summary = [f"fork server: {forked} helpers forked"]
    summary += [f"  {n} x {line}" for line, n in sorted(others.items())]
    summary.append("fork server: the helpers' CPU-seconds, by what they ran (the most first):")
    ranked = sorted(helpers.items(), key=lambda kv: -kv[1][0])
    summary += [f"  {cpu:7.1f} {n:4} x {what}" for what, (cpu, n) in ranked[:15]]
    return usage.ru_utime + usage.ru_stime, time.time() - since, summary


def main():
    args = sys.argv[1:]
    tests = []
    for t in binaries(sys.stdin):
        parts = SPLIT.get(t["name"]) if not args else None
        if not parts:
            tests.append(dict(t, filters=[], label=t["name"]))
            continue
        for part, filters in parts:
            tests.append(dict(t, filters=filters, label=f"{t['name']}[{part}]"))
    tests.sort(key=lambda t: -EXPECTED.get(t["label"], 5))
    cargo = os.environ.get("CARGO", "cargo")
    # What cargo puts on the library path of the tests it runs: the toolchain's own libraries
    # (a proc-macro crate's unit tests link libstd dynamically) and the target's deps.
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True).stdout.strip()
    host = subprocess.run(["rustc", "--print", "host-tuple"], capture_output=True, text=True).stdout.strip()
    lib_dirs = [os.path.join(sysroot, "lib", "rustlib", host, "lib"), os.path.join(sysroot, "lib")]
    if tests:
        lib_dirs.append(os.path.dirname(tests[0]["exe"]))
    if os.environ.get("LD_LIBRARY_PATH"):
        lib_dirs.append(os.environ["LD_LIBRARY_PATH"])
    job_env = dict(os.environ)
    job_env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    workdir = tempfile.mkdtemp(prefix="verlc-run-tests-")
    fork_server = start_fork_server(job_env, workdir)
    queue = list(tests)
    lock = threading.Condition()
    running_groups = set()
    failed = []
    costs = []

    def run(t):
        env = dict(job_env)
        env["CARGO"] = cargo
        env["CARGO_MANIFEST_DIR"] = t["dir"]
        env["CARGO_PKG_NAME"] = package_name(t["package"])
        start = time.time()
        # The job is reaped with wait4, whose resource usage counts the CPU of the job and of
        # every process it waited for (rank processes, Python peers, vLLM servers): what the
        # job costs the machine. Its output goes to a file, as nothing reads a pipe while
        # wait4 blocks (a job writing more than a pipe holds would stall).
        with tempfile.TemporaryFile() as out:
            p = subprocess.Popen(
                [t["exe"], *t["filters"], *args],
                cwd=t["dir"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            _, status, usage = os.wait4(p.pid, 0)
            code = os.waitstatus_to_exitcode(status)
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        took = time.time() - start
        cpu = usage.ru_utime + usage.ru_stime
        label = f"{package_name(t['package'])}::{t['label']} ({t['kind']})"
        with lock:
            costs.append((cpu, took, label))
            sys.stdout.write(f"\n     Running {label} [{took:.1f} s, {cpu:.1f} s of CPU]\n")
            sys.stdout.write(text)
            sys.stdout.flush()
            if code != 0:
                failed.append(f"{label}: exit status {code}")

    def lane():
        while True:
            with lock:
                while True:
                    if not queue:
                        return
                    # The longest job whose group is not running (a job waits for its group).
                    ready = [t for t in queue if GROUPS.get(t["label"]) not in running_groups]
                    if ready:
                        t = ready[0]
                        queue.remove(t)
                        break
                    lock.wait()
                group = GROUPS.get(t["label"])
                if group:
                    running_groups.add(group)
            try:
                run(t)
            finally:
                with lock:
                    running_groups.discard(group)
                    lock.notify_all()

    threads = [threading.Thread(target=lane) for _ in range(LANES)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    server_summary = []
    if fork_server is not None:
        # The helpers it forked are its children, so their CPU is counted here, not in the
        # jobs that used them.
        cpu, took, server_summary = stop_fork_server(fork_server)
        costs.append((cpu, took, "fork server and the Python helpers it forked"))
    shutil.rmtree(workdir, ignore_errors=True)
    # Where the machine's time went, for CI's budget (docs/testing.md).
    print("\njobs by CPU time (s of CPU, s of wall):")
    for cpu, took, label in sorted(costs, reverse=True):
        if cpu >= 1:
            print(f"  {cpu:7.1f} {took:7.1f}  {label}")
    print(f"  {sum(c for c, _, _ in costs):7.1f} in all")
    for line in server_summary:
        print(line)
    if failed:
        print("\nfailed test binaries:\n  " + "\n  ".join(failed))
        return 1
    print(f"\nall {len({t['exe'] for t in tests})} test binaries passed ({len(tests)} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

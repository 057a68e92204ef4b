"""Collect benchmark result lines (stdin), write results.json (argv[1]), print a table and
keep it in docs/benchmarks.md (argv[2], when given) with the machine and the commit."""
import datetime
import json
import math
import os
import platform
import subprocess
import sys


def cpu():
    """The CPU model and the vector/matrix extensions that decide bf16 and GEMM speed."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    return model, [f for f in wanted if f in flags]


def commit(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


rows = []
for line in sys.stdin:
    line = line.strip()
    if line:
        v = json.loads(line)
        rows.extend(v if isinstance(v, list) else [v])
bad = [r.get("name", "?") for r in rows
       if not all(isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) and r[k] > 0
                  for k in ("ours", "peer", "speedup"))]
if bad:
    sys.exit(f"benchmark results without a positive time on both sides: {', '.join(bad)}")
with open(sys.argv[1], "w") as f:
    json.dump(rows, f, indent=2)

header = f"{'name':<40} {'ours':>12} {'peer':>12} {'unit':>6} {'speedup':>8}"
lines = [header]
for r in rows:
    lines.append(f"{r['name']:<40} {r['ours']:>12.4g} {r['peer']:>12.4g} {r['unit']:>6} {r['speedup']:>7.2f}x")
print("\n".join(lines))

if len(sys.argv) > 2:
    root = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
    model, flags = cpu()
    md = [
        "# Benchmarks",
        "",
        "Written by `bench/run` (do not edit by hand): each row runs verlc and its peer side by",
        "side in one run on the same machine; speedup = peer time / our time. What each",
        "benchmark measures and how is in the header of its `bench/<name>/run`.",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {commit(root)}",
        f"- CPU: {model}, {os.cpu_count()} logical cores; flags: {', '.join(flags) or 'none of avx2/avx512/amx'}",
        f"- threads: as each benchmark states (`threads` below, where it reports them)",
        "",
        "| benchmark | ours | peer | unit | speedup | threads |",
        "|---|---:|---:|---|---:|---|",
    ]
    for r in rows:
        md.append(f"| {r['name']} | {r['ours']:.4g} | {r['peer']:.4g} | {r['unit']} | "
                  f"{r['speedup']:.2f}x | {r.get('threads', '')} |")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {sys.argv[2]}")

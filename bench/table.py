"""Collect benchmark result lines (stdin), write results.json (argv[1]), print a table."""
import json
import sys

rows = []
for line in sys.stdin:
    line = line.strip()
    if line:
        v = json.loads(line)
        rows.extend(v if isinstance(v, list) else [v])
with open(sys.argv[1], "w") as f:
    json.dump(rows, f, indent=2)
print(f"{'name':<40} {'ours':>12} {'peer':>12} {'unit':>6} {'speedup':>8}")
for r in rows:
    print(f"{r['name']:<40} {r['ours']:>12.4g} {r['peer']:>12.4g} {r['unit']:>6} {r['speedup']:>7.1f}x")

#!/usr/bin/env python3
"""Record what verl's example config dirs set, as Hydra overrides (dev-time tool).

The cases of `skipped.json` that compose an example config dir (verl 0.7.0's
`examples/sglang_multiturn/config`, which extends verl's tree through `hydra.searchpath`)
cannot be composed without verl's checkout. Each such config is a primary config whose
defaults list names one of verl's trainer configs and `_self_`, followed by a few settings.
This tool reads those configs from a verl git ref and writes, per config name, the trainer
config it extends and its settings as `++key=value` overrides (applied before the script's
own arguments, as Hydra applies `_self_` before the command line), so the runtime's example
test can run these cases on a fresh clone. The files themselves are not kept.

Usage:
    python3 tests/hydra/extract_example_configs.py \
        --repo <verl git dir> --ref v0.7.0 \
        --out tests/fixtures/verl_examples
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml


def show(repo, ref, path):
    return subprocess.run(
        ["git", "--git-dir", repo, "show", f"{ref}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def value_text(v):
    """A YAML value in Hydra's override grammar."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{value_text(x)}" for k, x in v.items()) + "}"
    s = str(v)
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def flatten(node, prefix, out):
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            flatten(v, key, out)
        else:
            out.append(f"++{key}={value_text(v)}")


def config_of(repo, ref, config_dir, name):
    doc = yaml.safe_load(show(repo, ref, f"{config_dir}/{name}.yaml")) or {}
    defaults = doc.pop("defaults", [])
    doc.pop("hydra", None)
    bases = [d for d in defaults if isinstance(d, str) and d != "_self_"]
    if len(bases) != 1 or defaults[-1] != "_self_":
        raise SystemExit(f"{name}: expected defaults [<trainer config>, _self_], got {defaults}")
    settings = []
    flatten(doc, "", settings)
    return {"extends": bases[0], "settings": settings}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--ref", default="v0.7.0")
    ap.add_argument("--out", default="tests/fixtures/verl_examples")
    args = ap.parse_args()
    out = Path(args.out)
    skipped = json.loads((out / "skipped.json").read_text())
    # The geo3k configs train vision-language models (which verlc does not implement) and carry
    # a whole chat template: not recorded.
    wanted = sorted(
        {
            (c["config_dir"], c["config_name"])
            for c in skipped
            if c.get("config_dir") and not c["config_name"].startswith("geo3k")
        }
    )
    configs = {}
    for config_dir, name in wanted:
        configs[f"{config_dir}/{name}"] = dict(config_of(args.repo, args.ref, config_dir, name), verl_ref=args.ref)
    (out / "example_configs.json").write_text(json.dumps(configs, indent=1) + "\n")
    print(f"{len(configs)} example configs -> {out / 'example_configs.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()

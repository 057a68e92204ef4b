#!/usr/bin/env python3
"""Derive verlc's built-in default tree of a verl release from the release's own config
tree: every config file of `verl/trainer/config` (not the `_generated_*.yaml` flattened
outputs), as the values Hydra reads from it (OmegaConf's YAML loader, so `1e-6` is a number),
written back as plain YAML without verl's comments. A file's `# @package` directive, which
Hydra reads from the header, is kept.

    builtin_tree.py TREE_ROOT VERSION OUT_DIR [--dir REL]

TREE_ROOT is the unpacked release (its `verl/` package) or a checkout of verl's repository.
`--dir` derives another config directory of it the same way (an example's `config/`, for the
test fixtures) instead of `verl/trainer/config`. OUT_DIR is replaced. The output is
deterministic, so the committed tree can be compared with a fresh run
(cli/tests/release_tables.rs); front/build.rs embeds it (front/src/config/builtin.rs).
"""
import os
import re
import shutil
import sys

import yaml
from omegaconf._utils import get_yaml_loader

PACKAGE = re.compile(r"^#\s*@package\s+\S+")


class Dumper(yaml.SafeDumper):
    """Block style, keys in verl's order, lists indented under their key."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def header_package(text):
    """The `# @package X` line of a file's header (comments and blank lines before any
    content), as Hydra reads it."""
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            return None
        if PACKAGE.match(s):
            return s
    return None


def main():
    args = sys.argv[1:]
    rel_dir = os.path.join("verl", "trainer", "config")
    if "--dir" in args:
        i = args.index("--dir")
        rel_dir = args[i + 1]
        del args[i : i + 2]
    root, version, out = args
    tree = os.path.join(root, rel_dir)
    with open(os.path.join(root, "verl", "version", "version"), encoding="utf-8") as f:
        found = f.read().strip()
    if found != version:
        sys.exit(f"{root} holds verl {found}, not {version}")
    if os.path.isdir(out):
        shutil.rmtree(out)
    files = []
    for dirpath, dirs, names in os.walk(tree):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".yaml") and not name.startswith("_generated"):
                files.append(os.path.relpath(os.path.join(dirpath, name), tree))
    for rel in sorted(files):
        with open(os.path.join(tree, rel), encoding="utf-8") as f:
            text = f.read()
        data = yaml.load(text, Loader=get_yaml_loader())
        # Hydra reads a `# @package` directive only as the file's first line.
        package = header_package(text)
        lines = [package] if package else []
        lines.append(f"# verl {version}'s {rel_dir}/{rel}, derived by scripts/builtin_tree.py.")
        body = ""
        if data is not None:
            body = yaml.dump(
                data,
                Dumper=Dumper,
                sort_keys=False,
                default_flow_style=False,
                allow_unicode=True,
                width=1000,
            )
        dest = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n" + body)
    print(f"{len(files)} files of verl {version} written to {out}")


if __name__ == "__main__":
    main()

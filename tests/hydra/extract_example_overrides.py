#!/usr/bin/env python3
"""Capture the Hydra command lines of verl's example launch scripts (dev-time tool).

For every `examples/**/*.sh` of a verl git ref, the script is evaluated by a sandboxed
bash in which `python`, `python3`, `torchrun`, `ray`, `srun` and every command that could
touch the machine (mkdir, rm, wget, git, pip, nvidia-smi, sleep, ...) are stubs that only
record their argv; commands bash cannot find are recorded too (command_not_found_handle).
So shell variables, `$((...))`, `${X//a/b}` and quoting are expanded exactly as bash
would, and nothing real runs. Each script gets a time limit. Environment variables the
script reads without a default get a dummy value: the script runs under `bash -u`, and
each "unbound variable" error adds that name and reruns.

Every recorded call that runs `-m verl.trainer.main_ppo` becomes a case. Cases composed
on verl's own config dir go to `overrides.json`; the rest (other entry points, example
config dirs that extend verl's tree via `hydra.searchpath`) go to `skipped.json` with a
reason, so the CI fixture holds only the scripts' arguments and none of verl's files.

With `--trainer sft` the same is done for verl's SFT trainer: calls of
`-m verl.trainer.sft_trainer` (or `sft_trainer_ray`) composing `sft_trainer_engine`, and of
verl 0.7.0's legacy `-m verl.trainer.fsdp_sft_trainer` composing `sft_trainer`.

Usage (needs a clone or mirror of verl; read-only, no work tree needed):
    python3 tests/hydra/extract_example_overrides.py \
        --repo <verl git dir> --ref v0.7.0 \
        --out tests/fixtures/verl_examples
    python3 tests/hydra/extract_example_overrides.py --trainer sft --only examples/sft \
        --repo <verl git dir> --ref v0.9.0 --out tests/fixtures/verl_sft_examples_0_9_0
    python3 tests/hydra/extract_example_overrides.py --trainer sft --only examples/sft \
        --repo <verl git dir> --ref v0.7.0 --out tests/fixtures/verl_sft_examples_0_7_0
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MAIN_MODULE = "verl.trainer.main_ppo"
# Other modules that run the same trainer and config.
ALSO_MAIN = ()
# main_ppo's @hydra.main(config_path="config", config_name="ppo_trainer").
DEFAULT_CONFIG_NAME = "ppo_trainer"
MODULE_DIR = "verl/trainer"
VERL_CONFIG_DIR = "verl/trainer/config"
IN_SCOPE_CONFIGS = {"ppo_trainer", "ppo_megatron_trainer"}


# Entry modules whose @hydra.main default config is not DEFAULT_CONFIG_NAME.
MODULE_CONFIG_NAMES = {}


def use_sft_trainer():
    """Record verl's SFT trainers' calls instead of main_ppo's (the engine trainer's, and
    verl 0.7.0's legacy fsdp_sft_trainer's, whose config is `sft_trainer`)."""
    global MAIN_MODULE, ALSO_MAIN, DEFAULT_CONFIG_NAME, IN_SCOPE_CONFIGS
    MAIN_MODULE = "verl.trainer.sft_trainer"
    ALSO_MAIN = ("verl.trainer.sft_trainer_ray", "verl.trainer.fsdp_sft_trainer")
    DEFAULT_CONFIG_NAME = "sft_trainer_engine"
    MODULE_CONFIG_NAMES["verl.trainer.fsdp_sft_trainer"] = "sft_trainer"
    IN_SCOPE_CONFIGS = {"sft_trainer_engine", "sft_trainer"}
# Where the sandbox's repository root appears in recorded paths.
FAKE_ROOT = "/workspace/verl"
FAKE_HOME = "/home/user"
TIME_LIMIT_S = 20
# Positional arguments for scripts that print a usage message without them.
USAGE_ARGS = ("8", FAKE_HOME + "/outputs")
MAX_RERUNS = 40
VERBOSE = False

# Stubs that record their argv and succeed. `tee` and `cat` pass stdin through.
RECORDING_STUBS = [
    "python", "python3", "torchrun", "ray", "srun", "sbatch", "nohup", "accelerate",
    "deepspeed", "mpirun", "conda", "scontrol", "docker",
    "mkdir", "rm", "cp", "mv", "touch", "ln", "chmod", "rsync", "tar", "unzip",
    "wget", "curl", "git", "pip", "pip3", "huggingface-cli", "hf", "modelscope",
    "nvidia-smi", "npu-smi", "sleep", "kill", "pkill", "hostname", "ssh", "scp",
]
PASS_THROUGH_STUBS = ["tee"]

STUB = """#!/bin/bash
{ printf '%s\\0' "$(basename "$0")" "$@"; printf '\\1\\0'; } >> "$VERLC_CALLS"
exit 0
"""

PASS_STUB = """#!/bin/bash
{ printf '%s\\0' "$(basename "$0")" "$@"; printf '\\1\\0'; } >> "$VERLC_CALLS"
exec /bin/cat
"""

# Sourced by bash before the script (BASH_ENV): shell-level stubs.
PRELUDE = """
command_not_found_handle() {
    { printf '%s\\0' "$@"; printf '\\1\\0'; } >> "$VERLC_CALLS"
    return 0
}
source() { return 0; }
ulimit() { return 0; }
date() { echo 20250101-000000; }
cd() { builtin cd "$@" 2>/dev/null || true; }
"""


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def list_scripts(repo, ref):
    names = sh("git", "-C", repo, "ls-tree", "-r", "--name-only", ref, "examples").splitlines()
    return sorted(n for n in names if n.endswith(".sh"))


def make_sandbox(tmp):
    stub_dir = tmp / "stubs"
    stub_dir.mkdir()
    for name in RECORDING_STUBS + PASS_THROUGH_STUBS:
        p = stub_dir / name
        p.write_text(PASS_STUB if name in PASS_THROUGH_STUBS else STUB)
        p.chmod(0o755)
    prelude = tmp / "prelude.sh"
    prelude.write_text(PRELUDE)
    return stub_dir, prelude


def dummy_value(name):
    """A plausible value for an env var the script needs; numbers where one is expected."""
    up = name.upper()
    if re.search(r"GPU", up):
        return "8"
    if re.search(r"(NNODES|NODES|NUM|WORLD|SIZE|RANK|COUNT|^TP|^PP|^EP|^CP|_TP$|_PP$|_EP$)", up):
        return "1"
    if re.search(r"PORT", up):
        return "6379"
    if re.search(r"(ADDR|HOST|IP)", up):
        return "127.0.0.1"
    return f"dummy_{name.lower()}"


def run_once(script_path, root, stub_dir, prelude, calls, env_extra, strict, argv=()):
    calls.write_bytes(b"")
    env = {
        "PATH": f"{stub_dir}:/usr/bin:/bin",
        "HOME": FAKE_HOME,
        "USER": "user",
        "LANG": "C.UTF-8",
        "BASH_ENV": str(prelude),
        "VERLC_CALLS": str(calls),
        "PWD": str(root),
    }
    env.update(env_extra)
    args = ["timeout", str(TIME_LIMIT_S), "/bin/bash"] + (["-u"] if strict else []) + [str(script_path), *argv]
    p = subprocess.run(args, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    return p.returncode, p.stderr


def parse_calls(calls):
    out = []
    for rec in calls.read_bytes().split(b"\x01\x00"):
        parts = rec.split(b"\x00")
        if parts and parts[-1] == b"":
            parts = parts[:-1]
        if parts:
            out.append([x.decode("utf-8", "replace") for x in parts])
    return out


def evaluate(script, text, tmp, stub_dir, prelude, argv=()):
    """Run the script until no variable is unbound; return (calls, env_dummies, note)."""
    root = tmp / "verl"
    if root.exists():
        shutil.rmtree(root)
    path = root / script
    path.parent.mkdir(parents=True)
    path.write_text(text)
    calls = tmp / "calls.bin"
    env_extra = {}
    strict = True
    note = None
    err = ""
    for _ in range(MAX_RERUNS):
        rc, err = run_once(path, root, stub_dir, prelude, calls, env_extra, strict, argv)
        if rc == 124:
            note = f"timed out after {TIME_LIMIT_S}s"
            break
        m = re.search(r": ([^\s:]+): unbound variable", err)
        if not m:
            break
        name = m.group(1)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in env_extra:
            # A positional parameter, an array item, or a name we already set: run
            # without -u from here on (bash then expands it to the empty string).
            strict = False
            continue
        env_extra[name] = dummy_value(name)
    if VERBOSE:
        print(f"--- {script} (last run's stderr tail)\n" + "\n".join(err.splitlines()[-8:]), file=sys.stderr)
    return parse_calls(calls), env_extra, note, str(root)


def normalize(s, root):
    return s.replace(root, FAKE_ROOT)


def hydra_args(argv, root):
    """Split main_ppo's argv into (config_path, config_name, overrides, unknown flags)."""
    config_path = None
    config_name = None
    overrides = []
    flags = []
    i = 0
    while i < len(argv):
        a = argv[i]
        for long, short in (("--config-path", "-cp"), ("--config-name", "-cn")):
            if a in (long, short) and i + 1 < len(argv):
                val = argv[i + 1]
                i += 1
                break
            if a.startswith(long + "="):
                val = a[len(long) + 1:]
                break
        else:
            long = None
        if long == "--config-path":
            config_path = val
        elif long == "--config-name":
            config_name = val
        elif a.startswith("-") and not a.startswith("--") or a.startswith("--"):
            flags.append(a)
        else:
            overrides.append(normalize(a, root))
        i += 1
    return config_path, config_name, overrides, flags


def resolve_config_dir(config_path, root):
    """Hydra takes a relative --config-path from the directory of main_ppo.py."""
    if config_path is None:
        return VERL_CONFIG_DIR
    if os.path.isabs(config_path):
        rel = os.path.relpath(config_path, root)
        if rel.startswith(".."):
            return config_path
        return os.path.normpath(rel)
    return os.path.normpath(os.path.join(MODULE_DIR, config_path))


def cases_of_script(script, text, ref, tmp, stub_dir, prelude):
    calls, env_extra, note, root = evaluate(script, text, tmp, stub_dir, prelude)
    positional = None
    if not any(len(c) > 1 for c in calls):
        # Nothing launched: likely a usage check (`$# -lt 2`). Retry with dummy arguments
        # (only then: main_ppo scripts append "$@" to their overrides).
        positional = USAGE_ARGS
        calls, env_extra, note, root = evaluate(script, text, tmp, stub_dir, prelude, positional)
    cases, skipped = [], []
    base = {"script": script, "verl_ref": ref}
    mains = []
    other_entry = []
    for argv in calls:
        if "-m" in argv:
            k = argv.index("-m")
            if k + 1 < len(argv):
                if argv[k + 1] == MAIN_MODULE or argv[k + 1] in ALSO_MAIN:
                    mains.append((argv[k + 1], argv[k + 2:]))
                elif argv[k + 1].startswith("verl."):
                    other_entry.append(argv[k + 1])
        elif argv and argv[0] in ("python", "python3") and len(argv) > 1 and argv[1].endswith(".py"):
            other_entry.append(argv[1])
    if not mains:
        reason = f"entry point {', '.join(sorted(set(other_entry)))}, not {MAIN_MODULE}" if other_entry else f"no {MAIN_MODULE} call recorded"
        if note:
            reason += f" ({note})"
        return [], [dict(base, reason=reason)]
    for n, (module, argv) in enumerate(mains):
        config_path, config_name, overrides, flags = hydra_args(argv, root)
        config_dir = resolve_config_dir(config_path, root)
        name = config_name or MODULE_CONFIG_NAMES.get(module, DEFAULT_CONFIG_NAME)
        case = dict(base)
        if len(mains) > 1:
            case["call"] = n
        case.update(
            config_dir=None if config_dir == VERL_CONFIG_DIR else config_dir,
            config_name=name,
            overrides=overrides,
        )
        if env_extra:
            case["dummy_env"] = env_extra
        if positional:
            case["script_args"] = list(positional)
        if flags:
            skipped.append(dict(case, reason=f"unexpected launcher flags {flags}"))
        elif config_dir != VERL_CONFIG_DIR:
            skipped.append(
                dict(case, reason=f"composes the example config dir `{config_dir}` (extends verl's tree via hydra.searchpath); its YAML files are verl's, so it is kept out of the CI fixture")
            )
        elif name.removesuffix(".yaml") not in IN_SCOPE_CONFIGS:
            skipped.append(dict(case, reason=f"config `{name}` is not {'/'.join(sorted(IN_SCOPE_CONFIGS))}"))
        else:
            cases.append(case)
    return cases, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="a verl git repository (a bare mirror is fine)")
    ap.add_argument("--ref", default="v0.7.0")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "fixtures" / "verl_examples"))
    ap.add_argument("--only", help="substring filter on script paths (for debugging)")
    ap.add_argument("--verbose", action="store_true", help="print the tail of each script's stderr")
    ap.add_argument("--trainer", choices=["ppo", "sft"], default="ppo", help="whose calls to record")
    args = ap.parse_args()
    if args.trainer == "sft":
        use_sft_trainer()
    global VERBOSE
    VERBOSE = args.verbose

    scripts = list_scripts(args.repo, args.ref)
    if args.only:
        scripts = [s for s in scripts if args.only in s]
    all_cases, all_skipped = [], []
    with tempfile.TemporaryDirectory(prefix="verl-examples-") as t:
        tmp = Path(t)
        stub_dir, prelude = make_sandbox(tmp)
        for script in scripts:
            text = sh("git", "-C", args.repo, "show", f"{args.ref}:{script}")
            cases, skipped = cases_of_script(script, text, args.ref, tmp, stub_dir, prelude)
            all_cases += cases
            all_skipped += skipped
            status = f"{len(cases)} case(s)" if cases else "skipped: " + "; ".join(s["reason"] for s in skipped)
            print(f"{script}: {status}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overrides.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    (out / "skipped.json").write_text(json.dumps(all_skipped, indent=1) + "\n")
    print(f"{len(scripts)} scripts: {len(all_cases)} cases in overrides.json, {len(all_skipped)} skipped", file=sys.stderr)


if __name__ == "__main__":
    main()

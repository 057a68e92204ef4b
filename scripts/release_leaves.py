#!/usr/bin/env python3
"""Derive a verl release's leaf table from its own files: every key of the trees verl
generates (`verl/trainer/config/_generated_*.yaml`) and of each trainer composed with every
`model_engine` option, with the types its value may take.

A key's types come from the dataclass verl converts its section into (the section's
`_target_`, its field's annotation: `Optional[int]` is an integer or null), else from verl's
default (a boolean, a number, a string, a list, a map; a null default says nothing, and a key
nothing types is "any"; front/src/load/leaf_types.rs lists the type names). verlc's
checker reads the table for the keys of a release it does not model key by key (see
front/src/check.rs): their values are checked by type instead of passing through.

    release_leaves.py TREE_ROOT VERSION OUT.json [--sft | --legacy-sft]

TREE_ROOT is the unpacked release (its `verl/` package). With `--sft` the table is that of
verl's SFT trainer instead: `sft_trainer_engine` composed with each option of its `engine`
group (and the `optim` option of the same name): `front/releases/verl-<release>.sft.json`.
With `--legacy-sft` it is that of verl 0.7.0's legacy `fsdp_sft_trainer` (config `sft_trainer`),
plus the `data` keys its datasets read with `config.get` that the config does not list (a user
adds them with `+data.<key>=...`): `front/releases/verl-0.7.0.legacy_sft.json`. The output is deterministic (sorted
keys), so the committed tables can be compared with a fresh run
(cli/tests/release_tables.rs).
"""
import ast
import json
import os
import re
import sys

import yaml



# Sections verl hands whole, as keyword arguments, to a class that is not a dataclass (no
# `_target_`): the constructor's annotations type their leaves. verl 0.9's `trainer.v1.sampler`
# goes to its replay buffer (`_build_replay_buffer` in trainer/ppo/v1/trainer_base.py), whose
# `max_off_policy_threshold` is `int` in 0.9.0 and `int | None` in 0.9.1.
SECTION_CONSTRUCTORS = {"trainer.v1.sampler": "ReplayBuffer"}


def dataclass_fields(verl_root):
    """Class name -> {field: annotation source}, following base classes by name, for the
    dataclasses of verl's config modules (read as source: importing verl needs ray)."""
    classes = {}
    for sub in ["workers/config", "trainer/config", "utils", "workers/rollout", "experimental",
                "trainer/ppo/v1"]:
        top = os.path.join(verl_root, sub)
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    try:
                        tree = ast.parse(f.read())
                    except SyntaxError:
                        continue
                for node in tree.body:
                    if not isinstance(node, ast.ClassDef):
                        continue
                    fields = {}
                    for item in node.body:
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            fields[item.target.id] = ast.unparse(item.annotation)
                    bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                    classes.setdefault(node.name, (fields, bases))
                    if node.name in SECTION_CONSTRUCTORS.values():
                        init = next((f for f in node.body if isinstance(f, ast.FunctionDef)
                                     and f.name == "__init__"), None)
                        params = {a.arg: ast.unparse(a.annotation)
                                  for a in (init.args.args + init.args.kwonlyargs if init else [])
                                  if a.annotation is not None}
                        classes.setdefault(f"{node.name}.__init__", (params, []))

    def resolved(name, seen=()):
        if name not in classes or name in seen:
            return {}
        fields, bases = classes[name]
        out = {}
        for b in bases:
            out.update(resolved(b, seen + (name,)))
        out.update(fields)
        return out

    return {name: resolved(name) for name in classes}


def split_top(text, sep):
    """`text` split at `sep` outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def annotation_types(ann):
    """The JSON types an annotation admits, or None when it says nothing checkable."""
    ann = ann.strip().strip("'\"")
    if "|" in ann and not ann.startswith(("Optional[", "Union[")):
        parts = split_top(ann, "|")
        if len(parts) > 1:
            return union([annotation_types(p) for p in parts])
    for wrapper in ("typing.", "t."):
        if ann.startswith(wrapper):
            ann = ann[len(wrapper):]
    if ann.startswith("Optional[") and ann.endswith("]"):
        inner = annotation_types(ann[len("Optional["):-1])
        return None if inner is None else sorted(set(inner) | {"null"})
    if ann.startswith("Union[") and ann.endswith("]"):
        return union([annotation_types(p) for p in split_top(ann[len("Union["):-1], ",")])
    head = ann.split("[", 1)[0]
    simple = {
        "bool": ["boolean"],
        "int": ["integer"],
        "float": ["number"],
        "str": ["string"],
        "None": ["null"],
        "list": ["array"], "List": ["array"], "tuple": ["array"], "Tuple": ["array"],
        "Sequence": ["array"], "ListConfig": ["array"],
        "dict": ["object"], "Dict": ["object"], "DictConfig": ["object"], "Mapping": ["object"],
    }
    if head in simple:
        return list(simple[head])
    if head == "Literal":
        return ["string"]
    # Any, a dataclass, an enum, a forward reference: no check from the annotation.
    return None


def union(parts):
    if any(p is None for p in parts):
        return None
    return sorted(set(t for p in parts for t in p))


def default_types(value):
    """The types a default says a value takes (None: it says nothing)."""
    if isinstance(value, bool):
        return ["boolean"]
    if isinstance(value, (int, float)):
        return ["number"]
    if isinstance(value, str):
        # An interpolation's type is its target's, a mandatory value's (`???`) unknown; a string
        # may hold any scalar verl reads.
        return None if "${" in value or value == "???" else ["string", "number", "boolean"]
    if isinstance(value, list):
        return ["array"]
    if isinstance(value, dict):
        return ["object"]
    return None


def nested_class(ann, classes):
    """The dataclass an annotation names (`Optional[RolloutCorrectionConfig]`), if any."""
    for name in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", ann or ""):
        if name in classes and name not in ("Optional", "Union", "BaseConfig"):
            return classes[name]
    return {}


def value_types(value):
    """The JSON type of a default itself (an integer default is an integer, …)."""
    if isinstance(value, bool):
        return ["boolean"]
    if isinstance(value, int):
        return ["integer"]
    if isinstance(value, float):
        return ["number"]
    if isinstance(value, str):
        return [] if "${" in value or value == "???" else ["string"]
    if isinstance(value, list):
        return ["array"]
    if isinstance(value, dict):
        return ["object"]
    return ["null"]


def leaves(node, prefix, target_fields, classes, out):
    """Every leaf of `node` (a map) under `prefix`, typed; `target_fields` are the annotations
    of the dataclass the map converts into, when its parent's annotation names one."""
    target = node.get("_target_") if isinstance(node, dict) else None
    fields = classes.get(str(target).rsplit(".", 1)[-1], {}) if target else {}
    for key, value in node.items():
        if str(key).startswith("_"):
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        ann = fields.get(key) or target_fields.get(key)
        types = annotation_types(ann) if ann else None
        if isinstance(value, dict) and value:
            # A map of settings: its own leaves (a dataclass field of a nested config too, or
            # a constructor's keyword arguments).
            inner = nested_class(ann, classes)
            if not inner and path in SECTION_CONSTRUCTORS:
                inner = classes.get(f"{SECTION_CONSTRUCTORS[path]}.__init__", {})
            leaves(value, path, inner, classes, out)
            # A dict of configs by name (`teacher_models: dict[str, ...TeacherModelConfig]`):
            # any name's entry takes the leaves of the ones verl ships, under `*`.
            entry = re.fullmatch(r"(?:dict|Dict)\[str,\s*(\w+)\]", (ann or "").strip())
            if entry and entry.group(1) in classes:
                for sub in value.values():
                    if isinstance(sub, dict):
                        leaves(sub, f"{path}.*", classes[entry.group(1)], classes, out)
            if types is None:
                continue
            if "object" in types:
                # A dict the dataclass takes whole (`mcore_kwargs`): keys beyond verl's are
                # the user's to add.
                out[path] = sorted(set(types) | {"object"})
                continue
        if types is None:
            types = default_types(value)
        else:
            # verl's own default stays valid even where it strays from the annotation.
            types = sorted(set(types) | set(value_types(value)))
        if types is None:
            # Known to the release, but nothing says what it takes: any value.
            out.setdefault(path, ["any"])
            continue
        if value is None:
            types = sorted(set(types) | {"null"})
        prev = [t for t in out.get(path, []) if t != "any"]
        out[path] = sorted(set(types) | set(prev))


def compositions(config):
    """(config name, model_engine option) pairs to compose: each trainer with each engine."""
    bases = [b for b in ("ppo_trainer", "ppo_megatron_trainer")
             if os.path.isfile(os.path.join(config, f"{b}.yaml"))]
    group = os.path.join(config, "model_engine")
    engines = sorted(n[:-5] for n in os.listdir(group) if n.endswith(".yaml")) if os.path.isdir(group) else []
    out = [(b, None) for b in bases]
    out += [("ppo_trainer", e) for e in engines]
    return out


def sft_compositions(config):
    """(config name, group overrides) of verl's SFT trainer: the engine-based config with each
    option of its `engine` group (and the `optim` option of the same name, where there is
    one). 0.7.0's legacy `sft_trainer` (`fsdp_sft_trainer`, gone in 0.7.1) is not tabled."""
    out = []
    if os.path.isfile(os.path.join(config, "sft_trainer_engine.yaml")):
        engines = sorted(n[:-5] for n in os.listdir(os.path.join(config, "engine")) if n.endswith(".yaml"))
        for e in engines:
            overrides = [f"engine={e}"]
            if os.path.isfile(os.path.join(config, "optim", f"{e}.yaml")):
                overrides.append(f"optim={e}")
            out.append(("sft_trainer_engine", overrides))
    return out


# The datasets verl 0.7.0's legacy SFT trainer builds from its `data` section.
LEGACY_SFT_DATASETS = ["utils/dataset/sft_dataset.py", "utils/dataset/multiturn_sft_dataset.py"]


def dataset_reads(verl_root):
    """{key: default} of every `config.get("key", default)` in the legacy SFT datasets' files
    (a default that is not a literal is None)."""
    out = {}
    for rel in LEGACY_SFT_DATASETS:
        with open(os.path.join(verl_root, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "config" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                continue
            default = None
            if len(node.args) > 1:
                try:
                    default = ast.literal_eval(node.args[1])
                except ValueError:
                    default = None
            out.setdefault(node.args[0].value, default)
    return out


def legacy_sft_leaves(verl_root, config, classes, out):
    """The legacy SFT config's leaves and the dataset keys it does not list."""
    tree = compose(config, "sft_trainer", overrides=[])
    leaves(tree, "", {}, classes, out)
    data = tree.get("data", {})
    extra = {k: v for k, v in sorted(dataset_reads(verl_root).items()) if k not in data}
    leaves(extra, "data", {}, classes, out)
    # The trainer's own `config.model.get(...)` of a key the config does not list.
    leaves({"lora_adapter_path": None}, "model", {}, classes, out)


def compose(config, base, engine=None, overrides=None):
    """The tree Hydra composes for `base` (with `model_engine=engine`, or the given group
    overrides), interpolations kept."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    if overrides is None:
        overrides = [f"model_engine={engine}"] if engine else []
    with initialize_config_dir(config_dir=os.path.abspath(config), version_base=None):
        cfg = hydra_compose(config_name=base, overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)


def main():
    args = [a for a in sys.argv[1:] if a not in ("--sft", "--legacy-sft")]
    sft = "--sft" in sys.argv[1:]
    root, version, dest = args[0], args[1], args[2]
    verl_root = os.path.join(root, "verl")
    config = os.path.join(verl_root, "trainer/config")
    classes = dataclass_fields(verl_root)
    out = {}
    if "--legacy-sft" in sys.argv[1:]:
        legacy_sft_leaves(verl_root, config, classes, out)
        write_table(dest, version, ["sft_trainer"] + [f"verl/{p}" for p in LEGACY_SFT_DATASETS], out)
        return
    if sft:
        composed = []
        for base, overrides in sft_compositions(config):
            leaves(compose(config, base, overrides=overrides), "", {}, classes, out)
            composed.append(" ".join([base] + overrides))
        write_table(dest, version, composed, out)
        return
    names = sorted(n for n in os.listdir(config) if n.startswith("_generated_") and n.endswith(".yaml"))
    for name in names:
        with open(os.path.join(config, name), encoding="utf-8") as f:
            tree = yaml.safe_load(f)
        leaves(tree, "", {}, classes, out)
    # The generated files cover some engines; the trainer composed with each option of the
    # `model_engine` group covers the rest (0.8's mindspeed).
    composed = []
    for base, engine in compositions(config):
        leaves(compose(config, base, engine), "", {}, classes, out)
        composed.append(f"{base} model_engine={engine}" if engine else base)
    write_table(dest, version, names + composed, out)


def write_table(dest, version, sources, out):
    table = {
        "release": version,
        "sources": sources,
        "leaves": {k: out[k] for k in sorted(out)},
    }
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=False)
        f.write("\n")


if __name__ == "__main__":
    main()

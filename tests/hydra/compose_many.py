#!/usr/bin/env python3
"""Compose many configs with Hydra in one process: the reference side of verlc's parity
tests (cli/tests/hydra_parity.rs).

stdin: a JSON list of cases
    {"config_dir": "/abs/dir", "config_name": "ppo_trainer", "overrides": ["k=v", ...],
     "cwd": "/abs/dir" (optional: relative `file://` search paths are taken from it)}
stdout: a JSON list, one entry per case, in order
    {"ok": true,  "error": null, "config": <the resolved tree>}
    {"ok": false, "error": "<ExceptionType>: <message>", "config": null}

A case is composed exactly as `python -m verl.trainer.main_ppo --config-path DIR
--config-name NAME OVERRIDES...` composes it before verl's own code runs: Hydra's compose
(struct mode, defaults lists, override grammar), then OmegaConf.to_container with
resolve=True, so interpolation errors count as rejections. `???` values are kept as the
string "???" (throw_on_missing=False): Hydra itself does not reject them.

Speed: a compose of verl's tree takes ~0.25 s of pure-Python work, nearly all of it in
steps that are the same for every case with the same config name and config-group
choices. Those steps are memoized (see `install_memos`); value overrides, which is where
the cases differ, are still parsed and applied by Hydra itself on a fresh copy. Set
VERLC_HYDRA_NO_MEMO=1 to compose every case from scratch (to check the memos).
"""

import copy
import json
import math
import os
import sys

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal import config_loader_impl
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader


def _sources_key(repo):
    return tuple((type(s).__name__, s.path) for s in repo.get_sources())


def install_memos():
    """Memoize the three case-independent steps of a compose, keyed by what they read."""
    yaml_cache = {}
    omegaconf_load = OmegaConf.load

    def cached_load(file_):
        # The YAML parse of a config file (OmegaConf.create still runs on a deep copy).
        name = getattr(file_, "name", None)
        if not isinstance(name, str) or not os.path.isfile(name):
            return omegaconf_load(file_)
        st = os.stat(name)
        key = (os.path.realpath(name), st.st_mtime_ns, st.st_size)
        if key not in yaml_cache:
            yaml_cache[key] = yaml.load(file_, Loader=get_yaml_loader())
        obj = copy.deepcopy(yaml_cache[key])
        if obj is not None and not isinstance(obj, (list, dict, str)):
            raise IOError(f"Invalid loaded object type: {type(obj).__name__}")
        return OmegaConf.create() if obj is None else OmegaConf.create(obj)

    OmegaConf.load = staticmethod(cached_load)

    defaults_cache = {}
    create_defaults_list = config_loader_impl.create_defaults_list

    def cached_create_defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing):
        # The defaults list depends on the config-group overrides only; value overrides
        # are sorted out exactly as hydra._internal.defaults_list.Overrides does.
        group_lines, config_overrides = [], []
        for o in overrides_list:
            if not o.is_sweep_override() and (isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group)):
                config_overrides.append(o)
            else:
                group_lines.append(o.input_line)
        key = (_sources_key(repo), config_name, tuple(group_lines), prepend_hydra, skip_missing)
        if key not in defaults_cache:
            defaults_cache[key] = create_defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing)
        result = copy.copy(defaults_cache[key])
        result.defaults = copy.deepcopy(result.defaults)
        result.config_overrides = config_overrides
        return result

    config_loader_impl.create_defaults_list = cached_create_defaults_list

    composed_cache = {}
    compose_from_defaults = ConfigLoaderImpl._compose_config_from_defaults_list

    def cached_compose_from_defaults(self, defaults, repo):
        # The merge of a defaults list; Hydra then applies the value overrides to a copy.
        key = (tuple((d.config_path, d.parent, d.package, d.is_self, d.primary) for d in defaults), _sources_key(repo))
        if key not in composed_cache:
            composed_cache[key] = compose_from_defaults(self, defaults, repo)
        return copy.deepcopy(composed_cache[key])

    ConfigLoaderImpl._compose_config_from_defaults_list = cached_compose_from_defaults


def jsonable(v):
    """JSON has no inf/nan: spell them as Python prints them, like verlc's to_json."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    return v


def compose_one(case):
    GlobalHydra.instance().clear()
    cwd = os.getcwd()
    try:
        if case.get("cwd"):
            os.chdir(case["cwd"])
        with initialize_config_dir(config_dir=case["config_dir"], version_base=None):
            cfg = compose(config_name=case["config_name"], overrides=list(case.get("overrides", [])))
            tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        return {"ok": True, "error": None, "config": jsonable(tree)}
    except Exception as e:  # Hydra and OmegaConf raise many types; all are rejections.
        msg = str(e).strip() or repr(e)
        return {"ok": False, "error": f"{type(e).__name__}: {msg}", "config": None}
    finally:
        os.chdir(cwd)
        GlobalHydra.instance().clear()


def main():
    if os.environ.get("VERLC_HYDRA_NO_MEMO") != "1":
        install_memos()
    cases = json.load(sys.stdin)
    out = [compose_one(c) for c in cases]
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

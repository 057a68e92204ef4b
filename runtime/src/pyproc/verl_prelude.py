# Put ahead of the helper scripts that run the user's verl classes (runtime/src/pyproc.rs,
# `VERL_PRELUDE`): the user's code imports verl's base classes, and verl's package root imports
# Ray, which a machine running verlc usually lacks. `verl_modules(bare, modules, standin)` makes
# `modules` importable and says how:
#   "installed"                 verl imports as it is;
#   "without its package root"  verl is installed but its root fails: the packages in `bare` are
#                               made without running their __init__ (which pull in Ray), with a
#                               stand-in DataProto and event-loop helper where verl's need Ray;
#   "stand-in"                  no verl: `standin()` provides modules with the same interface.
import asyncio
import importlib
import importlib.util
import os
import sys
import types


def bare_package(name, path):
    mod = types.ModuleType(name)
    mod.__path__ = [path]
    sys.modules[name] = mod
    return mod


def purge_verl():
    for k in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
        del sys.modules[k]


class StandInTensorDict(dict):
    """The part of TensorDict verl's users read: tensors by name, and batch_size."""

    @property
    def batch_size(self):
        for v in self.values():
            return [len(v)]
        return [0]


class StandInDataProtoItem:
    """One row of a StandInDataProto (verl's DataProtoItem): `batch` holds the row's tensors,
    `non_tensor_batch` its values."""

    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch = StandInTensorDict(batch)
        self.non_tensor_batch = dict(non_tensor_batch)
        self.meta_info = meta_info


class StandInDataProto:
    """verl's DataProto as reward managers and samplers use it: `batch` (tensors by name),
    `non_tensor_batch` (numpy object arrays by name), `meta_info`, `len()`, `data[i]` (a row),
    `data[a:b]` and `data[indices]` (a DataProto of those rows)."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = StandInTensorDict(batch or {})
        self.non_tensor_batch = dict(non_tensor_batch or {})
        self.meta_info = dict(meta_info or {})

    @classmethod
    def from_dict(cls, tensors=None, non_tensors=None, meta_info=None):
        return cls(tensors, non_tensors, meta_info)

    def __len__(self):
        for v in self.batch.values():
            return len(v)
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getitem__(self, item):
        if isinstance(item, int):
            return StandInDataProtoItem(
                {k: v[item] for k, v in self.batch.items()},
                {k: v[item] for k, v in self.non_tensor_batch.items()},
                self.meta_info,
            )
        return StandInDataProto(
            {k: v[item] for k, v in self.batch.items()},
            {k: v[item] for k, v in self.non_tensor_batch.items()},
            self.meta_info,
        )


def event_loop():
    """verl's `ray_utils.get_event_loop`: the thread's loop, made if there is none."""
    try:
        return asyncio.get_event_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        return loop


def data_proto_class():
    """verl's DataProto where it imports, else the stand-in."""
    try:
        from verl import DataProto

        return DataProto
    except Exception:
        return StandInDataProto


def data_proto_of(batch):
    """A DataProto of a batch sent over the protocol: `tensors` (nested lists by name),
    `non_tensors` (lists by name, made numpy object arrays), `meta_info`."""
    import numpy as np
    import torch

    tensors = {k: torch.tensor(v) for k, v in (batch.get("tensors") or {}).items()}
    non_tensors = {}
    for k, v in (batch.get("non_tensors") or {}).items():
        arr = np.empty(len(v), dtype=object)
        arr[:] = v
        non_tensors[k] = arr
    return data_proto_class().from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info=batch.get("meta_info") or {}
    )


def verl_modules(bare, modules, standin):
    try:
        import verl  # noqa: F401

        for m in modules:
            importlib.import_module(m)
        return "installed"
    except Exception:
        pass
    purge_verl()
    spec = importlib.util.find_spec("verl")
    if spec is not None and spec.submodule_search_locations:
        root = list(spec.submodule_search_locations)[0]
        verl = bare_package("verl", root)
        verl.DataProto = StandInDataProto
        protocol = types.ModuleType("verl.protocol")
        protocol.DataProto = StandInDataProto
        protocol.DataProtoItem = StandInDataProtoItem
        sys.modules["verl.protocol"] = protocol
        bare_package("verl.utils", os.path.join(root, "utils"))
        try:
            importlib.import_module("verl.utils.ray_utils")
        except Exception:
            ray_utils = types.ModuleType("verl.utils.ray_utils")
            ray_utils.get_event_loop = event_loop
            sys.modules["verl.utils.ray_utils"] = ray_utils
        for name in bare:
            bare_package("verl." + name, os.path.join(root, *name.split(".")))
        try:
            for m in modules:
                importlib.import_module(m)
            return "without its package root"
        except Exception:
            purge_verl()
    standin()
    return "stand-in"


def standin_package(*names):
    """Empty packages `verl`, `verl.<name>`... for stand-in modules to sit in."""
    if "verl" not in sys.modules:
        bare_package("verl", "")
        sys.modules["verl"].DataProto = StandInDataProto
    for name in names:
        if "verl." + name not in sys.modules:
            bare_package("verl." + name, "")


def stand_in_module(name, **attrs):
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return mod


def load_user_object(path, name):
    """verl's load_extern_object: a file path (its directory importable, as verl's PYTHONPATH
    usually has it) or `pkg://module.path`."""
    if path.startswith("pkg://"):
        module = importlib.import_module(path[len("pkg://") :])
    else:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Custom module file '{path}' not found.")
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        module_name = "custom_module_" + str(abs(hash(os.path.abspath(path))))
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise AttributeError(f"Custom module '{path}' has no attribute '{name}'.")
    return getattr(module, name)


def config_object(config):
    """A JSON config as verl's classes receive it: an OmegaConf DictConfig."""
    try:
        from omegaconf import OmegaConf

        return OmegaConf.create(config)
    except ImportError:

        class Config(dict):
            def __getattr__(self, k):
                try:
                    v = self[k]
                except KeyError as e:
                    raise AttributeError(k) from e
                return Config(v) if isinstance(v, dict) else v

        return Config(config)


def jsonable(v):
    """A value as JSON: tensors and arrays as lists, mappings and sequences through, bytes in
    base64, PIL images as `{"bytes": PNG in base64}`, non-finite floats and anything else by
    repr."""
    import math

    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (bytes, bytearray)):
        # As verlc's parquet reader gives binary cells (an image's `bytes`).
        import base64

        return base64.b64encode(bytes(v)).decode("ascii")
    pil = sys.modules.get("PIL.Image")
    if pil is not None and isinstance(v, pil.Image):
        # A dataset item's picture (verl's messages carry PIL images): losslessly, as an image
        # cell of verl's data files.
        import base64
        import io

        buf = io.BytesIO()
        v.save(buf, format="PNG")
        return {"bytes": base64.b64encode(buf.getvalue()).decode("ascii")}
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    tolist = getattr(v, "tolist", None)
    if callable(tolist):
        try:
            return jsonable(tolist())
        except Exception:
            pass
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return jsonable(item())
        except Exception:
            pass
    return repr(v)

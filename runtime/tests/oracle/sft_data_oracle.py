"""verl's own multi-turn SFT dataset (MultiTurnSFTDataset) as the oracle of the runtime's SFT data.

Usage: sft_data_oracle.py sft OUT MODEL_ORACLE TEMPLATE...
(MODEL_ORACLE is model_oracle.py, whose tokenizer this script trains: named so that the test's
cache of this output changes with it.)
Writes
- OUT/tok<i>: a byte-level BPE tokenizer with the i-th chat template (model_oracle.py's
  chat_tokenizers, as the chat-template tests use);
- OUT/<name>.parquet: conversations in verl's SFT layout (a `messages` column; `tools` and
  `enable_thinking` columns in some files), written with pyarrow;
- OUT/expected.json: for every verl release below, tokenizer, file and dataset option set, what
  verl's dataset returns for each row in no_padding mode (input_ids and loss_mask) or the
  exception it raises.

verl is not imported as a package (its __init__ needs ray and tensordict): the dataset module's
classes and functions, and the few verl helpers it imports, are executed from each release's
own files; its other imports are the real numpy, pandas, torch, omegaconf and transformers.
"""
import ast
import contextlib
import importlib.util
import io
import json
import logging
import os
import re
import sys
from enum import Enum
from functools import wraps
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, ListConfig
from torch.utils.data import Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model_oracle import chat_tokenizers  # noqa: E402


def release_roots():
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        sys.exit("verl is not installed in this interpreter (run scripts/setup)")
    roots = {"0.7.0": os.path.dirname(spec.origin)}
    newer = os.environ.get("VERLC_VERL_RELEASES", os.path.join(HERE, "../../../.venv/verl-releases"))
    for release in ["0.7.1", "0.8.0", "0.9.0", "0.9.1"]:
        root = os.path.join(newer, release, "verl")
        if not os.path.isdir(root):
            sys.exit(f"verl {release}'s files are not at {root} (run scripts/setup)")
        roots[release] = root
    return roots


def definitions(path, names, namespace):
    """Executes the top-level functions and classes of `path` (all, or those in `names`) and
    its plain assignments in `namespace`; its imports are not executed."""
    with open(path) as f:
        tree = ast.parse(f.read())
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if names is None or node.name in names:
                keep.append(node)
        elif isinstance(node, ast.Assign) and names is None:
            keep.append(node)
    module = ast.Module(body=keep, type_ignores=[])
    namespace["__file__"] = path
    exec(compile(module, path, "exec"), namespace)
    return namespace


def module_path(root, dotted):
    rel = dotted.split(".")[1:]
    base = os.path.join(root, *rel)
    return base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")


def verl_imports(path):
    """(module, name) of every `from verl... import name` and `from .x import name` in `path`."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = os.path.dirname(path)
    out = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = os.path.join(package, *(node.module or "").split("."))
                out.extend((("rel", target), a.name) for a in node.names)
            elif node.module and node.module.split(".")[0] == "verl":
                out.extend(((node.module, None), a.name) for a in node.names)
    return out


def base_namespace():
    logger = logging.getLogger("verl-oracle")
    return {
        "__name__": "verl_oracle",
        "np": np,
        "pd": pd,
        "torch": torch,
        "F": F,
        "re": re,
        "os": os,
        "logging": logging,
        "logger": logger,
        "wraps": wraps,
        "Any": Any,
        "Optional": Optional,
        "Enum": Enum,
        "DictConfig": DictConfig,
        "ListConfig": ListConfig,
        "Dataset": Dataset,
    }


class Unavailable:
    def __init__(self, name):
        self.name = name

    def __call__(self, *a, **k):
        raise RuntimeError(f"the oracle does not provide verl's {self.name}")


def load(root, path, names=None, depth=0):
    """`path`'s definitions with the verl names it imports resolved from verl's own files
    (hdfs copying is the identity: the files are local)."""
    from transformers import PreTrainedTokenizer, PreTrainedTokenizerBase, ProcessorMixin

    ns = base_namespace()
    ns.update(
        PreTrainedTokenizer=PreTrainedTokenizer,
        PreTrainedTokenizerBase=PreTrainedTokenizerBase,
        ProcessorMixin=ProcessorMixin,
    )
    for (module, _), name in verl_imports(path):
        if name in ("copy_local_path_from_hdfs", "copy_to_local"):
            ns[name] = lambda p, verbose=False, **_: p
            continue
        if name == "compute_position_id_with_mask":
            ns[name] = definitions(module_path(root, module) if module != "rel" else _, {name}, base_namespace())[name]
            continue
        if module == "rel":
            target = _ + ".py" if os.path.isfile(_ + ".py") else os.path.join(_, "__init__.py")
        else:
            target = module_path(root, module)
        wanted = module.rsplit(".", 1)[-1] if module != "rel" else os.path.basename(_)
        if depth < 2 and wanted in ("chat_template", "tokenizer", "dataset_utils", "py_functional") and os.path.isfile(target):
            ns[name] = load(root, target, {name}, depth + 1)[name]
        else:
            ns[name] = Unavailable(name)
    return definitions(path, names, ns)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


PLAIN = [
    [{"role": "user", "content": "Reverse 12345."}, {"role": "assistant", "content": "54321"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "sunny, 21 degrees"},
        {"role": "user", "content": "and tomorrow?"},
        {"role": "assistant", "content": "rain (héllo ✓)"},
    ],
    [
        {"role": "user", "content": "reverse digits " * 6},
        {"role": "assistant", "content": "the answer is " * 8},
    ],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
]

TOOL_CHATS = [
    [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome"})],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "Paris sunny, Rome rain."},
    ],
]

THINKING = [
    ([{"role": "user", "content": "Reverse 12."}, {"role": "assistant", "content": "21"}], True),
    ([{"role": "user", "content": "Reverse 34."}, {"role": "assistant", "content": "43"}], False),
]


def write_files(out):
    files = {}

    def table(rows, path):
        pq.write_table(pa.Table.from_pylist(rows), path)
        files[os.path.basename(path)[: -len(".parquet")]] = path

    table([{"messages": m} for m in PLAIN], os.path.join(out, "plain.parquet"))
    table([{"messages": m, "tools": TOOLS} for m in TOOL_CHATS], os.path.join(out, "tools.parquet"))
    table([{"messages": m, "enable_thinking": t} for m, t in THINKING], os.path.join(out, "thinking.parquet"))
    return files


OPTIONS = {
    "long": {"max_length": 4096, "truncation": "error"},
    "short_error": {"max_length": 40, "truncation": "error"},
    "short_right": {"max_length": 40, "truncation": "right"},
    "short_left": {"max_length": 40, "truncation": "left"},
    "ignore_mismatch": {"max_length": 4096, "truncation": "error", "ignore_input_ids_mismatch": True},
    "no_thinking_kwargs": {"max_length": 4096, "truncation": "error", "apply_chat_template_kwargs": {"enable_thinking": False}},
    "thinking_default_off": {"max_length": 4096, "truncation": "error", "enable_thinking_default": False},
}


# verl 0.7.0's legacy trainer runs the multi-turn dataset in its default `right` padding mode,
# where `truncation` is obeyed.
RIGHT_PADDED = ["short_error", "short_right", "short_left"]

# verl 0.7.0's single-turn SFTDataset (the legacy trainer without multiturn.enable): its files,
# column settings and options.
QA = [
    ("Reverse 12345.", "54321"),
    ("What is the weather in Paris? (héllo ✓)", "sunny, 21 degrees"),
    ("reverse digits " * 6, "the answer is " * 8),
    ("hi", ""),
]

SINGLE_TURN_KEYS = {
    "columns": {"prompt_key": "question", "response_key": "answer"},
    "dict_keys": {
        "prompt_key": "extra_info",
        "response_key": "extra_info",
        "prompt_dict_keys": ["question"],
        "response_dict_keys": ["answer"],
    },
}

SINGLE_TURN_OPTIONS = {
    "long": {"max_length": 4096, "truncation": "error"},
    "short_error": {"max_length": 80, "truncation": "error"},
    "short_right": {"max_length": 80, "truncation": "right"},
    "short_left": {"max_length": 80, "truncation": "left"},
    "kwargs": {"max_length": 4096, "truncation": "error", "apply_chat_template_kwargs": {"enable_thinking": False}},
}


def write_single_turn_files(out):
    paths = {}
    rows = [{"question": q, "answer": a} for q, a in QA]
    paths["columns"] = os.path.join(out, "qa.parquet")
    pq.write_table(pa.Table.from_pylist(rows), paths["columns"])
    rows = [{"extra_info": {"split": "train", "index": i, "question": q, "answer": a}} for i, (q, a) in enumerate(QA)]
    paths["dict_keys"] = os.path.join(out, "qa_extra_info.parquet")
    pq.write_table(pa.Table.from_pylist(rows), paths["dict_keys"])
    return paths


def unpadded(item):
    """A right-padded item's real tokens (where the attention mask is 1)."""
    n = int(item["attention_mask"].sum())
    return {"input_ids": item["input_ids"][:n].tolist(), "loss_mask": item["loss_mask"][:n].tolist()}


def items(ds, keep):
    rows = []
    for i in range(len(ds)):
        try:
            rows.append(keep(ds[i]))
        except (ValueError, AssertionError, NotImplementedError, TypeError) as e:
            rows.append({"error": type(e).__name__, "message": str(e)})
    return rows


def legacy_cases(out, tokenizers, root):
    """verl 0.7.0's legacy trainer's data: the single-turn dataset, and the multi-turn one
    right-padded."""
    single = load(root, os.path.join(root, "utils/dataset/sft_dataset.py"))["SFTDataset"]
    multi = load(root, os.path.join(root, "utils/dataset/multiturn_sft_dataset.py"))["MultiTurnSFTDataset"]
    files = write_single_turn_files(out)
    multi_files = {k: os.path.join(out, f"{k}.parquet") for k in ("plain", "tools", "thinking")}
    results = []
    for tok_name, fast in tokenizers.items():
        for layout, keys in SINGLE_TURN_KEYS.items():
            for opt_name, opts in SINGLE_TURN_OPTIONS.items():
                config = {**keys, **opts}
                with contextlib.redirect_stdout(io.StringIO()):
                    ds = single(parquet_files=files[layout], tokenizer=fast, config=config)
                results.append({"format": "single_turn", "tokenizer": tok_name, "file": os.path.basename(files[layout]),
                                "options": opt_name, "config": config, "rows": items(ds, unpadded)})
        for file_name, path in multi_files.items():
            for opt_name in RIGHT_PADDED:
                config = {"pad_mode": "right", **OPTIONS[opt_name]}
                with contextlib.redirect_stdout(io.StringIO()):
                    ds = multi(parquet_files=[path], tokenizer=fast, config=config)
                results.append({"format": "multi_turn", "tokenizer": tok_name, "file": os.path.basename(path),
                                "options": opt_name, "config": config, "rows": items(ds, unpadded)})
    with open(os.path.join(out, "legacy.json"), "w") as f:
        json.dump(results, f, ensure_ascii=False)


def main(out, templates):
    os.makedirs(out, exist_ok=True)
    tokenizers = chat_tokenizers(out, templates)
    files = write_files(out)
    logging.disable(logging.WARNING)
    results = []
    for release, root in release_roots().items():
        path = os.path.join(root, "utils/dataset/multiturn_sft_dataset.py")
        cls = load(root, path)["MultiTurnSFTDataset"]
        for tok_name, fast in tokenizers.items():
            for file_name, file_path in files.items():
                for opt_name, opts in OPTIONS.items():
                    config = {"pad_mode": "no_padding", **opts}
                    # verl prints the dataset's length; the oracle's stdout stays quiet.
                    with contextlib.redirect_stdout(io.StringIO()):
                        ds = cls(parquet_files=[file_path], tokenizer=fast, config=config)
                    rows = []
                    for i in range(len(ds)):
                        try:
                            item = ds[i]
                            rows.append(
                                {
                                    "input_ids": item["input_ids"].tolist(),
                                    "loss_mask": item["loss_mask"].tolist(),
                                    "position_ids": item["position_ids"].tolist(),
                                }
                            )
                        except (ValueError, AssertionError) as e:
                            rows.append({"error": type(e).__name__, "message": str(e)})
                    results.append(
                        {
                            "release": release,
                            "tokenizer": tok_name,
                            "file": file_name,
                            "options": opt_name,
                            "config": config,
                            "rows": rows,
                        }
                    )
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(results, f, ensure_ascii=False)
    # pandas warns that verl's SFTDataset indexes a Series by position.
    import warnings

    warnings.simplefilter("ignore", FutureWarning)
    legacy_cases(out, tokenizers, release_roots()["0.7.0"])


if __name__ == "__main__":
    if sys.argv[1] != "sft":
        sys.exit(f"unknown command {sys.argv[1]}")
    main(sys.argv[2], sys.argv[4:])

# verlc reward server: serves a user's compute_score over JSON lines on stdin/stdout.
# argv: <path, or pkg://<module> for an installed module> <function name> <reward_kwargs as JSON>
# Protocol (one JSON object per line):
#   server -> {"ready": true} | {"ready": false, "error": "..."}         once, at start
#   client -> {"id": N, "items": [{"data_source", "solution_str", "ground_truth", "extra_info"}]}
#   server -> {"id": N, "results": [{"score": float | null, "bad": repr | null, "extra": {...},
#                                     "dict": whether the function returned a dict}]}
#           | {"id": N, "error": "traceback", "item": index of the item that raised | null}
# The user's prints go to stderr; stdout carries only the protocol. pyproc/verl_prelude.py is put
# ahead of this script.
import asyncio
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback


def jsonable(v):
    try:
        json.dumps(v, allow_nan=False)
        return v
    except (TypeError, ValueError):
        if isinstance(v, float):
            return repr(v)
        try:
            return float(v)
        except Exception:
            return repr(v)


def normalize(res):
    extra = {}
    if isinstance(res, dict):
        if "score" not in res:
            raise ValueError(f"the reward function returned a dict without 'score': {res!r}")
        extra = {str(k): jsonable(v) for k, v in res.items() if k != "score"}
        score = res["score"]
    elif isinstance(res, (int, float, bool)):
        score = res
    elif isinstance(res, (str, bytes)):
        # verl would fail writing text into the reward tensor: a bad score, said as such.
        return {"score": None, "bad": repr(res), "extra": extra}
    else:
        score = res[0]
    try:
        score = float(score)
    except (TypeError, ValueError):
        return {"score": None, "bad": repr(res), "extra": extra}
    if not math.isfinite(score):
        return {"score": None, "bad": repr(score), "extra": extra}
    return {"score": score, "bad": None, "extra": extra, "dict": isinstance(res, dict)}


def no_verl():
    raise ImportError("verl is not installed in this Python")


def main():
    send = protocol_sender(allow_nan=False)  # noqa: F821 - defined by pyproc/channel.py, put ahead of this script

    path, name = sys.argv[1], sys.argv[2]
    kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    try:
        if path.startswith("pkg://"):
            # An installed module (verl's own scorers), not a file; verl's package root
            # imports Ray, which the prelude (pyproc/verl_prelude.py) does without.
            installed = path[len("pkg://"):]
            if installed.split(".")[0] == "verl":
                verl_modules([], [installed], no_verl)  # noqa: F821 - pyproc/verl_prelude.py
            module = importlib.import_module(installed)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
            spec = importlib.util.spec_from_file_location("custom_module", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules["custom_module"] = module
            spec.loader.exec_module(module)
        if not hasattr(module, name):
            raise AttributeError(f"Reward function '{name}' not found in '{path}'.")
        fn = getattr(module, name)
    except BaseException:
        send({"ready": False, "error": traceback.format_exc()})
        return 1
    send({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        item = None
        try:
            results = []
            for item, it in enumerate(req["items"]):
                res = fn(
                    data_source=it["data_source"],
                    solution_str=it["solution_str"],
                    ground_truth=it["ground_truth"],
                    extra_info=it.get("extra_info"),
                    **kwargs,
                )
                if inspect.isawaitable(res):
                    res = asyncio.run(res)
                results.append(normalize(res))
            item = None
            send({"id": req["id"], "results": results})
        except BaseException:
            send({"id": req["id"], "error": traceback.format_exc(), "item": item})
    return 0


if __name__ == "__main__":
    sys.exit(main())

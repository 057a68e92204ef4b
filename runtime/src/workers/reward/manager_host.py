# verlc reward-manager host: runs a reward manager class as verl runs it, over JSON lines on
# stdin/stdout: the user's class (`reward_manager.source: importlib`) or one of verl's
# registered managers verlc does not implement itself (0.7.0's `batch`, `prime`).
# argv: one JSON object
#   {"class": {"path", "name"} | null, "registered": name, "kwargs": {...},
#    "reward_fn_key": str, "config": the composed config, "tokenizer": dir,
#    "function": {"path", "name", "kwargs"} | null}      null: verl's default_compute_score
# Protocol (one JSON object per line):
#   host -> {"ready": true, "interface": "legacy" | "loop", "class": str, "verl": str}
#         | {"ready": false, "error": "traceback"}                                     once
#   client -> {"id", "batch": {"tensors": {name: nested lists}, "non_tensors": {name: list},
#                              "meta_info": {...}}}
#   host -> {"id", "rewards": [[float per response token] per row], "extra": {key: [per row]}}
#         | {"id", "error": "traceback"}
# Two interfaces, chosen as verl chooses them: a subclass of the reward loop's
# RewardManagerBase is built with (config, tokenizer, compute_score, ...) and scores each row
# with `await run_single(data[i:i+1])` (its `reward_score` placed at the row's last response
# token); any other class is verl's AbstractRewardManager kind, built with (tokenizer,
# num_examine=0, compute_score, reward_fn_key, **reward_kwargs) and called as
# `manager(data, return_dict=True)` for the whole batch's reward tensor.
import asyncio
import functools
import inspect
import json
import sys
import traceback


def standin_modules():
    """verl's reward-manager interfaces for a machine without verl."""

    class AbstractRewardManager:
        def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key="data_source", **kwargs):
            pass

        def __call__(self, data, return_dict=False):
            raise NotImplementedError

    class RewardManagerBase:
        def __init__(self, config, tokenizer, compute_score=None, **kwargs):
            self.config = config
            self.tokenizer = tokenizer
            self.compute_score = compute_score
            self.loop = event_loop()  # noqa: F821 - pyproc/verl_prelude.py

        async def run_single(self, data):
            raise NotImplementedError

    registry = {}

    def register(name):
        def deco(cls):
            registry[name] = cls
            return cls

        return deco

    def get_reward_manager_cls(name):
        if name not in registry:
            raise ValueError(f"Unknown reward manager: {name} (verl is not installed here)")
        return registry[name]

    def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        raise NotImplementedError(
            f"Reward function is not implemented for {data_source=}: verl is not installed here "
            "(set custom_reward_function.path)"
        )

    standin_package(  # noqa: F821 - pyproc/verl_prelude.py
        "utils",
        "workers",
        "experimental",
        "experimental.reward_loop",
        "experimental.reward_loop.reward_manager",
    )
    stand_in_module(  # noqa: F821
        "verl.workers.reward_manager",
        register=register,
        get_reward_manager_cls=get_reward_manager_cls,
        AbstractRewardManager=AbstractRewardManager,
    )
    stand_in_module("verl.workers.reward_manager.abstract", AbstractRewardManager=AbstractRewardManager)  # noqa: F821
    stand_in_module("verl.utils.reward_score", default_compute_score=default_compute_score)  # noqa: F821
    stand_in_module(  # noqa: F821
        "verl.experimental.reward_loop.reward_manager.base", RewardManagerBase=RewardManagerBase
    )
    sys.modules["verl.experimental.reward_loop.reward_manager"].RewardManagerBase = RewardManagerBase
    sys.modules["verl.experimental.reward_loop.reward_manager"].register = register


def loop_registry():
    """The reward loop's package made without its __init__ (it imports Ray) gets the names
    users import from it: `register` and `RewardManagerBase`."""
    pkg = sys.modules.get("verl.experimental.reward_loop.reward_manager")
    if pkg is None:
        return
    for module, names in [("registry", ["register", "get_reward_manager_cls"]), ("base", ["RewardManagerBase"])]:
        try:
            mod = __import__(f"verl.experimental.reward_loop.reward_manager.{module}", fromlist=names)
        except Exception:
            continue
        for n in names:
            if hasattr(mod, n) and not hasattr(pkg, n):
                setattr(pkg, n, getattr(mod, n))


def loop_base():
    try:
        from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

        return RewardManagerBase
    except Exception:
        return None


def compute_score_of(spec):
    f = spec.get("function")
    if not f:
        from verl.utils.reward_score import default_compute_score

        return default_compute_score
    fn = load_user_object(f["path"], f["name"])  # noqa: F821 - pyproc/verl_prelude.py
    kwargs = f.get("kwargs") or {}
    if not kwargs:
        return fn

    @functools.wraps(fn)
    def with_kwargs(*args, **kw):
        return fn(*args, **{**kwargs, **kw})

    return with_kwargs


def accepted(cls, kwargs):
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def build(spec, tokenizer, config, compute_score):
    if spec.get("class"):
        cls = load_user_object(spec["class"]["path"], spec["class"]["name"])  # noqa: F821
    else:
        from verl.workers.reward_manager import get_reward_manager_cls

        cls = get_reward_manager_cls(spec["registered"])
    kwargs = spec.get("kwargs") or {}
    base = loop_base()
    if base is not None and isinstance(cls, type) and issubclass(cls, base):
        args = accepted(
            cls,
            {
                "config": config,
                "tokenizer": tokenizer,
                "compute_score": compute_score,
                "reward_router_address": None,
                "reward_model_tokenizer": None,
            },
        )
        return cls(**args, **kwargs), "loop", cls.__name__
    manager = cls(
        tokenizer=tokenizer,
        num_examine=0,
        compute_score=compute_score,
        reward_fn_key=spec["reward_fn_key"],
        **kwargs,
    )
    return manager, "legacy", cls.__name__


def score_legacy(manager, data):
    try:
        result = manager(data, return_dict=True)
    except TypeError as e:
        if "return_dict" not in str(e):
            raise
        result = manager(data)
    if isinstance(result, dict):
        return result["reward_tensor"], dict(result.get("reward_extra_info") or {})
    return result, {}


def score_loop(manager, data):
    import torch

    loop = getattr(manager, "loop", None) or asyncio.new_event_loop()

    async def all_rows():
        return await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))

    outs = loop.run_until_complete(all_rows())
    responses = data.batch["responses"]
    prompt_len = data.batch["prompts"].shape[-1]
    lengths = data.batch["attention_mask"][:, prompt_len:].sum(-1)
    rewards = torch.zeros_like(responses, dtype=torch.float32)
    extra = {}
    for i, out in enumerate(outs):
        score = out["reward_score"] if isinstance(out, dict) else out
        if int(lengths[i]) > 0:
            rewards[i, int(lengths[i]) - 1] = float(score)
        for k, v in ((out.get("reward_extra_info") or {}) if isinstance(out, dict) else {}).items():
            extra.setdefault(k, [None] * len(outs))[i] = v
    return rewards, extra


def main():
    send = protocol_sender(allow_nan=False)  # noqa: F821 - pyproc/channel.py

    spec = json.loads(sys.argv[1])
    try:
        kind = verl_modules(  # noqa: F821 - pyproc/verl_prelude.py
            ["workers", "experimental", "experimental.reward_loop", "experimental.reward_loop.reward_manager"],
            [
                "verl.workers.reward_manager",
                "verl.utils.reward_score",
                "verl.experimental.reward_loop.reward_manager.base",
            ],
            standin_modules,
        )
        loop_registry()
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
        config = config_object(spec["config"])  # noqa: F821 - pyproc/verl_prelude.py
        manager, interface, name = build(spec, tokenizer, config, compute_score_of(spec))
    except BaseException:
        send({"ready": False, "error": traceback.format_exc()})
        return 1
    send({"ready": True, "interface": interface, "class": name, "verl": kind})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            data = data_proto_of(req["batch"])  # noqa: F821 - pyproc/verl_prelude.py
            if interface == "loop":
                rewards, extra = score_loop(manager, data)
            else:
                rewards, extra = score_legacy(manager, data)
            send(
                {
                    "id": req["id"],
                    "rewards": jsonable(rewards),  # noqa: F821 - pyproc/verl_prelude.py
                    "extra": {str(k): jsonable(list(v)) for k, v in extra.items()},  # noqa: F821
                }
            )
        except BaseException:
            send({"id": req["id"], "error": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

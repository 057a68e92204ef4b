# verlc agent-loop host: runs the agent loops an `agent_loop_config_path` file registers (verl's
# AgentLoopBase subclasses), their generation served by verlc's rollout, over JSON lines.
# argv: one JSON object {"config_path", "tokenizer", "config": the composed config}
# Protocol (one JSON object per line):
#   host -> {"ready": true, "names": [registered agent names], "verl": str}
#         | {"ready": false, "error": "traceback"}                                      once
#   client -> {"id", "run": {"rows": [{"agent_name", "kwargs": {...}}], "sampling_params": {...}}}
#   host -> {"id", "generate": [{"sample", "prompt_ids", "max_tokens"}]}  while loops wait on
#           the server: every request its loops made since the last answer
#   client -> {"id", "generated": [{"token_ids", "log_probs"}]}            in the same order
#   host -> {"id", "done": [{"prompt_ids", "response_ids", "response_mask", "response_logprobs",
#                            "num_turns", "reward_score"}]}  | {"id", "error": "traceback"}
# Each loop is built as verl builds it (`_target_` with the entry's other keys, plus
# trainer_config, server_manager, tokenizer, processor=None, dataset_cls, dataset_config) and
# awaited as `run(sampling_params, **row)`. verl's agent_loop module imports Ray: its interface
# (AgentLoopBase, AgentLoopOutput, AgentLoopMetrics, register, AsyncLLMServerManager,
# DictConfigWrap) is provided here with the same fields and signatures.
import asyncio
import importlib
import json
import os
import sys
import traceback
import types


class DictConfigWrap:
    def __init__(self, config):
        self.config = config


class AgentLoopMetrics:
    def __init__(self, generate_sequences=0.0, tool_calls=0.0, **_):
        self.generate_sequences = generate_sequences
        self.tool_calls = tool_calls


class AgentLoopOutput:
    def __init__(self, prompt_ids, response_ids, response_mask, response_logprobs=None, routed_experts=None,
                 multi_modal_data=None, reward_score=None, num_turns=0, metrics=None, extra_fields=None):
        self.prompt_ids = list(prompt_ids)
        self.response_ids = list(response_ids)
        self.response_mask = list(response_mask)
        self.response_logprobs = None if response_logprobs is None else list(response_logprobs)
        self.routed_experts = routed_experts
        self.multi_modal_data = multi_modal_data
        self.reward_score = reward_score
        self.num_turns = num_turns
        self.metrics = metrics if metrics is not None else AgentLoopMetrics()
        self.extra_fields = dict(extra_fields or {})


class TokenOutput:
    def __init__(self, token_ids, log_probs=None, routed_experts=None, stop_reason=None):
        self.token_ids = token_ids
        self.log_probs = log_probs
        self.routed_experts = routed_experts
        self.stop_reason = stop_reason


_registry = {}


def register(agent_name):
    def decorator(cls):
        _registry[agent_name] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
        return cls

    return decorator


class AgentLoopBase:
    def __init__(self, trainer_config, server_manager, tokenizer, processor, dataset_cls=None,
                 dataset_config=None, **kwargs):
        self.config = trainer_config.config
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.dataset_config = dataset_config
        self.apply_chat_template_kwargs = (dataset_config or {}).get("apply_chat_template_kwargs", {}) or {}
        self.loop = asyncio.get_event_loop()

    async def apply_chat_template(self, messages, tools=None, images=None, videos=None, remove_system_prompt=False):
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
        )

    async def run(self, sampling_params, **kwargs):
        raise NotImplementedError


class Server:
    """verl's AsyncLLMServerManager: `generate` parks the request until the host hands every
    waiting request to verlc's rollout at once."""

    def __init__(self, sample_of):
        self.pending = []
        self.sample_of = sample_of

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        fut = asyncio.get_running_loop().create_future()
        task = asyncio.current_task()
        self.pending.append((self.sample_of.get(task, 0), list(prompt_ids), sampling_params, fut))
        return await fut


def agent_loop_module():
    mod = types.ModuleType("verl.experimental.agent_loop.agent_loop")
    for name, obj in [("AgentLoopBase", AgentLoopBase), ("AgentLoopOutput", AgentLoopOutput),
                      ("AgentLoopMetrics", AgentLoopMetrics), ("register", register),
                      ("DictConfigWrap", DictConfigWrap), ("AsyncLLMServerManager", Server),
                      ("_agent_loop_registry", _registry)]:
        setattr(mod, name, obj)
    for pkg in ["verl", "verl.experimental", "verl.experimental.agent_loop"]:
        if pkg not in sys.modules:
            bare_package(pkg, "")  # noqa: F821 - pyproc/verl_prelude.py
    sys.modules["verl.experimental.agent_loop.agent_loop"] = mod
    sys.modules["verl.experimental.agent_loop"].AgentLoopBase = AgentLoopBase
    sys.modules["verl.experimental.agent_loop"].AgentLoopOutput = AgentLoopOutput
    sys.modules["verl.experimental.agent_loop"].register = register
    replica = types.ModuleType("verl.workers.rollout.replica")
    replica.TokenOutput = TokenOutput
    for pkg in ["verl.workers", "verl.workers.rollout"]:
        if pkg not in sys.modules:
            bare_package(pkg, "")  # noqa: F821
    sys.modules["verl.workers.rollout.replica"] = replica


def instantiate(entry, **kwargs):
    target = entry["_target_"]
    module_name, _, cls_name = target.rpartition(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    extra = {k: v for k, v in entry.items() if k not in ("_target_", "name")}
    return cls(**extra, **kwargs)


def main():
    send = protocol_sender(allow_nan=False)  # noqa: F821 - pyproc/channel.py
    spec = json.loads(sys.argv[1])
    try:
        kind = verl_modules(  # noqa: F821 - pyproc/verl_prelude.py
            ["utils.dataset"], ["verl.utils.dataset.rl_dataset"], lambda: None
        )
        agent_loop_module()
        import yaml
        from transformers import AutoTokenizer

        path = spec["config_path"]
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        sys.path.insert(0, os.getcwd())
        with open(path) as f:
            entries = yaml.safe_load(f) or []
        for e in entries:
            _registry[e["name"]] = e
        tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
        config = config_object(spec["config"])  # noqa: F821 - pyproc/verl_prelude.py
        try:
            from verl.utils.dataset.rl_dataset import RLHFDataset as dataset_cls
        except Exception:
            dataset_cls = None
    except BaseException:
        send({"ready": False, "error": traceback.format_exc()})
        return 1
    send({"ready": True, "names": sorted(_registry), "verl": kind})
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            outs = loop.run_until_complete(run_batch(req, send, tokenizer, config, dataset_cls))
            send({"id": req["id"], "done": outs})
        except BaseException:
            send({"id": req["id"], "error": traceback.format_exc()})
    return 0


async def run_batch(req, send, tokenizer, config, dataset_cls):
    rows = req["run"]["rows"]
    sampling = req["run"]["sampling_params"]
    sample_of = {}
    server = Server(sample_of)

    async def one(i, row):
        sample_of[asyncio.current_task()] = i
        name = row["agent_name"]
        if name not in _registry:
            raise KeyError(f"Agent loop {name} not registered, registered agent loops: {sorted(_registry)}")
        agent = instantiate(
            _registry[name], trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
            processor=None, dataset_cls=dataset_cls, dataset_config=config.get("data", {}),
        )
        return await agent.run(dict(sampling), **row["kwargs"])

    tasks = [asyncio.ensure_future(one(i, r)) for i, r in enumerate(rows)]
    idle = 0
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0)
        running = sum(1 for t in tasks if not t.done())
        # Every running loop waits on the server (or none has moved for a while): hand the
        # waiting requests to verlc's rollout in one batch.
        if server.pending and (len(server.pending) >= running or idle > 200):
            batch, server.pending = server.pending, []
            send({"id": req["id"], "generate": [
                {"sample": s, "prompt_ids": p, "max_tokens": int(sp.get("max_tokens") or 0)} for s, p, sp, _ in batch
            ]})
            answer = json.loads(sys.stdin.readline())
            for (_, _, _, fut), g in zip(batch, answer["generated"]):
                fut.set_result(TokenOutput(g["token_ids"], g["log_probs"], stop_reason="completed"))
            idle = 0
        else:
            idle += 1
            if idle > 200:
                await asyncio.sleep(0.001)
    outs = []
    for t in tasks:
        o = t.result()
        outs.append({
            "prompt_ids": [int(x) for x in o.prompt_ids],
            "response_ids": [int(x) for x in o.response_ids],
            "response_mask": [int(x) for x in o.response_mask],
            "response_logprobs": None if o.response_logprobs is None else [float(x) for x in o.response_logprobs],
            "num_turns": int(o.num_turns),
            "reward_score": None if o.reward_score is None else float(o.reward_score),
        })
    return outs


if __name__ == "__main__":
    sys.exit(main())

# verlc agent-loop host: runs the agent loops an `agent_loop_config_path` file registers (verl's
# AgentLoopBase subclasses), their generation served by verlc's rollout, over JSON lines.
# argv: one JSON object {"config_path", "tokenizer", "config": the composed config, "model_type"}
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
# trainer_config, server_manager, tokenizer, processor=None, dataset_cls, and the data config
# and model type under the names its constructor takes: see AgentLoopBase) and
# awaited as `run(sampling_params, **row)`. verl's agent_loop module imports Ray: its interface
# (AgentLoopBase, AgentLoopOutput, AgentLoopMetrics, register, AsyncLLMServerManager,
# DictConfigWrap) is provided here with the same fields and signatures.
import asyncio
import importlib
import inspect
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
                 multi_modal_data=None, reward_score=None, num_turns=0, metrics=None, extra_fields=None, **_):
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
    def __init__(self, token_ids, log_probs=None, routed_experts=None, stop_reason=None, num_preempted=None,
                 extra_fields=None):
        self.token_ids = token_ids
        self.log_probs = log_probs
        self.routed_experts = routed_experts
        self.stop_reason = stop_reason
        self.num_preempted = num_preempted
        self.extra_fields = dict(extra_fields or {})


VERL_KIND = "no"


def continuous_token_factory():
    """verl's `create_continuous_token_builder` (verl 0.9's tokenization of agent loops) from the
    verl beside this helper, or None where that verl has none."""
    try:
        return importlib.import_module("verl.utils.tokenizer.continuous_token_wiring").create_continuous_token_builder
    except Exception:
        return None


def get(config, key, default=None):
    try:
        value = config.get(key, default)
    except Exception:
        return default
    return default if value is None else value


_registry = {}


def register(agent_name):
    def decorator(cls):
        _registry[agent_name] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
        return cls

    return decorator


class AgentLoopBase:
    """verl's AgentLoopBase as each release builds it: verl 0.7.0 passes the data config as
    `dataset_config`, later releases as `data_config` (wrapped), 0.9.1 also `hf_model_type`; both
    attributes are set. verl 0.9's Continuous Token methods (`ct_*`) use the builder of the verl
    installed beside the helper, as verl's own base class does (0.9.0 where
    `data.continuous_token.enable`, 0.9.1 always)."""

    def __init__(self, trainer_config, server_manager, tokenizer, processor, dataset_cls=None,
                 dataset_config=None, data_config=None, hf_model_type=None, **kwargs):
        self.config = trainer_config.config
        self.rollout_config = get(get(self.config, "actor_rollout_ref", {}), "rollout", {})
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        data = data_config.config if data_config is not None else dataset_config
        if data is None:
            data = get(self.config, "data", {})
        self.dataset_config = data
        self.data_config = data
        self.apply_chat_template_kwargs = get(data, "apply_chat_template_kwargs", {})
        self.mm_processor_kwargs = get(data, "mm_processor_kwargs", {})
        self.hf_model_type = hf_model_type
        self.continuous_token_builder = None
        self.enable_continuous_token = False
        create = continuous_token_factory()
        ct = get(data, "continuous_token", None)
        if create is not None and (ct is None or get(ct, "enable", False)):
            model = get(get(self.config, "actor_rollout_ref", {}), "model", {})
            offered = {
                "hf_model_type": hf_model_type,
                "chat_template_kwargs": dict(self.apply_chat_template_kwargs),
                "mm_processor_kwargs": dict(self.mm_processor_kwargs),
                "processor": processor,
                "model_family": get(ct, "model_family", "auto"),
                "model_path": get(model, "path", None),
                "tokenizer_name_or_path": get(model, "tokenizer_path", None),
            }
            # Each release's factory names what it takes (the rest would reach its builder).
            accepted = inspect.signature(create).parameters
            self.continuous_token_builder = create(
                tokenizer, **{k: v for k, v in offered.items() if k in accepted}
            )
            self.enable_continuous_token = True
        self.loop = asyncio.get_event_loop()

    async def apply_chat_template(self, messages, tools=None, images=None, videos=None, remove_system_prompt=False):
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
        )

    async def process_vision_info(self, messages):
        return await self.process_multi_modal_info(messages)

    async def process_multi_modal_info(self, messages):
        # verl extracts pictures through the processor; the helper has none (processor=None).
        return {}

    def _assert_mm_supported(self, has_multi_modal):
        if has_multi_modal:
            raise ValueError("verlc runs the user's agent loops on text prompts only")

    def _get_mm_processor_kwargs(self, audio_data=None):
        return dict(self.mm_processor_kwargs or {})

    @staticmethod
    def build_sglang_video_payload(videos, mm_inputs):
        return None

    def _builder(self, method):
        if self.continuous_token_builder is None:
            raise RuntimeError(
                f"{method} is verl 0.9's Continuous Token API: it needs verl 0.9's "
                "verl.utils.tokenizer.continuous_token_wiring importable beside the agent loops "
                f"(this helper found {VERL_KIND!r} verl), and on verl 0.9.0 data.continuous_token.enable"
            )
        return self.continuous_token_builder

    def _cap_text_prompt_length(self, prompt_ids):
        length = int(get(self.rollout_config, "prompt_length", 0) or 0)
        if length and len(prompt_ids) > length:
            return prompt_ids[-length:]
        return prompt_ids

    async def ct_build_initial_tokens(self, messages, tools=None, images=None, videos=None, audios=None,
                                      mm_inputs_out=None):
        builder = self._builder("ct_build_initial_tokens")
        prompt_ids = builder.build_initial_tokens(
            messages, tools=tools, images=images, videos=videos, audios=audios, mm_inputs_out=mm_inputs_out
        )
        return self._cap_text_prompt_length(list(prompt_ids))

    async def ct_merge_context_msg(self, previous_messages, updated_messages, runtime_token_ids, response_mask,
                                   response_logprobs=None, tools=None):
        builder = self._builder("ct_merge_context_msg")
        merged = builder.merge_context_tokens(previous_messages, updated_messages, runtime_token_ids, tools=tools)
        mask, logprobs = builder.align_response_metadata(merged, response_mask, response_logprobs)
        return merged, mask, logprobs

    async def ct_merge_assistant_token(self, runtime_token_ids, assistant_token_ids, response_mask,
                                       response_logprobs=None, assistant_logprobs=None):
        builder = self._builder("ct_merge_assistant_token")
        merged = builder.merge_assistant_tokens(runtime_token_ids, assistant_token_ids)
        mask, logprobs = builder.align_response_metadata(
            merged, response_mask, response_logprobs, assistant_logprobs=assistant_logprobs
        )
        return merged, mask, logprobs

    async def run(self, sampling_params, **kwargs):
        raise NotImplementedError


class Server:
    """verl's AsyncLLMServerManager: `generate` parks the request until the host hands every
    waiting request to verlc's rollout at once."""

    def __init__(self, sample_of):
        self.pending = []
        self.sample_of = sample_of

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       audio_data=None, **_):
        if image_data or video_data or audio_data:
            raise ValueError("verlc runs the user's agent loops on text prompts only")
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


def instantiate(entry, optional=None, **kwargs):
    """The entry's class built with `kwargs`, the entry's own keys, and those of `optional` the
    constructor names or takes as keywords (each verl release passes its own set)."""
    target = entry["_target_"]
    module_name, _, cls_name = target.rpartition(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    extra = {k: v for k, v in entry.items() if k not in ("_target_", "name")}
    params = inspect.signature(cls.__init__).parameters
    keyword = any(p.kind == p.VAR_KEYWORD for p in params.values())
    chosen = {k: v for k, v in (optional or {}).items() if k in params or keyword}
    return cls(**extra, **kwargs, **chosen)


def main():
    global VERL_KIND
    send = protocol_sender(allow_nan=False)  # noqa: F821 - pyproc/channel.py
    spec = json.loads(sys.argv[1])
    try:
        kind = verl_modules(  # noqa: F821 - pyproc/verl_prelude.py
            ["utils.dataset"], ["verl.utils.dataset.rl_dataset"], lambda: None
        )
        VERL_KIND = kind
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
            outs = loop.run_until_complete(
                run_batch(req, send, tokenizer, config, dataset_cls, spec.get("model_type"))
            )
            send({"id": req["id"], "done": outs})
        except BaseException:
            send({"id": req["id"], "error": traceback.format_exc()})
    return 0


async def run_batch(req, send, tokenizer, config, dataset_cls, model_type):
    rows = req["run"]["rows"]
    sampling = req["run"]["sampling_params"]
    sample_of = {}
    server = Server(sample_of)

    async def one(i, row):
        sample_of[asyncio.current_task()] = i
        name = row["agent_name"]
        if name not in _registry:
            raise KeyError(f"Agent loop {name} not registered, registered agent loops: {sorted(_registry)}")
        data = config.get("data", {})
        agent = instantiate(
            _registry[name], trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
            processor=None, dataset_cls=dataset_cls,
            optional={"data_config": DictConfigWrap(data), "dataset_config": data, "hf_model_type": model_type},
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

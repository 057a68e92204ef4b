# verlc tool host: runs verl-style tools for the agent loop, over JSON lines on stdin/stdout.
# argv: <tool_config_path or ""> <function_tool_path or ""> <seconds a call may take>
#       <interaction_config_path or "">
# Protocol (one JSON object per line):
#   host -> {"ready": true, "schemas": [OpenAI function tool schemas], "names": [...],
#            "interactions": [...]}
#         | {"ready": false, "error": "traceback"}                                  once
#   client -> {"id": N, "calls": [{"name", "arguments": JSON text, "create_kwargs": {...}}]}
#   host -> {"id": N, "results": [{"text": str, "reward": float | null, "failed": bool}]}
#   client -> {"id": N, "respond": {"instance": str, "messages": [...], "kwargs": {...}}}
#   host -> {"id": N, "user": {"text": str, "reward": float | null, "terminate": bool}}
#         | {"id": N, "user": {"error": "traceback"}}
# `respond` asks the interaction named by kwargs["name"] (verl 0.7's BaseInteraction: a
# scripted user) for its answer to the conversation so far, starting the instance with the
# kwargs the first time.
# Requests run concurrently and are answered as each finishes (in any order); the calls of
# one request run concurrently too. A tool that raises, or runs past the time a call may
# take, gets verl's text "Error executing tool '<name>': <why>" (a synchronous function runs
# on a worker thread, which is abandoned when it overruns; a coroutine is cancelled). The host
# itself only fails on protocol errors. The tools' prints go to stderr; stdout carries only
# the protocol.
#
# Tool classes follow verl's BaseTool (create / execute / release, `verl.tools.base_tool`):
# verl's own, loaded without its Ray-importing package root where needed (pyproc/verl_prelude.py's
# verl_modules, put ahead of this script), and where verl is absent a small compatible
# `verl.tools.base_tool` / `verl.tools.schemas` (`standin` below).
import asyncio
import concurrent.futures
import functools
import importlib
import importlib.util
import inspect
import json
import os
import sys
import traceback
import types
import uuid


def standin():
    class _Obj:
        def __init__(self, d):
            for k, v in d.items():
                setattr(self, k, _Obj(v) if isinstance(v, dict) else v)
            self._d = d

        def model_dump(self, **_):
            return self._d

    class OpenAIFunctionToolSchema(_Obj):
        @classmethod
        def model_validate(cls, d):
            return cls(d)

    class ToolResponse:
        def __init__(self, text=None, image=None, video=None):
            self.text, self.image, self.video = text, image, video

    class BaseTool:
        def __init__(self, config, tool_schema):
            self.config = config
            self.tool_schema = tool_schema
            self.name = tool_schema.function.name

        def get_openai_tool_schema(self):
            return self.tool_schema

        async def create(self, instance_id=None, **kwargs):
            return (instance_id or str(uuid.uuid4())), ToolResponse()

        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text="Updated the tool state."), 0.0, {}

        async def calc_reward(self, instance_id, **kwargs):
            return 0.0

        async def release(self, instance_id, **kwargs):
            return None

    bare_package("verl", "")
    bare_package("verl.tools", "")
    schemas = types.ModuleType("verl.tools.schemas")
    schemas.OpenAIFunctionToolSchema = OpenAIFunctionToolSchema
    schemas.ToolResponse = ToolResponse
    base = types.ModuleType("verl.tools.base_tool")
    base.BaseTool = BaseTool
    base.OpenAIFunctionToolSchema = OpenAIFunctionToolSchema
    base.ToolResponse = ToolResponse
    sys.modules["verl.tools.schemas"] = schemas
    sys.modules["verl.tools.base_tool"] = base


def schema_dict(schema):
    if isinstance(schema, dict):
        return schema
    try:
        return schema.model_dump(exclude_unset=True, exclude_none=True)
    except TypeError:
        return schema.model_dump()


class FunctionTool:
    def __init__(self, name, fn, schema):
        self.name, self.fn, self.schema = name, fn, schema


def yaml_classes(path, section):
    """The `section` list of a YAML config as (item, class) pairs: each item's `class_name`
    imported (modules beside the config import by name, as on verl's PYTHONPATH)."""
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    out = []
    for item in cfg.get(section) or []:
        module_name, _, class_name = item["class_name"].rpartition(".")
        out.append((item, getattr(importlib.import_module(module_name), class_name)))
    return out


def load_yaml_tools(path):
    from verl.tools.schemas import OpenAIFunctionToolSchema

    tools = {}
    for item, cls in yaml_classes(path, "tools"):
        config = dict(item.get("config") or {})
        schema = item.get("tool_schema")
        schema_obj = OpenAIFunctionToolSchema.model_validate(schema) if schema else None
        tool = cls(config=config, tool_schema=schema_obj)
        tools[tool.name] = tool
    return tools


def load_interactions(path):
    """verl 0.7's interaction config: `interaction: [{name?, class_name, config}]`; a missing
    name is the class name without its `Interaction` suffix, lower-cased."""
    out = {}
    for item, cls in yaml_classes(path, "interaction"):
        class_name = cls.__name__
        config = dict(item.get("config") or {})
        name = item.get("name")
        if name is None:
            name = class_name[: -len("Interaction")] if class_name.endswith("Interaction") else class_name
            name = name.lower()
        if name in out:
            raise ValueError(f"interaction {name!r} is declared twice")
        config["name"] = name
        out[name] = cls(config=config)
    return out


def function_tool_module():
    """`verl.tools.function_tool` as verl 0.9 has it (`@function_tool`, `@function_tool("name")`,
    `@function_tool(schema=...)`): verl's own where it imports, else this stand-in, which
    infers the schema the same way (transformers' get_json_schema: type hints and a Google
    docstring)."""
    try:
        from verl.tools import function_tool as real

        if hasattr(real, "FUNCTION_TOOL_REGISTRY"):
            return real.FUNCTION_TOOL_REGISTRY
    except Exception:
        pass
    registry = {}

    def function_tool(name=None, *, schema=None):
        def make(override):
            def decorator(fn):
                tool_name = override or fn.__name__
                if schema is not None:
                    built = schema_dict(schema)
                else:
                    from transformers.utils import get_json_schema

                    built = get_json_schema(fn)
                    built["function"]["name"] = tool_name
                registry[tool_name] = FunctionTool(tool_name, fn, built)
                return fn

            return decorator

        if callable(name) and schema is None:
            return make(None)(name)
        return make(name)

    mod = types.ModuleType("verl.tools.function_tool")
    mod.function_tool = function_tool
    mod.FUNCTION_TOOL_REGISTRY = registry
    sys.modules["verl.tools.function_tool"] = mod
    return registry


def load_function_tools(path):
    """The functions of the file registered with `@function_tool`."""
    registry = function_tool_module()
    before = set(registry)
    spec = importlib.util.spec_from_file_location("verlc_function_tools", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    tools = {}
    for name in registry:
        if name in before:
            continue
        entry = registry[name]
        schema = getattr(entry, "tool_schema", None) or getattr(entry, "schema", None)
        tools[name] = FunctionTool(name, entry.fn, schema_dict(schema))
    return tools


def text_of(resp):
    if resp is None:
        return ""
    if isinstance(resp, str):
        return resp
    if isinstance(resp, dict):
        return json.dumps(resp, ensure_ascii=False)
    if getattr(resp, "image", None) or getattr(resp, "video", None):
        # verl adds them to the conversation; verlc's loop carries text answers only, so the
        # call fails (the model and the tool metrics see it) rather than losing them unseen.
        raise ValueError("the tool answered with an image or video, which verlc's agent loop does not carry yet")
    text = getattr(resp, "text", None)
    return text if text is not None else ("" if hasattr(resp, "text") else str(resp))


def failure(name, why):
    return {"text": f"Error executing tool '{name}': {why}", "reward": 0.0, "failed": True}


async def call_one(tools, call, pool):
    name = call["name"]
    tool = tools.get(name)
    if tool is None:
        return {
            "text": f"Unknown function '{name}'. Available tools: {list(tools)}",
            "reward": 0.0,
            "failed": True,
        }
    try:
        args = json.loads(call["arguments"])
    except Exception as e:
        return {"text": f"Invalid JSON in arguments for '{name}': {e}", "reward": 0.0, "failed": True}
    if isinstance(tool, FunctionTool):
        loop = asyncio.get_running_loop()
        if inspect.iscoroutinefunction(tool.fn):
            res = await (tool.fn(**args) if isinstance(args, dict) else tool.fn(args))
        else:
            job = functools.partial(tool.fn, **args) if isinstance(args, dict) else functools.partial(tool.fn, args)
            res = await loop.run_in_executor(pool, job)
            if inspect.isawaitable(res):
                res = await res
        reward = None
        if isinstance(res, tuple):
            reward = res[1] if len(res) > 1 else None
            res = res[0]
        return {"text": text_of(res), "reward": 0.0 if reward is None else float(reward), "failed": False}
    instance_id, _ = await tool.create(create_kwargs=call.get("create_kwargs") or {})
    try:
        resp, reward, _metrics = await tool.execute(instance_id, args)
    finally:
        await tool.release(instance_id)
    return {"text": text_of(resp), "reward": None if reward is None else float(reward), "failed": False}


async def respond(interactions, started, req):
    try:
        kwargs = dict(req.get("kwargs") or {})
        name = kwargs.get("name")
        if name not in interactions:
            raise ValueError(f"interaction {name!r} is not in the interaction config (it has {list(interactions)})")
        interaction = interactions[name]
        instance = req["instance"]
        if instance not in started:
            await interaction.start_interaction(instance, **kwargs)
            started.add(instance)
        terminate, text, reward, _metrics = await interaction.generate_response(instance, req["messages"], **kwargs)
        return {"text": str(text), "reward": None if reward is None else float(reward), "terminate": bool(terminate)}
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which stops the run
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return {"error": traceback.format_exc()}


async def guarded(tools, call, pool, timeout):
    name = call["name"]
    try:
        return await asyncio.wait_for(call_one(tools, call, pool), timeout)
    except asyncio.TimeoutError:
        return failure(name, f"timed out after {timeout:g} s")
    except BaseException as e:  # noqa: BLE001 - the model sees what went wrong, as in verl
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return failure(name, e)


def main():
    send = protocol_sender(ensure_ascii=False)  # noqa: F821 - defined by pyproc/channel.py, put ahead of this script

    config_path, function_path = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    interaction_path = sys.argv[4] if len(sys.argv) > 4 else ""
    try:
        verl_modules(  # noqa: F821 - pyproc/verl_prelude.py, put ahead of this script
            ["tools"], ["verl.tools.base_tool", "verl.tools.schemas"], standin
        )
        interactions = load_interactions(interaction_path) if interaction_path else {}
        tools = {}
        if config_path:
            tools.update(load_yaml_tools(config_path))
        if function_path:
            for name, t in load_function_tools(function_path).items():
                if name in tools:
                    raise ValueError(f"tool {name!r} is declared twice (tool config and function tools)")
                tools[name] = t
        schemas = [
            schema_dict(t.schema if isinstance(t, FunctionTool) else t.get_openai_tool_schema())
            for t in tools.values()
        ]
    except BaseException:
        send({"ready": False, "error": traceback.format_exc()})
        return 1
    send({"ready": True, "schemas": schemas, "names": list(tools), "interactions": list(interactions)})
    started = set()
    # Synchronous tools run here; threads that overrun their time are left behind, so the
    # pool is wide.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="tool")

    async def answer(req):
        if "respond" in req:
            send({"id": req["id"], "user": await respond(interactions, started, req["respond"])})
            return
        results = await asyncio.gather(*(guarded(tools, c, pool, timeout) for c in req["calls"]))
        send({"id": req["id"], "results": results})

    async def serve():
        # One loop for the host's life: tools may keep connections or tasks on it.
        loop = asyncio.get_running_loop()
        running = set()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            if not line.strip():
                continue
            task = loop.create_task(answer(json.loads(line)))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    asyncio.run(serve())
    # Abandoned tool threads must not keep the process alive.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

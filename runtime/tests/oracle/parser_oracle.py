"""verl 0.9.1's own tool-call parsers (`hermes`, `qwen3_coder`), as the oracle of verlc's
(runtime/tests/rollout/agent.rs).

Usage: parser_oracle.py parsers OUTDIR
  Writes OUTDIR/parsers.json: for each format and each text of CASES, the content and calls
  (name, arguments as JSON text) that verl 0.9.1's parser extracts, run from the unpacked 0.9.1
  tree (.venv/verl-releases/0.9.1) without its package root (which imports Ray). The parsers
  take token ids; a stand-in tokenizer whose decode returns the text for its one id lets the
  texts be given directly.
"""
import asyncio
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VERL = os.path.join(ROOT, ".venv", "verl-releases", "0.9.1")
# The parsers log every block they skip; the test compares what they return.
os.environ.setdefault("VERL_LOGGING_LEVEL", "CRITICAL")


def load_parsers():
    for name in ("verl", "verl.utils", "verl.tools", "verl.experimental", "verl.experimental.agent_loop"):
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(VERL, *name.split("."))]
        sys.modules[name] = mod
    ray_utils = types.ModuleType("verl.utils.ray_utils")
    ray_utils.get_event_loop = asyncio.get_event_loop
    sys.modules["verl.utils.ray_utils"] = ray_utils
    trace = types.ModuleType("verl.utils.rollout_trace")
    trace.rollout_trace_op = lambda f: f
    sys.modules["verl.utils.rollout_trace"] = trace
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

    return ToolParser, OpenAIFunctionToolSchema


class TextTokenizer:
    """Decodes id i to the i-th registered text."""

    def __init__(self):
        self.texts = []

    def add(self, text):
        self.texts.append(text)
        return [len(self.texts) - 1]

    def decode(self, ids, **_):
        return "".join(self.texts[i] for i in ids)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what"},
                    "top_k": {"type": "integer", "description": "how many"},
                    "threshold": {"type": "number", "description": "cut"},
                    "exact": {"type": "boolean", "description": "exact match"},
                    "filters": {"type": "object", "description": "filters"},
                    "tags": {"type": "array", "description": "tags"},
                },
                "required": ["query"],
            },
        },
    }
]

CASES = [
    "no call at all",
    'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "x", "top_k": 3}}\n</tool_call><|im_end|>',
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{bad}</tool_call>'
    '<tool_call>{"name": "b", "arguments": [1, "é"]}</tool_call>',
    "Thinking.\n<tool_call>\n<function=search>\n<parameter=query>\nrust tool parsers\n</parameter>\n"
    "<parameter=top_k>\n5\n</parameter>\n<parameter=threshold>\n0.25\n</parameter>\n"
    "<parameter=exact>\nTrue\n</parameter>\n</function>\n</tool_call><|im_end|>",
    "<tool_call>\n<function=search>\n<parameter=threshold>\n2.0\n</parameter>\n"
    '<parameter=filters>\n{"lang": "en", "n": [1, 2]}\n</parameter>\n'
    "<parameter=tags>\n['a', 'b', None, True]\n</parameter>\n<parameter=top_k>\nmany\n</parameter>\n"
    "<parameter=extra>\nnot declared\n</parameter>\n<parameter=query>\nnull\n</parameter>\n</function>\n"
    "</tool_call>\n<tool_call>\n<function=other>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=search>\n<parameter=query>\nunfinished",
    "<tool_call>\n<function=search\n</tool_call>",
    "text <function=search><parameter=query>q</parameter></function> <tool_call> open",
    "<tool_call>\nno function here\n</tool_call>",
    "<tool_call>\n<function=search>\n<parameter=top_k>\n-7\n</parameter>\n<parameter=threshold>\nnan\n</parameter>\n"
    "<parameter=exact>\nyes\n</parameter>\n<parameter=filters>\n[1, 2]\n</parameter>\n</function>\n</tool_call>",
]


def main(out):
    ToolParser, Schema = load_parsers()
    tools = [Schema.model_validate(t) for t in TOOLS]
    tok = TextTokenizer()
    results = []
    for fmt in ("hermes", "qwen3_coder"):
        parser = ToolParser.get_tool_parser(fmt, tok)
        for text in CASES:
            content, calls = asyncio.run(parser.extract_tool_calls(tok.add(text), tools))
            results.append(
                {
                    "format": fmt,
                    "text": text,
                    "content": content,
                    "calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
                }
            )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "parsers.json"), "w") as f:
        json.dump({"tools": TOOLS, "cases": results}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "parsers":
        sys.exit(__doc__)
    main(sys.argv[2])

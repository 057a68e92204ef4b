"""verl 0.9.1's own token building for tool-calling conversations, as the oracle of verlc's
agent loop (runtime/tests/rollout/agent.rs).

Usage: agent_oracle.py agent OUTDIR TEMPLATE
  Saves a tiny byte-level BPE tokenizer with the chat template TEMPLATE (a Qwen2.5 one) in
  OUTDIR/tok/ and writes OUTDIR/agent.json: scripted conversations (the model's turns as text,
  the tool responses as text) and, for each, the prompt ids, the response ids, mask and
  log-probs that verl 0.9.1's continuous-token builder gives (build_initial_tokens,
  merge_assistant_tokens, merge_context_tokens, align_response_metadata), run from the unpacked
  0.9.1 tree (.venv/verl-releases/0.9.1) without importing verl's package root (which needs
  Ray).
"""
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VERL = os.path.join(ROOT, ".venv", "verl-releases", "0.9.1")


def load_builder():
    # Bare package modules: `verl/__init__.py` imports Ray; the tokenizer utilities do not.
    for name in ("verl", "verl.utils"):
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(VERL, *name.split("."))]
        sys.modules[name] = mod
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    return create_continuous_token_builder


CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expr": {"type": "string", "description": "the expression"}},
            "required": ["expr"],
        },
    },
}

CONVERSATIONS = [
    {
        "name": "one_call_then_answer",
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What is 1+2?"},
        ],
        "turns": [
            '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call><|im_end|>',
            "The answer is 3.<|im_end|>",
        ],
        "tool_rounds": [["3"]],
    },
    {
        "name": "two_parallel_calls_then_two_rounds",
        "messages": [{"role": "user", "content": "Add things."}],
        "turns": [
            'Sure.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "2*3"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calc", "arguments": {"expr": "4-1"}}\n</tool_call><|im_end|>',
            '<tool_call>\n{"name": "calc", "arguments": {"expr": "6+3"}}\n</tool_call><|im_end|>',
            "9<|im_end|>",
        ],
        "tool_rounds": [["6", "3"], ["9"]],
    },
]


def main(out, template):
    sys.path.insert(0, HERE)
    from model_oracle import bpe_tokenizer
    from transformers import PreTrainedTokenizerFast

    create = load_builder()
    with open(template) as f:
        chat_template = f.read()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe_tokenizer(), eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, bos_token=None
    )
    tok.chat_template = chat_template
    tok.save_pretrained(os.path.join(out, "tok"))
    builder = create(tok, hf_model_type="qwen2")
    results = []
    for conv in CONVERSATIONS:
        messages = [dict(m) for m in conv["messages"]]
        stream = list(builder.build_initial_tokens(messages, tools=[CALC]))
        prompt = list(stream)
        mask, logprobs = [], []
        turn_ids = []
        for t, text in enumerate(conv["turns"]):
            ids = tok.encode(text, add_special_tokens=False)
            turn_ids.append(ids)
            lps = [-0.1 * (k + 1) - t for k in range(len(ids))]
            merged = builder.merge_assistant_tokens(stream, ids)
            stream = list(merged.token_ids)
            mask, logprobs = builder.align_response_metadata(merged, mask, logprobs, assistant_logprobs=lps)
            if t < len(conv["tool_rounds"]):
                # The assistant message as verl's loop records it, then the round's responses.
                messages.append({"role": "assistant", "content": "", "tool_calls": []})
                tool_msgs = [{"role": "tool", "content": c} for c in conv["tool_rounds"][t]]
                updated = messages + tool_msgs
                merged = builder.merge_context_tokens(messages, updated, stream, tools=[CALC])
                stream = list(merged.token_ids)
                mask, logprobs = builder.align_response_metadata(merged, mask, logprobs)
                messages = updated
        response = stream[len(prompt):]
        assert len(response) == len(mask) == len(logprobs)
        results.append(
            {
                "name": conv["name"],
                "messages": conv["messages"],
                "tools": [CALC],
                "turn_ids": turn_ids,
                "tool_rounds": conv["tool_rounds"],
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": mask,
                "response_logprobs": logprobs,
            }
        )
    with open(os.path.join(out, "agent.json"), "w") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    if sys.argv[1] != "agent":
        sys.exit(f"unknown command {sys.argv[1]}")
    main(sys.argv[2], sys.argv[3])

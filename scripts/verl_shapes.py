"""What a verl user's run points at, written without weights or downloads: model directories of
a Hub model's shape (its `config.json` and a byte-level BPE tokenizer with the family's vocabulary
size, special tokens and a chat template of the family's format) and data files in the layouts
verl's `examples/data_preprocess/*.py` scripts write (gsm8k, MATH, DAPO/AIME, Eurus, geo3k with
images, multi-turn with tools or an interaction, Search-R1, HH-RLHF, ToolRL).

Used by `scripts/smoke-examples` (verl's example scripts through `verlc smoke`) and
`bench/smoke_7b`. The configs carry each model's real dimensions, vocabulary and special token
ids, as far as smoke reads them (family, vocabulary, special ids, rope, tying, layer kinds,
experts and top-k); the tokenizers are made here, so their merges are not the model's."""

import json
import os
import re
import struct
import threading
import zlib

# ---------------------------------------------------------------------------------------------
# Tokenizers


def _byte_alphabet():
    """GPT-2's byte-to-unicode table: byte-level BPE's 256 base symbols."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes, n = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + n)
            n += 1
    return [chr(c) for c in codes]


def bpe_model(regular, first_id=0):
    """A byte-level BPE of `regular` tokens with ids from `first_id`: the 256 bytes, then
    concatenations of earlier tokens (each with the merge that makes it)."""
    vocab, merges, tokens = {}, [], []
    for t in _byte_alphabet():
        vocab[t] = first_id + len(tokens)
        tokens.append(t)
    left = 0
    while len(tokens) < regular:
        a = tokens[left]
        for b in tokens[:400]:
            t = a + b
            if len(tokens) >= regular:
                break
            if t in vocab or len(t) > 12:
                continue
            vocab[t] = first_id + len(tokens)
            tokens.append(t)
            merges.append(f"{a} {b}")
        left += 1
    return vocab, merges


def tokenizer_json(regular, specials, first_id=0):
    """tokenizer.json: `regular` BPE tokens from `first_id`, `specials` as {id: text}."""
    vocab, merges = bpe_model(regular, first_id)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for i, s in sorted(specials.items())
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }


QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_5_SPECIALS = QWEN2_SPECIALS + [
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
QWEN3_SPECIALS = QWEN2_5_SPECIALS + ["<tool_response>", "</tool_response>", "<think>", "</think>"]

# ChatML as Qwen writes it: a default system turn, tools listed in the system turn, tool
# results as user turns in <tool_response>, images and videos as vision placeholders.
_CHATML_CONTENT = (
    "{%- macro content(c) -%}{%- if c is string -%}{{ c }}{%- else -%}{%- for p in c -%}"
    "{%- if p.type == 'image' or 'image' in p -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif p.type == 'video' or 'video' in p -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- else -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
)
_CHATML_BODY = (
    "{%- if tools -%}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ content(messages[0].content) }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n"
    "{%- elif messages[0].role != 'system' -%}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and loop.first and tools -%}"
    "{%- elif m.role == 'tool' -%}<|im_start|>user\n<tool_response>\n{{ content(m.content) }}\n</tool_response><|im_end|>\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ content(m.content) }}"
    "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}\n<tool_call>\n{{ c.function | tojson }}\n</tool_call>{%- endfor -%}{%- endif -%}"
    "<|im_end|>\n{%- endif -%}{%- endfor -%}"
)
CHATML = _CHATML_CONTENT + _CHATML_BODY + "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
# Qwen3's: the same, with `enable_thinking=False` closing an empty thinking block.
CHATML_THINKING = (
    _CHATML_CONTENT + _CHATML_BODY + "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking -%}<think>\n\n</think>\n\n{%- endif -%}{%- endif -%}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
DEEPSEEK_LLM = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}User: {{ m.content }}\n\n"
    "{% elif m.role == 'assistant' %}Assistant: {{ m.content }}{{ eos_token }}{% else %}{{ m.content }}\n\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
)

# Gemma's turns: the assistant is `model`, a system turn's text goes before the first user
# turn's (Gemma has no system role), every turn ends with <end_of_turn>.
GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}{% if m.role == 'system' %}"
    "{% set ns.system = m.content + '\n\n' %}{% else %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{% if m.role == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}{{ m.content | trim }}<end_of_turn>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Seed-OSS's turns: each opens with <seed:bos> and the role, and closes with <seed:eos>.
SEED_OSS = (
    "{% for m in messages %}<seed:bos>{{ m.role }}\n{{ m.content }}<seed:eos>{% endfor %}"
    "{% if add_generation_prompt %}<seed:bos>assistant\n{% endif %}"
)
# gpt-oss's harmony format, reduced to its turn markers: <|start|>role<|message|>text<|end|>.
HARMONY = (
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def _qwen(specials, template):
    ids = {151643 + i: s for i, s in enumerate(specials)}
    return {"regular": 151643, "specials": ids, "eos": "<|im_end|>", "pad": "<|endoftext|>", "bos": None,
            "template": template, "class": "Qwen2Tokenizer"}


def _llama3():
    names = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "<|eot_id|>"}
    ids = {128000 + i: names.get(i, f"<|reserved_special_token_{i}|>") for i in range(256)}
    return {"regular": 128000, "specials": ids, "eos": "<|eot_id|>", "pad": "<|end_of_text|>", "bos": "<|begin_of_text|>",
            "template": LLAMA3, "class": "PreTrainedTokenizerFast"}


def _deepseek_llm():
    ids = {100000: "<｜begin▁of▁sentence｜>", 100001: "<｜end▁of▁sentence｜>"}
    return {"regular": 100000, "specials": ids, "eos": "<｜end▁of▁sentence｜>", "pad": "<｜end▁of▁sentence｜>",
            "bos": "<｜begin▁of▁sentence｜>", "template": DEEPSEEK_LLM, "class": "LlamaTokenizerFast"}


def _tekken():
    names = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]"}
    ids = {i: names.get(i, f"<SPECIAL_{i}>") for i in range(1000)}
    return {"regular": 131072 - 1000, "first_id": 1000, "specials": ids, "eos": "</s>", "pad": "<pad>", "bos": "<s>",
            "template": MISTRAL, "class": "PreTrainedTokenizerFast"}


def _gemma():
    # Gemma's first 108 ids: <pad>, <eos>, <bos>, <unk>, <mask>, two markers, unused slots,
    # then the turn markers at 106 and 107; its 256,000-token vocabulary after them.
    names = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 5: "<2mass>", 6: "[@BOS@]",
             106: "<start_of_turn>", 107: "<end_of_turn>"}
    ids = {i: names.get(i, f"<unused{i - 7}>") for i in range(108)}
    return {"regular": 256000 - 108, "first_id": 108, "specials": ids, "eos": "<end_of_turn>", "pad": "<pad>",
            "bos": "<bos>", "template": GEMMA, "class": "GemmaTokenizerFast"}


def _seed_oss():
    names = {0: "<seed:bos>", 1: "<seed:pad>", 2: "<seed:eos>", 3: "<seed:think>", 4: "</seed:think>",
             5: "<seed:tool_call>", 6: "</seed:tool_call>"}
    ids = {i: names.get(i, f"<seed:reserved_{i}>") for i in range(64)}
    return {"regular": 155136 - 64, "first_id": 64, "specials": ids, "eos": "<seed:eos>", "pad": "<seed:pad>",
            "bos": "<seed:bos>", "template": SEED_OSS, "class": "PreTrainedTokenizerFast"}


def _harmony():
    names = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
             200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}
    ids = {i: names.get(i, f"<|reserved_{i}|>") for i in range(199998, 201088)}
    return {"regular": 199998, "specials": ids, "eos": "<|return|>", "pad": "<|endoftext|>", "bos": None,
            "template": HARMONY, "class": "PreTrainedTokenizerFast"}


TOKENIZERS = {
    "qwen2": lambda: _qwen(QWEN2_SPECIALS, CHATML),
    "qwen2.5": lambda: _qwen(QWEN2_5_SPECIALS, CHATML),
    "qwen3": lambda: _qwen(QWEN3_SPECIALS, CHATML_THINKING),
    "llama3": _llama3,
    "deepseek_llm": _deepseek_llm,
    "tekken": _tekken,
    "gemma": _gemma,
    "seed_oss": _seed_oss,
    "harmony": _harmony,
}


def write_tokenizer(out, kind, cache=None):
    """Writes tokenizer.json and tokenizer_config.json of tokenizer family `kind` into `out`;
    returns {text: id} of its special tokens. `cache`: a directory that keeps each family's
    tokenizer.json (the vocabulary takes seconds to make)."""
    t = TOKENIZERS[kind]()
    specials = t["specials"]
    if t["pad"] not in specials.values():
        specials = {**specials, max(specials) + 1: t["pad"]}
    text = None
    cached = cache and os.path.join(cache, f"{kind}.tokenizer.json")
    if cached and os.path.exists(cached):
        with open(cached) as f:
            text = f.read()
    if text is None:
        text = json.dumps(tokenizer_json(t["regular"], specials, t.get("first_id", 0)), ensure_ascii=False)
        if cached:
            # Written whole, then renamed into place: parallel jobs share the cache, and a
            # reader must never see a half-written file.
            os.makedirs(cache, exist_ok=True)
            partial = f"{cached}.{os.getpid()}.{threading.get_ident()}.part"
            with open(partial, "w") as f:
                f.write(text)
            os.replace(partial, cached)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write(text)
    config = {"tokenizer_class": t["class"], "eos_token": t["eos"], "pad_token": t["pad"], "bos_token": t["bos"],
              "model_max_length": 131072, "chat_template": t["template"]}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False)
    return {s: i for i, s in specials.items()}


# ---------------------------------------------------------------------------------------------
# Models: the Hub models verl's examples name, by a lower-case part of their name (first match).

def _dense(model_type, hidden, inter, layers, heads, kv, vocab, tie, rope=1e6, head_dim=None, max_pos=32768):
    c = {"model_type": model_type, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": tie,
         "rope_theta": rope, "max_position_embeddings": max_pos, "rms_norm_eps": 1e-6, "hidden_act": "silu",
         "attention_dropout": 0.0, "torch_dtype": "bfloat16"}
    if head_dim:
        c["head_dim"] = head_dim
    return c


def _moe(c, experts, top_k, moe_inter):
    return {**c, "num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": moe_inter,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _qwen3_5(hidden, layers, heads, kv, moe=None):
    """A Qwen3.5 checkpoint: an image-text model, its text model in `text_config` (Gated DeltaNet
    layers among gated attention, interleaved M-RoPE over a quarter of each head), Qwen3.5's
    tower (transformers 5's default sizes). The vision token ids are those of the Qwen3
    tokenizer these stand-ins are written with (the published tokenizer has them at 248053+)."""
    text = _dense("qwen3_5_text", hidden, 3 * hidden, layers, heads, kv, 248320, False, rope=1e7, head_dim=256, max_pos=262144)
    text.update({"full_attention_interval": 4, "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
                 "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                 "linear_num_value_heads": 32,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                     "mrope_section": [11, 11, 10], "mrope_interleaved": True}})
    model_type = "qwen3_5"
    if moe:
        text = _moe(text, *moe)
        text["model_type"] = "qwen3_5_moe_text"
        text["shared_expert_intermediate_size"] = moe[2]
        model_type = "qwen3_5_moe"
    vision = {"model_type": f"{model_type}_vision", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
              "num_heads": 16, "in_channels": 3, "out_hidden_size": hidden, "patch_size": 16, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh"}
    return {"model_type": model_type, "text_config": text, "vision_config": vision, "tie_word_embeddings": False,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
            "video_token_id": 151656}


def _vl(text, vision_out):
    c = {**text, "model_type": "qwen2_5_vl", "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
         "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655, "video_token_id": 151656}
    c["vision_config"] = {"model_type": "qwen2_5_vl", "depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": vision_out, "patch_size": 14,
                          "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                          "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "hidden_act": "silu"}
    return c


def _qwen3_vl(hidden, inter, layers, heads, kv, moe=None):
    """A Qwen3-VL: the text model in `text_config` (interleaved M-RoPE; with `moe` =
    (experts, top-k, expert width) Qwen3-VL-MoE's), Qwen3-VL's tower."""
    text = _dense("qwen3_vl_text", hidden, inter, layers, heads, kv, 151936, False, rope=5e6, head_dim=128,
                  max_pos=262144)
    model_type = "qwen3_vl"
    if moe:
        text = _moe(text, *moe)
        text["model_type"], model_type = "qwen3_vl_moe_text", "qwen3_vl_moe"
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
    vision = {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
              "in_channels": 3, "out_hidden_size": hidden, "patch_size": 16, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
              "hidden_act": "gelu_pytorch_tanh"}
    return {"model_type": model_type, "text_config": text, "vision_config": vision, "tie_word_embeddings": False,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
            "video_token_id": 151656}


def _qwen3_moe(hidden, layers, heads, kv, experts, top_k, moe_inter):
    return _moe(_dense("qwen3_moe", hidden, 3 * hidden, layers, heads, kv, 151936, False, head_dim=128, max_pos=40960),
                experts, top_k, moe_inter)


def _gemma2(hidden, inter, layers, heads, kv, head_dim, query_scalar):
    """A Gemma 2: tied embeddings, every other layer within 4,096 positions, soft caps 50 on
    attention scores and 30 on logits, the tanh GELU named by `hidden_activation`."""
    c = _dense("gemma2", hidden, inter, layers, heads, kv, 256000, True, rope=10000.0, head_dim=head_dim, max_pos=8192)
    c.update({"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
              "query_pre_attn_scalar": query_scalar, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
              "final_logit_softcapping": 30.0})
    return c


# (name part, family tokenizer, config, architecture); order matters: the first match wins.
MODELS = [
    ("qwen2.5-vl-3b", "qwen2.5", lambda: _vl(_dense("qwen2_5_vl", 2048, 11008, 36, 16, 2, 151936, True), 2048), "Qwen2_5_VLForConditionalGeneration"),
    ("qwen2.5-vl-7b", "qwen2.5", lambda: _vl(_dense("qwen2_5_vl", 3584, 18944, 28, 28, 4, 152064, False), 3584), "Qwen2_5_VLForConditionalGeneration"),
    ("qwen2.5-vl-32b", "qwen2.5", lambda: _vl(_dense("qwen2_5_vl", 5120, 27648, 64, 40, 8, 152064, False), 5120), "Qwen2_5_VLForConditionalGeneration"),
    ("qwen3-vl-30b-a3b", "qwen3", lambda: _qwen3_vl(2048, 6144, 48, 32, 4, (128, 8, 768)), "Qwen3VLMoeForConditionalGeneration"),
    ("qwen3-vl-235b-a22b", "qwen3", lambda: _qwen3_vl(4096, 12288, 94, 64, 4, (128, 8, 1536)), "Qwen3VLMoeForConditionalGeneration"),
    ("qwen3-vl-8b", "qwen3", lambda: _qwen3_vl(4096, 12288, 36, 32, 8), "Qwen3VLForConditionalGeneration"),
    ("qwen3-vl-32b", "qwen3", lambda: _qwen3_vl(5120, 25600, 64, 64, 8), "Qwen3VLForConditionalGeneration"),
    ("qwen3-next-80b-a3b", "qwen3", lambda: {**_qwen3_moe(2048, 48, 16, 2, 512, 10, 512), "model_type": "qwen3_next",
                                            "head_dim": 256, "full_attention_interval": 4, "partial_rotary_factor": 0.25,
                                            "shared_expert_intermediate_size": 512, "linear_conv_kernel_dim": 4,
                                            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                                            "linear_num_key_heads": 16, "linear_num_value_heads": 32}, "Qwen3NextForCausalLM"),
    ("qwen3.5-397b-a17b", "qwen3", lambda: _qwen3_5(4096, 60, 32, 2, (512, 10, 1024)), "Qwen3_5MoeForConditionalGeneration"),
    ("qwen3.5-122b-a10b", "qwen3", lambda: _qwen3_5(3072, 48, 32, 2, (256, 8, 1024)), "Qwen3_5MoeForConditionalGeneration"),
    ("qwen3.5-35b-a3b", "qwen3", lambda: _qwen3_5(2048, 40, 16, 2, (256, 8, 512)), "Qwen3_5MoeForConditionalGeneration"),
    ("qwen3.5-27b", "qwen3", lambda: _qwen3_5(5120, 64, 24, 4), "Qwen3_5ForConditionalGeneration"),
    ("qwen3.5-4b", "qwen3", lambda: _qwen3_5(2560, 32, 16, 4), "Qwen3_5ForConditionalGeneration"),
    ("qwen3.5-2b", "qwen3", lambda: _qwen3_5(2048, 24, 8, 2), "Qwen3_5ForConditionalGeneration"),
    # The 2507 releases read 256k tokens natively.
    ("qwen3-235b-a22b-instruct-2507", "qwen3", lambda: {**_qwen3_moe(4096, 94, 64, 4, 128, 8, 1536), "max_position_embeddings": 262144, "rope_theta": 5e6}, "Qwen3MoeForCausalLM"),
    ("qwen3-30b-a3b-instruct-2507", "qwen3", lambda: {**_qwen3_moe(2048, 48, 32, 4, 128, 8, 768), "max_position_embeddings": 262144, "rope_theta": 1e7}, "Qwen3MoeForCausalLM"),
    ("qwen3-235b-a22b", "qwen3", lambda: _qwen3_moe(4096, 94, 64, 4, 128, 8, 1536), "Qwen3MoeForCausalLM"),
    ("qwen3-30b", "qwen3", lambda: _qwen3_moe(2048, 48, 32, 4, 128, 8, 768), "Qwen3MoeForCausalLM"),
    ("qwen3-0.6b", "qwen3", lambda: _dense("qwen3", 1024, 3072, 28, 16, 8, 151936, True, head_dim=128, max_pos=40960), "Qwen3ForCausalLM"),
    ("qwen3-1.7b", "qwen3", lambda: _dense("qwen3", 2048, 6144, 28, 16, 8, 151936, True, head_dim=128, max_pos=40960), "Qwen3ForCausalLM"),
    ("qwen3-4b", "qwen3", lambda: _dense("qwen3", 2560, 9728, 36, 32, 8, 151936, True, head_dim=128, max_pos=40960), "Qwen3ForCausalLM"),
    ("qwen3-8b", "qwen3", lambda: _dense("qwen3", 4096, 12288, 36, 32, 8, 151936, False, head_dim=128, max_pos=40960), "Qwen3ForCausalLM"),
    ("qwen3-32b", "qwen3", lambda: _dense("qwen3", 5120, 25600, 64, 64, 8, 151936, False, head_dim=128, max_pos=40960), "Qwen3ForCausalLM"),
    ("qwen2.5-0.5b", "qwen2.5", lambda: _dense("qwen2", 896, 4864, 24, 14, 2, 151936, True), "Qwen2ForCausalLM"),
    ("qwen2.5-1.5b", "qwen2.5", lambda: _dense("qwen2", 1536, 8960, 28, 12, 2, 151936, True), "Qwen2ForCausalLM"),
    ("qwen2.5-3b", "qwen2.5", lambda: _dense("qwen2", 2048, 11008, 36, 16, 2, 151936, True), "Qwen2ForCausalLM"),
    ("qwen2.5-math-7b", "qwen2.5", lambda: _dense("qwen2", 3584, 18944, 28, 28, 4, 152064, False, rope=10000.0, max_pos=4096), "Qwen2ForCausalLM"),
    ("qwen2.5-7b", "qwen2.5", lambda: _dense("qwen2", 3584, 18944, 28, 28, 4, 152064, False), "Qwen2ForCausalLM"),
    ("qwen2.5-coder-14b", "qwen2.5", lambda: _dense("qwen2", 5120, 13824, 48, 40, 8, 152064, False), "Qwen2ForCausalLM"),
    ("qwen2.5-14b", "qwen2.5", lambda: _dense("qwen2", 5120, 13824, 48, 40, 8, 152064, False), "Qwen2ForCausalLM"),
    ("qwen2.5-32b", "qwen2.5", lambda: _dense("qwen2", 5120, 27648, 64, 40, 8, 152064, False), "Qwen2ForCausalLM"),
    ("qwen2.5-72b", "qwen2.5", lambda: _dense("qwen2", 8192, 29568, 80, 64, 8, 152064, False), "Qwen2ForCausalLM"),
    ("qwen2-7b", "qwen2", lambda: _dense("qwen2", 3584, 18944, 28, 28, 4, 152064, False), "Qwen2ForCausalLM"),
    ("qwen2-72b", "qwen2", lambda: _dense("qwen2", 8192, 29568, 80, 64, 8, 152064, False), "Qwen2ForCausalLM"),
    ("deepseek-llm-7b", "deepseek_llm", lambda: _dense("llama", 4096, 11008, 30, 32, 32, 102400, False, rope=10000.0, max_pos=4096), "LlamaForCausalLM"),
    ("skywork-reward-v2-llama-3.2-3b", "llama3", lambda: {**_dense("llama", 3072, 8192, 28, 24, 8, 128256, True, rope=500000.0, max_pos=131072), "num_labels": 1}, "LlamaForSequenceClassification"),
    ("skywork-reward-llama-3.1-8b", "llama3", lambda: {**_dense("llama", 4096, 14336, 32, 32, 8, 128256, False, rope=500000.0, max_pos=131072), "num_labels": 1}, "LlamaForSequenceClassification"),
    ("fsfairx-llama3-rm", "llama3", lambda: {**_dense("llama", 4096, 14336, 32, 32, 8, 128256, False, rope=500000.0, max_pos=8192), "num_labels": 1}, "LlamaForSequenceClassification"),
    ("gemma-2-2b", "gemma", lambda: _gemma2(2304, 9216, 26, 8, 4, 256, 256), "Gemma2ForCausalLM"),
    ("gemma-2-9b", "gemma", lambda: _gemma2(3584, 14336, 42, 16, 8, 256, 256), "Gemma2ForCausalLM"),
    ("gemma-2-27b", "gemma", lambda: _gemma2(4608, 36864, 46, 32, 16, 128, 144), "Gemma2ForCausalLM"),
    ("seed-oss-36b", "seed_oss", lambda: {**_dense("seed_oss", 5120, 27648, 64, 80, 8, 155136, False, rope=1e7, head_dim=128,
                                                   max_pos=524288),
                                            "attention_bias": True, "attention_out_bias": False, "mlp_bias": False,
                                            "attention_dropout": 0.1, "residual_dropout": 0.1}, "SeedOssForCausalLM"),
    ("gpt-oss-20b", "harmony", lambda: {**_dense("gpt_oss", 2880, 2880, 24, 64, 8, 201088, False, rope=150000.0, head_dim=64,
                                                 max_pos=131072),
                                        "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
                                        "attention_bias": True, "sliding_window": 128, "swiglu_limit": 7.0,
                                        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                         "beta_slow": 1.0, "truncate": False,
                                                         "original_max_position_embeddings": 4096}}, "GptOssForCausalLM"),
    ("mistral-nemo", "tekken", lambda: _dense("mistral", 5120, 14336, 40, 32, 8, 131072, False, head_dim=128, max_pos=1024000), "MistralForCausalLM"),
]
# Named for a Qwen3 checkpoint of another publisher, or verl's own merged checkpoint.
ALIASES = {"qwen3-4b-sft": "qwen3-4b", "qwen3-30b-moe-merge": "qwen3-30b", "qwen2-70b": "qwen2-72b"}


def model_row(name):
    """The MODELS row of a model path (a Hub id or a local copy named after it), or None."""
    low = name.lower().replace("_", "-")
    for alias, target in ALIASES.items():
        if alias in low:
            low = target
    # A size ends the name or is followed by a non-digit: `qwen2.5-3b` is not `qwen2.5-32b`.
    return next((row for row in MODELS if re.search(re.escape(row[0]) + r"(?![0-9.])", low)), None)


def write_model(out, name, cache=None):
    """A model directory of `name`'s shape in `out` (config.json, generation_config.json,
    tokenizer files; preprocessor_config.json for a VLM). Returns False when `name` is not in
    MODELS."""
    row = model_row(name)
    if row is None:
        return False
    _, kind, make, arch = row
    os.makedirs(out, exist_ok=True)
    ids = write_tokenizer(out, kind, cache)
    config = make()
    tok = TOKENIZERS[kind]()
    eos = ids[tok["eos"]]
    config.update({"architectures": [arch], "eos_token_id": eos, "bos_token_id": ids.get(tok["bos"]) if tok["bos"] else None,
                   "pad_token_id": ids[tok["pad"]]})
    if "text_config" in config:
        config["text_config"]["eos_token_id"] = eos
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos], "pad_token_id": ids[tok["pad"]], "temperature": 0.7, "top_p": 0.8}, f)
    if config["model_type"] == "qwen2_5_vl":
        with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
            json.dump({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056,
                       "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                       "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}, f)
    if config["model_type"] in ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"):
        with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
            json.dump({"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
                       "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                       "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                       "image_std": [0.5, 0.5, 0.5]}, f)
    return True


def write_adapter(out, model_dir, rank=8, targets=("q_proj", "v_proj")):
    """A PEFT LoRA adapter directory for the model in `model_dir` (its config.json's widths):
    adapter_config.json and adapter_model.safetensors with zero weights, as PEFT's
    save_pretrained names them."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    kv = c.get("num_key_value_heads", heads) * head_dim
    widths = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
              "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, c["intermediate_size"]),
              "up_proj": (hidden, c["intermediate_size"]), "down_proj": (c["intermediate_size"], hidden)}
    parent = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
    header, offset = {}, 0
    for layer in range(c["num_hidden_layers"]):
        for t in targets:
            base = f"base_model.model.model.layers.{layer}.{parent.get(t, 'mlp')}.{t}"
            n_in, n_out = widths[t]
            for side, shape in (("lora_A", [rank, n_in]), ("lora_B", [n_out, rank])):
                size = shape[0] * shape[1] * 2
                header[f"{base}.{side}.weight"] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
                offset += size
    os.makedirs(out, exist_ok=True)
    text = json.dumps(header).encode()
    with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(bytes(offset))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets),
                   "task_type": "CAUSAL_LM", "bias": "none", "lora_dropout": 0.0}, f)


# ---------------------------------------------------------------------------------------------
# Data: rows as verl's preprocess scripts write them.

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GSM8K_TOOL_SYSTEM = (
    "You are a math expert. You are given a question and you need to solve it step by step. Reasoning step by step "
    "before any tool call. You should use the `calc_gsm8k_reward` tool after step by step solving the question, before "
    "generate final answer at least once and refine your answer if necessary. Put your final answer in the format of "
    "`#### <answer>`."
)


def png(width, height, colour):
    """A solid-colour RGB PNG (verl's geo3k rows hold their pictures as PNG bytes)."""
    raw = b"".join(b"\x00" + bytes(colour) * width for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _gsm8k(i, split):
    a, b = 3 + i % 97, 11 + i % 53
    q = f"Natalia sold clips to {a} of her friends in April, and then she sold {b} more clips in May. How many clips did she sell altogether?"
    return q, str(a + b), f"{a} + {b} = {a + b} #### {a + b}"


def row(kind, i, split):
    """Row `i` of a `split` file of data kind `kind` (see DATA_KINDS)."""
    q, answer, worked = _gsm8k(i, split)
    if kind == "gsm8k":
        return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} {GSM8K_INSTRUCTION}"}],
                "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i, "answer": worked, "question": q}}
    if kind == "math":
        return {"data_source": "DigitalLearningGmbH/MATH-lighteval", "prompt": [{"role": "user", "content": f"{q} {MATH_INSTRUCTION}"}],
                "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split": split, "index": i}}
    if kind in ("dapo", "aime"):
        text = ("Solve the following math problem step by step. The last line of your response should be of the form "
                f"Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
                'Remember to put your answer on its own line after "Answer:".')
        return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": text}], "ability": "MATH",
                "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": answer}, "extra_info": {"index": f"{kind}-{split}-{i}"}}
    if kind == "eurus":
        return {"data_source": "numina_synthetic_math", "prompt": [{"role": "system", "content": "When tackling complex reasoning tasks, you have access to the following actions."},
                                                                    {"role": "user", "content": f"{q}\n\nPresent the answer in LaTex format: \\boxed{{Your answer}}"}],
                "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split": split, "index": i}}
    if kind in ("gsm8k_tool", "gsm8k_interaction"):
        extra = {"split": split, "index": i, "answer": worked, "question": q, "need_tools_kwargs": True,
                 "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": answer}}},
                 "interaction_kwargs": {"name": "gsm8k", "query": q, "ground_truth": answer}}
        prompt = [{"role": "system", "content": GSM8K_TOOL_SYSTEM}, {"role": "user", "content": q}]
        if kind == "gsm8k_interaction":
            prompt = [{"role": "user", "content": f"{q} {GSM8K_INSTRUCTION}"}]
        return {"data_source": "openai/gsm8k", "prompt": prompt, "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": extra}
    if kind in ("geo3k", "geo3k_tool"):
        text = (f"<image>Find x so that the segments add up: {q} You FIRST think about the reasoning process as an internal "
                "monologue and then provide the final answer. The final answer MUST BE put in \\boxed{}.")
        extra = {"split": split, "index": i, "answer": answer, "question": q}
        if kind == "geo3k_tool":
            extra.update({"need_tools_kwargs": True, "tools_kwargs": {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": answer}}}})
        colour = ((i * 40) % 256, (i * 90) % 256, (i * 150) % 256)
        return {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": text}],
                "images": [{"bytes": png(56 + 28 * (i % 3), 56, colour), "path": None}], "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": extra}
    if kind == "video":
        # A video as a list of frames (qwen_vl_utils reads either a file or its frames).
        colour = ((i * 40) % 256, (i * 90) % 256, (i * 150) % 256)
        frames = [{"bytes": png(56, 56, colour), "path": None} for _ in range(4)]
        return {"data_source": "tinyllava_video_r1", "prompt": [{"role": "user", "content": f"<video>How many clips? {q}"}],
                "videos": [frames], "ability": "video", "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i}}
    if kind == "search":
        text = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
                "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
                "<tool_call> query </tool_call> and it will return the top searched results between <tool_response> and "
                f"</tool_response>. Provide the answer inside <answer> and </answer>. Question: How many clips, {q}")
        return {"data_source": "searchR1_nq", "prompt": [{"role": "user", "content": text}], "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": [answer]}},
                "extra_info": {"split": split, "index": i, "need_tools_kwargs": True, "question": q,
                               "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": {"target": [answer]}, "question": q, "data_source": "searchR1_nq"}}}}}
    if kind == "hh_rlhf":
        return {"data_source": "Dahoas/full-hh-rlhf", "prompt": [{"role": "user", "content": f"How can I count the clips? {q}"}],
                "ability": "alignment", "reward_model": {"style": "model", "ground_truth": f"They sold {answer} clips."},
                "extra_info": {"split": split, "index": i}}
    if kind == "rlla":
        gt = json.dumps({"name": "add", "parameters": {"a": answer, "b": "0"}})
        return {"data_source": "rlla", "prompt": [{"role": "system", "content": "You are a helpful assistant that can call tools."},
                                                 {"role": "user", "content": q}],
                "ability": "tool", "reward_model": {"style": "rule", "ground_truth": f"<tool_call>\n{gt}\n</tool_call>"},
                "extra_info": {"split": split, "index": i}}
    raise ValueError(f"unknown data kind {kind}")


DATA_KINDS = ["gsm8k", "math", "dapo", "aime", "eurus", "gsm8k_tool", "gsm8k_interaction", "geo3k", "geo3k_tool",
              "video", "search", "hh_rlhf", "rlla"]


def write_data(path, kind, split, rows):
    """`rows` rows of `kind` as a parquet file at `path`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row(kind, i, split) for i in range(rows)]), path)


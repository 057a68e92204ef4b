"""Hugging Face transformers oracle for the runtime's model, rollout and tokenizer tests.

Usage:
  model_oracle.py models OUTDIR
      Creates randomly initialised tiny Llama / Qwen2 / Qwen3 checkpoints (RoPE default, linear,
      dynamic, llama3 and yarn) with
      save_pretrained in OUTDIR/<arch>/ (Llama sharded with an index) and writes
        OUTDIR/<arch>_ref.safetensors  padded batch inputs and fp32 logits, an unpadded batch
        OUTDIR/<arch>_greedy.json      left-padded prompts and transformers' greedy generate()
  model_oracle.py grads OUTDIR WEIGHTS
      Loads the causal LM whose model.safetensors is WEIGHTS and writes OUTDIR/grads.safetensors:
      a padded batch, the loss -mean of its next-token log-probs, and `grad.<name>` of every
      parameter (gradient parity).
  model_oracle.py verify DIR KIND INPUTS OUT
      Loads DIR with AutoModelForCausalLM (KIND=causal) or AutoModelForTokenClassification
      (KIND=value), runs the inputs of INPUTS (input_ids, attention_mask, position_ids) and
      writes OUT.safetensors with `logits` (causal) or `values` (value).
  model_oracle.py lora BASE ADAPTER INPUTS OUT
      Loads the causal LM BASE with the PEFT adapter ADAPTER (is_trainable=True), and for the
      batch of INPUTS (input_ids, attention_mask, position_ids, responses: the last R columns)
      writes OUT.safetensors: `lp` the responses' log-probs, `base_lp` the same with the
      adapter disabled, `loss` = -mean(lp), `grad.<name>` of every adapter tensor, `after.<name>`
      after one torch AdamW step (lr 1e-2, weight_decay 1.0), and `merged_lp` of the model
      merge_and_unload() gives after that step.
  model_oracle.py reward OUTDIR TEMPLATE
      Saves tiny random Qwen2ForSequenceClassification and LlamaForSequenceClassification
      reward models (one label) with a byte-level BPE tokenizer whose chat template is
      TEMPLATE in OUTDIR/rm_<arch>/, and writes OUTDIR/rm_<arch>.json: conversations ending
      with the assistant's response, their apply_chat_template() text and ids, and the
      sequence-classification score of each (one padded batch), also of the ids cut to 9.
  model_oracle.py vllm OUTDIR
      Two tiny Qwen2 checkpoints of one shape (head dimension 32, which vLLM's CPU attention
      needs), OUTDIR/vllm_a/ and OUTDIR/vllm_b/ (other weights: the hybrid engine's update), and
      OUTDIR/vllm_greedy.json: prompts and transformers' greedy generate() for each.
  model_oracle.py tokenizer OUTDIR TEMPLATE...
      Trains a tiny byte-level BPE tokenizer with the `tokenizers` package, wraps it in
      PreTrainedTokenizerFast with each chat TEMPLATE, saves OUTDIR/tok<i>/ and writes
      OUTDIR/chat.json with apply_chat_template() text and ids for several conversations.
"""
import json
import os
import sys

import torch

torch.set_num_threads(1)


def arch_configs():
    from transformers import (
        GemmaConfig,
        Gemma2Config,
        GptOssConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
        SeedOssConfig,
    )

    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        initializer_range=0.15,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return {
        "llama": (
            LlamaConfig(
                **common,
                num_key_value_heads=2,
                rope_theta=10000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
                attention_bias=True,
                mlp_bias=True,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            "12KB",
        ),
        # Mistral-Nemo's shape: an explicit head_dim wider than hidden / heads, no sliding window.
        "mistral": (
            MistralConfig(
                **common,
                num_key_value_heads=2,
                head_dim=32,
                rope_theta=1e6,
                sliding_window=None,
                tie_word_embeddings=False,
            ),
            None,
        ),
        # Mistral 7B v0.1's kind: every layer within a sliding window (4 positions, which the
        # batches outgrow).
        "mistral_window": (
            MistralConfig(
                **common,
                num_key_value_heads=2,
                head_dim=32,
                rope_theta=1e6,
                sliding_window=4,
                tie_word_embeddings=False,
            ),
            None,
        ),
        # Gemma: (1 + w) norms, embeddings scaled by sqrt(hidden), tanh-GELU gates, one KV head,
        # a head wider than hidden / heads, tied embeddings.
        "gemma": (
            GemmaConfig(
                **common,
                num_key_value_heads=1,
                head_dim=32,
                hidden_act="gelu_pytorch_tanh",
                tie_word_embeddings=True,
            ),
            None,
        ),
        # Gemma 2: Gemma's layers with norms after attention and MLP, soft caps low enough to
        # bite on these scores and logits, a query scale of its own (24, not the head's 32),
        # sliding-window layers (0 and 2, a window of 4 positions) around a full one, and
        # `hidden_activation` (read) apart from `hidden_act` (ignored). Norm weights are
        # randomised after init (see `enliven_norms`): at their initial zeros every norm of a
        # layer is the same function.
        "gemma2": (
            Gemma2Config(
                **{**common, "num_hidden_layers": 3},
                num_key_value_heads=2,
                head_dim=32,
                query_pre_attn_scalar=24,
                sliding_window=4,
                attn_logit_softcapping=1.5,
                final_logit_softcapping=2.5,
                hidden_act="silu",
                hidden_activation="gelu_pytorch_tanh",
                tie_word_embeddings=True,
            ),
            None,
        ),
        # Seed-OSS: q/k/v biases, the output projection's own bias key, MLP biases; no dropout.
        "seed_oss": (
            SeedOssConfig(
                **common,
                num_key_value_heads=2,
                head_dim=32,
                attention_bias=True,
                attention_out_bias=True,
                mlp_bias=True,
                attention_dropout=0.0,
                residual_dropout=0.0,
                tie_word_embeddings=False,
            ),
            None,
        ),
        "qwen2": (
            Qwen2Config(
                **common,
                num_key_value_heads=2,
                rope_theta=1e6,
                rope_scaling={"rope_type": "linear", "factor": 2.0},
                tie_word_embeddings=True,
            ),
            None,
        ),
        # Qwen2 under use_sliding_window: the layers from max_window_layers (1) on attend within
        # a window of 4 positions, layer 0 over all.
        "qwen2_window": (
            Qwen2Config(
                **{**common, "num_hidden_layers": 3},
                num_key_value_heads=2,
                rope_theta=1e6,
                use_sliding_window=True,
                sliding_window=4,
                max_window_layers=1,
                tie_word_embeddings=True,
            ),
            None,
        ),
        # Dynamic NTK scaling only acts beyond max_position_embeddings (8 < 12 positions here).
        "llama_dynamic": (
            LlamaConfig(
                **{**common, "max_position_embeddings": 8},
                num_key_value_heads=4,
                rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                tie_word_embeddings=False,
            ),
            None,
        ),
        "qwen3": (
            Qwen3Config(
                **common,
                num_key_value_heads=1,
                head_dim=32,
                rope_theta=10000.0,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                tie_word_embeddings=False,
            ),
            None,
        ),
        # Sparse MLPs in layers 0 and 2 (top-2 of 8 experts, renormalised), a dense one in layer 1.
        "qwen3_moe": (
            Qwen3MoeConfig(
                **{**common, "num_hidden_layers": 3},
                num_key_value_heads=2,
                head_dim=32,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=48,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[1],
                tie_word_embeddings=False,
            ),
            None,
        ),
        # gpt-oss: attention sinks, sliding-window layers (0 and 2, a window of 4 positions,
        # which the batches outgrow) around a full one, yarn rotary without truncation, every
        # MLP top-2 of 4 biased experts through the clamped SwiGLU. Weights enlarged after
        # init (see `enliven_gpt_oss`) so that the clamps, sinks and biases all take part.
        "gpt_oss": (
            GptOssConfig(
                **{**common, "num_hidden_layers": 3, "intermediate_size": 48},
                num_key_value_heads=2,
                head_dim=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=4,
                rope_theta=10000.0,
                rope_scaling={
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "truncate": False,
                    "original_max_position_embeddings": 32,
                },
                tie_word_embeddings=False,
            ),
            None,
        ),
    }


def attn_implementation(model_type):
    # gpt-oss's sinks and Gemma 2's soft caps have no SDPA path in transformers.
    return "eager" if model_type in ("gpt_oss", "gemma2") else "sdpa"


def enliven_norms(model):
    """Gives every RMSNorm of a fresh model its own random weights."""
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def enliven_gpt_oss(model):
    """Scales a fresh tiny gpt-oss so that its SwiGLU clamps bite (gate and up values past
    the limit of 7), its sinks weigh in the softmax and its expert biases are not zero."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            ex.gate_up_proj.mul_(6.0)
            ex.gate_up_proj_bias.copy_(torch.randn(ex.gate_up_proj_bias.shape, generator=gen))
            ex.down_proj_bias.copy_(torch.randn(ex.down_proj_bias.shape, generator=gen) * 0.1)
            layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=gen) * 2.0)


def padded_batch(gen, lengths, total, vocab=128):
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, total - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[i, total - n :] = 1
    pos = mask.cumsum(-1) - 1
    pos.masked_fill_(mask == 0, 1)
    return ids, mask, pos


def greedy(model, prompts, max_new, eos, pad):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new,
        min_new_tokens=0,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
        eos_token_id=eos,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(row)
    return rows


def models(out):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    os.makedirs(out, exist_ok=True)
    for arch, (cfg, shard) in arch_configs().items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(
            cfg, attn_implementation=attn_implementation(cfg.model_type), torch_dtype=torch.float32
        ).eval()
        if cfg.model_type == "gpt_oss":
            enliven_gpt_oss(model)
        if cfg.model_type == "gemma2":
            enliven_norms(model)
        kw = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(os.path.join(out, arch), safe_serialization=True, **kw)
        gen = torch.Generator().manual_seed(1)
        ids, mask, pos = padded_batch(gen, [10, 7, 4], 10)
        nopad = torch.randint(3, 128, (2, 12), generator=gen)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            nopad_logits = model(input_ids=nopad).logits
        save_file(
            {
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": pos,
                "logits": logits.contiguous(),
                "nopad_input_ids": nopad,
                "nopad_logits": nopad_logits.contiguous(),
            },
            os.path.join(out, f"{arch}_ref.safetensors"),
        )
        prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (6, 3, 9, 1)]
        if arch == "llama_dynamic":
            continue  # transformers caches grown frequencies across generate steps; logits only
        with torch.no_grad():
            free = greedy(model, prompts, 16, None, 0)
            eos = free[0][5]
            stopped = greedy(model, prompts, 16, eos, 0)
        with open(os.path.join(out, f"{arch}_greedy.json"), "w") as f:
            json.dump({"prompts": prompts, "max_new_tokens": 16, "eos": eos, "pad": 0, "outputs": stopped}, f)


def vllm_models(out):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.15,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (6, 3, 9, 1, 12)]
    result = {"prompts": prompts, "max_new_tokens": 16, "pad": 0}
    for tag, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg).eval()
        model.save_pretrained(os.path.join(out, f"vllm_{tag}"), safe_serialization=True)
        with torch.no_grad():
            free = greedy(model, prompts, 16, None, 0)
            eos = free[0][4]
            result[f"eos_{tag}"] = eos
            result[f"outputs_{tag}"] = greedy(model, prompts, 16, eos, 0)
    with open(os.path.join(out, "vllm_greedy.json"), "w") as f:
        json.dump(result, f)


def grads(outdir, *weights):
    """For the causal LM of each weights file (one process for all: importing transformers costs
    more than a tiny model's backward), the gradient of every parameter for a fixed loss: the
    mean log-prob of each row's next tokens on a padded batch (what the actor's update
    differentiates), in `grads-<i>.safetensors` for the i-th file."""
    os.makedirs(outdir, exist_ok=True)
    for i, w in enumerate(weights):
        grads_of(w, os.path.join(outdir, f"grads-{i}.safetensors"))


def grads_of(weights, out):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from transformers import AutoConfig

    path = os.path.dirname(weights)
    impl = attn_implementation(AutoConfig.from_pretrained(path).model_type)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl, torch_dtype=torch.float32)
    model.train()
    gen = torch.Generator().manual_seed(7)
    ids, mask, pos = padded_batch(gen, [10, 8, 5], 10)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    # Predictions from real positions only: how transformers treats a fully masked (left
    # padding) query row is its own business, and no RL loss reads one.
    m = (mask[:, 1:] * mask[:, :-1]).float()
    loss = -(lp * m).sum() / m.sum()
    loss.backward()
    tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "loss": loss.detach()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors["grad." + name] = p.grad.contiguous()
    save_file(tensors, out)


def router_losses(outdir):
    """Router logits of a padded batch (2 rows of 6 tokens, 8 experts) and what transformers'
    Qwen3-MoE computes from them: `load_balancing_loss_func` with top-2 and the attention mask
    (one MoE layer), and the z-loss (mean squared logsumexp over the real tokens)."""
    from safetensors.torch import save_file
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    os.makedirs(outdir, exist_ok=True)
    gen = torch.Generator().manual_seed(11)
    experts, top_k = 8, 2
    logits = torch.randn(2, 6, experts, generator=gen) * 2.0
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    balance = load_balancing_loss_func((logits.reshape(-1, experts),), experts, top_k, mask)
    real = mask.reshape(-1).bool()
    z = torch.logsumexp(logits.reshape(-1, experts)[real], -1).square().mean()
    save_file(
        {"logits": logits.contiguous(), "attention_mask": mask, "balance": balance.reshape(1), "z": z.reshape(1)},
        os.path.join(outdir, "router.safetensors"),
    )


def verify(path, kind, inputs, out):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    x = load_file(inputs)
    if kind == "vision":
        return verify_vision(path, x, out)
    if kind == "pixels":
        return verify_pixels(path, x, out)
    from transformers import AutoConfig

    cls = AutoModelForCausalLM if kind == "causal" else AutoModelForTokenClassification
    impl = attn_implementation(AutoConfig.from_pretrained(path).model_type)
    model = cls.from_pretrained(path, attn_implementation=impl, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        y = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"], position_ids=x["position_ids"]).logits
    key = "logits" if kind == "causal" else "values"
    y = y if kind == "causal" else y[..., 0]
    save_file({key: y.contiguous()}, out)


def verify_pixels(path, x, out):
    """A saved vision-language directory of any family as transformers reads it
    (`AutoModelForImageTextToText`): its logits of the given ids, pixels and image grids."""
    from safetensors.torch import save_file
    from transformers import AutoModelForImageTextToText

    import transformers

    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa", torch_dtype=torch.float32).eval()
    # transformers 5 places the multimodal positions from the processor's token types.
    mm = {}
    if int(transformers.__version__.split(".")[0]) >= 5:
        mm["mm_token_type_ids"] = (x["input_ids"] == model.config.image_token_id).int()
    with torch.no_grad():
        logits = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"],
                       pixel_values=x["pixel_values"], image_grid_thw=x["image_grid_thw"], **mm).logits
    save_file({"logits": logits.contiguous()}, out)


def verify_vision(path, x, out):
    """A saved Qwen2.5-VL directory as transformers reads it: its image processor
    (preprocessor_config.json) prepares the PNG image `png`, and the model's logits of the
    given prompt ids with those pixels."""
    import io

    from PIL import Image
    from safetensors.torch import save_file
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    image = Image.open(io.BytesIO(bytes(x["png"].tolist()))).convert("RGB")
    pixels = Qwen2VLImageProcessor.from_pretrained(path)(images=[image], return_tensors="pt")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        path, attn_implementation="sdpa", torch_dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = model(
            input_ids=x["input_ids"],
            attention_mask=x["attention_mask"],
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
        ).logits
    save_file(
        {
            "logits": logits.contiguous(),
            "pixel_values": pixels["pixel_values"].contiguous(),
            "image_grid_thw": pixels["image_grid_thw"].contiguous(),
        },
        out,
    )


def lora(base, adapter, inputs, out):
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    x = load_file(inputs)
    # A vision-language model's inputs carry its images; transformers places the multimodal
    # positions itself from the attention mask and the grids.
    vision = "pixel_values" in x
    if vision:
        from transformers import AutoModelForImageTextToText as Model

        extra = {"pixel_values": x["pixel_values"], "image_grid_thw": x["image_grid_thw"]}
    else:
        Model = AutoModelForCausalLM
        extra = {"position_ids": x["position_ids"]}
    from transformers import AutoConfig

    impl = attn_implementation(AutoConfig.from_pretrained(base).model_type)
    model = Model.from_pretrained(base, attn_implementation=impl, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    ids, r = x["input_ids"], x["responses"].shape[1]
    t = ids.shape[1]

    def log_probs(m):
        logits = m(input_ids=ids, attention_mask=x["attention_mask"], **extra).logits
        lp = torch.log_softmax(logits[:, t - r - 1 : t - 1].float(), -1)
        return lp.gather(-1, x["responses"][..., None])[..., 0]

    def key(name):
        # verlc's variable names: a vision-language model's checkpoint names (`model.*`,
        # `visual.*`), not its module tree's.
        name = name.removeprefix("base_model.model.").replace(".default", "")
        if name.startswith("model.visual."):
            return name.removeprefix("model.")
        return name.replace("model.language_model.", "model.", 1)

    res = {}
    with torch.no_grad(), model.disable_adapter():
        res["base_lp"] = log_probs(model)
    lp = log_probs(model)
    loss = -lp.mean()
    loss.backward()
    res["lp"] = lp.detach()
    res["loss"] = loss.detach().reshape(1)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for n, p in params:
        # An expert no token chose takes no gradient (its adapters' are zero).
        res[f"grad.{key(n)}"] = p.grad if p.grad is not None else torch.zeros_like(p)
    opt = torch.optim.AdamW([p for _, p in params], lr=1e-2, weight_decay=1.0)
    opt.step()
    for n, p in params:
        res[f"after.{key(n)}"] = p.detach()
    merged = model.merge_and_unload()
    with torch.no_grad():
        res["merged_lp"] = log_probs(merged)
    save_file({k: v.contiguous() for k, v in res.items()}, out)


CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": True},
    {
        "messages": [
            {"role": "system", "content": "You are terse.\nAnswer in one line."},
            {"role": "user", "content": "Reverse 12345."},
            {"role": "assistant", "content": "54321"},
            {"role": "user", "content": "  And 987? (unicode: héllo ✓)"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
        "add_generation_prompt": False,
    },
    {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "add_generation_prompt": True,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Get the weather \"now\" for a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
                        "required": ["city"],
                    },
                },
            }
        ],
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}],
            },
            {"role": "tool", "content": "{\"temp\": 21}"},
            {"role": "tool", "content": "sunny"},
        ],
        "add_generation_prompt": True,
    },
    {"messages": [{"role": "user", "content": "Think less."}], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
]


def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models as tk_models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(tk_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = [c["messages"][0]["content"] for c in CONVERSATIONS] * 20 + [
        "system user assistant tool function arguments name the weather city paris answer reverse digits"
    ] * 50
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


RM_CHATS = [
    [{"role": "user", "content": "Reverse 12345."}, {"role": "assistant", "content": "54321"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "sunny, 21 degrees"},
    ],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "Answer in one line (unicode: héllo ✓)."}, {"role": "assistant", "content": "the answer"}],
]


def reward(out, template_path):
    from transformers import LlamaConfig, PreTrainedTokenizerFast, Qwen2Config
    from transformers import LlamaForSequenceClassification, Qwen2ForSequenceClassification

    with open(template_path) as f:
        template = f.read()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe_tokenizer(), eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, bos_token=None
    )
    fast.chat_template = template
    pad = fast.pad_token_id
    common = dict(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, num_labels=1, pad_token_id=pad,
    )
    archs = {
        "qwen2": (Qwen2ForSequenceClassification, Qwen2Config(**common, tie_word_embeddings=False)),
        "llama": (LlamaForSequenceClassification, LlamaConfig(**common, attention_bias=True, tie_word_embeddings=False)),
    }
    for arch, (cls, cfg) in archs.items():
        torch.manual_seed(3)
        model = cls(cfg).eval()
        d = os.path.join(out, f"rm_{arch}")
        model.save_pretrained(d, safe_serialization=True)
        fast.save_pretrained(d)
        texts = [fast.apply_chat_template(c, tokenize=False, add_generation_prompt=False) for c in RM_CHATS]
        ids = [fast(t, add_special_tokens=False)["input_ids"] for t in texts]

        def scores(rows):
            width = max(len(r) for r in rows)
            x = torch.full((len(rows), width), pad, dtype=torch.long)
            m = torch.zeros_like(x)
            for i, r in enumerate(rows):
                x[i, : len(r)] = torch.tensor(r)
                m[i, : len(r)] = 1
            with torch.no_grad():
                return model(input_ids=x, attention_mask=m).logits[:, 0].tolist()

        cut = [r[:9] for r in ids]
        with open(os.path.join(out, f"rm_{arch}.json"), "w") as f:
            json.dump(
                {"chats": RM_CHATS, "texts": texts, "ids": ids, "scores": scores(ids), "cut9_scores": scores(cut)},
                f,
                ensure_ascii=False,
            )


def chat_tokenizers(out, templates):
    """{"tok<i>": tokenizer}: bpe_tokenizer() with the i-th chat template, each saved in OUT/tok<i>."""
    from transformers import PreTrainedTokenizerFast

    tok = bpe_tokenizer()
    tokenizers = {}
    for i, template_path in enumerate(templates):
        with open(template_path) as f:
            template = f.read()
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, bos_token=None
        )
        fast.chat_template = template
        fast.save_pretrained(os.path.join(out, f"tok{i}"))
        tokenizers[f"tok{i}"] = fast
    return tokenizers


def tokenizer(out, templates):
    results = []
    for name, fast in chat_tokenizers(out, templates).items():
        for j, conv in enumerate(CONVERSATIONS):
            kw = dict(conv.get("kwargs", {}))
            if "tools" in conv:
                kw["tools"] = conv["tools"]
            text = fast.apply_chat_template(
                conv["messages"], tokenize=False, add_generation_prompt=conv["add_generation_prompt"], **kw
            )
            ids = fast.apply_chat_template(
                conv["messages"], tokenize=True, add_generation_prompt=conv["add_generation_prompt"], **kw
            )
            results.append({"tokenizer": name, "case": j, **conv, "text": text, "ids": ids})
    with open(os.path.join(out, "chat.json"), "w") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "models":
        models(sys.argv[2])
    elif cmd == "grads":
        grads(sys.argv[2], *sys.argv[3:])
    elif cmd == "router_losses":
        router_losses(sys.argv[2])
    elif cmd in ("verify", "lora"):
        # Groups of four arguments, one per model: one interpreter start for all of them.
        args = sys.argv[2:]
        if not args or len(args) % 4:
            sys.exit(f"{cmd}: arguments come in groups of four, got {len(args)}")
        for i in range(0, len(args), 4):
            (verify if cmd == "verify" else lora)(*args[i : i + 4])
    elif cmd == "reward":
        reward(sys.argv[2], sys.argv[3])
    elif cmd == "vllm":
        vllm_models(sys.argv[2])
    elif cmd == "tokenizer":
        tokenizer(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"unknown command {cmd}")

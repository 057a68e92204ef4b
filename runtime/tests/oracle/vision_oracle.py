"""transformers' Qwen2.5-VL vision tower as the oracle of the runtime's (tests/model/vision.rs).

Usage: vision_oracle.py qwen2_5_vl OUT
       vision_oracle.py mrope OUT
       vision_oracle.py qwen2_5_vl_model OUT
       vision_oracle.py images OUT
       vision_oracle.py prompts OUT MODEL_ORACLE TEMPLATE
       vision_oracle.py all OUT MODEL_ORACLE TEMPLATE   (every output, one interpreter)
Writes OUT/qwen2_5_vl.safetensors: a seeded tiny tower's weights (named as in a checkpoint
under `visual.`), its inputs (`input.pixel_values`, `input.grid_thw`) and outputs
(`output.embeds`; `output.grad_pixel_values`, the gradient of the embeddings' sum of
squares), for two images of different grids and a two-frame video; and OUT/config.json, the
tower's `vision_config`.

`mrope` writes OUT/mrope.json: verl 0.9.1's own `get_rope_index` (models/transformers/qwen2_vl.py,
executed from its source with a stand-in processor that names the special tokens) on token rows
with text only, one and two images, an image and videos (fractional seconds per temporal patch),
and padding.

`qwen2_5_vl_model` writes OUT/qwen2_5_vl_model.safetensors and OUT/model.json: a seeded tiny
Qwen2.5-VL (vision tower, Qwen2 text model with M-RoPE), two rows with an image each (one
left-padded) and transformers' logits, the gradients of the real tokens' log-likelihood (`grad.*`);
OUT/checkpoint/, the model as `save_pretrained` writes it.

`images` writes OUT/*.png and OUT/images.json: verl's preparation of each image (its
`process_image` with qwen_vl_utils' `fetch_image`, then transformers' `Qwen2VLImageProcessor`):
the pixel values and patch grid, under default and narrowed pixel bounds.

`prompts` writes OUT/tok and OUT/prompts.json: rows with `<image>` placeholders as verl 0.9.1's
dataset and a Qwen2.5-VL processor turn them into prompt token ids (see `prompts`).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel


def verl_definition(relpath, name, namespace, cls=None):
    """The function `name` (or the method `name` of class `cls`) of verl 0.9.1's file `relpath`,
    executed from its source in `namespace` (verl is not imported: its package needs ray)."""
    import ast

    root = os.environ.get("VERLC_VERL_NEWER_ROOT") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".venv", "verl-releases", "0.9.1", "verl")
    path = os.path.join(root, relpath)
    with open(path) as f:
        body = ast.parse(f.read()).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    flags = __import__("__future__").annotations.compiler_flag
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[name]


def qwen2_5_vl(out):
    config = {
        "depth": 3,
        "hidden_size": 32,
        "num_heads": 4,
        "intermediate_size": 48,
        "out_hidden_size": 40,
        "patch_size": 4,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "spatial_merge_size": 2,
        # Windows of 16 pixels: 4 x 4 patches, 2 x 2 merge units.
        "window_size": 16,
        "fullatt_block_indexes": [1],
        "hidden_act": "silu",
    }
    torch.manual_seed(5)
    cfg = Qwen2_5_VLVisionConfig(**config)
    cfg._attn_implementation = "eager"
    model = Qwen2_5_VisionTransformerPretrainedModel(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("ln_q.weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
    # Two images (6 x 10 and 4 x 4 patches: a window grid with a partial window) and a video of
    # two temporal patches of 8 x 6.
    grid = torch.tensor([[1, 6, 10], [1, 4, 4], [2, 8, 6]], dtype=torch.int64)
    n = int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())
    width = 3 * 2 * 4 * 4
    pixels = torch.randn(n, width, dtype=torch.float32).requires_grad_(True)
    embeds = model(pixels, grid_thw=grid)
    embeds.pow(2).sum().backward()
    tensors = {f"visual.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    tensors["input.pixel_values"] = pixels.detach().contiguous()
    tensors["input.grid_thw"] = grid
    tensors["output.embeds"] = embeds.detach().contiguous()
    tensors["output.grad_pixel_values"] = pixels.grad.contiguous()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "qwen2_5_vl.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)


def video_batch(tensors, model, rows, tokens, images, videos, **extra):
    """The logits of `rows` (token ids, left-padded to the longest) holding `images` and
    `videos` (each `(grids, pixel values)`) into `tensors` as `video.*`. transformers 5 places
    the multimodal positions from the processor's token types."""
    import transformers

    (image, video), (i_grids, i_pixels), (v_grids, v_pixels) = tokens, images, videos
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    if int(transformers.__version__.split(".")[0]) >= 5:
        extra["mm_token_type_ids"] = (ids == image).int() + 2 * (ids == video).int()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=i_pixels,
                       image_grid_thw=torch.tensor(i_grids), pixel_values_videos=v_pixels,
                       video_grid_thw=torch.tensor(v_grids), **extra).logits
    tensors["video.input_ids"] = ids
    tensors["video.attention_mask"] = mask
    tensors["video.pixel_values"] = i_pixels.contiguous()
    tensors["video.image_grid_thw"] = torch.tensor(i_grids)
    tensors["video.pixel_values_videos"] = v_pixels.contiguous()
    tensors["video.video_grid_thw"] = torch.tensor(v_grids)
    tensors["video.logits"] = logits.contiguous()


def qwen2_5_vl_model(out):
    """A seeded tiny Qwen2_5_VLForConditionalGeneration: its weights under checkpoint names
    (`model.*`, `visual.*`, `lm_head.*`), two rows (one left-padded) with an image each, and
    the logits transformers computes (its own M-RoPE positions from the attention mask)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vision = {
        "depth": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 48, "out_hidden_size": 64,
        "patch_size": 4, "temporal_patch_size": 2, "in_channels": 3, "spatial_merge_size": 2,
        "window_size": 16, "fullatt_block_indexes": [1], "hidden_act": "silu",
    }
    text = {
        "model_type": "qwen2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "hidden_act": "silu",
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    image, video, start, end = 250, 251, 248, 249
    torch.manual_seed(11)
    cfg = Qwen2_5_VLConfig(text_config=dict(text), vision_config=dict(vision), image_token_id=image,
                           video_token_id=video, vision_start_token_id=start, vision_end_token_id=end)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    model = Qwen2_5_VLForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) * 0.1)
    grids = [[1, 4, 6], [1, 4, 4]]
    row0 = [10, 11, 12, start] + [image] * 6 + [end, 13, 14, 15, 16]
    row1 = [0, 0, 20, 21, start] + [image] * 4 + [end, 22, 23, 24, 25, 26]
    ids = torch.tensor([row0, row1])
    mask = torch.tensor([[1] * 15, [0, 0] + [1] * 13])
    pixels = torch.randn(24 + 16, 3 * 2 * 4 * 4)
    # transformers 5 computes the multimodal positions from the token types its processor
    # returns (image 1, text 0); without them its positions are text positions.
    import transformers
    mm = {}
    if int(transformers.__version__.split(".")[0]) >= 5:
        mm["mm_token_type_ids"] = (ids == image).int()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels,
                       image_grid_thw=torch.tensor(grids), **mm).logits
    # Greedy generation (no stop token), with transformers' cache and rope deltas.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=mask, pixel_values=pixels,
                                   image_grid_thw=torch.tensor(grids), max_new_tokens=6, do_sample=False,
                                   **mm)
    generated = generated[:, ids.shape[1]:]
    # The gradient of the next-token log-likelihood of the real tokens (a training loss's
    # shape), for every parameter: vision tower and text model.
    out_logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels,
                       image_grid_thw=torch.tensor(grids), **mm).logits
    logp = torch.log_softmax(out_logits[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    # Positions whose token and next token are both real (a padding position's logits are
    # nobody's prediction).
    loss = (logp * mask[:, :-1] * mask[:, 1:]).sum()
    loss.backward()
    grads = {}
    for k, p in model.named_parameters():
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        elif k.startswith("model.visual."):
            k = "visual." + k[len("model.visual."):]
        grads[f"grad.{k}"] = p.grad.detach().contiguous()
    tensors = {}
    for k, v in model.state_dict().items():
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        elif k.startswith("model.visual."):
            k = "visual." + k[len("model.visual."):]
        tensors[k] = v.detach().contiguous()
    # A batch with videos: row 0 (left-padded) a video of 2 temporal patches; row 1 an image,
    # then a video of 3 temporal patches at two seconds each. transformers fills the image
    # placeholders from `pixel_values` and the video ones from `pixel_values_videos`; the time
    # ids step by seconds per temporal patch x tokens_per_second (whole seconds: 4.57 casts
    # them to integers first, where verl's own positions, which verl trains with, multiply in
    # floating point; mrope.json holds those).
    v_grids = [[2, 4, 4], [3, 4, 6]]
    v_seconds = [1.0, 2.0]
    i_grids = [[1, 4, 4]]
    real0 = [30, start] + [video] * 8 + [end, 31, 32]
    real1 = [33, start] + [image] * 4 + [end, 34, start] + [video] * 18 + [end, 35]
    v_pixels = torch.randn(2 * 16 + 3 * 24, 3 * 2 * 4 * 4)
    i_pixels = torch.randn(16, 3 * 2 * 4 * 4)
    video_batch(tensors, model, [real0, real1], (image, video), (i_grids, i_pixels), (v_grids, v_pixels),
                second_per_grid_ts=torch.tensor(v_seconds))
    tensors["video.second_per_grid_ts"] = torch.tensor(v_seconds, dtype=torch.float64)
    # verl's critic on this model: TRL's value head (a linear layer on the last hidden state;
    # verl turns its dropout off) over the image-text model. The values of the image batch and
    # the gradient of their sum over real tokens for every parameter (`vgrad.*`).
    v_head = torch.nn.Linear(64, 1)
    with torch.no_grad():
        v_head.weight.copy_(torch.randn_like(v_head.weight) * 0.1)
        v_head.bias.fill_(0.05)
    model.zero_grad()
    hidden = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=torch.tensor(grids),
                   output_hidden_states=True, **mm).hidden_states[-1]
    values = v_head(hidden).squeeze(-1)
    (values * mask).sum().backward()
    for k, p in list(model.named_parameters()) + [("score.weight", v_head.weight), ("score.bias", v_head.bias)]:
        if p.grad is None:  # the language-model head: no value reads it
            continue
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        elif k.startswith("model.visual."):
            k = "visual." + k[len("model.visual."):]
        tensors[f"vgrad.{k}"] = p.grad.detach().contiguous()
    tensors["score.weight"] = v_head.weight.detach().contiguous()
    tensors["score.bias"] = v_head.bias.detach().contiguous()
    tensors["output.values"] = values.detach().contiguous()
    tensors["input.input_ids"] = ids
    tensors["input.attention_mask"] = mask
    tensors["input.pixel_values"] = pixels.contiguous()
    tensors["input.image_grid_thw"] = torch.tensor(grids)
    tensors["output.logits"] = logits.contiguous()
    tensors["output.loglik"] = loss.detach().reshape(1)
    tensors["output.generated"] = generated.contiguous()
    tensors.update(grads)
    os.makedirs(out, exist_ok=True)
    # The checkpoint as transformers saves it (config.json with its vision_config, weights).
    model.save_pretrained(os.path.join(out, "checkpoint"), safe_serialization=True)
    save_file(tensors, os.path.join(out, "qwen2_5_vl_model.safetensors"))
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump({"text_config": text, "vision_config": vision,
                   "image_token_id": image, "video_token_id": video, "vision_start_token_id": start}, f)


def qwen3_vl_model(out):
    """A seeded tiny Qwen3VLForConditionalGeneration (a tower with the DeepStack features of two
    blocks): `run_image_text` into OUT/qwen3_vl."""
    qwen3_vl_family(out, moe=False)


def qwen3_vl_moe_model(out):
    """The same for a seeded tiny Qwen3VLMoeForConditionalGeneration (four experts, top two,
    the middle layer dense through `mlp_only_layers`), into OUT/qwen3_vl_moe. Its experts are
    fused parameters (transformers 4.57: `gate_up_proj` (E, H, 2I), `down_proj` (E, I, H);
    5: each transposed); the tensors file holds them, and their gradients, also split per
    expert under the names of a Qwen3-MoE checkpoint (what verlc's model holds)."""
    qwen3_vl_family(out, moe=True)


def split_experts(tensors, intermediate):
    """Each fused expert tensor of `tensors` also as one linear weight per expert."""
    v5 = int(__import__("transformers").__version__.split(".")[0]) >= 5
    for k in [k for k in tensors if k.endswith("mlp.experts.gate_up_proj")]:
        head, prefix = k[: -len("mlp.experts.gate_up_proj")], "grad." if k.startswith("grad.") else ""
        w = tensors[k]
        for e in range(w.shape[0]):
            gate_up = w[e] if v5 else w[e].t()  # (2I, H)
            tensors[f"{head}mlp.experts.{e}.gate_proj.weight"] = gate_up[:intermediate].clone(memory_format=torch.contiguous_format)
            tensors[f"{head}mlp.experts.{e}.up_proj.weight"] = gate_up[intermediate:].clone(memory_format=torch.contiguous_format)
    for k in [k for k in tensors if k.endswith("mlp.experts.down_proj")]:
        head = k[: -len("mlp.experts.down_proj")]
        w = tensors[k]
        for e in range(w.shape[0]):
            tensors[f"{head}mlp.experts.{e}.down_proj.weight"] = (w[e] if v5 else w[e].t()).clone(memory_format=torch.contiguous_format)


def qwen3_vl_family(out, moe):
    if moe:
        from transformers import Qwen3VLMoeConfig as Config
        from transformers import Qwen3VLMoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model

    vision = {
        "depth": 3, "hidden_size": 32, "num_heads": 4, "intermediate_size": 48, "out_hidden_size": 64,
        "patch_size": 4, "temporal_patch_size": 2, "in_channels": 3, "spatial_merge_size": 2,
        "hidden_act": "gelu_pytorch_tanh", "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1],
    }
    text = {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    }
    if moe:
        text.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                     "decoder_sparse_step": 1, "mlp_only_layers": [1]})
    torch.manual_seed(17 if moe else 13)
    run_image_text(out, "qwen3_vl_moe" if moe else "qwen3_vl", Config, Model, text, vision,
                   text["moe_intermediate_size"] if moe else None)


def run_image_text(out, dirname, Config, Model, text, vision, moe_intermediate=None):
    """A seeded tiny image-text model of `Config`/`Model` (`text`, `vision` its sub-configs):
    its tower's outputs (merged embeddings and any DeepStack features) for two images, its
    checkpoint, two rows (one left-padded) with an image each, the logits and greedy tokens
    transformers computes (its own M-RoPE positions), and every parameter's gradient of the
    real tokens' log-likelihood, into OUT/DIRNAME. With `moe_intermediate`, the fused experts
    are also split per expert (`split_experts`)."""
    image, video, start, end = 250, 251, 248, 249
    cfg = Config(text_config=dict(text), vision_config=dict(vision), image_token_id=image,
                 video_token_id=video, vision_start_token_id=start, vision_end_token_id=end)
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    model = Model(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) * 0.1)
    grids = [[1, 4, 6], [1, 4, 4]]
    row0 = [10, 11, 12, start] + [image] * 6 + [end, 13, 14, 15, 16]
    row1 = [0, 0, 20, 21, start] + [image] * 4 + [end, 22, 23, 24, 25, 26]
    ids = torch.tensor([row0, row1])
    mask = torch.tensor([[1] * 15, [0, 0] + [1] * 13])
    pixels = torch.randn(24 + 16, 3 * 2 * 4 * 4)
    grid_t = torch.tensor(grids)
    # transformers 5 places the multimodal positions from the processor's token types.
    import transformers
    mm = {}
    if int(transformers.__version__.split(".")[0]) >= 5:
        mm["mm_token_type_ids"] = (ids == image).int()
    with torch.no_grad():
        tower = model.model.visual(pixels, grid_thw=grid_t)
        # transformers 4.57 returns (embeddings, DeepStack features); 5 an output object
        # (without DeepStack features for a tower that has none).
        if isinstance(tower, tuple):
            merged, deepstack = tower
        else:
            merged, deepstack = tower.pooler_output, getattr(tower, "deepstack_features", None) or []
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid_t, **mm).logits
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=mask, pixel_values=pixels,
                                   image_grid_thw=grid_t, max_new_tokens=6, do_sample=False, **mm)
    generated = generated[:, ids.shape[1]:]
    out_logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid_t, **mm).logits
    logp = torch.log_softmax(out_logits[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss = (logp * mask[:, :-1] * mask[:, 1:]).sum()
    loss.backward()

    def name(k):
        if k.startswith("model.language_model."):
            return "model." + k[len("model.language_model."):]
        if k.startswith("model.visual."):
            return "visual." + k[len("model.visual."):]
        return k

    tensors = {f"grad.{name(k)}": p.grad.detach().contiguous() for k, p in model.named_parameters()}
    tensors.update({name(k): v.detach().contiguous() for k, v in model.state_dict().items()})
    tensors["input.input_ids"] = ids
    tensors["input.attention_mask"] = mask
    tensors["input.pixel_values"] = pixels.contiguous()
    tensors["input.image_grid_thw"] = grid_t
    tensors["output.tower"] = merged.contiguous()
    for i, d in enumerate(deepstack):
        tensors[f"output.deepstack.{i}"] = d.contiguous()
    tensors["output.logits"] = logits.contiguous()
    tensors["output.loglik"] = loss.detach().reshape(1)
    tensors["output.generated"] = generated.contiguous()
    # A batch with videos as Qwen3-VL's processor lays them out: each temporal patch in a
    # vision span of its own behind its timestamp (here the text tokens 40-43). Row 0 (left-
    # padded) a video of two temporal patches; row 1 an image, then a video of two.
    v_grids = [[2, 4, 4], [2, 4, 6]]
    real0 = [30, 40, start] + [video] * 4 + [end, 41, start] + [video] * 4 + [end, 31, 32]
    real1 = [33, start] + [image] * 4 + [end, 42, start] + [video] * 6 + [end, 43, start] + [video] * 6 + [end, 35]
    i_grids = [[1, 4, 4]]
    i_pixels = torch.randn(16, pixels.shape[1])
    v_pixels = torch.randn(32 + 48, pixels.shape[1])
    video_batch(tensors, model, [real0, real1], (image, video), (i_grids, i_pixels), (v_grids, v_pixels))
    if moe_intermediate:
        split_experts(tensors, moe_intermediate)
    dir = os.path.join(out, dirname)
    os.makedirs(dir, exist_ok=True)
    model.save_pretrained(os.path.join(dir, "checkpoint"), safe_serialization=True)
    save_file(tensors, os.path.join(dir, "model.safetensors"))


def qwen3_5_family(out, moe):
    """A seeded tiny Qwen3.5 image-text model (transformers 5's Qwen3_5ForConditionalGeneration,
    or Qwen3_5MoeForConditionalGeneration with `moe`): a two-block tower without DeepStack, a
    four-layer text model (Gated DeltaNet and gated attention in turn) under interleaved M-RoPE
    over a quarter of each head: `run_image_text` into OUT/qwen3_5 or OUT/qwen3_5_moe."""
    if moe:
        from transformers import Qwen3_5MoeConfig as Config
        from transformers import Qwen3_5MoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3_5Config as Config
        from transformers import Qwen3_5ForConditionalGeneration as Model

    vision = {
        "depth": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 48, "out_hidden_size": 64,
        "patch_size": 4, "temporal_patch_size": 2, "in_channels": 3, "spatial_merge_size": 2,
        "hidden_act": "gelu_pytorch_tanh", "num_position_embeddings": 16,
    }
    # 48-wide heads, a quarter rotated: 12 rotary dimensions, sections of 2 (time, height and
    # width interleaved over the six frequencies).
    text = {
        "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 48, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "hidden_act": "silu", "full_attention_interval": 2,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 2, 2], "mrope_interleaved": True},
    }
    if moe:
        text.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                     "shared_expert_intermediate_size": 24})
    else:
        text["intermediate_size"] = 96
    torch.manual_seed(23 if moe else 19)
    run_image_text(out, "qwen3_5_moe" if moe else "qwen3_5", Config, Model, text, vision,
                   text["moe_intermediate_size"] if moe else None)


def images(out):
    """verl's preparation of images for Qwen-VL models, run from its own code: verl 0.9.1's
    `process_image` (utils/dataset/vision_utils.py) with qwen_vl_utils' `fetch_image` (its
    functions executed from its installed source: the package's torchvision import is not
    needed for images), then transformers' `Qwen2VLImageProcessor`; on PNG files written here
    (RGB of several sizes, RGBA, grayscale, palette), with default and narrowed pixel bounds."""
    import ast
    import base64
    import copy
    import importlib.util
    import io
    import logging
    import math
    import types
    from typing import Any, Dict, Optional, Tuple, Union

    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    spec = importlib.util.find_spec("qwen_vl_utils")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen_vl_utils is not installed (run scripts/setup)")
    source = os.path.join(list(spec.submodule_search_locations)[0], "vision_process.py")
    with open(source) as f:
        tree = ast.parse(f.read())
    wanted = {"round_by_factor", "ceil_by_factor", "floor_by_factor", "smart_resize", "to_rgb", "fetch_image"}
    ns = {"math": math, "os": os, "logging": logging, "Image": Image, "BytesIO": io.BytesIO, "copy": copy,
          "base64": base64, "requests": None, "Optional": Optional, "Tuple": Tuple, "Dict": Dict,
          "Union": Union, "Any": Any}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            exec(compile(ast.Module(body=[node], type_ignores=[]), source, "exec"), ns)
        elif isinstance(node, ast.Assign):
            # The module's constants; assignments that name its video readers are not needed.
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), source, "exec"), ns)
            except NameError:
                pass
    sys.modules["qwen_vl_utils"] = types.SimpleNamespace(fetch_image=ns["fetch_image"])
    process_image = verl_definition("utils/dataset/vision_utils.py", "process_image",
                                    {"Image": Image, "BytesIO": io.BytesIO})

    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(3)

    def png(name, mode, w, h):
        channels = {"RGB": 3, "RGBA": 4, "L": 1}.get(mode, 1)
        data = torch.randint(0, 256, (h, w, channels), generator=gen, dtype=torch.uint8).numpy()
        if mode == "P":
            img = Image.fromarray(data[:, :, 0], "L").convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        elif mode == "L":
            img = Image.fromarray(data[:, :, 0], "L")
        else:
            img = Image.fromarray(data, mode)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        with open(os.path.join(out, name), "wb") as f:
            f.write(buf.getvalue())
        return buf.getvalue()

    files = {
        "rgb_97x61.png": png("rgb_97x61.png", "RGB", 97, 61),
        "rgb_300x200.png": png("rgb_300x200.png", "RGB", 300, 200),
        "rgb_13x40.png": png("rgb_13x40.png", "RGB", 13, 40),
        "rgba_57x83.png": png("rgba_57x83.png", "RGBA", 57, 83),
        "gray_64x50.png": png("gray_64x50.png", "L", 64, 50),
        "palette_45x45.png": png("palette_45x45.png", "P", 45, 45),
    }
    # (case, fetch bounds given in the row, processor bounds)
    settings = [
        ("defaults", None, None),
        ("narrow_processor", None, (28 * 28 * 4, 28 * 28 * 20)),
        ("narrow_fetch", (28 * 28 * 2, 28 * 28 * 12), None),
    ]
    results = []
    for name, data in files.items():
        for label, fetch, proc in settings:
            ele = {"bytes": data}
            if fetch:
                ele["min_pixels"], ele["max_pixels"] = fetch
            img = process_image(ele, image_patch_size=14)
            kwargs = {}
            if proc:
                kwargs = {"min_pixels": proc[0], "max_pixels": proc[1]}
            processor = Qwen2VLImageProcessor(**kwargs)
            batch = processor(images=[img], return_tensors="pt")
            results.append({"file": name, "case": label, "fetch": fetch, "processor": proc,
                            "grid_thw": batch["image_grid_thw"][0].tolist(),
                            "pixel_values": batch["pixel_values"].flatten().tolist()})
        # Qwen3-VL's processor (its preprocessor_config.json: 16-pixel patches, mean and std
        # 0.5, the pixel bounds as `size`); verl 0.9 fetches with the processor's patch size.
        # transformers' fast processor (with torchvision, as verl runs) honours `size`; the
        # slow one of 4.57 replaces it by Qwen2-VL's defaults unless given min/max_pixels, so
        # the bounds are passed as those.
        preprocessor = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
                        "image_processor_type": "Qwen2VLImageProcessorFast"}
        img = process_image({"bytes": data}, image_patch_size=16)
        processor = Qwen2VLImageProcessor(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                          min_pixels=65536, max_pixels=16777216)
        batch = processor(images=[img], return_tensors="pt")
        results.append({"file": name, "case": "qwen3_vl", "fetch": None, "processor": None,
                        "preprocessor": preprocessor,
                        "grid_thw": batch["image_grid_thw"][0].tolist(),
                        "pixel_values": batch["pixel_values"].flatten().tolist()})
    with open(os.path.join(out, "images.json"), "w") as f:
        json.dump(results, f)


def prompts(out, model_oracle, template_path):
    """verl 0.9.1's vision prompts: its dataset's `_build_messages` (executed from its source)
    turns `<image>` placeholders into content parts, qwen_vl_utils' fetch_image prepares each
    image part (verl 0.9's RL path, process_vision_info), and a Qwen2.5-VL processor (transformers' image processor, a byte-level
    BPE tokenizer with the Qwen-VL special tokens and OUT/tok's chat template) renders the
    prompt with the generation prompt and expands each image token. Writes OUT/tok (the
    tokenizer), OUT/*.png and OUT/prompts.json (the rows and their input ids). MODEL_ORACLE is
    model_oracle.py, whose BPE tokenizer this builds on (named so that a cache of this output
    changes with it)."""
    import io
    import re
    import types

    from PIL import Image
    from transformers import Qwen2TokenizerFast
    from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model_oracle import bpe_tokenizer

    images(out)  # the PNG files, and qwen_vl_utils' fetch_image bound in sys.modules
    build_messages = verl_definition("utils/dataset/rl_dataset.py", "_build_messages",
                                     {"re": re, "os": os, "Image": Image, "BytesIO": io.BytesIO}, cls="RLHFDataset")

    tok = bpe_tokenizer()
    tok.add_special_tokens(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    # The processor wants Qwen2's tokenizer class; the tokenizer itself is the test's BPE.
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None)
    with open(template_path) as f:
        fast.chat_template = f.read()
    fast.save_pretrained(os.path.join(out, "tok"))
    # No video processor (transformers' needs torchvision; these rows have images only): the
    # processor's class check is skipped for it.
    Qwen2_5_VLProcessor.check_argument_for_proper_class = lambda self, name, arg: None
    processor = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=fast,
                                    chat_template=fast.chat_template)
    me = types.SimpleNamespace(image_key="images", video_key="videos", audio_key="audios", processor=processor)
    rows = [
        {"prompt": [{"role": "user", "content": "Describe <image> please."}], "images": ["rgb_97x61.png"]},
        {"prompt": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "<image><image>Compare the two."}],
         "images": ["rgb_13x40.png", "gray_64x50.png"]},
        {"prompt": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                    {"role": "user", "content": "What is in <image>?"}], "images": ["rgba_57x83.png"]},
        {"prompt": [{"role": "user", "content": "no image here"}], "images": []},
    ]
    results = []
    for row in rows:
        example = {"prompt": copy_messages(row["prompt"]),
                   "images": [{"bytes": open(os.path.join(out, f), "rb").read()} for f in row["images"]]}
        messages = build_messages(me, example, key="prompt")
        imgs = []
        for m in messages:
            if isinstance(m["content"], list):
                for part in m["content"]:
                    if part.get("type") == "image":
                        # qwen_vl_utils' process_vision_info (verl 0.9's RL path): fetch_image of
                        # the part, which holds the decoded image.
                        imgs.append(sys.modules["qwen_vl_utils"].fetch_image(part, image_patch_size=14))
        raw = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[raw], images=imgs or None, return_tensors="pt")
        results.append({**row, "input_ids": inputs["input_ids"][0].tolist()})
    # Rows of a parquet file in geo3k's layout (a chat `prompt`, `images` as {bytes, path}
    # cells, here with the per-image pixel bounds qwen_vl_utils reads), read as Hugging Face
    # datasets reads them (pyarrow rows).
    import pyarrow as pa
    import pyarrow.parquet as pq

    def cell(name, max_pixels=None):
        return {"bytes": open(os.path.join(out, name), "rb").read(), "path": name, "min_pixels": None,
                "max_pixels": max_pixels}

    geo = [
        {"prompt": [{"role": "user", "content": "<image>Find x in the figure."}],
         "images": [cell("rgb_300x200.png")]},
        {"prompt": [{"role": "user", "content": "Compare <image> and <image>."}],
         "images": [cell("rgb_97x61.png"), cell("rgba_57x83.png", max_pixels=28 * 28 * 4)]},
    ]
    pq.write_table(pa.Table.from_pylist(geo), os.path.join(out, "geo3k.parquet"))
    parquet_rows = []
    for example in pq.read_table(os.path.join(out, "geo3k.parquet")).to_pylist():
        messages = build_messages(me, example, key="prompt")
        imgs = [sys.modules["qwen_vl_utils"].fetch_image(part, image_patch_size=14)
                for m in messages if isinstance(m["content"], list)
                for part in m["content"] if part.get("type") == "image"]
        raw = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[raw], images=imgs, return_tensors="pt")
        # The dataset's measure for filter_overlong_prompts fetches with data.image_patch_size
        # (here 16, beside the processor's 14).
        # (A cell's own max_pixels below fetch_image's minimum at that size fails its assertion:
        # null.)
        try:
            fetched16 = [sys.modules["qwen_vl_utils"].fetch_image(part, image_patch_size=16)
                         for m in messages if isinstance(m["content"], list)
                         for part in m["content"] if part.get("type") == "image"]
            measured = len(processor(text=[raw], images=fetched16, return_tensors="pt")["input_ids"][0])
        except AssertionError:
            measured = None
        parquet_rows.append({"input_ids": inputs["input_ids"][0].tolist(),
                             "image_grid_thw": inputs["image_grid_thw"].tolist(),
                             "measured_len_patch16": measured})
    with open(os.path.join(out, "prompts.json"), "w") as f:
        json.dump(results, f)
    with open(os.path.join(out, "geo3k.json"), "w") as f:
        json.dump(parquet_rows, f)


def copy_messages(messages):
    return [dict(m) for m in messages]


# The stand-in processor's special tokens.
IMAGE, VIDEO, START, END = 151655, 151656, 151652, 151653


def mrope(out):
    import types
    from typing import Optional

    get_rope_index = verl_definition("models/transformers/qwen2_vl.py", "get_rope_index",
                                     {"torch": torch, "Optional": Optional})
    ids = {"<|image_pad|>": IMAGE, "<|video_pad|>": VIDEO, "<|vision_start|>": START}
    processor = types.SimpleNamespace(
        image_processor=types.SimpleNamespace(merge_size=2),
        tokenizer=types.SimpleNamespace(convert_tokens_to_ids=lambda t: ids[t]),
    )

    def vision(token, t, h, w):
        return [START] + [token] * (t * (h // 2) * (w // 2)) + [END]

    text = lambda n, base=10: [base + i for i in range(n)]
    cases = [
        {"name": "text", "tokens": text(7), "images": [], "videos": [], "seconds": []},
        {"name": "one_image", "tokens": text(3) + vision(IMAGE, 1, 4, 6) + text(5), "images": [[1, 4, 6]], "videos": [], "seconds": []},
        {"name": "two_images", "tokens": vision(IMAGE, 1, 2, 2) + text(2) + vision(IMAGE, 1, 6, 4) + text(1),
         "images": [[1, 2, 2], [1, 6, 4]], "videos": [], "seconds": []},
        {"name": "image_and_videos", "tokens": text(2) + vision(VIDEO, 3, 4, 4) + text(3) + vision(IMAGE, 1, 2, 4) + vision(VIDEO, 2, 2, 2) + text(4),
         "images": [[1, 2, 4]], "videos": [[3, 4, 4], [2, 2, 2]], "seconds": [0.5, 1.75]},
        {"name": "video_no_seconds", "tokens": vision(VIDEO, 2, 4, 2) + text(3), "images": [], "videos": [[2, 4, 2]], "seconds": None},
    ]
    results = []
    for case in cases:
        for pad in (0, 3):
            tokens = [0] * pad + case["tokens"]
            mask = [0] * pad + [1] * len(case["tokens"])
            kwargs = {}
            if case["images"]:
                kwargs["image_grid_thw"] = torch.tensor(case["images"])
            if case["videos"]:
                kwargs["video_grid_thw"] = torch.tensor(case["videos"])
                if case["seconds"] is not None:
                    kwargs["second_per_grid_ts"] = torch.tensor(case["seconds"])
            pos = get_rope_index(processor, torch.tensor(tokens), attention_mask=torch.tensor(mask), **kwargs)
            results.append(dict(case, name=f"{case['name']}_pad{pad}", tokens=tokens, mask=mask, position_ids=pos.tolist()))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mrope.json"), "w") as f:
        json.dump({"tokens": {"image": IMAGE, "video": VIDEO, "vision_start": START}, "cases": results}, f)


def everything(out, model_oracle, template_path):
    """Every output above into OUT, in one interpreter (one torch and transformers import)."""
    qwen2_5_vl(out)
    mrope(out)
    qwen2_5_vl_model(out)
    qwen3_vl_model(out)
    qwen3_vl_moe_model(out)
    prompts(out, model_oracle, template_path)  # runs `images` too


def models(out):
    """Every family's model run (`*_model` above) into OUT, in one interpreter: what the tests
    run on transformers 5, whose Qwen3.5 image-text models are run too."""
    qwen2_5_vl_model(out)
    qwen3_vl_model(out)
    qwen3_vl_moe_model(out)
    qwen3_5_family(out, moe=False)
    qwen3_5_family(out, moe=True)


if __name__ == "__main__":
    commands = {"qwen2_5_vl": qwen2_5_vl, "mrope": mrope, "qwen2_5_vl_model": qwen2_5_vl_model, "qwen3_vl_model": qwen3_vl_model,
                "qwen3_vl_moe_model": qwen3_vl_moe_model, "models": models, "images": images,
                "prompts": prompts, "all": everything}
    if sys.argv[1] not in commands:
        sys.exit(f"unknown command {sys.argv[1]}")
    commands[sys.argv[1]](*sys.argv[2:])

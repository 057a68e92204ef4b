"""Peer of bench/vlm_step: transformers 4.57's Qwen2_5_VLForConditionalGeneration (the version
verl pins; SDPA attention in the tower and the text model) forward + backward of a batch of
images and prompts; with `--family qwen3_vl` its Qwen3VLForConditionalGeneration (16-pixel
patches, DeepStack after three of the tower's blocks). `export DIR` writes a seeded model as
transformers saves it (config with `text_config` and `vision_config`,
`model.language_model.*`/`model.visual.*` weights) and the batch, so the Rust side loads the
same checkpoint and inputs; `time DIR` times a step and prints the loss for the cross-check.
Prints key=value lines.
Usage: peer.py export|time DIR [--family qwen2_5_vl|qwen3_vl] [--steps N] [--warmup N] [--threads N]"""
import os
import sys
import time

import torch

# Four 448 x 448 images (32 x 32 patches of 14 pixels, 256 merged tokens each) in four
# prompts of 64 text tokens after the picture.
IMAGES, SIDE, TEXT = 4, 32, 64


def arg(name, default):
    a = sys.argv
    return int(a[a.index(name) + 1]) if name in a else default


def family():
    a = sys.argv
    return a[a.index("--family") + 1] if "--family" in a else "qwen2_5_vl"


def patch():
    return 16 if family() == "qwen3_vl" else 14


def model():
    if family() == "qwen3_vl":
        return qwen3_vl_model()
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, vocab_size=2048,
                         max_position_embeddings=4096, rope_theta=10000.0,
                         rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]},
                         tie_word_embeddings=False),
        vision_config=dict(depth=8, hidden_size=256, num_heads=4, intermediate_size=688,
                           out_hidden_size=512, patch_size=14, temporal_patch_size=2,
                           spatial_merge_size=2, window_size=112, fullatt_block_indexes=[3, 7]),
        image_token_id=2000, video_token_id=2001, vision_start_token_id=2002,
        vision_end_token_id=2003,
    )
    torch.manual_seed(0)
    m = Qwen2_5_VLForConditionalGeneration(cfg).float()
    with torch.no_grad():
        for name, p in m.named_parameters():
            norm = name.endswith("norm.weight") or name.split(".")[-2] in ("norm1", "norm2", "ln_q")
            if not norm:
                p.normal_(0.0, 0.02)
    return m.eval(), cfg


def qwen3_vl_model():
    """The same sizes as a Qwen3-VL: Qwen3's text model under interleaved M-RoPE, an 8-block
    tower of width 256 on 16-pixel patches (a 48 x 48 position grid) with DeepStack features
    after blocks 1, 3 and 5."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg = Qwen3VLConfig(
        text_config=dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=2048,
                         max_position_embeddings=4096, rope_theta=10000.0,
                         rope_scaling={"rope_type": "default", "mrope_section": [8, 12, 12],
                                       "mrope_interleaved": True},
                         tie_word_embeddings=False),
        vision_config=dict(depth=8, hidden_size=256, num_heads=4, intermediate_size=688,
                           out_hidden_size=512, patch_size=16, temporal_patch_size=2,
                           spatial_merge_size=2, num_position_embeddings=2304,
                           deepstack_visual_indexes=[1, 3, 5]),
        image_token_id=2000, video_token_id=2001, vision_start_token_id=2002,
        vision_end_token_id=2003,
    )
    torch.manual_seed(0)
    m = Qwen3VLForConditionalGeneration(cfg).float()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02)
    return m.eval(), cfg


def batch(cfg):
    g = torch.Generator().manual_seed(1)
    pad = SIDE * SIDE // 4
    rows = []
    for _ in range(IMAGES):
        text = torch.randint(0, 1900, (TEXT,), generator=g)
        rows.append(torch.cat([torch.tensor([cfg.vision_start_token_id]),
                               torch.full((pad,), cfg.image_token_id),
                               torch.tensor([cfg.vision_end_token_id]), text]))
    ids = torch.stack(rows)
    pixels = torch.randn(IMAGES * SIDE * SIDE, 3 * 2 * patch() * patch(), generator=g)
    grid = torch.tensor([[1, SIDE, SIDE]] * IMAGES)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels,
            "image_grid_thw": grid}


def export(out):
    from safetensors.torch import save_file

    m, cfg = model()
    m.save_pretrained(out)
    save_file(batch(cfg), os.path.join(out, "batch.safetensors"))


def loss_of(m, x):
    logits = m(**x).logits
    ids = x["input_ids"]
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return -lp.mean()


def timed(out):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    torch.set_num_threads(arg("--threads", 2))
    steps, warmup = arg("--steps", 3), arg("--warmup", 1)
    m = AutoModelForImageTextToText.from_pretrained(
        out, attn_implementation="sdpa", torch_dtype=torch.float32).train()
    x = load_file(os.path.join(out, "batch.safetensors"))
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        loss = loss_of(m, x)
        loss.backward()
        dt = time.perf_counter() - t
        m.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(dt)
    times.sort()
    print(f"threads={torch.get_num_threads()}")
    print(f"loss={loss.item():.6f}")
    print(f"step_ms={times[len(times) // 2] * 1e3:.3f}")


if __name__ == "__main__":
    {"export": export, "time": timed}[sys.argv[1]](sys.argv[2])

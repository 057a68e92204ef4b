"""Peer of bench/moe_layer: transformers 5's Qwen3MoeSparseMoeBlock (router, top-k, experts
as transformers runs them by default on this machine) forward + backward on a Qwen3-MoE-shaped
layer. `export DIR` also writes the block's weights under the checkpoint's per-expert names
and the tokens, so the Rust side runs the same weights on the same tokens; `time DIR` times
the block and prints the output's sum for the cross-check. Run with .venv/transformers5 on
PYTHONPATH. Prints key=value lines.
Usage: peer.py export|time DIR [--steps N] [--warmup N] [--threads N]"""
import os
import sys
import time

import torch

HIDDEN, EXPERTS, TOP_K, INTER, TOKENS = 512, 64, 8, 256, 4096


def arg(name, default):
    a = sys.argv
    return int(a[a.index(name) + 1]) if name in a else default


def block():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                         moe_intermediate_size=INTER, norm_topk_prob=True)
    torch.manual_seed(0)
    b = Qwen3MoeSparseMoeBlock(cfg).float()
    with torch.no_grad():
        for p in b.parameters():
            p.normal_(0.0, 0.02)
    return b, cfg


def export(out):
    from safetensors.torch import save_file

    b, _ = block()
    t = {"mlp.gate.weight": b.gate.weight.detach().contiguous()}
    gate_up, down = b.experts.gate_up_proj.detach(), b.experts.down_proj.detach()
    for e in range(EXPERTS):
        t[f"mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :INTER].contiguous()
        t[f"mlp.experts.{e}.up_proj.weight"] = gate_up[e, INTER:].contiguous()
        t[f"mlp.experts.{e}.down_proj.weight"] = down[e].contiguous()
    t["x"] = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    os.makedirs(out, exist_ok=True)
    save_file(t, os.path.join(out, "moe_layer.safetensors"))


def timed(out):
    from safetensors.torch import load_file

    torch.set_num_threads(arg("--threads", 2))
    steps, warmup = arg("--steps", 5), arg("--warmup", 2)
    b, cfg = block()
    x = load_file(os.path.join(out, "moe_layer.safetensors"))["x"].unsqueeze(0).requires_grad_()
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        y = b(x)
        y.sum().backward()
        dt = time.perf_counter() - t
        x.grad = None
        if i >= warmup:
            times.append(dt)
    times.sort()
    print(f"experts_implementation={getattr(cfg, '_experts_implementation', 'eager')}")
    print(f"threads={torch.get_num_threads()}")
    print(f"checksum={b(x).double().abs().sum().item():.6f}")
    print(f"step_ms={times[len(times) // 2] * 1e3:.3f}")


if __name__ == "__main__":
    {"export": export, "time": timed}[sys.argv[1]](sys.argv[2])

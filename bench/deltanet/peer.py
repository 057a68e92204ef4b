"""Peer of bench/deltanet: transformers 5's Qwen3_5GatedDeltaNet (its plain-torch path, what
runs without the flash-linear-attention and causal-conv1d kernels, as on CPU) on the same
shapes, forward + backward. Run with .venv/transformers5 on PYTHONPATH. Prints key=value lines.
With --bf16 the layer's weights and input are bf16 (its recurrence still runs in fp32, as
transformers writes it). Usage: peer.py [--steps N] [--warmup N] [--threads N] [--bf16]"""
import sys
import time

import torch

HIDDEN, BATCH, TOKENS = 1024, 4, 512


def arg(name, default):
    a = sys.argv
    return int(a[a.index(name) + 1]) if name in a else default


def main():
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    steps, warmup = arg("--steps", 5), arg("--warmup", 2)
    torch.set_num_threads(arg("--threads", 2))
    cfg = Qwen3_5TextConfig(hidden_size=HIDDEN, num_hidden_layers=1, layer_types=["linear_attention"],
                            linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
                            linear_num_key_heads=8, linear_num_value_heads=16)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
    layer = Qwen3_5GatedDeltaNet(cfg, 0).to(dtype)
    x = torch.randn(BATCH, TOKENS, HIDDEN, dtype=dtype, requires_grad=True)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        layer(x).sum().backward()
        dt = time.perf_counter() - t
        x.grad = None
        if i >= warmup:
            times.append(dt)
    times.sort()
    print(f"threads={torch.get_num_threads()}")
    print(f"step_ms={times[len(times) // 2] * 1e3:.3f}")


if __name__ == "__main__":
    main()

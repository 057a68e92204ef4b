"""PyTorch peer of bench/optim_step: the same Megatron-style bf16 mixed-precision step with
PyTorch's best tools (fp32 master params, grads copied with _foreach_copy_, foreach
clip_grad_norm_, torch.optim.AdamW(fused=True), copy back), plus fused AdamW alone.
Prints key=value lines. Usage: peer.py [--steps N] [--warmup N] [--threads N]"""
import sys
import time

import torch


def shapes():
    h, f = 1024, 4096
    out = []
    for l in range(4):
        p = f"layers.{l}"
        out += [(f"{p}.input_layernorm.weight", (h,)), (f"{p}.attn.qkv.weight", (3 * h, h)),
                (f"{p}.attn.qkv.bias", (3 * h,)), (f"{p}.attn.proj.weight", (h, h)),
                (f"{p}.attn.proj.bias", (h,)), (f"{p}.post_layernorm.weight", (h,)),
                (f"{p}.mlp.up.weight", (f, h)), (f"{p}.mlp.up.bias", (f,)),
                (f"{p}.mlp.down.weight", (h, f)), (f"{p}.mlp.down.bias", (h,))]
    return out


def arg(name, default):
    a = sys.argv
    return int(a[a.index(name) + 1]) if name in a else default


def main():
    steps, warmup = arg("--steps", 10), arg("--warmup", 3)
    if arg("--threads", 0) > 0:
        torch.set_num_threads(arg("--threads", 0))
    torch.manual_seed(0)
    named = [(n, (torch.randn(s) * 0.02).bfloat16().requires_grad_()) for n, s in shapes()]
    grads = [(torch.randn(p.shape) * 1e-3).bfloat16() for _, p in named]
    model = [p for _, p in named]
    master = [torch.nn.Parameter(p.detach().float()) for p in model]
    for m in master:
        m.grad = torch.zeros_like(m)
    decay = [m for (n, p), m in zip(named, master) if not (n.endswith(".bias") or p.dim() == 1)]
    no_decay = [m for (n, p), m in zip(named, master) if n.endswith(".bias") or p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-8, fused=True)
    main_grads = [m.grad for m in master]

    def step():
        torch._foreach_copy_(main_grads, [p.grad for p in model])
        norm = torch.nn.utils.clip_grad_norm_(master, 1.0, foreach=True)
        norm.item()
        opt.step()
        with torch.no_grad():
            torch._foreach_copy_(model, master)

    times, adam_times = [], []
    for i in range(warmup + steps):
        for p, g in zip(model, grads):
            p.grad = g
        t = time.perf_counter()
        step()
        dt = time.perf_counter() - t
        if i >= warmup:
            times.append(dt)
    for i in range(warmup + steps):
        t = time.perf_counter()
        opt.step()
        if i >= warmup:
            adam_times.append(time.perf_counter() - t)
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"params={sum(p.numel() for p in model)}")
    print(f"threads={torch.get_num_threads()}")
    print(f"step_ms={med(times) * 1e3:.3f}")
    print(f"fused_adamw_only_ms={med(adam_times) * 1e3:.3f}")


if __name__ == "__main__":
    with torch.no_grad():
        main()

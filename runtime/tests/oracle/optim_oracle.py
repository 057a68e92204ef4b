"""PyTorch oracle for the runtime's optimizer tests.

Usage: optim_oracle.py OUTDIR
Writes OUTDIR/<case>.safetensors (inputs and expected values) and OUTDIR/<case>.json
(scalars). Everything is seeded; the Rust tests feed the same inputs to runtime::optim and
compare. Cases:
  adamw   100-step AdamW trajectory, two param groups, lr changing every step
  sgd     100-step SGD(momentum) trajectory, same layout
  clip    torch.nn.utils.clip_grad_norm_ (L2 clipping, L2 no-op, inf norm)
  bf16    Megatron-style bf16 step with an fp32 master (reference for the mixed optimizer)
  bf16_params  torch's default AdamW stepping bf16 params in place, state in bf16 (what a
          bf16 model under verl's FSDP `model_dtype: bf16` trains with)
  verl    verl's constant / cosine LambdaLR schedules, from verl's own source
"""
import ast
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

torch.set_num_threads(1)
OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)

SHAPES = {"w1": (64, 32), "b1": (32,), "w2": (16, 8, 4)}
GROUPS = [["w1", "w2"], ["b1"]]
STEPS = 100


def lr_at(t):
    return 1e-3 * (1.0 + 0.01 * t)


def init(seed):
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    grads = [{n: torch.randn(s, generator=g) * (1.0 + 0.1 * t) for n, s in SHAPES.items()} for t in range(STEPS)]
    return params, grads


def trajectory(make_opt, seed, impl):
    params, grads = init(seed)
    ps = {n: torch.nn.Parameter(p.clone()) for n, p in params.items()}
    opt = make_opt(ps, impl)
    out = {}
    for t in range(STEPS):
        for pg in opt.param_groups:
            pg["lr"] = lr_at(t)
        for n, p in ps.items():
            p.grad = grads[t][n].clone()
        opt.step()
        for n, p in ps.items():
            out[f"{impl}.{t}.{n}"] = p.detach().clone()
    return params, grads, out


def save_traj(case, make_opt, seed):
    tensors = {}
    for impl in ("fused", "default"):
        params, grads, out = trajectory(make_opt, seed, impl)
        tensors.update(out)
    tensors.update({f"init.{n}": p for n, p in params.items()})
    for t, gs in enumerate(grads):
        tensors.update({f"grad.{t}.{n}": g for n, g in gs.items()})
    save_file(tensors, os.path.join(OUT, f"{case}.safetensors"))


def adamw(ps, impl):
    kw = {"fused": True} if impl == "fused" else {"foreach": False}
    return torch.optim.AdamW(
        [{"params": [ps[n] for n in GROUPS[0]], "weight_decay": 0.1},
         {"params": [ps[n] for n in GROUPS[1]], "weight_decay": 0.0}],
        lr=lr_at(0), betas=(0.9, 0.95), eps=1e-8, **kw)


def sgd(ps, impl):
    kw = {"fused": True} if impl == "fused" else {"foreach": False}
    return torch.optim.SGD(
        [{"params": [ps[n] for n in GROUPS[0]], "weight_decay": 0.01},
         {"params": [ps[n] for n in GROUPS[1]], "weight_decay": 0.0}],
        lr=lr_at(0), momentum=0.9, **kw)


def clip_case():
    g = torch.Generator().manual_seed(7)
    tensors, scalars = {}, {}
    for case, scale, max_norm, norm_type in (("l2", 1.0, 1.0, 2.0), ("noop", 1e-3, 1.0, 2.0), ("inf", 1.0, 0.5, math.inf)):
        grads = {n: torch.randn(s, generator=g) * scale for n, s in SHAPES.items()}
        ps = {n: torch.nn.Parameter(torch.zeros(s)) for n, s in SHAPES.items()}
        for n, p in ps.items():
            p.grad = grads[n].clone()
            tensors[f"{case}.in.{n}"] = grads[n]
        total = torch.nn.utils.clip_grad_norm_(list(ps.values()), max_norm, norm_type=norm_type)
        for n, p in ps.items():
            tensors[f"{case}.out.{n}"] = p.grad.clone()
        scalars[case] = {"max_norm": max_norm, "total_norm": float(total),
                         "num_zeros": int(sum((gr == 0).sum() for gr in grads.values()))}
    save_file(tensors, os.path.join(OUT, "clip.safetensors"))
    with open(os.path.join(OUT, "clip.json"), "w") as f:
        json.dump(scalars, f)


def bf16_case():
    """Megatron Float16Optimizer step by hand: fp32 master, bf16 model, grads copied to fp32,
    global norm + clip (max_norm/(norm+1e-6)), fused AdamW on the master, copy back."""
    g = torch.Generator().manual_seed(11)
    model = {n: torch.randn(s, generator=g).bfloat16() for n, s in SHAPES.items()}
    master = {n: torch.nn.Parameter(p.float()) for n, p in model.items()}
    opt = torch.optim.AdamW(
        [{"params": [master[n] for n in GROUPS[0]], "weight_decay": 0.1},
         {"params": [master[n] for n in GROUPS[1]], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.999), eps=1e-8, fused=True)
    tensors = {f"init.{n}": p for n, p in model.items()}
    norms = []
    for t in range(50):
        grads = {n: (torch.randn(s, generator=g) * 0.05).bfloat16() for n, s in SHAPES.items()}
        tensors.update({f"grad.{t}.{n}": gr for n, gr in grads.items()})
        for n, p in master.items():
            p.grad = grads[n].float()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(master.values()), 1.0)))
        opt.step()
        for n in model:
            model[n] = master[n].detach().bfloat16()
            tensors[f"model.{t}.{n}"] = model[n]
            tensors[f"master.{t}.{n}"] = master[n].detach().clone()
    save_file(tensors, os.path.join(OUT, "bf16.safetensors"))
    with open(os.path.join(OUT, "bf16.json"), "w") as f:
        json.dump({"grad_norms": norms}, f)


def bf16_params_case():
    """No master copy: the bf16 params are the optimizer's params, stepped by torch's default
    AdamW (what verl builds: no `fused`; the for-loop/foreach ops, each rounding to bf16) with
    bf16 moments. clip_grad_norm_ reports the (bf16) grad norm; max_norm inf leaves the grads
    as they are, so the step itself is compared bit for bit."""
    g = torch.Generator().manual_seed(12)
    ps = {n: torch.nn.Parameter(torch.randn(s, generator=g).bfloat16()) for n, s in SHAPES.items()}
    opt = torch.optim.AdamW(
        [{"params": [ps[n] for n in GROUPS[0]], "weight_decay": 0.1},
         {"params": [ps[n] for n in GROUPS[1]], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    tensors = {f"init.{n}": p.detach().clone() for n, p in ps.items()}
    norms = []
    for t in range(50):
        grads = {n: (torch.randn(s, generator=g) * 0.05).bfloat16() for n, s in SHAPES.items()}
        tensors.update({f"grad.{t}.{n}": gr for n, gr in grads.items()})
        for n, p in ps.items():
            p.grad = grads[n].clone()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(ps.values()), math.inf)))
        opt.step()
        for n, p in ps.items():
            tensors[f"model.{t}.{n}"] = p.detach().clone()
            tensors[f"exp_avg_sq.{t}.{n}"] = opt.state[p]["exp_avg_sq"].clone()
    assert all(opt.state[p]["exp_avg"].dtype == torch.bfloat16 for p in ps.values())
    save_file(tensors, os.path.join(OUT, "bf16_params.safetensors"))
    with open(os.path.join(OUT, "bf16_params.json"), "w") as f:
        json.dump({"grad_norms": norms}, f)


def verl_case():
    """Runs verl's own schedule functions (extracted from its source: importing verl needs ray)."""
    import importlib.util
    from torch.optim.lr_scheduler import LambdaLR
    from torch.optim import Optimizer
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "torch_functional.py")
    src = open(path).read()
    tree = ast.parse(src)
    wanted = {"get_cosine_schedule_with_warmup", "get_constant_schedule_with_warmup", "get_wsd_schedule_with_warmup"}
    mod = ast.Module(body=[n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted], type_ignores=[])
    ns = {"math": math, "LambdaLR": LambdaLR, "Optimizer": Optimizer}
    exec(compile(mod, path, "exec"), ns)
    out = {}
    cases = {
        "constant_w10": lambda o: ns["get_constant_schedule_with_warmup"](o, num_warmup_steps=10),
        "constant_w0": lambda o: ns["get_constant_schedule_with_warmup"](o, num_warmup_steps=0),
        "cosine_w10": lambda o: ns["get_cosine_schedule_with_warmup"](o, num_warmup_steps=10, num_training_steps=100),
        "cosine_min": lambda o: ns["get_cosine_schedule_with_warmup"](o, num_warmup_steps=5, num_training_steps=100, min_lr_ratio=0.1),
        "cosine_cycles": lambda o: ns["get_cosine_schedule_with_warmup"](o, num_warmup_steps=0, num_training_steps=100, min_lr_ratio=0.05, num_cycles=1.5),
        # verl 0.7.0's legacy SFT trainer calls it with its defaults.
        "wsd_w10": lambda o: ns["get_wsd_schedule_with_warmup"](o, num_warmup_steps=10, num_training_steps=100),
        "wsd_w0_short": lambda o: ns["get_wsd_schedule_with_warmup"](o, num_warmup_steps=0, num_training_steps=7),
    }
    # verl 0.9.1's version of the cosine schedule, with its zero_indexed_step (unpacked by
    # scripts/setup beside the venv's 0.7.0).
    newer = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".venv", "verl-releases",
                         "0.9.1", "verl", "utils", "torch_functional.py")
    if os.path.isfile(newer):
        tree9 = ast.parse(open(newer).read())
        mod9 = ast.Module(body=[n for n in tree9.body if isinstance(n, ast.FunctionDef) and n.name in wanted],
                          type_ignores=[])
        ns9 = {"math": math, "LambdaLR": LambdaLR, "Optimizer": Optimizer}
        exec(compile(mod9, newer, "exec"), ns9)
        cases["cosine_one_indexed_0_9"] = lambda o: ns9["get_cosine_schedule_with_warmup"](
            o, num_warmup_steps=5, num_training_steps=100, min_lr_ratio=0.1, zero_indexed_step=False)
    for name, make in cases.items():
        p = torch.nn.Parameter(torch.zeros(1))
        o = torch.optim.SGD([{"params": [p], "lr": 1e-3}, {"params": [], "lr": 5e-4}], lr=1e-3)
        s = make(o)
        lrs = []
        for _ in range(120):
            lrs.append([pg["lr"] for pg in o.param_groups])
            o.step()
            s.step()
        out[name] = lrs
    with open(os.path.join(OUT, "verl.json"), "w") as f:
        json.dump(out, f)


save_traj("adamw", adamw, 1)
save_traj("sgd", sgd, 2)
clip_case()
bf16_case()
bf16_params_case()
verl_case()
with open(os.path.join(OUT, "done"), "w") as f:
    f.write("ok")

"""Independent oracle for runtime::algo (advantage estimators, policy losses, loss aggregation,
KL estimators, KL controller, value loss, entropy).

Usage: algo_oracle.py OUTDIR
Writes OUTDIR/<group>.safetensors (inputs and expected values, float64) and OUTDIR/<group>.json
(parameters and scalars). Written from the formulas in docs/algorithms.md (not from
verl's code): advantages with plain Python loops over floats, losses with torch autograd in
float64 so that the Rust tests can compare values *and* gradients. Groups:
  adv     every advantage estimator on one seeded batch (groups of 4, 3, 2 and 1)
  agg     the four loss_agg_mode variants, local and with global-batch info
  pl      every policy loss x agg mode x (with / without rollout IS weights): loss, grad, metrics
  kl      every KL estimator (and "+" variant): value and gradient; the full-vocabulary KL
  kl_ctrl in-reward KL penalty with an adaptive controller
  value   clipped value loss: loss, grad, clipfrac per agg mode
  entropy entropy from logits: value and gradient
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)
OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)

EPS_STD = 1e-6
MEAN_EPS = 1e-8


def save(group, tensors, meta):
    save_file({k: v.detach().contiguous().to(torch.float64) for k, v in tensors.items()},
              os.path.join(OUT, f"{group}.safetensors"))
    with open(os.path.join(OUT, f"{group}.json"), "w") as f:
        json.dump(meta, f, indent=1)


def as_lists(t):
    return [[float(x) for x in row] for row in t.tolist()]


# ---------------------------------------------------------------------------------------------
# Advantage estimators (pure Python, float)

def groups_of(index):
    g = {}
    for i, gid in enumerate(index):
        g.setdefault(gid, []).append(i)
    return list(g.values())


def mean(xs):
    return sum(xs) / len(xs)


def std_unbiased(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def whiten(x, m):
    """(x - mean_m) / sqrt(var_m + 1e-8), unbiased masked variance; every element."""
    n = sum(sum(row) for row in m)
    s = sum(x[i][t] * m[i][t] for i in range(len(x)) for t in range(len(x[0])))
    mu = s / (n + MEAN_EPS)
    v = sum((x[i][t] - mu) ** 2 * m[i][t] for i in range(len(x)) for t in range(len(x[0]))) / (n + MEAN_EPS)
    v = v * n / (n - 1)
    return [[(x[i][t] - mu) / math.sqrt(v + 1e-8) for t in range(len(x[0]))] for i in range(len(x))]


def bcast(a, m):
    return [[a[i] * m[i][t] for t in range(len(m[0]))] for i in range(len(m))]


def adv_gae(r, v, m, gamma, lam):
    B, T = len(r), len(r[0])
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        nv, last = 0.0, 0.0
        for t in reversed(range(T)):
            if m[i][t]:
                delta = r[i][t] + gamma * nv - v[i][t]
                last = delta + gamma * lam * last
                nv = v[i][t]
            # masked token: V_next and A_next carried through unchanged
            out[i][t] = last
    ret = [[out[i][t] + v[i][t] for t in range(T)] for i in range(B)]
    return whiten(out, m), ret


def adv_grpo(s, index, norm, vectorized):
    a = [0.0] * len(s)
    for members in groups_of(index):
        xs = [s[i] for i in members]
        K = len(xs)
        if K == 1:
            mu, sd = 0.0, 1.0
        elif vectorized:
            var = (sum(x * x for x in xs) - sum(xs) ** 2 / K) / max(K - 1, 1)
            mu, sd = mean(xs), math.sqrt(max(var, EPS_STD))
        else:
            mu, sd = mean(xs), std_unbiased(xs)
        for i in members:
            a[i] = (s[i] - mu) / (sd + EPS_STD) if norm else s[i] - mu
    return a


def adv_passk(s, index, norm):
    a = [0.0] * len(s)
    for members in groups_of(index):
        xs = sorted(((s[i], i) for i in members), key=lambda p: -p[0])
        gap = xs[0][0] - xs[1][0]
        a[xs[0][1]] = gap / (std_unbiased([s[i] for i in members]) + EPS_STD) if norm else gap
    return a


def adv_rloo(s, index):
    a = list(s)
    for members in groups_of(index):
        if len(members) > 1:
            for i in members:
                a[i] = s[i] - mean([s[j] for j in members if j != i])
    return a


def adv_rloo_vec(s, index):
    a = [0.0] * len(s)
    for members in groups_of(index):
        K = len(members)
        if K > 1:
            tot = sum(s[j] for j in members)
            for i in members:
                a[i] = (K * s[i] - tot) / (K - 1)
    return a


def adv_opo(s, lengths, index):
    a = list(s)
    for members in groups_of(index):
        if len(members) > 1:
            b = sum(lengths[j] * s[j] for j in members) / sum(lengths[j] for j in members)
            for i in members:
                a[i] = s[i] - b
    return a


def adv_rfpp(r, m, gamma):
    B, T = len(r), len(r[0])
    G = [[0.0] * T for _ in range(B)]
    for i in range(B):
        run = 0.0
        for t in reversed(range(T)):
            run = r[i][t] + gamma * run
            G[i][t] = run
            run = run * m[i][t]
    w = whiten(G, m)
    return [[w[i][t] * m[i][t] for t in range(T)] for i in range(B)], G


def adv_rfpp_baseline(s, m, index):
    c = list(s)
    for members in groups_of(index):
        if len(members) > 1:
            mu = mean([s[j] for j in members])
            for i in members:
                c[i] = s[i] - mu
    w = whiten(bcast(c, m), m)
    return [[w[i][t] * m[i][t] for t in range(len(m[0]))] for i in range(len(m))]


def adv_remax(r, m, base):
    B, T = len(r), len(r[0])
    G = [[sum(r[i][k] * m[i][k] for k in range(t, T)) for t in range(T)] for i in range(B)]
    A = [[G[i][t] - base[i] * m[i][t] for t in range(T)] for i in range(B)]
    return A, G


def adv_gpg(s, index):
    alpha = len(s) / max(1, sum(1 for x in s if x != 0))
    a = [0.0] * len(s)
    for members in groups_of(index):
        mu = mean([s[j] for j in members]) if len(members) > 1 else 0.0
        for i in members:
            a[i] = alpha * (s[i] - mu)
    return a


def case_adv():
    g = torch.Generator().manual_seed(7)
    B, T = 10, 7
    index = [0, 1, 0, 2, 1, 0, 3, 1, 3, 0]  # groups of 4, 3, 1, 2
    index_k2 = [0, 1, 0, 2, 1, 0, 2, 1, 2, 0]  # groups of 4, 3, 3 (pass@k needs K >= 2)
    lengths = [7, 5, 3, 1, 6, 4, 7, 2, 5, 6]
    mask = torch.zeros(B, T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    mask[0, 2] = 0  # tool tokens inside a response
    mask[4, 1:3] = 0
    mask[6, 5] = 0
    rewards = torch.randn(B, T, generator=g) * 0.5 * mask
    # outcome-style rewards: the score sits on the last valid token
    outcome = torch.zeros(B, T)
    scores = [1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 2.0, 1.0, -1.0, 0.25]
    for i, n in enumerate(lengths):
        outcome[i, n - 1] = scores[i]
    values = torch.randn(B, T, generator=g)
    baselines = torch.randn(B, generator=g)
    gamma, lam = 0.95, 0.9

    r, m, v = as_lists(rewards), as_lists(mask), as_lists(values)
    ro = as_lists(outcome)
    so = [sum(row) for row in ro]
    s = [sum(row) for row in r]
    L = [sum(row) for row in m]
    T_ = lambda x: torch.tensor(x)
    out = {"rewards": rewards, "outcome": outcome, "mask": mask, "values": values, "baselines": baselines}
    A, R = adv_gae(r, v, m, gamma, lam)
    out["gae/adv"], out["gae/ret"] = T_(A), T_(R)
    # lam = 1, gamma = 1: unwhitened GAE equals the discounted-sum definition (see the Rust test)
    for name, rw, sc in (("dense", r, s), ("outcome", ro, so)):
        for norm in (True, False):
            out[f"grpo/{name}/{norm}"] = T_(bcast(adv_grpo(sc, index, norm, False), m))
            out[f"grpo_vectorized/{name}/{norm}"] = T_(bcast(adv_grpo(sc, index, norm, True), m))
            out[f"grpo_passk/{name}/{norm}"] = T_(bcast(adv_passk(sc, index_k2, norm), m))
        out[f"rloo/{name}"] = T_(bcast(adv_rloo(sc, index), m))
        out[f"rloo_vectorized/{name}"] = T_(bcast(adv_rloo_vec(sc, index), m))
        out[f"opo/{name}"] = T_(bcast(adv_opo(sc, L, index), m))
        out[f"gpg/{name}"] = T_(bcast(adv_gpg(sc, index), m))
        out[f"reinforce_plus_plus_baseline/{name}"] = T_(adv_rfpp_baseline(sc, m, index))
        A, G = adv_rfpp(rw, m, 0.9)
        out[f"reinforce_plus_plus/{name}/adv"], out[f"reinforce_plus_plus/{name}/ret"] = T_(A), T_(G)
        A, G = adv_remax(rw, m, baselines.tolist())
        out[f"remax/{name}/adv"], out[f"remax/{name}/ret"] = T_(A), T_(G)
    save("adv", out, {"index": index, "index_k2": index_k2, "gamma": gamma, "lam": lam, "rfpp_gamma": 0.9})


# ---------------------------------------------------------------------------------------------
# Aggregation (torch; differentiable)

AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def agg(loss, m, mode, dp=1, n_tok=None, gbs=None, scale=None):
    if mode == "token-mean":
        n = m.sum() if n_tok is None else n_tok
        return (loss * m).sum() / n * dp
    tok = m.sum(-1)
    nonempty = (tok > 0).to(loss.dtype)
    b = nonempty.sum() if gbs is None else gbs
    if mode == "seq-mean-token-sum":
        per_seq = (loss * m).sum(-1)
        return (per_seq * nonempty).sum() / b * dp
    if mode == "seq-mean-token-mean":
        per_seq = (loss * m).sum(-1) / (tok + MEAN_EPS)
        return (per_seq * nonempty).sum() / b * dp
    if mode == "seq-mean-token-sum-norm":
        S = loss.shape[-1] if scale is None else scale
        return (loss * m).sum() / S
    raise ValueError(mode)


GLOBAL = {"dp": 2, "n_tok": 50.0, "gbs": 8.0, "scale": 16.0}


def agg_variants(loss, m):
    """[(suffix, value)] for every mode, local and global."""
    out = []
    for mode in AGG_MODES:
        out.append((f"{mode}/local", agg(loss, m, mode)))
        out.append((f"{mode}/global", agg(loss, m, mode, GLOBAL["dp"], GLOBAL["n_tok"], GLOBAL["gbs"], GLOBAL["scale"])))
    return out


def mmean(x, m):
    return (x * m).sum() / (m.sum() + MEAN_EPS)


def case_agg():
    g = torch.Generator().manual_seed(11)
    loss = torch.randn(5, 6, generator=g)
    m = (torch.rand(5, 6, generator=g) > 0.35).to(torch.float64)
    m[3] = 0  # an empty sequence
    out = {"loss": loss, "mask": m}
    for k, v in agg_variants(loss, m):
        out[k] = v
    save("agg", out, {"global": GLOBAL})


# ---------------------------------------------------------------------------------------------
# Policy losses (torch autograd, float64)

CFG = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0, "tau_pos": 1.0, "tau_neg": 1.05,
       "clip_cov_ratio": 1.0, "clip_cov_lb": 0.0, "clip_cov_ub": 1.0, "kl_cov_ratio": 0.2, "ppo_kl_coef": 0.1,
       "dro_beta": 0.7}


def pl_vanilla(lp, old, A, m, w, mode, ag):
    d = (lp - old).clamp(-20, 20)
    rho = d.exp()
    l1 = -A * rho
    l2 = -A * rho.clamp(1 - CFG["clip_low"], 1 + CFG["clip_high"])
    lc = torch.maximum(l1, l2)
    cap = -A * CFG["clip_c"]
    l = torch.where(A < 0, torch.minimum(cap, lc), lc)
    if w is not None:
        l = l * w
    met = {"pg_clipfrac": mmean((l2 > l1).double(), m), "ppo_kl": mmean(-d, m),
           "pg_clipfrac_lower": mmean(((lc > cap) & (A < 0)).double(), m)}
    return agg(l, m, mode, **ag), met


def pl_gspo(lp, old, A, m, w, mode, ag):
    d = lp - old
    seq = (d * m).sum(-1) / m.sum(-1).clamp(min=1)
    logr = (lp - lp.detach() + seq.detach()[:, None]).clamp(max=10)
    r = logr.exp()
    l1 = -A * r
    l2 = -A * r.clamp(1 - CFG["clip_low"], 1 + CFG["clip_high"])
    l = torch.maximum(l1, l2)
    if w is not None:
        l = l * w
    met = {"pg_clipfrac": mmean((l2 > l1).double(), m), "ppo_kl": mmean(-d, m), "pg_clipfrac_lower": torch.tensor(0.0)}
    return agg(l, m, "seq-mean-token-mean", **ag), met


def pl_sapo(lp, old, A, m, w, mode, ag):
    d = (lp - old).clamp(-20, 20)
    rho = d.exp()
    tau = torch.where(A > 0, torch.tensor(CFG["tau_pos"]), torch.tensor(CFG["tau_neg"]))
    f = torch.sigmoid(tau * (rho - 1)) * 4 / tau
    l = -f * A
    if w is not None:
        l = l * w
    met = {"pg_clipfrac": torch.tensor(0.0), "ppo_kl": mmean(-d, m), "pg_clipfrac_lower": torch.tensor(0.0)}
    return agg(l, m, "seq-mean-token-mean", **ag), met


def pl_gpg(lp, old, A, m, w, mode, ag):
    l = -A * lp
    if w is not None:
        l = l * w
    return agg(l, m, mode, **ag), {}


def pl_clip_cov(lp, old, A, m, w, mode, ag):
    # With clip_cov_ratio = 1, max(1, floor(ratio * sum m)) >= #candidates, so every candidate
    # is detached and the random draw does not matter.
    d = lp - old
    rho = d.exp()
    l1 = -A * rho
    l2 = -A * rho.clamp(1 - CFG["clip_low"], 1 + CFG["clip_high"])
    cov = (A - mmean(A, m)) * (lp.detach() - mmean(lp.detach(), m))
    cand = (m > 0) & ~(l2 > l1) & (cov > CFG["clip_cov_lb"]) & (cov < CFG["clip_cov_ub"])
    assert int(cand.sum()) <= max(1, math.floor(CFG["clip_cov_ratio"] * float(m.sum())))
    corr = (~cand).double()
    l = torch.maximum(l1, l2) * corr
    if w is not None:
        l = l * w
    met = {"pg_clipfrac": mmean(cand.double(), m), "ppo_kl": mmean(-d, m)}
    return agg(l, m, mode, **ag), met


def pl_kl_cov(lp, old, A, m, w, mode, ag):
    d = lp - old
    l = -A * d.exp()
    valid = [(i, t) for i in range(m.shape[0]) for t in range(m.shape[1]) if m[i, t] > 0]
    a = [float(A[i, t]) for i, t in valid]
    p = [float(lp[i, t]) for i, t in valid]
    ma, mp = sum(a) / len(a), sum(p) / len(p)
    cov = [(a[j] - ma) * (p[j] - mp) for j in range(len(valid))]
    k = max(1, math.floor(len(valid) * CFG["kl_cov_ratio"]))
    top = sorted(range(len(valid)), key=lambda j: -cov[j])[:k]
    sel = torch.zeros_like(m, dtype=torch.bool)
    for j in top:
        sel[valid[j]] = True
    l = torch.where(sel, l + CFG["ppo_kl_coef"] * d.abs(), l)
    if w is not None:
        l = l * w
    return agg(l, m, mode, **ag), {"ppo_kl": mmean(d.abs(), m)}


def pl_geo_mean(lp, old, A, m, w, mode, ag):
    d = lp - old
    dc = d.clamp(-CFG["clip_low"], CFG["clip_high"])
    # pessimistic per token: for A > 0 the smaller log-ratio, for A < 0 the larger, A = 0 -> 0
    dstar = torch.where(A > 0, torch.minimum(d, dc), torch.where(A < 0, torch.maximum(d, dc), torch.zeros_like(d)))
    n = m.sum(-1) + MEAN_EPS
    rho = ((dstar * m).sum(-1) / n).exp()
    Ahat = (A * m).sum(-1) / n
    l = -Ahat * rho
    if w is not None:
        l = l * ((torch.log(w + 1e-10) * m).sum(-1) / n).exp()
    clipped = d != dc
    met = {"pg_clipfrac": mmean((clipped & (A > 0)).double(), m), "ppo_kl": mmean(-d, m),
           "pg_clipfrac_lower": mmean((clipped & (A < 0)).double(), m)}
    return l.mean(), met


def pl_cispo(lp, old, A, m, w, mode, ag):
    d = (lp - old).clamp(-20, 20)
    rho = d.exp()
    rc = rho.clamp(1 - CFG["clip_low"], 1 + CFG["clip_high"])
    l = -rc.detach() * A * lp
    if w is not None:
        l = l * w
    met = {"pg_clipfrac": mmean((rho != rc).double(), m), "ppo_kl": mmean(-d, m), "pg_clipfrac_lower": torch.tensor(0.0)}
    return agg(l, m, mode, **ag), met


def pl_dppo(divergence):
    # Binary trust region on p = exp(lp) around p_old; REINFORCE step weighted by the truncated ratio.
    def fn(lp, old, A, m, w, mode, ag):
        d = (lp - old).clamp(-20, 20)
        rho = d.exp()
        p, p_old = lp.detach().exp(), old.exp()
        if divergence == "tv":
            up = (p - p_old) <= CFG["clip_high"]
            down = (p - p_old) >= -CFG["clip_low"]
        else:
            kl = p_old * (old - lp.detach()) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
            up = (kl <= CFG["clip_high"]) | (p <= p_old)
            down = (kl <= CFG["clip_low"]) | (p >= p_old)
        v = torch.where(A > 0, up, down).double()
        l = -A * rho.clamp(max=CFG["clip_c"]).detach() * lp * v
        if w is not None:
            l = l * w
        met = {"pg_clipfrac": mmean(1 - v, m), "ppo_kl": mmean(-d, m),
               "pg_clipfrac_lower": mmean((rho > CFG["clip_c"]).double() * v, m)}
        return agg(l, m, mode, **ag), met
    return fn


def pl_dro(lp, old, A, m, w, mode, ag):
    d = lp - old
    l = -(lp * A - 0.5 * CFG["dro_beta"] * d * d)
    if w is not None:
        l = l * w
    return agg(l, m, mode, **ag), {"ppo_kl": mmean(-d, m)}


LOSSES = {"vanilla": pl_vanilla, "gspo": pl_gspo, "sapo": pl_sapo, "gpg": pl_gpg, "clip_cov": pl_clip_cov,
          "kl_cov": pl_kl_cov, "geo_mean": pl_geo_mean, "cispo": pl_cispo,
          "dppo_tv": pl_dppo("tv"), "dppo_kl": pl_dppo("kl"), "dro": pl_dro}


def case_pl():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 9
    m = torch.ones(B, T)
    for i, n in enumerate([9, 7, 4, 0, 8, 2]):
        m[i, n:] = 0
    m[0, 3] = 0
    old = -torch.rand(B, T, generator=g) * 3 - 0.05
    lp = old + torch.randn(B, T, generator=g) * 0.3
    A = torch.randn(B, T, generator=g) * 1.5
    A[1, :] = -2.0  # a sequence with negative advantage: dual-clip territory
    lp[1, :3] = old[1, :3] + 1.6  # ratio ~ 5 > clip_ratio_c
    A[4, 5] = 0.0
    w = torch.rand(B, T, generator=g) + 0.5
    out = {"old": old, "lp": lp, "adv": A, "mask": m, "w": w}
    meta = {"cfg": CFG, "global": GLOBAL, "metrics": {}}
    for name, fn in LOSSES.items():
        for mode in AGG_MODES:
            for scope, ag in (("local", {}), ("global", {"dp": GLOBAL["dp"], "n_tok": GLOBAL["n_tok"],
                                                          "gbs": GLOBAL["gbs"], "scale": GLOBAL["scale"]})):
                for wname, ww in (("now", None), ("w", w)):
                    x = lp.clone().requires_grad_(True)
                    loss, met = fn(x, old, A, m, ww, mode, ag)
                    loss.backward()
                    key = f"{name}/{mode}/{scope}/{wname}"
                    out[key + "/loss"] = loss
                    out[key + "/grad"] = x.grad
                    meta["metrics"][key] = {k: float(v.detach()) for k, v in met.items()}
    save("pl", out, meta)


# ---------------------------------------------------------------------------------------------
# KL estimators, controller, value loss, entropy

def kl_value(kind, lp, ref):
    d = lp - ref
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        x = (ref - lp).clamp(-20, 20)
        return (x.exp() - x - 1).clamp(-10, 10)
    raise ValueError(kind)


ALIASES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


def case_kl():
    g = torch.Generator().manual_seed(5)
    lp = -torch.rand(4, 5, generator=g) * 4
    ref = lp + torch.randn(4, 5, generator=g) * 0.8
    ref[0, 0] = lp[0, 0] + 25.0  # exercises the clamps of k3
    ref[0, 1] = lp[0, 1] - 30.0
    cot = torch.randn(4, 5, generator=g)  # cotangent: grad of sum(cot * kl)
    out = {"lp": lp, "ref": ref, "cot": cot}
    for name, kind in ALIASES.items():
        for plus in (False, True):
            x = lp.clone().requires_grad_(True)
            val = kl_value(kind, x, ref)
            if plus:
                # straight-through: value of `kind`, gradient of k2 (derivative of 0.5 d^2 is d)
                grad = cot * (lp - ref)
                val = val.detach()
            else:
                (val * cot).sum().backward()
                grad = x.grad
            key = name + ("+" if plus else "")
            out[f"{key}/value"] = val
            out[f"{key}/grad"] = grad
    # full KL over a vocabulary of 6
    logits = torch.randn(2, 3, 6, generator=g)
    ref_logits = torch.randn(2, 3, 6, generator=g)
    x = torch.log_softmax(logits, -1).clone().requires_grad_(True)
    q = torch.log_softmax(ref_logits, -1)
    full = (x.exp() * (x - q)).sum(-1)
    (full * cot[:2, :3]).sum().backward()
    out.update({"full/lp": x.detach(), "full/ref": q, "full/value": full, "full/grad": x.grad, "full/cot": cot[:2, :3]})
    save("kl", out, {})


def case_kl_ctrl():
    g = torch.Generator().manual_seed(9)
    B, T = 4, 5
    m = torch.ones(B, T)
    m[1, 3:] = 0
    m[2, 1] = 0
    scores = torch.zeros(B, T)
    scores[:, -1] = torch.tensor([1.0, 0.0, 0.5, 1.0])
    old = -torch.rand(B, T, generator=g) * 2
    ref = old + torch.randn(B, T, generator=g) * 0.5
    beta, target, horizon = 0.1, 0.05, 100.0
    kl = kl_value("k3", old, ref) * m
    rewards = scores - beta * kl
    current = float(((kl * m).sum(-1) / (m.sum(-1) + MEAN_EPS)).mean())
    e = min(max(current / target - 1, -0.2), 0.2)
    new_beta = beta * (1 + e * B / horizon)
    save("kl_ctrl", {"scores": scores, "old": old, "ref": ref, "mask": m, "rewards": rewards},
         {"beta": beta, "target": target, "horizon": horizon, "current_kl": current, "new_beta": new_beta})


def case_value():
    g = torch.Generator().manual_seed(13)
    B, T = 5, 6
    m = (torch.rand(B, T, generator=g) > 0.3).double()
    m[2] = 0
    values = torch.randn(B, T, generator=g)
    vpreds = values + torch.randn(B, T, generator=g) * 0.4
    returns = values + torch.randn(B, T, generator=g)
    c = 0.2
    out = {"vpreds": vpreds, "values": values, "returns": returns, "mask": m}
    meta = {"cliprange_value": c, "global": GLOBAL}
    for mode in AGG_MODES:
        for scope in ("local", "global"):
            x = vpreds.clone().requires_grad_(True)
            vclip = torch.maximum(torch.minimum(x, values + c), values - c)
            l1, l2 = (x - returns) ** 2, (vclip - returns) ** 2
            ag = {} if scope == "local" else {"dp": GLOBAL["dp"], "n_tok": GLOBAL["n_tok"], "gbs": GLOBAL["gbs"],
                                             "scale": GLOBAL["scale"]}
            loss = 0.5 * agg(torch.maximum(l1, l2), m, mode, **ag)
            loss.backward()
            out[f"{mode}/{scope}/loss"] = loss
            out[f"{mode}/{scope}/grad"] = x.grad
            out[f"{mode}/{scope}/clipfrac"] = mmean((l2 > l1).double(), m)
    save("value", out, meta)


def case_entropy():
    g = torch.Generator().manual_seed(17)
    logits = torch.randn(2, 3, 11, generator=g) * 3
    x = logits.clone().requires_grad_(True)
    p = torch.softmax(x, -1)
    h = -(p * torch.log(p)).sum(-1)
    cot = torch.randn(2, 3, generator=g)
    (h * cot).sum().backward()
    save("entropy", {"logits": logits, "entropy": h, "cot": cot, "grad": x.grad}, {})


case_adv()
case_agg()
case_pl()
case_kl()
case_kl_ctrl()
case_value()
case_entropy()

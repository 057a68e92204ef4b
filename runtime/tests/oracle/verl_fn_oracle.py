"""Runs functions of the installed verl 0.7.0 itself on fixed inputs, without importing the verl
package (its __init__ needs ray, tensordict, ...): the function's source is taken from verl's
file with `ast` and executed with torch and numpy, plus stand-ins for verl's data container.

Usage: verl_fn_oracle.py OUT
Writes
- OUT/pf_ppo.json: for seeded scores (with ties at the maximum and minimum), the weights that
  verl's compute_pf_ppo_reweight_data hands to torch.multinomial for each reweight method, and
  the rows it resampled (checked against the weights, since the draw is torch's);
- OUT/rollout_corr.json: for seeded old and rollout log-probs (with outliers) and several
  configurations, the importance weights, response mask and metrics of verl's
  compute_rollout_correction_and_rejection_mask (trainer/ppo/rollout_corr_helper.py);
- OUT/bypass.json: verl's compute_policy_loss_bypass_mode (trainer/ppo/core_algos.py, with its
  PPO-clip and REINFORCE losses and agg_loss) on seeded inputs: the loss, its gradient with
  respect to the log-probs, and the metrics, for both loss types and several corrections;
- OUT/policy_losses_0_9.json: the policy losses verl added after 0.7 (dppo_tv, dppo_kl, dro), run
  from verl 0.9.1's own core_algos.py (scripts/setup unpacks that release's files under
  .venv/verl-releases; VERLC_VERL_NEWER_ROOT overrides where) with its agg_loss and
  masked_mean, for every aggregation mode (0.9's token-sum included), local and with global-batch
  info, with and without
  rollout weights: loss, gradient with respect to the log-probs, metrics;
- OUT/estimators_0_9.json: the optimal token baseline estimators verl 0.9 added
  (optimal_token_baseline, tir_optimal_token_baseline) from 0.9.1's core_algos.py, on seeded
  groups (sizes 1 to 4, a strictly longest trajectory, tied longest ones, an empty response,
  masks with holes for the multi-turn form), with and without rollout IS weights; and its
  compute_variance_proxy_metrics (trainer/ppo/metric_utils.py) on the results; and gdpo on two
  reward components (with and without weights, and its fallback on the token-level rewards);
- OUT/distillation_0_9.json: verl 0.9.1's on-policy distillation term (distillation_loss with
  the k1/abs/k2/k3 estimators, supervised and as a policy gradient, clamped or not) on seeded
  student, teacher and old log-probs: loss, gradient with respect to the student's, metrics;
- OUT/distillation_topk_0_9.json: verl 0.9.1's top-k forward KL (its FSDP logits processor, then
  distillation_loss) on seeded student logits and a teacher's top-k: loss, gradient with respect
  to the logits, metrics, supervised and as a policy gradient, clamped or not;
- OUT/rejection_0_9.json: verl 0.9.1's rejection sampling (its rollout_rs options, one and
  several, with their threshold forms) on seeded log-ratios: parsed bounds, new mask, metrics;
- OUT/rollout_corr_0_9.json: verl 0.9.1's rollout correction (truncated and IcePop importance
  weights per token and per sequence, with a rejection option) on seeded log-probs: weights,
  mask, metrics;
- OUT/release_semantics.json: the four functions whose results changed between releases, run
  from verl 0.7.0's (installed) and 0.9.1's own core_algos.py on the same inputs (masks with
  holes, an empty row, singleton groups, near-equal scores): agg_loss's seq-mean-token-sum-norm
  (local, and with global-batch info over 2 data-parallel ranks), the gspo policy loss under each
  aggregation mode (loss and gradient), reinforce_plus_plus's advantages and returns, and
  grpo_vectorized's advantages;
- OUT/sft_loss_legacy.json: verl 0.7.0's legacy SFT trainer's micro-batch loss (its
  `_compute_loss_and_backward`, executed on fixed logits): loss and gradient;
- OUT/dynamic_bsz.json: for seeded valid-token counts and token budgets, the micro-batches
  (row indices, in order) of verl's rearrange_micro_batches (utils/seqlen_balancing.py, one
  process), with many equal lengths among the cases so that tie-breaking is exercised.
"""
import heapq
import ast
import importlib.util
import json
import os
import sys

import numpy as np
import torch


def installed_verl():
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        sys.exit("verl is not installed in this interpreter (run scripts/setup)")
    return os.path.dirname(spec.origin)


def newer_verl():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "../../../.venv/verl-releases/0.9.1/verl")
    root = os.environ.get("VERLC_VERL_NEWER_ROOT", default)
    if not os.path.isfile(os.path.join(root, "trainer/ppo/core_algos.py")):
        sys.exit(f"verl 0.9.1's files are not at {root} (run scripts/setup)")
    return root


def verl_function(relpath, name, namespace, root=None):
    path = os.path.join(root or installed_verl(), relpath)
    with open(path) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []  # registries are verl's import-time bookkeeping
    # Annotations stay unevaluated (they name verl's types, which are not imported here).
    flags = __import__("__future__").annotations.compiler_flag
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[name]


def masked_fns(root):
    """verl's masked_sum and masked_mean (utils/torch_functional.py of the tree at root, None:
    the installed verl), as the namespace its code reaches through `verl_F`."""
    vf = {"torch": torch}
    for name in ["masked_sum", "masked_mean"]:
        verl_function("utils/torch_functional.py", name, vf, root)
    return vf


def core_algos_namespace(root):
    """What functions of trainer/ppo/core_algos.py (of the tree at root) reach at module level:
    torch, typing names, verl_F's masked helpers and a stand-in AlgoConfig class."""
    import types

    typing = __import__("typing")

    class AlgoConfig:
        pass

    return {"torch": torch, "Optional": typing.Optional, "Any": typing.Any,
            "verl_F": types.SimpleNamespace(**masked_fns(root)), "AlgoConfig": AlgoConfig}


class Batch(dict):
    batch_size = None


class Data:
    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


def pf_ppo(out):
    captured = []

    class TorchShim:
        def __getattr__(self, k):
            return getattr(torch, k)

        def multinomial(self, w, n, replacement):
            captured.append(w.clone())
            return torch.multinomial(w, n, replacement=replacement)

    fn = verl_function(
        "trainer/ppo/core_algos.py", "compute_pf_ppo_reweight_data", {"torch": TorchShim(), "np": np}
    )
    gen = torch.Generator().manual_seed(5)
    rows, width = 12, 5
    scores = torch.randn(rows, width, generator=gen)
    sums = scores.sum(-1)
    top, bottom = int(sums.argmax()), int(sums.argmin())
    assert {top, bottom}.isdisjoint({3, 7})
    scores[3] = scores[top]  # ties: two rows share the highest and two the lowest summed score
    scores[7] = scores[bottom]
    result = {"token_level_scores": scores.tolist(), "methods": {}}
    for method, pow_ in [("pow", 2.0), ("pow", 0.5), ("max_min", 2.0), ("max_random", 2.0)]:
        captured.clear()
        torch.manual_seed(0)
        data = Data(Batch(token_level_scores=scores, row=torch.arange(rows)), {"uid": np.arange(rows)}, {})
        res = fn(data, method, pow_)
        result["methods"][f"{method}:{pow_}"] = {
            "weights": captured[0].tolist(),
            "resampled_rows": res.batch["row"].tolist(),
            "uids_follow_rows": bool((res.non_tensor_batch["uid"] == res.batch["row"].numpy()).all()),
        }
    with open(os.path.join(out, "pf_ppo.json"), "w") as f:
        json.dump(result, f)


def dynamic_bsz(out):
    import types

    ns = {"torch": torch, "heapq": heapq}
    for name in ["calculate_workload", "karmarkar_karp", "get_seqlen_balanced_partitions", "ceildiv", "roundup_divisible"]:
        verl_function("utils/seqlen_balancing.py", name, ns)
    ns["dist"] = types.SimpleNamespace(is_initialized=lambda: False)
    ns["tu"] = types.SimpleNamespace(index_select_tensor_dict=lambda batch, idx: idx)
    rearrange = verl_function("utils/seqlen_balancing.py", "rearrange_micro_batches", ns)
    gen = torch.Generator().manual_seed(11)
    cases = []
    for rows, width, budget in [(8, 40, 80), (16, 64, 200), (32, 48, 96), (24, 100, 1000), (13, 30, 30), (40, 20, 64)]:
        lengths = torch.randint(1, width + 1, (rows,), generator=gen)
        if rows >= 16:
            lengths[::3] = lengths[0]  # equal lengths: ties in the partitioning
        mask = torch.zeros(rows, width, dtype=torch.long)
        for i, n in enumerate(lengths.tolist()):
            mask[i, width - n :] = 1
        batch = {"input_ids": torch.zeros(rows, width, dtype=torch.long), "attention_mask": mask}
        _, parts = rearrange(batch, max_token_len=budget)
        cases.append({"lengths": lengths.tolist(), "budget": budget, "parts": parts})
    with open(os.path.join(out, "dynamic_bsz.json"), "w") as f:
        json.dump(cases, f)


def correction_functions():
    """verl's rollout-correction helpers with verl_F's masked sum/mean, in one namespace."""
    import types

    typing = __import__("typing")
    vf = masked_fns(None)
    proto = types.SimpleNamespace(from_dict=lambda tensors: types.SimpleNamespace(batch=tensors))
    ns = {"torch": torch, "Optional": typing.Optional, "Any": typing.Any,
          "verl_F": types.SimpleNamespace(**vf), "DataProto": proto, "SAFETY_BOUND": 20.0}
    for name in ["compute_rs_metrics", "compute_rollout_rejection_mask", "compute_is_metrics",
                 "compute_rollout_correction_weights", "compute_offpolicy_metrics",
                 "compute_rollout_correction_and_rejection_mask"]:
        verl_function("trainer/ppo/rollout_corr_helper.py", name, ns)
    return ns


def correction_inputs():
    """Seeded old and rollout log-probs with outliers, and a ragged response mask."""
    gen = torch.Generator().manual_seed(3)
    rows, width = 10, 7
    rollout = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3
    old = rollout + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.3
    old[2, 1] = rollout[2, 1] - 6.0  # catastrophic token (far below IcePop's lower bound)
    old[5, 3] = rollout[5, 3] + 2.5  # large ratio
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i in range(rows):
        mask[i, 2 + (i % 5):] = 0
    return old, rollout, mask


def correction_cases(fn, configs, path):
    """`fn` (a compute_rollout_correction_and_rejection_mask) on correction_inputs() per
    config: weights, mask and metrics, written to `path` with the inputs."""
    old, rollout, mask = correction_inputs()
    cases = []
    for cfg in configs:
        kw = {"rollout_is": None, "rollout_rs": None, "rollout_rs_threshold": None, **cfg}
        weights, new_mask, metrics = fn(old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, **kw)
        cases.append({
            "config": cfg,
            "weights": None if weights is None else weights.batch["rollout_is_weights"].tolist(),
            "mask": new_mask.tolist(),
            "metrics": {k: float(v) for k, v in metrics.items()},
        })
    with open(path, "w") as f:
        json.dump({"old": old.tolist(), "rollout": rollout.tolist(), "mask": mask.tolist(), "cases": cases}, f)


def rollout_corr(out):
    correction_cases(correction_functions()["compute_rollout_correction_and_rejection_mask"], [
        {"rollout_is": "token", "rollout_is_threshold": 2.0},
        {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True},
        {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True},
        {"rollout_rs": "token", "rollout_rs_threshold": 2.0},
        {"rollout_rs": "sequence", "rollout_rs_threshold": 2.5, "rollout_rs_threshold_lower": 0.2},
        {"rollout_rs": "geometric", "rollout_rs_threshold": 1.3},
        {"rollout_token_veto_threshold": 0.01},
        {"rollout_is": "token", "rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_token_veto_threshold": 0.05},
    ], os.path.join(out, "rollout_corr.json"))


def bypass(out):
    import types

    typing = __import__("typing")
    helper = correction_functions()
    # The bypass loss imports the helper module inside the function: serve it from here.
    mod = types.ModuleType("verl.trainer.ppo.rollout_corr_helper")
    mod.compute_rollout_correction_and_rejection_mask = helper["compute_rollout_correction_and_rejection_mask"]
    sys.modules["verl.trainer.ppo.rollout_corr_helper"] = mod
    verl_F = helper["verl_F"]

    class AlgoConfig:
        pass

    ns = {"torch": torch, "Optional": typing.Optional, "Any": typing.Any, "verl_F": verl_F,
          "AlgoConfig": AlgoConfig, "register_policy_loss": lambda name: (lambda f: f)}
    for name in ["agg_loss", "compute_policy_loss_vanilla", "compute_policy_loss_reinforce"]:
        verl_function("trainer/ppo/core_algos.py", name, ns)
    fn = verl_function("trainer/ppo/core_algos.py", "compute_policy_loss_bypass_mode", ns)

    gen = torch.Generator().manual_seed(9)
    rows, width = 6, 5
    rollout = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 2
    current = rollout + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i in range(rows):
        mask[i, 2 + (i % 3):] = 0
    cases = []
    for loss_type, corr in [
        ("ppo_clip", {}),
        ("ppo_clip", {"rollout_rs": "token", "rollout_rs_threshold": 1.5}),
        ("reinforce", {"rollout_is": "token", "rollout_is_threshold": 1.5}),
        ("reinforce", {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "geometric", "rollout_rs_threshold": 1.4}),
    ]:
        rc = {"loss_type": loss_type, **corr}

        class Config(dict):
            pass

        cfg = Config(clip_ratio_c=3.0)
        cfg.clip_ratio, cfg.clip_ratio_low, cfg.clip_ratio_high = 0.2, 0.2, 0.28
        cfg.policy_loss = {"rollout_correction": rc}
        cfg.global_batch_info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": rows}
        lp = current.clone().requires_grad_(True)
        loss, metrics = fn(old_log_prob=rollout, log_prob=lp, advantages=adv, response_mask=mask,
                           loss_agg_mode="token-mean", config=cfg)
        loss.backward()
        cases.append({"loss_type": loss_type, "correction": corr, "loss": loss.item(),
                      "grad": lp.grad.tolist(), "metrics": {k: float(v) for k, v in metrics.items()}})
    with open(os.path.join(out, "bypass.json"), "w") as f:
        json.dump({"rollout": rollout.tolist(), "log_prob": current.tolist(), "advantages": adv.tolist(),
                   "mask": mask.tolist(), "cases": cases}, f)


def policy_losses_0_9(out):
    import types

    root = newer_verl()
    ns = core_algos_namespace(root)
    verl_function("trainer/ppo/core_algos.py", "agg_loss", ns, root)
    fns = {mode: verl_function("trainer/ppo/core_algos.py", f"compute_policy_loss_{mode}", ns, root)
           for mode in ["dppo_tv", "dppo_kl", "dro"]}

    gen = torch.Generator().manual_seed(21)
    rows, width = 6, 8
    # Probabilities spread over (0, 1) so the trust regions cut on both sides.
    old = torch.log(torch.rand(rows, width, generator=gen, dtype=torch.float64) * 0.9 + 0.05)
    lp = old + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.6
    lp = lp.clamp(max=-1e-3)
    lp[2, :2] = old[2, :2] + 1.5  # ratios above clip_ratio_c
    adv = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    adv[4, 3] = 0.0
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i, n in enumerate([8, 6, 3, 0, 7, 5]):
        mask[i, n:] = 0
    weights = torch.rand(rows, width, generator=gen, dtype=torch.float64) + 0.5
    glob = {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 10, "loss_scale_factor": 12}
    settings = {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.15, "clip_ratio_c": 2.5,
                "dro_beta": 0.4}

    class Config(dict):
        pass

    cases = []
    for mode, fn in fns.items():
        for agg_mode in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                         "token-sum"]:
            for scope, info in [("local", {}), ("global", glob)]:
                for weighted in [False, True]:
                    cfg = Config(clip_ratio_c=settings["clip_ratio_c"])
                    cfg.clip_ratio = settings["clip_ratio"]
                    cfg.clip_ratio_low = settings["clip_ratio_low"]
                    cfg.clip_ratio_high = settings["clip_ratio_high"]
                    cfg.policy_loss = types.SimpleNamespace(dro_beta=settings["dro_beta"])
                    cfg.global_batch_info = info
                    x = lp.clone().requires_grad_(True)
                    loss, metrics = fn(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask,
                                       loss_agg_mode=agg_mode, config=cfg,
                                       rollout_is_weights=weights if weighted else None)
                    loss.backward()
                    cases.append({"mode": mode, "agg": agg_mode, "global": scope == "global",
                                  "weighted": weighted, "loss": loss.item(), "grad": x.grad.tolist(),
                                  "metrics": {k: float(v) for k, v in metrics.items()}})
    with open(os.path.join(out, "policy_losses_0_9.json"), "w") as f:
        json.dump({"old_log_prob": old.tolist(), "log_prob": lp.tolist(), "advantages": adv.tolist(),
                   "mask": mask.tolist(), "weights": weights.tolist(), "global": glob,
                   "settings": settings, "cases": cases}, f)


def estimators_0_9(out):
    import collections
    import types

    root = newer_verl()
    ns = {"torch": torch, "np": np, "defaultdict": collections.defaultdict}
    otb = verl_function("trainer/ppo/core_algos.py", "compute_optimal_token_baseline_advantage", ns, root)
    tir = verl_function("trainer/ppo/core_algos.py", "compute_multi_turn_optimal_token_baseline_advantage", ns,
                        root)
    vf = masked_fns(root)
    mns = {"torch": torch, "verl_F": types.SimpleNamespace(**vf), "DataProto": object}
    proxy = verl_function("trainer/ppo/metric_utils.py", "compute_variance_proxy_metrics", mns, root)

    gen = torch.Generator().manual_seed(9)
    rows, width = 11, 7
    # Groups: 0 (four rows, one strictly longest), 1 (three, two tied longest), 2 (one row),
    # 3 (three, one of them empty).
    index = [0, 0, 1, 0, 1, 2, 1, 3, 3, 0, 3]
    lengths = [5, 3, 6, 7, 6, 4, 2, 0, 5, 2, 3]
    mask = torch.zeros(rows, width, dtype=torch.float32)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    # Holes (tool turns) for the multi-turn form.
    holed = mask.clone()
    holed[0, 1] = 0
    holed[3, 2:4] = 0
    holed[8, 0] = 0
    rewards = torch.zeros(rows, width, dtype=torch.float32)
    for i, n in enumerate(lengths):
        if n:
            rewards[i, n - 1] = float(torch.randint(0, 3, (1,), generator=gen)) - 0.5
    rewards[2, 1] = 0.25  # a token-level reward inside a response
    vocab = 5
    logits = torch.randn(rows, width, vocab, generator=gen)
    probs = logits.softmax(-1)
    tokens = torch.randint(0, vocab, (rows, width), generator=gen)
    old = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log()
    sq = (probs ** 2).sum(-1)
    is_w = torch.rand(rows, width, generator=gen) + 0.5
    uid = np.array([f"u{g}" for g in index], dtype=object)

    class Batch:
        def __init__(self, batch):
            self.batch = batch

    cases = []
    for form, fn in [("single", otb), ("multi", tir)]:
        m = mask if form == "single" else holed
        for weighted in [False, True]:
            adv, ret = fn(token_level_rewards=rewards, response_mask=m, index=uid, old_log_probs=old,
                          sum_pi_squared=sq, rollout_is_weights=is_w if weighted else None)
            b = {"sum_pi_squared": sq, "old_log_probs": old, "advantages": adv, "response_mask": m}
            if weighted:
                b["rollout_is_weights"] = is_w
            metrics = proxy(Batch(b), gradient_norm=0.75)
            cases.append({"form": form, "weighted": weighted, "advantages": adv.tolist(),
                          "returns": ret.tolist(), "metrics": {k: float(v) for k, v in metrics.items()}})
    # GDPO: two reward components placed at each response's last token by verl's function
    # itself (from the attention mask), with and without weights; and its fallback on the
    # token-level rewards when no components are given.
    verl_function("trainer/ppo/core_algos.py", "compute_grpo_outcome_advantage", ns, root)
    wf = {"torch": torch}
    for name in ["masked_sum", "masked_mean", "masked_var", "masked_whiten"]:
        verl_function("utils/torch_functional.py", name, wf, root)
    ns["verl_F"] = types.SimpleNamespace(**wf)
    ns["Optional"] = __import__("typing").Optional
    ns["AlgoConfig"] = object
    gdpo = verl_function("trainer/ppo/core_algos.py", "compute_gdpo_outcome_advantage", ns, root)
    prompt = 3
    attention = torch.cat([torch.ones(rows, prompt), mask], dim=1).long()
    comps = {"format_reward": [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0],
             "accuracy_reward": [round(float(torch.rand(1, generator=gen)), 3) for _ in range(rows)]}
    gdpo_cases = []
    for weights in [None, [0.3, 1.5]]:
        cfg = {"gdpo_reward_keys": list(comps), "gdpo_reward_weights": weights}
        adv, ret = gdpo(token_level_rewards=rewards, response_mask=mask, index=uid, config=cfg,
                        non_tensor_batch={k: np.array(v) for k, v in comps.items()},
                        batch={"prompts": torch.zeros(rows, prompt), "attention_mask": attention})
        gdpo_cases.append({"weights": weights, "advantages": adv.tolist(), "returns": ret.tolist()})
    adv, _ = gdpo(token_level_rewards=rewards, response_mask=mask, index=uid)
    gdpo_cases.append({"weights": None, "fallback": True, "advantages": adv.tolist()})
    with open(os.path.join(out, "estimators_0_9.json"), "w") as f:
        json.dump({"gdpo_components": comps, "gdpo_cases": gdpo_cases, "index": index, "mask": mask.tolist(), "holed_mask": holed.tolist(),
                   "rewards": rewards.tolist(), "old_log_probs": old.tolist(), "sum_pi_squared": sq.tolist(),
                   "rollout_is_weights": is_w.tolist(), "grad_norm": 0.75, "cases": cases}, f)


class Metric:
    """verl's utils.metric.Metric, its value as a float."""

    def __init__(self, aggregation, value):
        self.value = float(value)


class Config(dict):
    """A dataclass config stand-in: fields read as attributes."""

    def __getattr__(self, k):
        return self[k]


def distillation_namespace(root):
    """The module namespace of trainer/distillation/losses.py (of the tree at root) with
    verl's own agg_loss, kl_penalty and vanilla PPO loss; get_distillation_loss_fn is set by
    the caller to the loss mode's function."""
    import enum

    typing = __import__("typing")
    core = core_algos_namespace(root)
    for name in ["agg_loss", "kl_penalty_forward", "kl_penalty", "compute_policy_loss_vanilla"]:
        verl_function("trainer/ppo/core_algos.py", name, core, root)

    class AggregationType(enum.Enum):
        MEAN = "mean"
        SUM = "sum"
        MIN = "min"
        MAX = "max"

    ns = {"torch": torch, "Any": typing.Any, "Metric": Metric, "AggregationType": AggregationType,
          "kl_penalty": core["kl_penalty"], "agg_loss": core["agg_loss"],
          "no_padding_2_padding": lambda x, data: x,
          "get_policy_loss_fn": lambda mode: core["compute_policy_loss_vanilla"]}
    verl_function("trainer/distillation/losses.py", "compute_distillation_loss_range", ns, root)
    verl_function("trainer/distillation/losses.py", "distillation_loss", ns, root)
    return ns


def metric_values(metrics):
    return {k: (v.value if isinstance(v, Metric) else float(v)) for k, v in metrics.items()}


def distillation_0_9(out):
    """verl 0.9.1's on-policy distillation term (trainer/distillation/losses.py's
    distillation_loss with the single-sample estimators, run from the unpacked tree with
    verl's own kl_penalty, agg_loss and compute_policy_loss_vanilla): loss, gradient with
    respect to the student's log-probs, and metrics, per estimator, supervised and as a
    policy gradient, with and without the max clamp, for several aggregations."""
    import types

    root = newer_verl()
    ns = distillation_namespace(root)
    estimator = verl_function("trainer/distillation/losses.py",
                              "compute_distillation_loss_reverse_kl_estimator", ns, root)
    ns["get_distillation_loss_fn"] = lambda mode: estimator
    loss_fn = ns["distillation_loss"]

    gen = torch.Generator().manual_seed(33)
    rows, width = 5, 7
    old = torch.log(torch.rand(rows, width, generator=gen, dtype=torch.float64) * 0.9 + 0.05)
    student = (old + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.3).clamp(max=-1e-3)
    teacher = (old + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 2.0).clamp(max=-1e-3)
    teacher[1, 2] = student[1, 2] - 30.0  # beyond k3's clamps and a loss_max_clamp of 10
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i, n in enumerate([7, 5, 2, 7, 4]):
        mask[i, n:] = 0
    glob = {"dp_size": 2, "batch_num_tokens": 30, "global_batch_size": 8}
    cases = []
    for mode in ["k1", "abs", "k2", "k3"]:
        for use_pg in [False, True]:
            if mode == "k1" and not use_pg:
                continue  # verl rejects the supervised k1
            for clamp in [None, 10.0]:
                for agg_mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]:
                    loss_cfg = Config(loss_mode=mode, loss_max_clamp=clamp, use_policy_gradient=use_pg,
                                      policy_loss_mode="vanilla", clip_ratio=0.2, clip_ratio_low=0.15,
                                      clip_ratio_high=0.25, global_batch_info={})
                    actor_cfg = types.SimpleNamespace(loss_agg_mode=agg_mode, global_batch_info={},
                                                      loss_scale_factor=None)
                    dist_cfg = types.SimpleNamespace(distillation_loss=loss_cfg)
                    x = student.clone().requires_grad_(True)
                    data = {"response_mask": mask, "teacher_logprobs": teacher.unsqueeze(-1),
                            "old_log_probs": old, **glob}
                    loss, metrics = loss_fn(actor_cfg, dist_cfg, {"log_probs": x}, data)
                    loss.backward()
                    cases.append({"mode": mode, "pg": use_pg, "clamp": clamp, "agg": agg_mode,
                                  "loss": loss.item(), "grad": x.grad.tolist(),
                                  "metrics": metric_values(metrics)})
    with open(os.path.join(out, "distillation_0_9.json"), "w") as f:
        json.dump({"old_log_prob": old.tolist(), "log_prob": student.tolist(), "teacher_log_prob": teacher.tolist(),
                   "mask": mask.tolist(), "global": glob, "cases": cases}, f)


def distillation_topk_0_9(out):
    """verl 0.9.1's top-k forward KL (loss_mode forward_kl_topk): the FSDP logits processor
    (trainer/distillation/fsdp/losses.py's compute_forward_kl_topk and kl_divergence) on seeded
    student logits against a teacher's top-k (torch.topk of its log-softmax: how its vLLM
    server ranks prompt log-probs), then losses.py's compute_forward_kl_topk and
    distillation_loss: loss, gradient with respect to the student's logits, metrics;
    supervised and as a policy gradient, with and without the log-prob and loss clamps."""
    import types

    root = newer_verl()
    ns = distillation_namespace(root)
    topk_fn = verl_function("trainer/distillation/losses.py", "compute_forward_kl_topk", ns, root)
    ns["get_distillation_loss_fn"] = lambda mode: topk_fn
    loss_fn = ns["distillation_loss"]
    fsdp = {"torch": torch, "F": torch.nn.functional,
            "get_ulysses_sequence_parallel_world_size": lambda: 1, "slice_input_tensor": None}
    verl_function("trainer/distillation/fsdp/losses.py", "kl_divergence", fsdp, root)
    processor = verl_function("trainer/distillation/fsdp/losses.py", "compute_forward_kl_topk", fsdp, root)

    gen = torch.Generator().manual_seed(41)
    rows, width, vocab, k = 4, 6, 23, 5
    student = torch.randn(rows, width, vocab, generator=gen, dtype=torch.float64) * 2.0
    teacher_logits = torch.randn(rows, width, vocab, generator=gen, dtype=torch.float64) * 3.0
    teacher_lps, teacher_ids = torch.log_softmax(teacher_logits, -1).topk(k, dim=-1)
    labels = torch.randint(vocab, (rows, width), generator=gen)
    old = torch.log_softmax(student + torch.randn(rows, width, vocab, generator=gen,
                                                  dtype=torch.float64) * 0.2, -1)
    old = old.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i, n in enumerate([6, 4, 1, 5]):
        mask[i, n:] = 0
    offsets = torch.arange(0, rows * width + 1, width)

    def nested(x):
        return torch.nested.nested_tensor_from_jagged(x.reshape(rows * width, k), offsets)

    glob = {"dp_size": 2, "batch_num_tokens": 24, "global_batch_size": 6}
    cases = []
    for use_pg in [False, True]:
        for lp_clamp in [None, -3.0]:
            for agg_mode in ["token-mean", "seq-mean-token-sum"]:
                max_clamp = 1.5 if lp_clamp is None else None
                loss_cfg = Config(loss_mode="forward_kl_topk", topk=k, loss_max_clamp=max_clamp,
                                  log_prob_min_clamp=lp_clamp, use_chunked_topk=False,
                                  use_policy_gradient=use_pg, policy_loss_mode="vanilla",
                                  clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.25,
                                  global_batch_info={})
                actor_cfg = types.SimpleNamespace(loss_agg_mode=agg_mode, global_batch_info={},
                                                  loss_scale_factor=None)
                dist_cfg = types.SimpleNamespace(distillation_loss=loss_cfg)
                x = student.clone().requires_grad_(True)
                outputs = processor(student_logits=x.reshape(1, rows * width, vocab),
                                    teacher_topk_log_probs=nested(teacher_lps),
                                    teacher_topk_ids=nested(teacher_ids), config=dist_cfg,
                                    data_format="thd")
                model_output = {name: v.reshape(rows, width) for name, v in outputs.items()}
                model_output["log_probs"] = torch.log_softmax(x, -1).gather(
                    -1, labels.unsqueeze(-1)).squeeze(-1)
                data = {"response_mask": mask, "old_log_probs": old, **glob}
                loss, metrics = loss_fn(actor_cfg, dist_cfg, model_output, data)
                loss.backward()
                cases.append({"pg": use_pg, "log_prob_min_clamp": lp_clamp, "loss_max_clamp": max_clamp,
                              "agg": agg_mode, "loss": loss.item(), "grad": x.grad.tolist(),
                              "metrics": metric_values(metrics)})
    with open(os.path.join(out, "distillation_topk_0_9.json"), "w") as f:
        json.dump({"student_logits": student.tolist(), "teacher_ids": teacher_ids.tolist(),
                   "teacher_log_probs": teacher_lps.tolist(), "labels": labels.tolist(),
                   "old_log_prob": old.tolist(), "mask": mask.tolist(), "global": glob,
                   "topk": k, "cases": cases}, f)


def correction_namespace_0_9():
    """trainer/ppo/rollout_corr_helper.py of verl 0.9.1's tree: its constants, threshold
    parsers, importance-weight and rejection functions and the combined entry point, with
    that tree's masked helpers (the off-policy diagnostics left out: verlc does not log them)."""
    import math
    import types

    typing = __import__("typing")
    root = newer_verl()
    vf = masked_fns(root)
    path = os.path.join(root, "trainer/ppo/rollout_corr_helper.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    consts = {}
    wanted = ("SUPPORTED_ROLLOUT_RS_OPTIONS", "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS", "SAFETY_BOUND")
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id in wanted for t in targets):
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), {"torch": torch}, consts)
    proto = types.SimpleNamespace(from_dict=lambda tensors: types.SimpleNamespace(batch=tensors))
    ns = {"torch": torch, "math": math, "Optional": typing.Optional, "Any": typing.Any,
          "verl_F": types.SimpleNamespace(**vf), "DataProto": proto,
          "compute_offpolicy_metrics": lambda **kw: {}, **consts}
    for name in ["_parse_rollout_rs_thresholds", "compute_rs_metrics", "compute_rollout_rejection_mask",
                 "_parse_rollout_is_threshold", "compute_is_metrics", "compute_rollout_correction_weights",
                 "compute_rollout_correction_and_rejection_mask"]:
        verl_function("trainer/ppo/rollout_corr_helper.py", name, ns, root)
    return ns


def rollout_corr_0_9(out):
    """verl 0.9.1's rollout correction (compute_rollout_correction_and_rejection_mask, run from
    the unpacked tree) on the 0.7 oracle's seeded log-probs: truncated (number and numeric
    string) and IcePop importance weights per token and per sequence, batch-normalised or not,
    with a 0.9 rejection option beside them: weights, mask and every metric."""
    correction_cases(correction_namespace_0_9()["compute_rollout_correction_and_rejection_mask"], [
        {"rollout_is": "token", "rollout_is_threshold": 2.0},
        {"rollout_is": "token", "rollout_is_threshold": "1.5"},
        {"rollout_is": "token", "rollout_is_threshold": "0.8_1.25"},
        {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0", "rollout_is_batch_normalize": True},
        {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True},
        {"rollout_is": "sequence", "rollout_is_threshold": "0.6_1.8"},
        {"rollout_is": "token", "rollout_is_threshold": "0.5_4.0", "rollout_rs": "token_k1",
         "rollout_rs_threshold": "0.3_3.0"},
    ], os.path.join(out, "rollout_corr_0_9.json"))


def rejection_0_9(out):
    """verl 0.9.1's rejection sampling (trainer/ppo/rollout_corr_helper.py's
    compute_rollout_rejection_mask with its threshold parser and compute_rs_metrics, run from
    the unpacked tree) on seeded log-ratios with outliers and a row without valid tokens: for
    each option list, the parsed bounds, the new mask and every metric."""
    import math
    import types

    ns = correction_namespace_0_9()
    parse = ns["_parse_rollout_rs_thresholds"]
    reject = ns["compute_rollout_rejection_mask"]

    gen = torch.Generator().manual_seed(17)
    rows, width = 6, 9
    log_ratio = torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.4
    log_ratio[1, 3] = 3.0
    log_ratio[2, 0] = -25.0  # beyond the safety bound
    log_ratio[4, :] *= 0.05
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i, n in enumerate([9, 7, 5, 0, 9, 3]):
        mask[i, n:] = 0
    cases = []
    for options, threshold in [
        ("token_k1", "0.6_1.6"), ("token_k1", 1.5), ("token_k2", "0.5"), ("token_k3", 0.3),
        ("seq_sum_k1", 2.0), ("seq_sum_k2", "1.0"), ("seq_sum_k3", 1.5), ("seq_mean_k1", "0.8_1.1"),
        ("seq_mean_k2", 0.2), ("seq_mean_k3", 0.01), ("seq_max_k2", "2.5"), ("seq_max_k3", 1.0),
        ("token_k1,seq_max_k2", "0.6_1.6,2.5"), (" seq_mean_k1, token_k3 ,seq_mean_k1", "0.5_2.0, 0.3"),
    ]:
        names = []
        for o in [p.strip() for p in options.split(",") if p.strip()]:
            if o not in names:
                names.append(o)
        bounds = parse(names, threshold)
        new_mask, metrics = reject(log_ratio, mask, rollout_rs=options, rollout_rs_threshold=threshold)
        cases.append({"options": names, "bounds": [[bounds[n]["lower"], bounds[n]["upper"]] for n in names],
                      "mask": new_mask.tolist(), "metrics": {k: float(v) for k, v in metrics.items()}})
    with open(os.path.join(out, "rejection_0_9.json"), "w") as f:
        json.dump({"log_ratio": log_ratio.tolist(), "mask": mask.tolist(), "cases": cases}, f)


def groupwise_namespace(root):
    """verl's group statistics (utils/groupwise.py of the tree at root): as_torch_index and
    group_mean_std with what they reach, on the CPU."""
    typing = __import__("typing")
    ns = {"torch": torch, "np": np, "os": os, "Any": typing.Any, "Optional": typing.Optional,
          "get_device_name": lambda: "cpu", "get_torch_device": lambda: torch.device("cpu")}
    path = os.path.join(root, "utils/groupwise.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    flags = __import__("__future__").annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec", flags=flags, dont_inherit=True), ns)
    return ns


def release_semantics(out):
    import types

    gen = torch.Generator().manual_seed(31)
    rows, width = 6, 5
    loss_mat = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    # Holes inside responses, a row without valid tokens, full rows.
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1],
                         [0, 1, 1, 0, 1], [1, 1, 1, 0, 0]], dtype=torch.float64)
    rewards = torch.zeros(rows, width, dtype=torch.float64)
    rewards[0, 3], rewards[1, 0], rewards[3, 4], rewards[4, 4], rewards[5, 2] = 1.0, 2.0, 1.0, -1.0, 0.5
    rewards[4, 0] = 0.25  # a reward on a masked position
    old = torch.log(torch.rand(rows, width, generator=gen, dtype=torch.float64) * 0.9 + 0.05)
    lp = old + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    # Groups: two pairs of near-equal scores, a group of three, a singleton.
    scores = torch.tensor([1.0, 1.001, 0.5, 0.5 + 1e-4, 2.0, -1.0, 0.3, 7.0], dtype=torch.float32)
    index = np.array(["a", "a", "b", "b", "c", "c", "c", "d"], dtype=object)
    glob = {"dp_size": 2, "global_batch_size": 10, "batch_num_tokens": 30, "loss_scale_factor": 4}

    class Config(dict):
        pass

    result = {}
    for label, root in [("0.7.0", installed_verl()), ("0.9.1", newer_verl())]:
        ns = core_algos_namespace(root)
        ns["np"] = np
        ns["ActorConfig"] = Config
        vf = masked_fns(root)
        for name in ["masked_var", "masked_whiten"]:
            verl_function("utils/torch_functional.py", name, vf, root)
        ns["verl_F"] = types.SimpleNamespace(**vf)
        g = groupwise_namespace(root)
        ns["as_torch_index"], ns["group_mean_std"] = g["as_torch_index"], g["group_mean_std"]
        agg = verl_function("trainer/ppo/core_algos.py", "agg_loss", ns, root)
        gspo = verl_function("trainer/ppo/core_algos.py", "compute_policy_loss_gspo", ns, root)
        rpp = verl_function("trainer/ppo/core_algos.py", "compute_reinforce_plus_plus_outcome_advantage", ns, root)
        grpo_v = verl_function("trainer/ppo/core_algos.py", "compute_grpo_vectorized_outcome_advantage", ns, root)
        params = set(__import__("inspect").signature(agg).parameters)
        norm = {}
        for scope, info in [("local", {}), ("global", glob)]:
            kwargs = {}
            if "global_batch_info" in params:
                kwargs["global_batch_info"] = info
            elif info:
                kwargs.update({k: v for k, v in info.items() if k in params})
            if "loss_scale_factor" in params:
                kwargs.setdefault("loss_scale_factor", info.get("loss_scale_factor"))
            try:
                norm[scope] = agg(loss_mat, mask, "seq-mean-token-sum-norm", **kwargs).item()
            except Exception as e:  # noqa: BLE001 (a release that refuses the call)
                norm[scope] = f"{type(e).__name__}: {e}"
        gspo_cases = {}
        for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]:
            cfg = Config()
            cfg.clip_ratio, cfg.clip_ratio_low, cfg.clip_ratio_high = 0.2, 0.2, 0.2
            cfg.global_batch_info = {}
            cfg.loss_scale_factor = None
            x = lp.clone().requires_grad_(True)
            loss, _ = gspo(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask,
                           loss_agg_mode=mode, config=cfg)
            loss.backward()
            gspo_cases[mode] = {"loss": loss.item(), "grad": x.grad.tolist()}
        rpp_cfg = types.SimpleNamespace(gamma=1.0)
        rpp_cfg.get = lambda k, d=None: getattr(rpp_cfg, k, d)
        a, r = rpp(token_level_rewards=rewards, response_mask=mask, config=rpp_cfg)
        token_scores = torch.zeros(len(scores), 2, dtype=torch.float32)
        token_scores[:, 1] = scores
        v_adv, _ = grpo_v(token_level_rewards=token_scores, response_mask=torch.ones(len(scores), 2),
                          index=index, epsilon=1e-6, norm_adv_by_std_in_grpo=True)
        result[label] = {"seq_sum_norm": norm, "gspo": gspo_cases,
                         "rpp_advantages": a.tolist(), "rpp_returns": r.tolist(),
                         "grpo_vectorized": v_adv[:, 1].tolist()}
    with open(os.path.join(out, "release_semantics.json"), "w") as f:
        json.dump({"loss_mat": loss_mat.tolist(), "mask": mask.tolist(), "rewards": rewards.tolist(),
                   "old_log_prob": old.tolist(), "log_prob": lp.tolist(), "advantages": adv.tolist(),
                   "scores": scores.tolist(), "groups": [ord(c) - ord("a") for c in index],
                   "global": glob, "releases": result}, f)


def sft_loss_0_9(out):
    """verl 0.9.1's sft_loss (workers/utils/losses.py, no_padding) on packed batches of jagged
    nested tensors: loss and gradient with respect to the flat log-probs, for several data-parallel
    sizes and global token counts (a micro-batch's share of a larger step)."""
    import types

    root = newer_verl()

    class PadMode:
        NO_PADDING = "no_padding"

    tu = types.SimpleNamespace(get_non_tensor_data=lambda data, key, default: data.get(key, default))
    ns = {"torch": torch, "tu": tu, "DatasetPadMode": PadMode, "masked_sum": masked_fns(root)["masked_sum"]}
    fn = verl_function("workers/utils/losses.py", "sft_loss", ns, root)
    gen = torch.Generator().manual_seed(17)
    cases = []
    for lengths, dp, extra in [([5, 3, 7], 1, 0), ([5, 3, 7], 2, 9), ([4], 4, 3), ([2, 6, 1, 5], 2, 0)]:
        total = sum(lengths)
        log_probs = -torch.rand(total, generator=gen, dtype=torch.float64) * 3
        # Masks in runs, like assistant turns; a sample's first token never trains.
        mask = (torch.rand(total, generator=gen) > 0.4).to(torch.int64)
        offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int64)
        for o in offsets[:-1]:
            mask[o] = 0
        batch_num_tokens = int(mask.sum()) + extra
        flat = log_probs.clone().requires_grad_(True)
        nested_lp = torch.nested.nested_tensor_from_jagged(flat, offsets)
        nested_mask = torch.nested.nested_tensor_from_jagged(mask, offsets)
        data = {"dp_size": dp, "batch_num_tokens": batch_num_tokens, "loss_mask": nested_mask, "pad_mode": "no_padding"}
        loss, _ = fn(None, {"log_probs": nested_lp}, data)
        loss.backward()
        cases.append({"lengths": lengths, "dp_size": dp, "batch_num_tokens": batch_num_tokens,
                      "log_probs": log_probs.tolist(), "loss_mask": mask.tolist(),
                      "loss": float(loss.detach()), "grad": flat.grad.tolist()})
    with open(os.path.join(out, "sft_loss_0_9.json"), "w") as f:
        json.dump(cases, f)


def sft_loss_legacy(out):
    """verl 0.7.0's legacy SFT trainer's loss (FSDPSFTTrainer._compute_loss_and_backward of
    trainer/fsdp_sft_trainer.py, the padded path without sequence parallelism) on fixed logits:
    for right-padded micro-batches and several micro-batch counts, the loss it returns and its
    gradient with respect to the logits. The method runs as verl wrote it, on a stand-in `self`
    whose model returns the given logits."""
    import types
    from contextlib import nullcontext

    from omegaconf import OmegaConf

    path = os.path.join(installed_verl(), "trainer/fsdp_sft_trainer.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FSDPSFTTrainer")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_compute_loss_and_backward")
    ns = {"torch": torch, "nn": torch.nn, "nullcontext": nullcontext}
    flags = __import__("__future__").annotations.compiler_flag
    exec(compile(ast.Module(body=[method], type_ignores=[]), path, "exec", flags=flags, dont_inherit=True), ns)
    fn = ns["_compute_loss_and_backward"]

    class Logits(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, **_):
            return types.SimpleNamespace(logits=self.logits)

    gen = torch.Generator().manual_seed(23)
    vocab = 11
    cases = []
    for rows, width, n_micro in [(2, 7, 1), (3, 6, 2), (1, 9, 4), (4, 5, 3)]:
        lengths = torch.randint(2, width + 1, (rows,), generator=gen)
        input_ids = torch.randint(0, vocab, (rows, width), generator=gen)
        attention = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.int64)
        loss_mask = ((torch.rand(rows, width, generator=gen) > 0.3).to(torch.int64)) * attention
        logits = torch.randn(rows, width, vocab, generator=gen, dtype=torch.float32).requires_grad_(True)
        me = types.SimpleNamespace(
            use_remove_padding=False,
            config=OmegaConf.create({"ulysses_sequence_parallel_size": 1, "data": {"balance_dp_token": False}}),
            device_name="cpu",
            sharding_manager=None,
            fsdp_model=Logits(logits),
            model=types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=vocab)),
        )
        batch = {"input_ids": input_ids, "attention_mask": attention,
                 "position_ids": torch.clip(attention.cumsum(-1) - 1, min=0), "loss_mask": loss_mask.clone()}
        loss = fn(me, batch, do_backward=True, n_micro_batches=n_micro)
        cases.append({"input_ids": input_ids.tolist(), "attention_mask": attention.tolist(),
                      "loss_mask": loss_mask.tolist(), "logits": logits.detach().tolist(),
                      "micro_batches": n_micro, "loss": float(loss.detach()), "grad": logits.grad.tolist()})
    with open(os.path.join(out, "sft_loss_legacy.json"), "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    sft_loss_legacy(sys.argv[1])
    release_semantics(sys.argv[1])
    pf_ppo(sys.argv[1])
    dynamic_bsz(sys.argv[1])
    rollout_corr(sys.argv[1])
    bypass(sys.argv[1])
    policy_losses_0_9(sys.argv[1])
    estimators_0_9(sys.argv[1])
    distillation_0_9(sys.argv[1])
    distillation_topk_0_9(sys.argv[1])
    rejection_0_9(sys.argv[1])
    rollout_corr_0_9(sys.argv[1])
    sft_loss_0_9(sys.argv[1])

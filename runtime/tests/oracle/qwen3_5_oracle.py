"""Qwen3.5 references from transformers 5.x's plain-torch path (no flash-linear-attention,
no causal-conv1d kernels): run with the transformers 5 packages on PYTHONPATH (scripts/setup
installs them under .venv/transformers5; the project venv keeps transformers 4.57).

  models OUT   a tiny random Qwen3_5ForCausalLM (two Gated DeltaNet and two gated attention
               layers, norms and DeltaNet parameters drawn away from their initial values) saved
               in OUT/qwen3_5, and a Qwen3_5MoeForCausalLM of the same layers with sparse MLPs
               (8 experts, top-2, a shared expert) in OUT/qwen3_5_moe, and a
               Qwen3NextForCausalLM of the same layers (its DeltaNet projections stored fused,
               layer 1 a dense MLP, top-k weights not renormalised) in OUT/qwen3_next; for
               each, logits of a
               left-padded batch longer than one 64-token chunk, every parameter's gradient of
               a log-prob loss and greedy generations (OUT/<name>_ref.safetensors,
               OUT/<name>_greedy.json); and the gated delta rule's chunked and recurrent forms
               on random inputs with an initial state (in qwen3_5_ref).
"""

import json
import os
import sys

import torch

# The batch and generation helpers of the transformers-4.57 oracle (same directory).
from model_oracle import greedy, padded_batch


def config(moe=False, next_=False):
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3NextConfig

    shared = dict(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=0,
        max_position_embeddings=512,
    )
    if next_:
        return Qwen3NextConfig(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            intermediate_size=96,
            mlp_only_layers=[1],
            norm_topk_prob=False,
            partial_rotary_factor=0.25,
            **shared,
        )
    if moe:
        return Qwen3_5MoeTextConfig(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            **shared,
        )
    return Qwen3_5TextConfig(intermediate_size=96, **shared)

def models(out):
    os.makedirs(out, exist_ok=True)
    for kind in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        one_model(out, kind)


def split_fused(name, g, cfg):
    """Qwen3-Next's fused DeltaNet projections (rows grouped by key head: q, k, the value
    heads' v and z; then b and a) as the separate ones verlc holds, by name."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, nv // nk
    h = g.shape[-1]
    if name.endswith("in_proj_qkvz.weight"):
        pre = name[: -len("in_proj_qkvz.weight")]
        q, k, v, z = torch.split(g.view(nk, 2 * dk + 2 * r * dv, h), [dk, dk, r * dv, r * dv], 1)
        qkv = torch.cat([q.reshape(-1, h), k.reshape(-1, h), v.reshape(-1, h)])
        return {pre + "in_proj_qkv.weight": qkv, pre + "in_proj_z.weight": z.reshape(-1, h)}
    if name.endswith("in_proj_ba.weight"):
        pre = name[: -len("in_proj_ba.weight")]
        b, a = torch.split(g.view(nk, 2 * r, h), [r, r], 1)
        return {pre + "in_proj_b.weight": b.reshape(-1, h), pre + "in_proj_a.weight": a.reshape(-1, h)}
    return {name: g}


def one_model(out, kind):
    from safetensors.torch import save_file
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mm
    from transformers.models.qwen3_next import modeling_qwen3_next as mn

    torch.manual_seed(0)
    if kind == "qwen3_next":
        model = mn.Qwen3NextForCausalLM(config(next_=True)).to(torch.float32).eval()
    elif kind == "qwen3_5_moe":
        model = mm.Qwen3_5MoeForCausalLM(config(moe=True)).to(torch.float32).eval()
    else:
        model = m.Qwen3_5ForCausalLM(config()).to(torch.float32).eval()
    # Move the parameters that start at an identity (zero-centred norms, the gated norm,
    # dt_bias) so that a wrong formula cannot hide behind a zero or a one.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("dt_bias"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 0.3)
    path = os.path.join(out, kind)
    model.save_pretrained(path, safe_serialization=True)

    gen = torch.Generator().manual_seed(1)
    ids, mask, pos = padded_batch(gen, [70, 41, 9], 70)
    nopad = torch.randint(3, 128, (2, 12), generator=gen)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        nopad_logits = model(input_ids=nopad).logits
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": pos,
        "logits": logits.contiguous(),
        "nopad_input_ids": nopad,
        "nopad_logits": nopad_logits.contiguous(),
    }

    # Gradients of the mean next-token log-prob over real positions.
    model.train()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    w = (mask[:, 1:] * mask[:, :-1]).float()
    loss = -(lp * w).sum() / w.sum()
    loss.backward()
    tensors["loss"] = loss.detach()
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        # transformers 5 holds experts fused ([E, 2I, H] gate and up, [E, H, I] down); the
        # checkpoint (and verlc) name them per expert.
        prefix, _, leaf = name.rpartition(".")
        if leaf == "gate_up_proj":
            inter = p.shape[1] // 2
            for e in range(p.shape[0]):
                tensors[f"grad.{prefix}.{e}.gate_proj.weight"] = p.grad[e, :inter].contiguous()
                tensors[f"grad.{prefix}.{e}.up_proj.weight"] = p.grad[e, inter:].contiguous()
        elif leaf == "down_proj" and prefix.endswith(".experts"):
            for e in range(p.shape[0]):
                tensors[f"grad.{prefix}.{e}.down_proj.weight"] = p.grad[e].contiguous()
        else:
            for held, g in split_fused(name, p.grad, model.config).items():
                tensors["grad." + held] = g.contiguous()
    model.eval()
    if kind == "qwen3_5":
        rule_tensors(gen, m, tensors)
    save_file(tensors, os.path.join(out, f"{kind}_ref.safetensors"))

    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (6, 3, 9, 1)]
    with torch.no_grad():
        outputs = greedy(model, prompts, 16, None, 0)
    with open(os.path.join(out, f"{kind}_greedy.json"), "w") as f:
        json.dump({"prompts": prompts, "max_new_tokens": 16, "pad": 0, "outputs": outputs}, f)


def rule_tensors(gen, m, tensors):
    # The two forms of the gated delta rule, from a non-zero state, over 100 tokens.
    b, t, h, dk, dv = 2, 100, 3, 16, 8
    q, k = torch.randn(b, t, h, dk, generator=gen), torch.randn(b, t, h, dk, generator=gen)
    v = torch.randn(b, t, h, dv, generator=gen)
    g = -torch.rand(b, t, h, generator=gen) * 0.5
    beta = torch.rand(b, t, h, generator=gen)
    s0 = torch.randn(b, h, dk, dv, generator=gen) * 0.1
    chunk, chunk_state = m.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    rec, rec_state = m.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    tensors.update(
        {
            "rule.q": q, "rule.k": k, "rule.v": v, "rule.g": g, "rule.beta": beta, "rule.s0": s0,
            "rule.chunk": chunk.contiguous(), "rule.chunk_state": chunk_state.contiguous(),
            "rule.recurrent": rec.contiguous(), "rule.recurrent_state": rec_state.contiguous(),
        }
    )


if __name__ == "__main__":
    if sys.argv[1] == "models":
        models(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")

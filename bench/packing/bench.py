"""What packing (`use_remove_padding`) saves on a batch of mixed lengths.

A Qwen2.5-0.5B-shaped model with 2 layers (hidden 896, 14 heads, 2 KV heads, ffn 4864, vocab
151936, tied embeddings) and 16 rows whose prompts (16-96 tokens, left-padded to 96) and
responses (8-128 tokens, right-padded to 128) vary as a GRPO batch's do. One actor update
(forward, backward, clip, AdamW; two micro-batches of 8 rows), timed three ways on the same
weights and batch:

- ours, packed: runtime's single engine with `remove_padding` (only valid tokens go through
  the projections, MLPs and the head; attention per sequence);
- ours, padded: the same engine on the padded micro-batches;
- PyTorch eager with transformers (padded, sdpa attention).

The first step's loss and grad norm must agree across all three. Reported: the tokens each
layout runs through the decoder layers (the compute that scales with them), and the times.

Usage: bench.py OUR_BINARY. Environment: VERLC_BENCH_THREADS (2), VERLC_BENCH_STEPS (4 timed
steps after one warm-up).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "train_step"))
from bench import peer_steps  # noqa: E402  (the same update in PyTorch)

THREADS = int(os.environ.get("VERLC_BENCH_THREADS", "2"))
STEPS = int(os.environ.get("VERLC_BENCH_STEPS", "4"))
WARMUP = 1
torch.set_num_threads(THREADS)

CONFIG = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
              num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
              rope_theta=1000000.0, rms_norm_eps=1e-6)
ROWS, PROMPT, RESPONSE, MICRO = 16, 96, 128, 8


def mixed_batch(seed):
    g = torch.Generator().manual_seed(seed)
    t = PROMPT + RESPONSE
    ids = torch.randint(0, CONFIG["vocab_size"], (ROWS, t), generator=g)
    mask = torch.zeros(ROWS, t, dtype=torch.long)
    for i in range(ROWS):
        p = int(torch.randint(16, PROMPT + 1, (1,), generator=g))
        r = int(torch.randint(8, RESPONSE + 1, (1,), generator=g))
        mask[i, PROMPT - p:PROMPT + r] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0) * mask + (1 - mask)
    return {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "position_ids": pos,
        "responses": (ids * mask)[:, PROMPT:].contiguous(),
        "response_mask": mask[:, PROMPT:].float(),
        "advantages": torch.randn(ROWS, 1, generator=g).repeat(1, RESPONSE),
    }


def ours(binary, d, bfile, packed):
    res = subprocess.run([binary, d, bfile, str(MICRO), str(WARMUP + STEPS), str(THREADS), "1" if packed else "0"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{binary} failed: {res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(binary):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(tie_word_embeddings=True, **CONFIG),
                                             attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    batch = mixed_batch(1)
    valid = int(batch["attention_mask"].sum())
    padded_tokens = batch["attention_mask"].numel()
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        bfile = os.path.join(d, "batch.safetensors")
        save_file({k: v.contiguous() for k, v in batch.items()}, bfile)
        os.sync()
        packed = ours(binary, d, bfile, True)
        padded = ours(binary, d, bfile, False)
    peer_times, (peer_loss, peer_norm) = peer_steps(model, batch, MICRO, WARMUP + STEPS)
    for name, r in (("packed", packed), ("padded", padded)):
        for what, a, b in (("loss", r["loss"], peer_loss), ("grad norm", r["grad_norm"], peer_norm)):
            if not abs(a - b) <= 1e-4 * max(1.0, abs(b)):
                sys.exit(f"{name}: first-step {what} differs: ours {a}, transformers {b}")
    t_packed = statistics.median(packed["times"][WARMUP:])
    t_padded = statistics.median(padded["times"][WARMUP:])
    t_peer = statistics.median(peer_times[WARMUP:])
    print(f"packing: {valid} valid of {padded_tokens} padded tokens ({1 - valid / padded_tokens:.0%} padding); "
          f"threads={THREADS}: packed {t_packed * 1e3:.0f} ms, padded {t_padded * 1e3:.0f} ms, "
          f"PyTorch+transformers padded {t_peer * 1e3:.0f} ms", file=sys.stderr)
    results = [
        {"name": "packing/tokens-through-layers", "ours": valid, "peer": padded_tokens, "unit": "tokens",
         "speedup": round(padded_tokens / valid, 3)},
        {"name": "packing/update-vs-padded", "ours": round(t_packed * 1e3, 1), "peer": round(t_padded * 1e3, 1),
         "unit": "ms", "speedup": round(t_padded / t_packed, 3)},
        {"name": "packing/update-vs-transformers", "ours": round(t_packed * 1e3, 1), "peer": round(t_peer * 1e3, 1),
         "unit": "ms", "speedup": round(t_peer / t_packed, 3)},
    ]
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])

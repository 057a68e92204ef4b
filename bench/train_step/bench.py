"""One actor update (forward, backward, grad clip, AdamW) of runtime's single engine against
PyTorch eager with the transformers Qwen2 model of the same weights, batch, dtype (fp32) and
thread count, on two shapes:

- tiny: the quickstart's model (builtin://tiny?layers=2&hidden=128 dims) and one of its
  mini-batches (256 responses of 4 tokens after 32-token prompts, 2 micro-batches of 128);
- qwen0.5b-2l: Qwen2.5-0.5B's dims (hidden 896, 14 heads, 2 KV heads, ffn 4864, vocab 151936,
  tied embeddings) with 2 layers, 8 rows of 96 + 32 tokens, one micro-batch.

Our side runs as a verlc trainer does, keeping freed host memory in the process
(runtime::host_alloc); the peer is a default PyTorch process. The same glibc setting
(MALLOC_MMAP_MAX_=0 with a large MALLOC_TRIM_THRESHOLD_, or jemalloc) speeds PyTorch up about as much.

The loss is the policy-gradient surrogate -(A * log pi(response)), token-mean. Both sides
take the response log-probs from logits of the response positions only (transformers:
`logits_to_keep`). Our last decoder layer also computes its queries, attention output and MLP
for those positions only (keys and values for all; runtime's `Model::forward_window`), as every
verlc actor and critic update does; transformers runs the last layer over every position. On
the 2-layer models here that is most of the difference. The first step's loss and grad norm must agree (same weights, same batch),
so the two sides are known to do the same work.

Usage: bench.py OUR_BINARY. Prints one JSON result per shape on the last line (a list).
Environment: VERLC_BENCH_THREADS (2), VERLC_BENCH_STEPS (6 timed steps after one warm-up),
VERLC_BENCH_SHAPES (comma-separated names; all by default).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen2Config

THREADS = int(os.environ.get("VERLC_BENCH_THREADS", "2"))
STEPS = int(os.environ.get("VERLC_BENCH_STEPS", "6"))
WARMUP = 1
torch.set_num_threads(THREADS)

SHAPES = {
    # name: (config, rows, prompt, response, micro)
    "tiny": (dict(vocab_size=38, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-6), 256, 32, 4, 128),
    "qwen0.5b-2l": (dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6), 8, 96, 32, 8),
}


def peer_steps(model, batch, micro, steps):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
    rows, r = batch["responses"].shape
    tokens = batch["response_mask"].sum()
    times, first = [], None
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for s in range(0, rows, micro):
            mb = {k: v[s:s + micro] for k, v in batch.items()}
            out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                        position_ids=mb["position_ids"], logits_to_keep=r + 1, use_cache=False)
            logits = out.logits[:, :-1, :].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, mb["responses"].unsqueeze(-1)).squeeze(-1)
            loss = -(lp * mb["advantages"] * mb["response_mask"]).sum() / tokens
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        times.append(time.perf_counter() - t)
        if first is None:
            first = (total, norm.item())
    return times, first


def batch_of(vocab, rows, prompt, response, seed):
    g = torch.Generator().manual_seed(seed)
    t = prompt + response
    ids = torch.randint(0, vocab, (rows, t), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(rows, t, dtype=torch.long),
        "position_ids": torch.arange(t).repeat(rows, 1),
        "responses": ids[:, prompt:].contiguous(),
        "response_mask": torch.ones(rows, response),
        "advantages": torch.randn(rows, 1, generator=g).repeat(1, response),
    }


def main(ours_bin):
    results = []
    only = os.environ.get("VERLC_BENCH_SHAPES")
    for name, (cfg, rows, prompt, response, micro) in SHAPES.items():
        if only and name not in only.split(","):
            continue
        torch.manual_seed(0)
        config = Qwen2Config(tie_word_embeddings=True, **cfg)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        model.train()
        batch = batch_of(cfg["vocab_size"], rows, prompt, response, 1)
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            bfile = os.path.join(d, "batch.safetensors")
            save_file({k: v.contiguous() for k, v in batch.items()}, bfile)
            # Write the checkpoint back now, not while our side is being timed.
            os.sync()
            res = subprocess.run([ours_bin, d, bfile, str(micro), str(WARMUP + STEPS), str(THREADS)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"{ours_bin} failed on {name}: {res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(name, [round(t, 3) for t in r["times"]], file=sys.stderr)
        peer_times, (peer_loss, peer_norm) = peer_steps(model, batch, micro, WARMUP + STEPS)
        # Same weights and batch: the first step must compute the same loss and gradient.
        for what, a, b in (("loss", r["loss"], peer_loss), ("grad norm", r["grad_norm"], peer_norm)):
            if not abs(a - b) <= 1e-4 * max(1.0, abs(b)):
                sys.exit(f"{name}: first-step {what} differs: ours {a}, transformers {b}")
        o = statistics.median(r["times"][WARMUP:])
        p = statistics.median(peer_times[WARMUP:])
        print(f"{name}: threads={THREADS} ours {o * 1e3:.1f} ms, PyTorch+transformers {p * 1e3:.1f} ms "
              f"(first-step loss {r['loss']:.6f} vs {peer_loss:.6f}, grad norm {r['grad_norm']:.6f} vs {peer_norm:.6f})",
              file=sys.stderr)
        results.append({"name": f"train_step/{name}", "ours": round(o * 1e3, 2), "peer": round(p * 1e3, 2),
                        "unit": "ms", "speedup": round(p / o, 3)})
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])

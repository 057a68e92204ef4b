"""Rollout generation: runtime::rollout::generate vs transformers' generate() on the same
random Qwen2 model on this CPU (sampling at temperature 1, EOS ignored so every row generates
the full length), with the same torch thread count on both sides, on two shapes:

- tiny: 4 layers, hidden 256, vocab 32000; 8 prompts of 16-32 tokens, 64 new tokens, one
  sample each, 1 thread (where Python's per-token overhead in generate() shows);
- qwen0.5b-2l: Qwen2.5-0.5B's dims (hidden 896, 14 heads, 2 KV heads, ffn 4864, vocab 151936,
  tied embeddings) with 2 layers; 8 prompts of 256 tokens, 8 samples each, 128 new tokens,
  2 threads. transformers: generate(num_return_sequences=8), which prefills every sample;
  verlc prefills each prompt once and copies its cache to the samples, as a trainer's
  rollout with `rollout.n` does. Decoding is bound by the 151936-wide output layer on both
  sides.

Usage: bench.py OUR_BINARY
Environment: VERLC_BENCH_SHAPES (comma-separated names; all by default).
Prints each shape's medians and, as the last line, a JSON list of
{"name","ours","peer","unit","speedup","threads"} with speedup = peer / ours.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

SHAPES = {
    "tiny": dict(
        config=dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
        lengths=[16 + (7 * i) % 17 for i in range(8)], new=64, n=1, threads=1, reps=5, warmup=True,
    ),
    "qwen0.5b-2l": dict(
        config=dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                    rope_theta=1000000.0),
        # One timed run a side (about a minute each here); verlc's driver warms up once anyway.
        lengths=[256] * 8, new=128, n=8, threads=2, reps=1, warmup=False,
    ),
}


def run_shape(ours_bin, name, shape):
    threads = shape["threads"]
    torch.set_num_threads(threads)
    cfg = Qwen2Config(tie_word_embeddings=True, **shape["config"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    lengths, new, n = shape["lengths"], shape["new"], shape["n"]
    prompts = [torch.randint(3, cfg.vocab_size, (k,), generator=g).tolist() for k in lengths]
    width = max(lengths)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    rows = len(prompts) * n

    def peer_once(seed):
        torch.manual_seed(seed)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=None,
                num_return_sequences=n,
            )
        dt = time.perf_counter() - t
        assert out.shape == (rows, width + new), out.shape
        return dt

    ours, peer = [], []
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        pfile = os.path.join(d, "prompts.json")
        with open(pfile, "w") as f:
            json.dump(prompts, f)
        if shape["warmup"]:
            peer_once(0)
        # Alternate the two sides so load from other processes on this machine hits both alike.
        for rep in range(shape["reps"]):
            res = subprocess.run([ours_bin, d, pfile, str(new), str(threads), "1", str(n)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"{ours_bin} failed: {res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            assert r["tokens"] == rows * new, r
            ours.extend(r["times"])
            peer.append(peer_once(rep + 1))
    o, p = statistics.median(ours), statistics.median(peer)
    tok = rows * new
    print(
        f"{name}, threads={threads}: ours {o * 1e3:.1f} ms ({tok / o:.0f} tok/s), "
        f"transformers generate {p * 1e3:.1f} ms ({tok / p:.0f} tok/s)",
        file=sys.stderr,
    )
    return {"name": f"rollout_generate/{name}", "ours": o * 1e3, "peer": p * 1e3, "unit": "ms",
            "speedup": p / o, "threads": threads}


def main(ours_bin):
    wanted = os.environ.get("VERLC_BENCH_SHAPES")
    names = wanted.split(",") if wanted else list(SHAPES)
    results = [run_shape(ours_bin, name, SHAPES[name]) for name in names]
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])

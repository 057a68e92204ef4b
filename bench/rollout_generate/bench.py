"""Rollout generation: runtime::rollout::generate vs transformers' generate() on the same tiny
random Qwen2 model on this CPU (4 layers, hidden 256, batch 8, 64 new tokens, sampling at
temperature 1, EOS ignored), with the same torch thread count on both sides.

Usage: bench.py OUR_BINARY
Prints the median wall time of each side and, as the last line, one JSON result
{"name","ours","peer","unit","speedup"} with speedup = peer / ours.
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

THREADS = int(os.environ.get("VERLC_BENCH_THREADS", "1"))
REPS = int(os.environ.get("VERLC_BENCH_REPS", "5"))
BATCH, NEW = 8, 64
torch.set_num_threads(THREADS)


def main(ours_bin):
    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    lengths = [16 + (7 * i) % 17 for i in range(BATCH)]
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    width = max(lengths)
    ids = torch.zeros(BATCH, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1

    def peer_once(seed):
        torch.manual_seed(seed)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0, eos_token_id=None,
            )
        dt = time.perf_counter() - t
        assert out.shape == (BATCH, width + NEW), out.shape
        return dt

    ours, peer = [], []
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        pfile = os.path.join(d, "prompts.json")
        with open(pfile, "w") as f:
            json.dump(prompts, f)
        peer_once(0)
        # Alternate the two sides so load from other processes on this machine hits both alike.
        for rep in range(REPS):
            res = subprocess.run([ours_bin, d, pfile, str(NEW), str(THREADS), "1"], capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"{ours_bin} failed: {res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            assert r["tokens"] == BATCH * NEW, r
            ours.extend(r["times"])
            peer.append(peer_once(rep + 1))
    o, p = statistics.median(ours), statistics.median(peer)
    tok = BATCH * NEW
    print(
        f"threads={THREADS}: ours {o * 1e3:.1f} ms ({tok / o:.0f} tok/s), "
        f"transformers generate {p * 1e3:.1f} ms ({tok / p:.0f} tok/s)",
        file=sys.stderr,
    )
    print(json.dumps({"name": "rollout_generate", "ours": o * 1e3, "peer": p * 1e3, "unit": "ms", "speedup": p / o}))


if __name__ == "__main__":
    main(sys.argv[1])

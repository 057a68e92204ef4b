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
  sides. vLLM (the CPU build scripts/setup installs, .venv/bin/python-vllm) is the second peer
  here, as `rollout.name: vllm` runs it: its OpenAI server on the same checkpoint (fp32,
  eager, token ids in and out), the 8 prompts sent at once with n = 8, after one warm-up
  request; its start-up (about 30-50 s) is reported apart, not timed.

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
        lengths=[256] * 8, new=128, n=8, threads=2, reps=1, warmup=False, vllm=True,
    ),
}


def vllm_time(model_dir, prompts, new, n, threads):
    """Seconds vLLM's server takes for the batch (and its start-up), as verlc's rollout
    sends it: one completion request per prompt, all in flight."""
    import signal
    import socket
    import threading
    import urllib.request

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python = os.path.join(root, ".venv", "bin", "python-vllm")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_SERVER_DEV_MODE="1",
               VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS=str(threads))
    log = tempfile.NamedTemporaryFile(prefix="bench-vllm-", suffix=".log", delete=False)
    t0 = time.perf_counter()
    server = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "float32", "--enforce-eager", "--skip-tokenizer-init",
         "--max-model-len", str(max(len(p) for p in prompts) + new), "--served-model-name", "m",
         # As verlc's rollout runs it on CPU: seeded requests fail a chunked prefill there.
         "--no-enable-chunked-prefill"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def post(body):
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.load(r)

    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"vLLM server exited; see {log.name}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        startup = time.perf_counter() - t0
        post({"model": "m", "prompt": prompts[0][:8], "max_tokens": 4})
        outs = [None] * len(prompts)

        def one(i):
            outs[i] = post({"model": "m", "prompt": prompts[i], "n": n, "max_tokens": new, "min_tokens": new,
                            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "ignore_eos": True, "logprobs": 0,
                            "return_tokens_as_token_ids": True, "seed": i})

        t = time.perf_counter()
        threads_ = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for th in threads_:
            th.start()
        for th in threads_:
            th.join()
        dt = time.perf_counter() - t
        for o in outs:
            assert len(o["choices"]) == n and all(len(c["logprobs"]["tokens"]) == new for c in o["choices"]), o
        return dt, startup
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


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
        served = vllm_time(d, prompts, new, n, threads) if shape.get("vllm") else None
    o, p = statistics.median(ours), statistics.median(peer)
    tok = rows * new
    print(
        f"{name}, threads={threads}: ours {o * 1e3:.1f} ms ({tok / o:.0f} tok/s), "
        f"transformers generate {p * 1e3:.1f} ms ({tok / p:.0f} tok/s)",
        file=sys.stderr,
    )
    results = [{"name": f"rollout_generate/{name}", "ours": o * 1e3, "peer": p * 1e3, "unit": "ms",
                "speedup": p / o, "threads": threads}]
    if served is not None:
        v, startup = served
        print(f"{name}, threads={threads}: vLLM {v * 1e3:.1f} ms ({tok / v:.0f} tok/s; start-up {startup:.1f} s)",
              file=sys.stderr)
        results.append({"name": f"rollout_generate/{name} vs vllm", "ours": o * 1e3, "peer": v * 1e3,
                        "unit": "ms", "speedup": v / o, "threads": threads, "peer_startup_s": startup})
    return results


def main(ours_bin):
    wanted = os.environ.get("VERLC_BENCH_SHAPES")
    names = wanted.split(",") if wanted else list(SHAPES)
    results = [r for name in names for r in run_shape(ours_bin, name, SHAPES[name])]
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])

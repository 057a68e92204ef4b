"""Samples per second of verl 0.9's trainer modes on the same work, through `verlc run`: the
synchronous loop (generate, then train on it) against `colocate_async` (a rollout thread
beside the trainer generates the next batches while the trainer updates; one warm-up batch,
`max_off_policy_threshold: 2`), against `separate_async` (the same loop, two mini-batch updates
per weight sync; its synchronous peer updates on the same two mini-batches), and with the vLLM
rollout against the synchronous loop with vLLM (the server is the rollout pool: a process of
its own, generating while the trainer updates).

The work: the quickstart's GRPO recipe and task (digit reversal, its built-in tokenizer) on a
model with Qwen2.5-0.5B's layer dims (hidden 896, 14 heads, 2 KV heads, ffn 4864) and 2 layers,
fp32; 16 prompts x 8 samples of up to 16 tokens per step, one epoch of one mini-batch.

Each side's step time is its own `timing_s/step` metric; the first step (warm-up, and for the
asynchronous loop the step that waits for the first batch) is left out and the median of the
others taken. Samples per second = 128 / that median.

The asynchronous loop gains only where the rollout thread and the update can run at once on
different cores. Both sides run twice: with THREADS libtorch intra-op threads per thread of work
(each side alone fills THREADS cores, so on a machine of THREADS cores the overlap competes for
them) and with one (the synchronous loop uses one core, the asynchronous one a core per thread
of work: the setting of ranks that each get one core).

Usage: bench.py VERLC_BINARY
Environment: VERLC_BENCH_STEPS (6 timed steps), VERLC_BENCH_THREADS (2), VERLC_BENCH_ONLY (run
the cases whose name contains it).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

STEPS = int(os.environ.get("VERLC_BENCH_STEPS", "6"))
THREADS = int(os.environ.get("VERLC_BENCH_THREADS", "2"))
MODEL = "builtin://tiny?layers=2&hidden=896&heads=14&kv_heads=2&intermediate=4864"
SAMPLES = 16 * 8
WORK = [
    f"actor_rollout_ref.model.path='{MODEL}'",
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=8",
    "data.max_response_length=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.actor.ppo_epochs=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    f"trainer.total_training_steps={STEPS + 1}",
]
ASYNC = [
    "trainer.v1.trainer_mode=colocate_async",
    "trainer.v1.colocate_async.num_warmup_batches=1",
    "trainer.v1.sampler.max_off_policy_threshold=2",
]
TWO_MINI_BATCHES = ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]
SEPARATE = TWO_MINI_BATCHES + [
    "trainer.v1.trainer_mode=separate_async",
    "trainer.v1.separate_async.parameter_sync_step=2",
    "trainer.v1.separate_async.num_warmup_batches=1",
    "trainer.v1.sampler.max_off_policy_threshold=2",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]
VLLM = ["actor_rollout_ref.rollout.name=vllm"]


def step_times(verlc, extra, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory() as ckpt:
        cmd = [verlc, "run", "--verl-version", "0.9.1", "examples/quickstart.yaml", *WORK, *extra,
               f"trainer.default_local_dir={ckpt}"]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.exit(f"verlc run failed ({res.returncode}): {res.stderr[-3000:]}{res.stdout[-2000:]}")
    steps = [float(x) for x in re.findall(r"timing_s/step:([\d.]+)", res.stdout)]
    if len(steps) != STEPS + 1:
        sys.exit(f"verlc run printed {len(steps)} steps, expected {STEPS + 1}:\n{res.stdout[-3000:]}")
    waits = [float(x) for x in re.findall(r"timing_s/gen:([\d.]+)", res.stdout)]
    return statistics.median(steps[1:]), statistics.median(waits[1:])


def main():
    verlc = sys.argv[1]
    results = []
    cases = [(f"colocate_async vs sync ({t} libtorch thread(s) per thread of work)", [], ASYNC, t)
             for t in sorted({THREADS, 1}, reverse=True)]
    cases += [
        (f"separate_async vs sync, 2 mini-batches ({THREADS} libtorch threads)", TWO_MINI_BATCHES,
         SEPARATE, THREADS),
    ]
    cases += [(f"colocate_async vs sync, vLLM rollout ({t} libtorch thread(s) in the trainer)",
               VLLM, VLLM + ASYNC, t) for t in sorted({THREADS, 1}, reverse=True)]
    only = os.environ.get("VERLC_BENCH_ONLY")
    if only:
        cases = [c for c in cases if only in c[0]]
    for name, common, mode, threads in cases:
        sync, sync_gen = step_times(verlc, common, threads)
        step, wait = step_times(verlc, mode, threads)
        print(f"{name}: sync {sync:.3f} s/step ({SAMPLES / sync:.1f} samples/s, generating "
              f"{sync_gen:.3f} s of it); asynchronous {step:.3f} s/step "
              f"({SAMPLES / step:.1f} samples/s, waiting for data {wait:.3f} s)", file=sys.stderr)
        results.append({
            "name": f"async_step {name}",
            "ours": step / SAMPLES,
            "peer": sync / SAMPLES,
            "unit": "s/sample",
            "speedup": sync / step,
        })
    print(json.dumps(results))


if __name__ == "__main__":
    main()

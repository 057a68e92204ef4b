"""One SFT step of examples/digits_sft.yaml, end to end: `verlc run` against TRL's SFTTrainer
doing the same work.

Same on both sides: the model shape (builtin://tiny?layers=2&hidden=128, a Qwen2 decoder,
randomly initialised), the tokenizer and chat template, the conversations (the example's
builtin://digit_reversal rows: the user's prompt, the assistant's reversed digits), the loss
(token mean over the assistant's tokens: TRL's prompt-completion format with
completion_only_loss), fp32 on the CPU with the same torch thread count, and a step's work:
32 conversations in 2 micro-batches of 16, one AdamW step (lr 3e-3, no weight decay, grad
clip 1.0), constant schedule.

A step on each side is timed from its own clock: verlc's `timing_s/step` metric, and for TRL
the time between the ends of consecutive optimizer steps. The first steps of each side
(warm-up) are left out; the median of the others is reported.

Usage: bench.py VERLC_BINARY EXPORT_BINARY
Environment: VERLC_BENCH_STEPS (40 timed steps), VERLC_BENCH_THREADS (2).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = int(os.environ.get("VERLC_BENCH_STEPS", "40"))
THREADS = int(os.environ.get("VERLC_BENCH_THREADS", "2"))
WARMUP = 3
MODEL = "builtin://tiny?layers=2&hidden=128"
DATA = "builtin://digit_reversal?split=train&min_digits=3&max_digits=3&size=740"


def ours(verlc, work):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    cmd = [
        verlc, "run", os.path.abspath("examples/digits_sft.yaml"),
        f"trainer.total_training_steps={STEPS + WARMUP}",
        "trainer.test_freq=-1", "data.val_files=null",
        f"trainer.default_local_dir={work}/ckpt",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if res.returncode != 0:
        sys.exit(f"verlc run failed ({res.returncode}): {res.stderr[-3000:]}{res.stdout[-2000:]}")
    steps = [float(x) for x in re.findall(r"timing_s/step:([\d.]+)", res.stdout)]
    losses = [float(x) for x in re.findall(r"train/loss:([\d.]+)", res.stdout)]
    if len(steps) != STEPS + WARMUP:
        sys.exit(f"verlc run printed {len(steps)} steps, expected {STEPS + WARMUP}:\n{res.stdout[-3000:]}")
    # The last step also writes the checkpoint: left out with the warm-up.
    return steps[WARMUP:-1], losses[0]


def peer(export_dir):
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(export_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(export_dir)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    with open(os.path.join(export_dir, "train.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    dataset = Dataset.from_list([
        {"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["ground_truth"]}]}
        for r in rows
    ])
    first_loss = []

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and not first_loss:
                first_loss.append(logs["loss"])

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            per_device_train_batch_size=16,
            gradient_accumulation_steps=2,
            learning_rate=3e-3,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_steps=STEPS + WARMUP,
            completion_only_loss=True,
            max_length=32,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer.train()
    ends = clock.ends
    if len(ends) != STEPS + WARMUP:
        sys.exit(f"TRL ran {len(ends)} optimizer steps, expected {STEPS + WARMUP}")
    steps = [b - a for a, b in zip(ends[WARMUP - 1:], ends[WARMUP:])]
    return steps[:-1], first_loss[0]


def main(verlc, export):
    with tempfile.TemporaryDirectory() as d:
        res = subprocess.run([export, MODEL, DATA, d], capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{export} failed: {res.stderr[-2000:]}")
        with tempfile.TemporaryDirectory() as work:
            our_steps, our_loss = ours(verlc, work)
        peer_steps, peer_loss = peer(d)
    o, p = statistics.median(our_steps), statistics.median(peer_steps)
    print(
        f"threads={THREADS}: verlc {o * 1000:.1f} ms/step, TRL SFTTrainer {p * 1000:.1f} ms/step; "
        f"first-step loss {our_loss:.3f} vs {peer_loss:.3f}",
        file=sys.stderr,
    )
    # Both start from a random model on the same conversations: a first loss far apart means the
    # two are not computing the same thing.
    if abs(our_loss - peer_loss) > 0.25 * max(our_loss, peer_loss):
        sys.exit(f"first-step losses differ: {our_loss:.3f} vs {peer_loss:.3f}")
    print(json.dumps({"name": "sft_step", "ours": o, "peer": p, "unit": "s", "speedup": p / o,
                      "threads": THREADS}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

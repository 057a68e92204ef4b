"""One GRPO step of the quickstart, end to end: `verlc run examples/quickstart.yaml` against
TRL's GRPOTrainer doing the same work.

Same on both sides: the model shape (builtin://tiny?layers=2&hidden=128, a Qwen2 decoder,
randomly initialised), the tokenizer and chat template, the training prompts (the
quickstart's builtin://digit_reversal rows), the reward (the builtin task's partial-credit
score), fp32 on the CPU with the same torch thread count, and the work of a step: 64 prompts
x 16 samples of up to 4 tokens (stopping at end-of-turn), old log-probs, then 2 epochs of 4
mini-batches of 256 samples in micro-batches of 128 (8 AdamW steps, lr 1e-3, grad clip 1.0),
GRPO advantages (group mean and std), token-mean loss, no KL, no reference model.
TRL: per_device_train_batch_size 128, gradient_accumulation_steps 2, steps_per_generation 8,
num_iterations 2, num_generations 16, max_completion_length 4, beta 0, loss_type dapo.

A step on each side is timed from its own clock: verlc's `timing_s/step` metric, and for TRL
the time between the ends of the 8th optimizer steps of consecutive rounds. The first step of
each side (warm-up) is left out; the median of the others is reported.

Usage: bench.py VERLC_BINARY EXPORT_BINARY
Environment: VERLC_BENCH_STEPS (4 timed steps), VERLC_BENCH_THREADS (2).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = int(os.environ.get("VERLC_BENCH_STEPS", "4"))
THREADS = int(os.environ.get("VERLC_BENCH_THREADS", "2"))
MODEL = "builtin://tiny?layers=2&hidden=128"
DATA = "builtin://digit_reversal?split=train&min_digits=3&max_digits=3&size=740"
OPT_STEPS_PER_ROUND = 8


def score(response, truth):
    """The builtin task's reward (runtime::data::builtin::compute_score)."""
    r, g = list(response.strip()), list(truth)
    if r == g:
        return 1.0
    longest = max(len(r), len(g), 1)
    digits = 0.0 if not r else sum(c.isdigit() and c.isascii() for c in r) / len(r)
    length = 1.0 - abs(len(r) - len(g)) / longest
    positions = sum(a == b for a, b in zip(r, g)) / longest
    return 0.1 * digits + 0.1 * length + 0.3 * positions


def ours(verlc):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    cmd = [
        verlc, "run", "examples/quickstart.yaml",
        f"trainer.total_training_steps={STEPS + 1}",
        "trainer.val_before_train=false", "trainer.test_freq=-1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.exit(f"verlc run failed ({res.returncode}): {res.stderr[-3000:]}{res.stdout[-2000:]}")
    steps = [float(x) for x in re.findall(r"timing_s/step:([\d.]+)", res.stdout)]
    scores = [float(x) for x in re.findall(r"critic/score/mean:([\d.]+)", res.stdout)]
    if len(steps) != STEPS + 1:
        sys.exit(f"verlc run printed {len(steps)} steps, expected {STEPS + 1}:\n{res.stdout[-3000:]}")
    return steps[1:], scores[0]


def peer(export_dir):
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(export_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(export_dir)
    # A causal LM takes no segment ids.
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    with open(os.path.join(export_dir, "train.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    dataset = Dataset.from_list(rows)
    first_scores = []

    def reward(completions, ground_truth, **_):
        out = []
        for c, g in zip(completions, ground_truth):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(score(text, g))
        if not first_scores:
            first_scores.append(statistics.mean(out))
        return out

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=128,
            gradient_accumulation_steps=2,
            steps_per_generation=8,
            num_iterations=2,
            num_generations=16,
            max_completion_length=4,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            weight_decay=0.01,
            max_grad_norm=1.0,
            beta=0.0,
            loss_type="dapo",
            scale_rewards="group",
            max_steps=OPT_STEPS_PER_ROUND * (STEPS + 1),
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=OPT_STEPS_PER_ROUND,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer.train()
    ends = clock.ends
    if len(ends) != OPT_STEPS_PER_ROUND * (STEPS + 1):
        sys.exit(f"TRL ran {len(ends)} optimizer steps, expected {OPT_STEPS_PER_ROUND * (STEPS + 1)}")
    rounds = [
        ends[OPT_STEPS_PER_ROUND * (k + 1) - 1] - ends[OPT_STEPS_PER_ROUND * k - 1]
        for k in range(1, STEPS + 1)
    ]
    return rounds, first_scores[0]


def main(verlc, export):
    with tempfile.TemporaryDirectory() as d:
        res = subprocess.run([export, MODEL, DATA, d], capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{export} failed: {res.stderr[-2000:]}")
        our_steps, our_score = ours(verlc)
        peer_steps, peer_score = peer(d)
    o, p = statistics.median(our_steps), statistics.median(peer_steps)
    print(
        f"threads={THREADS}: verlc {o:.3f} s/step {[round(x, 3) for x in our_steps]}, "
        f"TRL GRPOTrainer {p:.3f} s/step {[round(x, 3) for x in peer_steps]}; "
        f"first-step mean score {our_score:.3f} vs {peer_score:.3f}",
        file=sys.stderr,
    )
    # Both sides start from a random model on the same task: a score far apart means the two
    # are not doing the same thing.
    if abs(our_score - peer_score) > 0.1:
        sys.exit(f"first-step scores differ: {our_score:.3f} vs {peer_score:.3f}")
    print(json.dumps({"name": "grpo_step", "ours": o, "peer": p, "unit": "s", "speedup": p / o,
                      "threads": THREADS}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Time `verlc check` and Hydra's compose+resolve on the same tree and overrides: verl 0.7.0's
tree (the installed verl), and each newer carried release's (unpacked by scripts/setup), where
verlc also types the keys its 0.7 model lacks from the release's leaf table.

Both sides run as whole processes (a user types one command either way), in REPS rounds of
5 runs of verlc then one of Hydra, so a busy moment of a shared machine slows both sides
alike while each side still runs as a user repeats it (a Python process between two checks
leaves the caches cold for the next one); the median wall time of each side is reported.
Prints the JSON results (a list) as the last line.
"""
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time

REPS = int(os.environ.get("BENCH_REPS", "20"))
verlc = sys.argv[1]
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
trees = [
    ("check_vs_hydra", os.path.join(sysconfig.get_paths()["purelib"], "verl", "trainer", "config")),
] + [
    (f"check_vs_hydra/{r}", os.path.join(root, ".venv", "verl-releases", r, "verl", "trainer", "config"))
    for r in ("0.7.1", "0.8.0", "0.9.0", "0.9.1")
]
overrides = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "trainer.logger=[console]",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
]

HYDRA = r"""
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=sys.argv[2:])
OmegaConf.to_container(cfg, resolve=True)
"""


def timed(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t
    # The config is valid: anything but a clean exit on either side is a failure, not a
    # timing.
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    return elapsed


results = []
for name, config_dir in trees:
    if not os.path.isdir(config_dir):
        sys.exit(f"{config_dir} is missing (run scripts/setup)")
    ours_cmd = [verlc, "check", "--config-dir", config_dir, *overrides]
    peer_cmd = [sys.executable, "-c", HYDRA, config_dir, *overrides]
    ours_times, peer_times = [], []
    for _ in range(REPS):
        ours_times.extend(timed(ours_cmd) for _ in range(5))
        peer_times.append(timed(peer_cmd))
    ours = statistics.median(ours_times)
    peer = statistics.median(peer_times)
    print(f"{name}: verlc check: {ours * 1e3:.1f} ms, hydra compose+resolve: {peer * 1e3:.1f} ms", file=sys.stderr)
    results.append({"name": name, "ours": ours * 1e3, "peer": peer * 1e3, "unit": "ms", "speedup": peer / ours})
print(json.dumps(results))

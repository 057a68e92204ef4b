"""Runs verl 0.9.1's asynchronous replay buffer (`ReplayBufferAsync`,
verl/trainer/ppo/v1/replay_buffer.py, from the release files scripts/setup unpacks) on seeded
schedules and records what it did, for runtime/tests/trainer/replay.rs to replay through
verlc's buffer.

verl's buffer keeps its groups in TransferQueue; here an in-memory dictionary with the four calls
the class makes (`kv_list`, `kv_clear`, `kv_batch_get`, `KVBatchMeta`) stands in for that store,
and `SkipManager.annotate_tq` is the identity. The class itself runs unchanged except for one
thing: among groups queued at the same step verl orders by Python set iteration (arbitrary), and
the oracle hands it the keys in queue order so that the selection is reproducible.

Each schedule: `warmup` batches queued before step 1, then per step one batch queued and
`train` groups sampled; while the sampler waits, the simulated rollout finishes or fails a seeded
choice of in-flight groups (and between steps some more). Refills queue fresh groups at the
current step. Four schedules filter groups as DAPO does (`filter_groups_metric`: each response's
`acc` in `reward_extra_info`, the same for every response of a third of the groups), which the
stand-in store hands to verl's class as TransferQueue would.

Usage: replay_oracle.py OUT  (writes OUT/replay.json)
"""
import json
import os
import random
import sys
import types


def release_root():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "../../../.venv/verl-releases/0.9.1/verl")
    root = os.environ.get("VERLC_VERL_NEWER_ROOT", default)
    path = os.path.join(root, "trainer/ppo/v1/replay_buffer.py")
    if not os.path.isfile(path):
        sys.exit(f"verl 0.9.1's files are not at {root} (run scripts/setup)")
    return path


STORE = {}


class KVBatchMeta:
    def __init__(self, partition_id, keys, tags):
        self.partition_id, self.keys, self.tags = partition_id, keys, tags


def kv_list():
    return {p: dict(items) for p, items in STORE.items()}


def kv_clear(partition_id, keys):
    for k in keys:
        STORE.get(partition_id, {}).pop(k, None)


EXTRA = {}


def kv_batch_get(keys, partition_id, select_fields):
    assert select_fields == ["extra_fields"], select_fields
    return {"extra_fields": [EXTRA[k] for k in keys]}


def load_buffer_class():
    tq = types.ModuleType("transfer_queue")
    tq.kv_list, tq.kv_clear, tq.kv_batch_get, tq.KVBatchMeta = kv_list, kv_clear, kv_batch_get, KVBatchMeta
    skip = types.ModuleType("verl.utils.skip")

    class SkipManager:
        @staticmethod
        def annotate_tq(**_):
            return lambda f: f

    skip.SkipManager = SkipManager
    for name, mod in [("transfer_queue", tq), ("verl", types.ModuleType("verl")),
                      ("verl.utils", types.ModuleType("verl.utils")), ("verl.utils.skip", skip)]:
        sys.modules[name] = mod
    ns = {"__name__": "verl_replay_buffer"}
    path = release_root()
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    return ns["ReplayBufferAsync"]


def run(cls, seed, threshold, strategy, warmup, train, steps, p_finish, p_fail, dapo=False):
    STORE.clear()
    EXTRA.clear()
    rng = random.Random(seed)
    events = []
    uids = []
    state = {}  # uid -> step queued, for in-flight groups
    step = [0]

    def submit(count, log):
        for _ in range(count):
            uid = f"g{len(uids):05d}"
            uids.append(uid)
            STORE.setdefault("train", {})[uid] = {"is_prompt": True, "status": "pending", "global_steps": step[0]}
            state[uid] = step[0]
        log.append({"op": "submit", "count": count, "step": step[0]})

    def progress(log):
        # The rollout: each in-flight group finishes or fails with some probability.
        done = []
        for uid in sorted(state):
            r = rng.random()
            if r < p_fail:
                STORE["train"][uid]["status"] = "failure"
                done.append(("fail", uid))
            elif r < p_fail + p_finish:
                STORE["train"][uid]["status"] = "finished"
                # Each response's DAPO metric: a third of the groups all equal (no signal).
                flat = rng.random() < 0.35
                first = float(rng.random() < 0.5)
                values = [first if flat else float(rng.random() < 0.5) for _ in range(2)]
                for s, v in enumerate(values):
                    STORE["train"][f"{uid}_{s}_0"] = {"status": "finished"}
                    EXTRA[f"{uid}_{s}_0"] = {"reward_extra_info": {"acc": v}}
                # The values go with the event where the buffer filters on them.
                done.append(("finish", uid, values) if dapo else ("finish", uid))
            else:
                continue
        for op, uid, *_ in done:
            del state[uid]
        log.append({"op": "progress", "done": [[op, uids.index(u), *rest] for op, u, *rest in done]})

    class Buffer(cls):
        def _select_prompt_uids(self, partition_id, sampleable_keys, batch_size):
            return super()._select_prompt_uids(partition_id, sorted(sampleable_keys), batch_size)

    inner = []
    buf = Buffer(
        trainer_mode="colocate_async",
        trainer_config={},
        max_off_policy_threshold=threshold,
        max_off_policy_strategy=strategy,
        sampler_kwargs={},
        poll_interval=0.0,
        refill_fn=lambda k: submit(k, inner),
        filter_groups_metric="acc" if dapo else None,
    )
    buf._wait_for_next_poll = lambda partition_id, last: (progress(inner), last)[1]

    step[0] = 1
    submit(warmup * train, events)
    for g in range(1, steps + 1):
        step[0] = g
        submit(train, events)
        progress(events)
        inner.clear()
        batch, metrics = buf.sample(global_steps=g, partition_id="train", batch_size=train)
        selected = sorted({k.split("_")[0] for k in batch.keys})
        events.append({
            "op": "sample", "step": g, "batch": train, "inner": list(inner),
            "selected": [uids.index(u) for u in selected],
            # verl logs the DAPO value counts (a dict) as a table apart from the metrics.
            "metrics": {k: float(v) for k, v in metrics.items() if not isinstance(v, dict)},
        })
        # The trainer clears what it trained on at the end of the step.
        kv_clear("train", list(batch.keys))
    return {"seed": seed, "threshold": threshold, "strategy": strategy, "dapo": dapo, "events": events}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cls = load_buffer_class()
    cases = []
    seed = 0
    for threshold in [1, 2, 3, None]:
        for strategy in ["drop", "wait"]:
            for warmup, p_finish, p_fail in [(0, 0.5, 0.0), (1, 0.35, 0.05), (2, 0.2, 0.1)]:
                seed += 1
                cases.append(run(cls, seed, threshold, strategy, warmup, 3, 8, p_finish, p_fail))
    # DAPO's dynamic sampling (filter_groups on a reward_extra_info metric) with both strategies.
    for threshold in [2, None]:
        for strategy in ["drop", "wait"]:
            seed += 1
            cases.append(run(cls, seed, threshold, strategy, 1, 3, 8, 0.35, 0.05, dapo=True))
    with open(os.path.join(out, "replay.json"), "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()

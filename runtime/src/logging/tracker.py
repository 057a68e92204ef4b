"""verlc's experiment-tracker process: feeds wandb or MLflow through their own SDKs.

Reads one JSON object per line on stdin:
  {"init": {"backend": "wandb" | "mlflow", "project": str, "experiment": str, "config": {...}}}
  {"log": {"step": int, "data": {str: float}}}
  {"finish": {}}
and answers nothing: problems go to stderr, which the trainer shows, and never stop training.
Each backend is set up as verl's `Tracking` sets it up (project, run name, config, environment).
"""
import json
import os
import re
import sys


def flatten(value, prefix=""):
    """Nested dicts and lists as `a/b/0`-style keys (verl's MLflow params)."""
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}/"))
    elif isinstance(value, list):
        out[f"{prefix}list_len"] = len(value)
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{i}/"))
    else:
        out[prefix[:-1]] = value
    return out


class Wandb:
    def __init__(self, project, experiment, config):
        import wandb

        self.wandb = wandb
        wandb.init(project=project, name=experiment, entity=os.environ.get("WANDB_ENTITY"), config=config)

    def log(self, step, data):
        self.wandb.log(data=data, step=step)

    def finish(self):
        self.wandb.finish(exit_code=0)


class Mlflow:
    INVALID = re.compile(r"[^/\w.\- :]")

    def __init__(self, project, experiment, config):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:////tmp/mlruns.db"))
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if run_id:
            mlflow.start_run(run_id=run_id)
        else:
            experiment_obj = mlflow.set_experiment(project)
            mlflow.start_run(experiment_id=experiment_obj.experiment_id, run_name=experiment)
        params = {k: str(v)[:6000] for k, v in flatten(config).items()}
        items = list(params.items())
        for i in range(0, len(items), 100):
            mlflow.log_params(dict(items[i:i + 100]))

    def log(self, step, data):
        clean = {self.INVALID.sub("_", k.replace("@", "_at_")): v for k, v in data.items()}
        self.mlflow.log_metrics(metrics=clean, step=step)

    def finish(self):
        self.mlflow.end_run()


def main():
    tracker = None
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if "init" in msg:
                a = msg["init"]
                cls = {"wandb": Wandb, "mlflow": Mlflow}[a["backend"]]
                tracker = cls(a["project"], a["experiment"], a.get("config") or {})
            elif "log" in msg and tracker is not None:
                tracker.log(msg["log"]["step"], msg["log"]["data"])
            elif "finish" in msg and tracker is not None:
                tracker.finish()
                tracker = None
        except Exception as e:  # a tracker problem never stops training
            print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if "init" in msg:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

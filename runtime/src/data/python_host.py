# verlc data host: runs a user's dataset class (`data.custom_cls`) and sampler class
# (`data.sampler.class_path`) as verl's trainer would, over JSON lines on stdin/stdout.
# argv: one JSON object
#   {"dataset": {"path", "name"} | null,   null: verl's RLHFDataset (only with a sampler)
#    "sampler": {"path", "name"} | null,
#    "train_files": [...], "val_files": [...], "tokenizer": dir,
#    "config": the composed `data` section, "train_max_samples": int, "val_max_samples": int,
#    "vision": the model has a vision tower (the dataset gets its processor, where one loads),
#    "written_dir": where verlc wrote `builtin://` rows as JSON lines (base64 image bytes) | null}
# Protocol (one JSON object per line):
#   host -> {"ready": true, "train": N, "val": M | null, "sampler_len": K | null,
#            "curriculum": bool, "verl": "installed" | "without its package root" | "stand-in",
#            "dataset_class": str, "sampler_class": str | null}
#         | {"ready": false, "error": "traceback"}                                      once
#   client -> {"id", "rows": "train" | "val", "start", "end"}
#   host -> {"id", "rows": [item as JSON: tensors and arrays as lists, images as PNG cells,
#            other objects by repr]}
#   client -> {"id", "take": k, "drop_last": bool}  the sampler's next k indices: with
#             drop_last an epoch's short tail is skipped and the batch starts the next epoch;
#             without it a batch runs on into the next epoch (a DAPO refill)
#   host -> {"id", "indices": [...], "epoch": e, "yielded": y (indices drawn in epoch e)}
#   client -> {"id", "update": {"tensors": {name: nested lists}, "non_tensors": {name: list},
#                               "meta_info": {...}}}      a curriculum sampler's update(batch)
#   client -> {"id", "state": true}   -> {"id", "state": {"epoch", "yielded", "state_dict"}}
#   client -> {"id", "restore": {"epoch", "yielded", "state_dict"}}
#   host -> {"id", "ok": true} | {"id", "error": "traceback"}
# A sampler with state_dict/load_state_dict is restored through them; one without is
# fast-forwarded by drawing `yielded` indices of a fresh epoch iterator, as torchdata's
# StatefulDataLoader resumes a sampler that keeps no state.
# Base classes: verl's own, or stand-ins (pyproc/verl_prelude.py's verl_modules, put ahead of this
# script with pyproc/channel.py). The user's prints go to stderr; stdout carries only the protocol.
import inspect
import json
import sys
import traceback


def standin_modules():
    """verl's dataset and sampler interfaces, for a machine without verl."""
    import torch.utils.data

    class AbstractSampler(torch.utils.data.Sampler):
        def __init__(self, data_source, data_config):
            pass

    class AbstractCurriculumSampler(AbstractSampler):
        def update(self, batch):
            raise NotImplementedError

    class RLHFDataset(torch.utils.data.Dataset):
        """verl 0.7's RLHFDataset: rows of parquet/JSON files, `raw_prompt` from the prompt
        column (with images: each `<image>` a `{"type": "image", "image": PIL image}` part, the
        row's `image_key` column popped), `index`/`tools_kwargs`/`interaction_kwargs` from
        `extra_info`. Videos are not read."""

        def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
            if isinstance(data_files, str):
                data_files = [data_files]
            self.data_files = list(data_files)
            self.tokenizer = tokenizer
            self.processor = processor
            self.config = config
            self.max_samples = max_samples
            self.prompt_key = config.get("prompt_key", "prompt")
            self.image_key = config.get("image_key", "images")
            self.max_prompt_length = config.get("max_prompt_length", 1024)
            self.filter_overlong_prompts = config.get("filter_overlong_prompts", True)
            self.apply_chat_template_kwargs = config.get("apply_chat_template_kwargs", {}) or {}
            self.shuffle = config.get("shuffle", False)
            self.seed = config.get("seed")
            self._read_files_and_tokenize()

        def _read_files_and_tokenize(self):
            import pandas as pd

            frames = []
            for f in self.data_files:
                if f.endswith(".parquet"):
                    frames.append(pd.read_parquet(f))
                elif f.endswith(".json") or f.endswith(".jsonl"):
                    frames.append(pd.read_json(f, lines=f.endswith(".jsonl")))
                else:
                    raise ValueError(f"Unsupported file format: {f}")
            rows = pd.concat(frames, ignore_index=True).to_dict("records") if frames else []
            if 0 < self.max_samples < len(rows):
                import numpy as np

                if self.shuffle:
                    rng = np.random.default_rng(*((self.seed,) if self.seed is not None else ()))
                    keep = rng.choice(len(rows), size=self.max_samples, replace=False)
                else:
                    keep = range(self.max_samples)
                rows = [rows[i] for i in keep]
            if self.filter_overlong_prompts:
                rows = [r for r in rows if self._prompt_len(r) <= self.max_prompt_length]
            self.dataframe = rows

        def _prompt_len(self, row):
            messages = self._build_messages(dict(row))
            return len(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
                )
            )

        def __len__(self):
            return len(self.dataframe)

        def _build_messages(self, example):
            messages = [dict(m) for m in example[self.prompt_key]]
            images = example.pop(self.image_key, None)
            images = [] if images is None else list(images)
            if not images:
                return messages
            import re

            used = 0
            for m in messages:
                if not isinstance(m.get("content"), str):
                    continue
                parts = []
                for piece in (p for p in re.split("(<image>)", m["content"]) if p != ""):
                    if piece == "<image>":
                        if used >= len(images):
                            raise ValueError(f"the prompt has more <image> placeholders than its {len(images)} image(s)")
                        parts.append({"type": "image", "image": to_pil(images[used])})
                        used += 1
                    else:
                        parts.append({"type": "text", "text": piece})
                m["content"] = parts
            return messages

        def __getitem__(self, item):
            row = dict(self.dataframe[item])
            row["raw_prompt"] = self._build_messages(row)
            extra = row.get("extra_info") or {}
            row["extra_info"] = extra
            row["index"] = extra.get("index", 0)
            row["tools_kwargs"] = extra.get("tools_kwargs", {})
            row["interaction_kwargs"] = extra.get("interaction_kwargs", {})
            return row

    standin_package("utils", "utils.dataset", "experimental", "experimental.dataset")
    stand_in_module("verl.utils.dataset.rl_dataset", RLHFDataset=RLHFDataset)
    stand_in_module(
        "verl.experimental.dataset.sampler",
        AbstractSampler=AbstractSampler,
        AbstractCurriculumSampler=AbstractCurriculumSampler,
    )


def to_pil(cell):
    """An image cell of verl's data (`{"bytes", "path"}`, a path, or a PIL image) as an RGB PIL
    image; bytes may come base64-encoded, as verlc writes binary cells to JSON."""
    import base64
    import io

    from PIL import Image

    if isinstance(cell, Image.Image):
        return cell.convert("RGB")
    if isinstance(cell, dict):
        if cell.get("bytes") is not None:
            data = cell["bytes"]
            if isinstance(data, str):
                data = base64.b64decode(data)
            return Image.open(io.BytesIO(data)).convert("RGB")
        cell = cell.get("path") or cell.get("image")
    if isinstance(cell, str):
        return Image.open(cell.removeprefix("file://")).convert("RGB")
    raise TypeError(f"an image cell must be {{bytes, path}}, a path or a PIL image, got {type(cell).__name__}")


def load_processor(directory):
    """The model's processor as verl's `hf_processor` loads it, or None where the directory
    has none (verl's own dataset then says it needs one for images)."""
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(directory)
    except Exception as e:
        print(f"no processor loads from {directory}: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    # A processor that is only a tokenizer is none (as verl's hf_processor decides).
    return None if "Processor" not in type(processor).__name__ else processor


def as_verl_files(files, written_dir, image_key):
    """The files verlc wrote under `written_dir` (JSON lines, binary cells in base64) whose rows
    have pictures (an `image_key` column) turned into parquet files with the image cells' bytes
    decoded, as verl's preprocessed data holds them; other files as they are."""
    import base64
    import os

    out = []
    for f in files:
        if not written_dir or not os.path.abspath(f).startswith(os.path.abspath(written_dir) + os.sep):
            out.append(f)
            continue
        import pandas as pd

        frame = pd.read_json(f, lines=True)
        if image_key not in frame.columns:
            out.append(f)
            continue

        def decode(cells):
            if not isinstance(cells, list):
                return cells
            return [
                {**c, "bytes": base64.b64decode(c["bytes"])} if isinstance(c, dict) and isinstance(c.get("bytes"), str) else c
                for c in cells
            ]

        frame[image_key] = frame[image_key].map(decode)
        target = os.path.splitext(f)[0] + ".parquet"
        frame.to_parquet(target)
        out.append(target)
    return out


def make_dataset(cls, files, tokenizer, config, max_samples, processor=None):
    kwargs = dict(data_files=files, tokenizer=tokenizer, config=config, processor=processor)
    params = inspect.signature(cls.__init__).parameters
    if "max_samples" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs["max_samples"] = max_samples
    return cls(**kwargs)


class Sampling:
    """The sampler driven as verl's dataloader drives it: an iterator per epoch."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.epoch = 0
        self.yielded = 0
        self.it = iter(sampler)

    def next_epoch(self):
        self.epoch += 1
        self.yielded = 0
        self.it = iter(self.sampler)

    def draw(self):
        try:
            i = next(self.it)
        except StopIteration:
            return None
        self.yielded += 1
        return int(i)

    def take(self, k, drop_last):
        out = []
        while len(out) < k:
            i = self.draw()
            if i is not None:
                out.append(i)
                continue
            # The epoch ended: with drop_last its short tail is dropped, as verl's dataloader
            # drops it; an epoch that could never fill a batch would loop forever.
            if self.yielded == 0 or (drop_last and self.yielded < k):
                raise RuntimeError(
                    f"the sampler yields {self.yielded} indices an epoch, fewer than a batch of {k}"
                )
            if drop_last:
                out = []
            self.next_epoch()
        return out

    def state(self):
        sd = None
        if hasattr(self.sampler, "state_dict") and hasattr(self.sampler, "load_state_dict"):
            sd = jsonable(self.sampler.state_dict())
        return {"epoch": self.epoch, "yielded": self.yielded, "state_dict": sd}

    def restore(self, st):
        self.epoch = int(st["epoch"])
        if st.get("state_dict") is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(st["state_dict"])
        self.it = iter(self.sampler)
        self.yielded = 0
        for _ in range(int(st["yielded"])):
            if self.draw() is None:
                break


def main():
    send = protocol_sender(allow_nan=False)  # noqa: F821 - defined by pyproc/channel.py, put ahead of this script

    spec = json.loads(sys.argv[1])
    try:
        verl_kind = verl_modules(  # noqa: F821 - pyproc/verl_prelude.py, put ahead of this script
            ["utils.dataset", "experimental", "experimental.dataset"],
            ["verl.utils.dataset.rl_dataset", "verl.experimental.dataset.sampler"],
            standin_modules,
        )
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
        config = config_object(spec["config"])
        if spec.get("dataset"):
            cls = load_user_object(spec["dataset"]["path"], spec["dataset"]["name"])
            import torch.utils.data

            if not (isinstance(cls, type) and issubclass(cls, torch.utils.data.Dataset)):
                raise TypeError(
                    f"The custom dataset class '{spec['dataset']['name']}' from "
                    f"'{spec['dataset']['path']}' must inherit from torch.utils.data.Dataset"
                )
        else:
            from verl.utils.dataset.rl_dataset import RLHFDataset as cls
        processor = load_processor(spec["tokenizer"]) if spec.get("vision") else None
        image_key = spec["config"].get("image_key") or "images"
        for split in ("train_files", "val_files"):
            spec[split] = as_verl_files(spec.get(split) or [], spec.get("written_dir"), image_key)
        datasets = {"train": make_dataset(cls, spec["train_files"], tokenizer, config, spec["train_max_samples"], processor)}
        if spec.get("val_files"):
            datasets["val"] = make_dataset(cls, spec["val_files"], tokenizer, config, spec["val_max_samples"], processor)
        sampling = None
        curriculum = False
        if spec.get("sampler"):
            from verl.experimental.dataset.sampler import AbstractCurriculumSampler, AbstractSampler

            scls = load_user_object(spec["sampler"]["path"], spec["sampler"]["name"])
            sampler = scls(data_source=datasets["train"], data_config=config)
            if not isinstance(sampler, AbstractSampler):
                raise TypeError(
                    f"The sampler class '{spec['sampler']['name']}' must inherit from "
                    "verl.experimental.dataset.sampler.AbstractSampler"
                )
            curriculum = isinstance(sampler, AbstractCurriculumSampler)
            sampling = Sampling(sampler)
    except BaseException:
        send({"ready": False, "error": traceback.format_exc()})
        return 1
    sampler_len = None
    if sampling is not None:
        try:
            sampler_len = len(sampling.sampler)
        except TypeError:
            sampler_len = None
    send(
        {
            "ready": True,
            "train": len(datasets["train"]),
            "val": len(datasets["val"]) if "val" in datasets else None,
            "sampler_len": sampler_len,
            "curriculum": curriculum,
            "verl": verl_kind,
            "dataset_class": cls.__name__,
            "sampler_class": type(sampling.sampler).__name__ if sampling else None,
        }
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            if "rows" in req:
                ds = datasets[req["rows"]]
                rows = []
                for i in range(int(req["start"]), int(req["end"])):
                    item = ds[i]
                    if not isinstance(item, dict):
                        raise TypeError(f"item {i} of {type(ds).__name__} is a {type(item).__name__}, not a dict")
                    rows.append(jsonable(item))
                send({"id": req["id"], "rows": rows})
            elif "take" in req:
                indices = sampling.take(int(req["take"]), bool(req["drop_last"]))
                send({"id": req["id"], "indices": indices, "epoch": sampling.epoch, "yielded": sampling.yielded})
            elif "update" in req:
                sampling.sampler.update(batch=data_proto_of(req["update"]))  # noqa: F821 - pyproc/verl_prelude.py
                send({"id": req["id"], "ok": True})
            elif "state" in req:
                send({"id": req["id"], "state": sampling.state()})
            elif "restore" in req:
                sampling.restore(req["restore"])
                send({"id": req["id"], "ok": True})
            else:
                raise ValueError(f"unknown request {sorted(req)}")
        except BaseException:
            send({"id": req["id"], "error": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

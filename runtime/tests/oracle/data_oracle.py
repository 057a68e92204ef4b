"""pyarrow oracle for the runtime's dataset tests.

Usage: data_oracle.py parquet OUTDIR
Writes verl-layout RL datasets (as examples/data_preprocess/gsm8k.py produces them) with
pyarrow, plus the rows pyarrow reads back, as JSON:
  OUTDIR/train.parquet   snappy, row groups of 2 rows
  OUTDIR/other.parquet   gzip, a list-valued ground truth and nulls
  OUTDIR/train.json, OUTDIR/other.json   table.to_pylist() of each
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

TRAIN = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": "48/2 = 24 ... #### 72", "question": "Natalia sold clips"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "You are a careful solver.\nShow work."},
            {"role": "user", "content": "Weng earns $12 an hour (ünïcödé ✓). " + INSTRUCTION},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "10"},
        "extra_info": {"split": "train", "index": 1, "answer": "#### 10", "question": "Weng earns"},
    },
    {
        "data_source": "lighteval/MATH",
        "prompt": [{"role": "user", "content": "reverse 12345 " * 20}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "54321"},
        "extra_info": {"split": "train", "index": 7, "answer": "", "question": "long"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "compute 2+2"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 3, "answer": "4", "question": "2+2"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "what is the answer"}],
        "ability": "math",
        "reward_model": {"style": "model", "ground_truth": "42"},
        "extra_info": {"split": "train", "index": 4, "answer": "42", "question": "life"},
    },
]

OTHER = [
    {
        "data_source": "searchR1_nq",
        "prompt": [{"role": "user", "content": "who wrote hamlet"}],
        "ability": None,
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}},
        "extra_info": {"split": "test", "index": None, "need_tools_kwargs": False, "tools_kwargs": None},
    },
    {
        "data_source": "searchR1_nq",
        "prompt": [{"role": "user", "content": "capital of france"}],
        "ability": "qa",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris"]}},
        "extra_info": {"split": "test", "index": 11, "need_tools_kwargs": True, "tools_kwargs": {"search": {"k": 3}}},
    },
]


def main(out):
    os.makedirs(out, exist_ok=True)
    for name, rows, kw in (
        ("train", TRAIN, dict(row_group_size=2)),
        ("other", OTHER, dict(compression="gzip")),
    ):
        table = pa.Table.from_pylist(rows)
        pq.write_table(table, os.path.join(out, f"{name}.parquet"), **kw)
        back = pq.read_table(os.path.join(out, f"{name}.parquet")).to_pylist()
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(back, f, ensure_ascii=False)


if __name__ == "__main__":
    if sys.argv[1] != "parquet":
        sys.exit(f"unknown command {sys.argv[1]}")
    main(sys.argv[2])

"""Writes what a user smokes before a 7B launch (bench/smoke_7b): a Qwen2.5-7B-shaped model
directory without weights (its config.json and generation config, and a byte-level BPE
tokenizer with a 151,643-token vocabulary, Qwen's three ChatML special tokens and ChatML
template), 1,000 training and 100 test rows in the layout of verl's
examples/data_preprocess/gsm8k.py (parquet), and a GRPO config in the shape of verl's gsm8k
example for 8 GPUs. argv: the output directory."""

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

out = sys.argv[1]
model = os.path.join(out, "Qwen2.5-7B-shaped")
os.makedirs(model, exist_ok=True)

# GPT-2's byte-to-unicode table: byte-level BPE's 256 base symbols.
printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
codes, n = printable[:], 0
for b in range(256):
    if b not in printable:
        printable.append(b)
        codes.append(256 + n)
        n += 1
base = [chr(c) for c in codes]

# 151,643 regular tokens (Qwen2's count): the 256 bytes, then merges of earlier tokens, each
# new token the concatenation of a merge's two parts.
VOCAB = 151_643
vocab, merges, tokens = {}, [], []
for t in base:
    vocab[t] = len(tokens)
    tokens.append(t)
left = 0
while len(tokens) < VOCAB:
    a = tokens[left]
    for b in tokens[:400]:
        t = a + b
        if len(tokens) >= VOCAB:
            break
        if t in vocab or len(t) > 12:
            continue
        vocab[t] = len(tokens)
        tokens.append(t)
        merges.append(f"{a} {b}")
    left += 1
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [
        {"id": VOCAB + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, s in enumerate(specials)
    ],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
}
with open(os.path.join(model, "tokenizer.json"), "w") as f:
    json.dump(tokenizer, f, ensure_ascii=False)
chatml = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "bos_token": None, "model_max_length": 131072, "chat_template": chatml}, f)
config = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "sliding_window": 131072, "max_window_layers": 28, "attention_dropout": 0.0,
}
with open(os.path.join(model, "config.json"), "w") as f:
    json.dump(config, f)
with open(os.path.join(model, "generation_config.json"), "w") as f:
    json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}, f)

data = os.path.join(out, "gsm8k")
os.makedirs(data, exist_ok=True)
instruction = "Let's think step by step and output the final answer after \"####\"."


def row(i, split):
    a, b = 3 + i % 97, 11 + i % 53
    question = f"Natalia sold clips to {a} of her friends in April, and then she sold {b} more clips in May. How many clips did she sell altogether? {instruction}"
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": i, "answer": f"{a} + {b} = {a + b} #### {a + b}", "question": question},
    }


pq.write_table(pa.Table.from_pylist([row(i, "train") for i in range(1000)]), os.path.join(data, "train.parquet"))
pq.write_table(pa.Table.from_pylist([row(i, "test") for i in range(100)]), os.path.join(data, "test.parquet"))

with open(os.path.join(out, "grpo_7b.yaml"), "w") as f:
    f.write(f"""# verl's gsm8k GRPO example for Qwen2.5-7B on one node of 8 GPUs, as a user writes it.
data:
  train_files: {data}/train.parquet
  val_files: {data}/test.parquet
  train_batch_size: 1024
  max_prompt_length: 512
  max_response_length: 1024
  filter_overlong_prompts: true
  truncation: error
actor_rollout_ref:
  model:
    path: {model}
    use_remove_padding: true
    enable_gradient_checkpointing: true
  actor:
    optim:
      lr: 1.0e-6
    ppo_mini_batch_size: 256
    ppo_micro_batch_size_per_gpu: 40
    use_kl_loss: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    entropy_coeff: 0
    fsdp_config:
      param_offload: false
      optimizer_offload: false
  rollout:
    log_prob_micro_batch_size_per_gpu: 40
    tensor_model_parallel_size: 2
    name: vllm
    gpu_memory_utilization: 0.6
    n: 5
  ref:
    log_prob_micro_batch_size_per_gpu: 40
    fsdp_config:
      param_offload: true
algorithm:
  adv_estimator: grpo
  use_kl_in_reward: false
trainer:
  critic_warmup: 0
  logger: [console]
  project_name: verl_grpo_example_gsm8k
  experiment_name: qwen2_7b_function_rm
  n_gpus_per_node: 8
  nnodes: 1
  save_freq: 20
  test_freq: 5
  total_epochs: 15
""")
print(out)

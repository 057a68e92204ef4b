"""Writes what a user smokes before a 7B launch (bench/smoke_7b): a Qwen2.5-7B-shaped model
directory without weights (its config.json and generation config, and a byte-level BPE
tokenizer with Qwen2.5's 151,643-token vocabulary size, its special tokens and ChatML
template: scripts/verl_shapes.py), 1,000 training and 100 test rows in the layout of verl's
examples/data_preprocess/gsm8k.py (parquet), and a GRPO config in the shape of verl's gsm8k
example for 8 GPUs. argv: the output directory."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import verl_shapes  # noqa: E402

out = sys.argv[1]
model = os.path.join(out, "Qwen2.5-7B-shaped")
verl_shapes.write_model(model, "Qwen2.5-7B-Instruct")
data = os.path.join(out, "gsm8k")
verl_shapes.write_data(os.path.join(data, "train.parquet"), "gsm8k", "train", 1000)
verl_shapes.write_data(os.path.join(data, "test.parquet"), "gsm8k", "test", 100)

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

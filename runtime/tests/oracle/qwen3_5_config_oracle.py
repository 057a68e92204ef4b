"""Qwen3.5's multimodal checkpoints' config.json as transformers 5 writes them: the composite
`Qwen3_5Config` / `Qwen3_5MoeConfig` (model_type `qwen3_5` / `qwen3_5_moe`), whose text
model's keys, `vocab_size` among them, are only in `text_config`. argv: `configs` OUT."""

import os
import sys

from transformers import Qwen3_5Config, Qwen3_5MoeConfig


def configs(out):
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16)
    vision = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64)
    Qwen3_5Config(text_config=text, vision_config=vision).save_pretrained(os.path.join(out, "qwen3_5"))
    moe = dict(text, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=32)
    Qwen3_5MoeConfig(text_config=moe, vision_config=vision).save_pretrained(os.path.join(out, "qwen3_5_moe"))


if __name__ == "__main__":
    if sys.argv[1] == "configs":
        configs(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")

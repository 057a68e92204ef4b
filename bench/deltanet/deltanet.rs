//! Benchmark: forward + backward of one Qwen3.5 Gated DeltaNet layer (runtime's
//! `model::gated_deltanet`, chunked form) on a Qwen3.5-shaped layer, CPU, in fp32 or (with
//! `--bf16`) with bf16 weights and activations, as mixed-precision training runs it. Prints
//! `key=value` lines; bench/deltanet/run compares them with transformers' torch path
//! (peer.py) on the same shapes, dtype, tokens and threads.
//!
//! Usage: deltanet [--steps N] [--warmup N] [--threads N] [--bf16]
use std::time::Instant;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use verlc_runtime::model::decoder::{Mixer, Model};
use verlc_runtime::model::{LinearAttentionConfig, ModelSource};

#[path = "../cli.rs"]
mod cli;
use cli::{arg, median};

/// Shared with peer.py.
const HIDDEN: i64 = 1024;
const BATCH: i64 = 4;
const TOKENS: i64 = 512;

fn main() {
    let (steps, warmup, threads) = (arg("--steps", 5), arg("--warmup", 2), arg("--threads", 2));
    tch::set_num_threads(threads as i32);
    // As a verlc trainer runs (the peer is a default PyTorch process; see bench/train_step).
    verlc_runtime::host_alloc::keep_freed_memory();
    let mut cfg = ModelSource::parse("builtin://tiny?arch=qwen3_5&layers=1")
        .and_then(|s| s.config())
        .expect("config");
    cfg.hidden_size = HIDDEN;
    cfg.linear = LinearAttentionConfig {
        layer_types: vec!["linear_attention".into()],
        linear_conv_kernel_dim: 4,
        linear_key_head_dim: 64,
        linear_value_head_dim: 64,
        linear_num_key_heads: 8,
        linear_num_value_heads: 16,
    };
    cfg.validate().expect("valid");
    let kind = if std::env::args().any(|a| a == "--bf16") {
        Kind::BFloat16
    } else {
        Kind::Float
    };
    let mut vs = VarStore::new(Device::Cpu);
    let model = Model::new(&cfg, &vs.root() / "model").expect("model");
    verlc_runtime::model::init::init_weights(&vs, &cfg, 0).expect("init");
    if kind == Kind::BFloat16 {
        vs.bfloat16();
    }
    let Mixer::Linear(layer) = model.layers()[0].mixer() else {
        panic!("layer 0 is not a Gated DeltaNet");
    };
    tch::manual_seed(0);
    let x = Tensor::randn([BATCH, TOKENS, HIDDEN], (kind, Device::Cpu)).set_requires_grad(true);
    let mut times = Vec::new();
    for i in 0..warmup + steps {
        let t = Instant::now();
        let y = layer.forward(&x, None, None);
        y.sum(Kind::Float).backward();
        let dt = t.elapsed().as_secs_f64();
        let _ = x.grad().zero_();
        if i >= warmup {
            times.push(dt);
        }
    }
    println!("threads={}", tch::get_num_threads());
    println!("step_ms={:.3}", median(times) * 1e3);
}

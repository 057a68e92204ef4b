//! Benchmark: forward + backward of one Qwen3-MoE sparse MLP block (runtime's `model::moe`:
//! router, top-k, experts grouped by the tokens routed to them) on the weights and tokens
//! bench/moe_layer/peer.py exported (64 experts, top-8, hidden 512, expert width 256, 4096
//! tokens, fp32). Prints `key=value` lines (the output's checksum for the cross-check).
//!
//! Usage: moe_layer DIR [--steps N] [--warmup N] [--threads N]
use std::time::Instant;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use verlc_runtime::model::decoder::{FeedForward, Model};
use verlc_runtime::model::{ModelSource, MoeConfig};

#[path = "../cli.rs"]
mod cli;
use cli::{arg, median};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: moe_layer DIR");
    let (steps, warmup, threads) = (arg("--steps", 5), arg("--warmup", 2), arg("--threads", 2));
    tch::set_num_threads(threads as i32);
    // As a verlc trainer runs (the peer is a default PyTorch process; see bench/train_step).
    verlc_runtime::host_alloc::keep_freed_memory();
    let tensors: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(format!("{dir}/moe_layer.safetensors"))
            .expect("exported weights")
            .into_iter()
            .collect();
    let x = tensors["x"].unsqueeze(0);
    let hidden = x.size()[2];
    let mut cfg = ModelSource::parse("builtin://tiny?arch=qwen3_moe&layers=1")
        .and_then(|s| s.config())
        .expect("config");
    cfg.hidden_size = hidden;
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = Some(8);
    cfg.moe = MoeConfig {
        num_experts: 64,
        num_experts_per_tok: 8,
        moe_intermediate_size: 256,
        norm_topk_prob: true,
        ..MoeConfig::default()
    };
    cfg.validate().expect("valid");
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&cfg, &vs.root() / "model").expect("model");
    let vars = vs.variables();
    for (name, t) in &tensors {
        if let Some(v) = vars.get(&format!("model.layers.0.{name}")) {
            tch::no_grad(|| v.shallow_clone().copy_(t));
        }
    }
    let FeedForward::Sparse(moe) = model.layers()[0].feed_forward() else {
        panic!("layer 0 is dense");
    };
    let x = x.set_requires_grad(true);
    let mut times = Vec::new();
    for i in 0..warmup + steps {
        let t = Instant::now();
        moe.forward(&x).sum(Kind::Float).backward();
        let dt = t.elapsed().as_secs_f64();
        let _ = x.grad().zero_();
        if i >= warmup {
            times.push(dt);
        }
    }
    let check = tch::no_grad(|| {
        moe.forward(&x)
            .to_kind(Kind::Double)
            .abs()
            .sum(Kind::Double)
    });
    println!("threads={}", tch::get_num_threads());
    println!("checksum={:.6}", check.double_value(&[]));
    println!("step_ms={:.3}", median(times) * 1e3);
}

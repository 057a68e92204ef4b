//! Benchmark: one mixed-precision (bf16 params, fp32 main params) AdamW optimizer step of
//! verlc_runtime::optim on a ~50M-parameter transformer-shaped model, plus the machine's
//! memory-bandwidth floor for that step. Prints `key=value` lines; bench/optim_step/run turns
//! them (and the PyTorch peer's) into the JSON result line.
//!
//! Usage: optim_step [--steps N] [--warmup N] [--threads N]
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use verlc_runtime::ops;
use verlc_runtime::optim::param_groups::{MegatronGroupsConfig, megatron_param_groups};
use verlc_runtime::optim::{Dtype, NamedParam, Optimizer, OptimizerConfig};

#[path = "../cli.rs"]
mod cli;
use cli::{arg, median};

/// Layer shapes shared with peer.py: 4 layers of hidden 1024, ffn 4096 (~50.4M params).
fn shapes() -> Vec<(String, Vec<i64>)> {
    let (h, f, layers) = (1024i64, 4096i64, 4);
    let mut v = Vec::new();
    for l in 0..layers {
        let p = format!("layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![h]));
        v.push((format!("{p}.attn.qkv.weight"), vec![3 * h, h]));
        v.push((format!("{p}.attn.qkv.bias"), vec![3 * h]));
        v.push((format!("{p}.attn.proj.weight"), vec![h, h]));
        v.push((format!("{p}.attn.proj.bias"), vec![h]));
        v.push((format!("{p}.post_layernorm.weight"), vec![h]));
        v.push((format!("{p}.mlp.up.weight"), vec![f, h]));
        v.push((format!("{p}.mlp.up.bias"), vec![f]));
        v.push((format!("{p}.mlp.down.weight"), vec![h, f]));
        v.push((format!("{p}.mlp.down.bias"), vec![h]));
    }
    v
}

/// Best-of-5 bandwidth of a 256 MiB fp32 copy (read + write), in bytes per second.
fn copy_bandwidth() -> f64 {
    let n = 64 * 1024 * 1024;
    let src = Tensor::ones([n], (Kind::Float, Device::Cpu));
    let mut dst = Tensor::zeros([n], (Kind::Float, Device::Cpu));
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_(&src);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (2 * 4 * n) as f64 / best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps = arg("--steps", 10);
    let warmup = arg("--warmup", 3);
    let threads = arg("--threads", 0);
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
    tch::manual_seed(0);
    let mut params = Vec::new();
    let mut grads = Vec::new();
    for (name, shape) in shapes() {
        let t = (Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)) * 0.02)
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        grads.push(
            (Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)) * 1e-3)
                .to_kind(Kind::BFloat16),
        );
        params.push(NamedParam::new(name, t));
    }
    let model: Vec<Tensor> = params.iter().map(|p| p.tensor.shallow_clone()).collect();
    let numel: i64 = model.iter().map(|t| t.numel() as i64).sum();
    let cfg = MegatronGroupsConfig {
        lr: 1e-4,
        min_lr: 0.0,
        weight_decay: 0.1,
        decoupled_lr: None,
        decoupled_min_lr: None,
        apply_wd_to_qk_layernorm: false,
    };
    let groups = megatron_param_groups(params, &cfg);
    let mut opt = Optimizer::new(groups, OptimizerConfig::megatron(Dtype::Bf16))?;
    let mut times = Vec::new();
    for i in 0..warmup + steps {
        for (p, g) in model.iter().zip(&grads) {
            ops::set_grad(p, Some(g))?;
        }
        let t = Instant::now();
        let out = opt.step(None)?;
        let dt = t.elapsed().as_secs_f64();
        if !out.update_successful {
            return Err("step was skipped".into());
        }
        if i >= warmup {
            times.push(dt);
        }
    }
    if std::env::var_os("OPTIM_STEP_PROFILE").is_some() {
        use verlc_runtime::optim::clip::NormType;
        for _ in 0..3 {
            for (p, g) in model.iter().zip(&grads) {
                ops::set_grad(p, Some(g))?;
            }
            let t0 = Instant::now();
            opt.prepare_grads(None)?;
            let t1 = Instant::now();
            let n = opt.grad_norm(NormType::L2, None)?;
            let t2 = Instant::now();
            opt.step_with_ready_grads()?;
            let t3 = Instant::now();
            eprintln!(
                "profile: copy grads {:.1} ms, norm {:.1} ms ({n:.3}), adam + copy back {:.1} ms",
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3,
                (t3 - t2).as_secs_f64() * 1e3
            );
        }
    }
    let bw = copy_bandwidth();
    // Bytes a fully fused step must move per param: read the bf16 grad (2), read and write
    // the fp32 main param, exp_avg and exp_avg_sq (24), write the bf16 param (2).
    let floor = 28.0 * numel as f64 / bw;
    println!("params={numel}");
    println!("threads={}", tch::get_num_threads());
    println!("step_ms={:.3}", median(times) * 1e3);
    println!("bandwidth_gbps={:.2}", bw / 1e9);
    println!("floor_ms={:.3}", floor * 1e3);
    Ok(())
}

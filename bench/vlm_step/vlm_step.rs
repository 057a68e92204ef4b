//! Benchmark: forward + backward of a Qwen2.5-VL batch (runtime's `CausalLm` with its vision
//! tower: windowed and full attention over the patches, the merger, the tower's embeddings in
//! the image placeholders, the text model under M-RoPE) on the checkpoint and batch
//! bench/vlm_step/peer.py exported (four 448 x 448 images, 1,024 patches each, in prompts of
//! 322 tokens; fp32). The loss is the mean next-token negative log-likelihood, as the peer's.
//! Prints `key=value` lines (the loss for the cross-check).
//!
//! Usage: vlm_step DIR [--steps N] [--warmup N] [--threads N] [--tower: the tower alone]
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::{Dtype, from_pretrained};

#[path = "../cli.rs"]
mod cli;
use cli::{arg, median};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: vlm_step DIR");
    let (steps, warmup, threads) = (arg("--steps", 3), arg("--warmup", 1), arg("--threads", 2));
    tch::set_num_threads(threads as i32);
    // As a verlc trainer runs (the peer is a default PyTorch process; see bench/train_step).
    verlc_runtime::host_alloc::keep_freed_memory();
    let m = from_pretrained(&dir, Device::Cpu, Dtype::Fp32, 0).expect("exported checkpoint");
    assert!(m.model.vision.is_some(), "a vision-language checkpoint");
    let x: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(format!("{dir}/batch.safetensors"))
            .expect("exported batch")
            .into_iter()
            .collect();
    let ids = &x["input_ids"];
    let grids: Vec<Vec<i64>> = Vec::try_from(&x["image_grid_thw"]).expect("grids");
    let grids: Vec<[i64; 3]> = grids.iter().map(|g| [g[0], g[1], g[2]]).collect();
    let t = ids.size()[1];
    if std::env::args().any(|a| a == "--tower") {
        // The vision tower alone, forward and backward apart (where a step's time goes).
        let tower = &m.model.vision.as_ref().expect("vision").tower;
        for _ in 0..warmup + steps {
            let start = Instant::now();
            let e = tower
                .forward(&x["pixel_values"], &grids)
                .expect("tower")
                .embeds;
            let fwd = start.elapsed().as_secs_f64();
            e.sum(Kind::Float).backward();
            let bwd = start.elapsed().as_secs_f64() - fwd;
            println!(
                "tower_fwd_ms={:.1} tower_bwd_ms={:.1}",
                fwd * 1e3,
                bwd * 1e3
            );
        }
        return;
    }
    let mut times = Vec::new();
    let mut loss = 0.0;
    for i in 0..warmup + steps {
        let start = Instant::now();
        let logits = m
            .model
            .forward_pixels(ids, &x["attention_mask"], &x["pixel_values"], &grids)
            .expect("forward");
        let lp = logits
            .narrow(1, 0, t - 1)
            .log_softmax(-1, Kind::Float)
            .gather(-1, &ids.narrow(1, 1, t - 1).unsqueeze(-1), false);
        let l = -lp.mean(Kind::Float);
        l.backward();
        let dt = start.elapsed().as_secs_f64();
        loss = l.double_value(&[]);
        m.vs.variables().values().for_each(|v| {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        });
        if i >= warmup {
            times.push(dt);
        }
    }
    println!("threads={threads}");
    println!("loss={loss:.6}");
    println!("step_ms={:.3}", median(times) * 1e3);
}

//! Benchmark: one actor update of runtime's single engine (forward, backward, clip, AdamW) on
//! a Hugging Face checkpoint and a batch written by bench/train_step/bench.py, which runs the
//! same update in PyTorch eager with transformers. Prints one JSON line: the per-step wall
//! times and, for the parity check, the first step's loss and grad norm.
//!
//! Usage: train_step MODEL_DIR BATCH.safetensors MICRO_BATCH STEPS THREADS [PACKED]
//! (PACKED 1: `use_remove_padding`, the micro-batches run without their padding).
use std::collections::HashMap;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use verlc_runtime::engine::{
    Batch, Engine, EngineSettings, ForwardOptions, MicroLoss, OptimSettings, SchedulerSettings,
    SingleEngine,
};
use verlc_runtime::model::{CausalLm, Dtype};
use verlc_runtime::optim::sched::{VerlSchedule, VerlSchedulerConfig};
use verlc_runtime::optim::{AdamWConfig, InnerConfig, LossScaling};

type Error = Box<dyn std::error::Error>;

fn arg(i: usize) -> Result<String, Error> {
    std::env::args()
        .nth(i)
        .ok_or_else(|| "usage: train_step MODEL_DIR BATCH MICRO STEPS THREADS".into())
}

fn main() -> Result<(), Error> {
    let (model, batch_file) = (arg(1)?, arg(2)?);
    let micro: usize = arg(3)?.parse()?;
    let steps: usize = arg(4)?.parse()?;
    let threads: i32 = arg(5)?.parse()?;
    let packed = std::env::args().nth(6).is_some_and(|a| a == "1");
    tch::set_num_threads(threads);
    // What a verlc trainer does at start-up (verlc_runtime::host_alloc).
    verlc_runtime::host_alloc::keep_freed_memory();
    let tensors: HashMap<String, Tensor> =
        Tensor::read_safetensors(&batch_file)?.into_iter().collect();
    let get = |k: &str| {
        tensors
            .get(k)
            .map(Tensor::shallow_clone)
            .ok_or_else(|| format!("{batch_file} has no `{k}`"))
    };
    let mut batch = Batch::new();
    for k in ["input_ids", "attention_mask", "position_ids", "responses"] {
        batch.insert(k, get(k)?.to_kind(Kind::Int64))?;
    }
    batch.insert("response_mask", get("response_mask")?.to_kind(Kind::Float))?;
    batch.insert("advantages", get("advantages")?.to_kind(Kind::Float))?;

    let mut engine = SingleEngine::<CausalLm>::new(EngineSettings {
        model_path: model,
        device: Device::Cpu,
        param_dtype: Dtype::Fp32,
        main_dtype: Dtype::Fp32,
        seed: 0,
        optim: Some(OptimSettings {
            freeze_vision_tower: false,
            inner: InnerConfig::AdamW(AdamWConfig::default()),
            lr: 1e-4,
            weight_decay: 0.01,
            clip_grad: 1.0,
            offload: false,
            offload_fraction: 0.0,
            schedule: SchedulerSettings::Verl(VerlSchedulerConfig {
                schedule: VerlSchedule::Constant,
                lr_warmup_steps: 0,
                lr_warmup_steps_ratio: 0.0,
                total_training_steps: steps as i64,
                zero_indexed_step: true,
            }),
        }),
        loss_scale_factor: None,
        loss_scaling: LossScaling::NONE,
        lora: None,
        config_overrides: Default::default(),
        remove_padding: packed,
    })?;
    let fwd = ForwardOptions::default();
    let mut times = Vec::new();
    let (mut first_loss, mut first_norm) = (None, None);
    for _ in 0..steps {
        let start = Instant::now();
        engine.optimizer_zero_grad()?;
        // The policy-gradient surrogate `-(A · log π)`, token-mean over the whole batch.
        let mut loss_sum = 0.0;
        let metrics =
            engine.forward_backward(&batch, &micro.into(), &fwd, &mut |mb: &Batch, out, agg| {
                let mask = mb.get("response_mask")?;
                let tokens = agg.batch_num_tokens.unwrap_or(1.0);
                let loss = (out.log_probs * mb.get("advantages")? * mask)
                    .sum(Kind::Float)
                    .neg()
                    / tokens;
                Ok(MicroLoss {
                    metrics: [("loss".to_owned(), loss.double_value(&[]))].into(),
                    loss,
                })
            })?;
        loss_sum += metrics.iter().map(|m| m["loss"]).sum::<f64>();
        let step = engine.optimizer_step()?;
        times.push(start.elapsed().as_secs_f64());
        first_loss.get_or_insert(loss_sum);
        first_norm.get_or_insert(step.grad_norm.unwrap_or(f64::NAN));
    }
    println!(
        "{}",
        serde_json::json!({
            "times": times,
            "loss": first_loss,
            "grad_norm": first_norm,
            "threads": tch::get_num_threads(),
        })
    );
    Ok(())
}

//! Benchmark driver for bench/rollout_generate: times `verlc_runtime::rollout::generate` on a
//! checkpoint directory. Usage:
//!   rollout_generate MODEL_DIR PROMPTS_JSON MAX_NEW_TOKENS THREADS REPS [N]
//! PROMPTS_JSON is a list of token-id lists; N samples per prompt (default 1, sharing the
//! prompt's prefill as a trainer's rollout does). Sampling at temperature 1 (no
//! top-k/top-p), EOS ignored so every row generates MAX_NEW_TOKENS. Prints one JSON line with the wall
//! times of each repetition (after one warm-up run).

use std::time::Instant;

use verlc_runtime::model::{Dtype, from_pretrained};
use verlc_runtime::rollout::{SamplingParams, StopTokens, generate};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if !(6..=7).contains(&args.len()) {
        return Err(
            "usage: rollout_generate MODEL_DIR PROMPTS_JSON MAX_NEW_TOKENS THREADS REPS [N]".into(),
        );
    }
    let n: usize = args.get(6).map_or(Ok(1), |s| s.parse())?;
    let prompts: Vec<Vec<i64>> = serde_json::from_str(&std::fs::read_to_string(&args[2])?)?;
    let max_new: usize = args[3].parse()?;
    let threads: i32 = args[4].parse()?;
    let reps: usize = args[5].parse()?;
    tch::set_num_threads(threads);
    let model = from_pretrained(&args[1], tch::Device::Cpu, Dtype::Fp32, 0)?.model;
    let stop = StopTokens {
        eos: vec![],
        pad: 0,
    };
    let mut times = Vec::new();
    let mut tokens = 0;
    for rep in 0..=reps {
        let params = SamplingParams {
            max_new_tokens: max_new,
            n,
            seed: rep as u64,
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let t = Instant::now();
        let out = generate(&model, &prompts, &params, &stop)?;
        let secs = t.elapsed().as_secs_f64();
        tokens = out.response_lengths.iter().sum::<usize>();
        if rep > 0 {
            times.push(secs);
        }
    }
    println!(
        "{}",
        serde_json::json!({"times": times, "tokens": tokens, "threads": tch::get_num_threads()})
    );
    Ok(())
}

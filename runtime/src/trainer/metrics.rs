//! verl's step metrics (docs/training-loop.md): data metrics
//! (`compute_data_metrics`), timing (`timing_s/*`, `timing_per_token_ms/*`), throughput
//! (`perf/*`) and validation (`val-core/…`, `val-aux/…`).

use std::collections::BTreeMap;
use std::time::Instant;

use tch::{Kind, Tensor};

use crate::engine::{Batch, Metrics};

use super::TrainerError;

/// Named timers of one step (verl's `marked_timer`).
#[derive(Debug, Default)]
pub struct Timers(pub BTreeMap<String, f64>);

impl Timers {
    /// Runs `f` and adds its wall time to timer `name`.
    pub fn time<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        *self.0.entry(name.to_owned()).or_insert(0.0) += start.elapsed().as_secs_f64();
        out
    }

    pub fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }
}

/// `{prefix}/mean`, `/max` and `/min` of `values` (an empty list: mean 0, max and min NaN).
pub(crate) fn stats(prefix: &str, values: &[f64], out: &mut Metrics) {
    let (mut mean, mut max, mut min) = (0.0, f64::NAN, f64::NAN);
    if !values.is_empty() {
        mean = values.iter().sum::<f64>() / values.len() as f64;
        max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        min = values.iter().copied().fold(f64::INFINITY, f64::min);
    }
    out.insert(format!("{prefix}/mean"), mean);
    out.insert(format!("{prefix}/max"), max);
    out.insert(format!("{prefix}/min"), min);
}

fn to_vec(t: &Tensor) -> Result<Vec<f64>, TrainerError> {
    Ok(Vec::<f64>::try_from(
        t.f_to_kind(Kind::Double)?.f_flatten(0, -1)?,
    )?)
}

fn masked_values(t: &Tensor, mask: &Tensor) -> Result<Vec<f64>, TrainerError> {
    to_vec(&t.f_masked_select(&mask.f_to_kind(Kind::Bool)?)?)
}

/// Unbiased variance (torch.var's default).
fn var(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return f64::NAN;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
}

/// The batch column of each row's `num_turns` (the tool agent loop's; verl's `__num_turns__`).
pub const NUM_TURNS: &str = "__num_turns__";
/// The batch columns of each row's tool calls and failed calls (the tool agent loop's).
pub const TOOL_CALLS: &str = "__tool_calls__";
pub const TOOL_FAILURES: &str = "__tool_failures__";

/// verl's `compute_data_metrics`.
/// `max_prompt_length` is `data.max_prompt_length`: verl pads every prompt to it, so its
/// `prompt_length/clip_ratio` is the share of prompts that reach the limit; verlc pads a batch
/// only to its longest prompt and measures against the limit itself.
pub fn data_metrics(
    batch: &Batch,
    use_critic: bool,
    max_prompt_length: usize,
) -> Result<Metrics, TrainerError> {
    let mut m = Metrics::new();
    let mask = batch.get("response_mask")?;
    let scores = to_vec(&batch.get("token_level_scores")?.f_sum_dim_intlist(
        -1i64,
        false,
        Kind::Double,
    )?)?;
    let rewards = to_vec(&batch.get("token_level_rewards")?.f_sum_dim_intlist(
        -1i64,
        false,
        Kind::Double,
    )?)?;
    stats("critic/score", &scores, &mut m);
    stats("critic/rewards", &rewards, &mut m);
    stats(
        "critic/advantages",
        &masked_values(batch.get("advantages")?, mask)?,
        &mut m,
    );
    let returns = masked_values(batch.get("returns")?, mask)?;
    stats("critic/returns", &returns, &mut m);
    if use_critic {
        let values = masked_values(batch.get("values")?, mask)?;
        stats("critic/values", &values, &mut m);
        let diff: Vec<f64> = returns.iter().zip(&values).map(|(r, v)| r - v).collect();
        m.insert(
            "critic/vf_explained_var".into(),
            1.0 - var(&diff) / (var(&returns) + 1e-5),
        );
    }
    let response_len = batch.get("responses")?.size()[1] as f64;
    // Lengths count every response token the model attends (verl reads the attention mask):
    // with tool rounds, the tool tokens too, which the response mask leaves out of the loss.
    let attn = batch.get("attention_mask")?;
    let responses_attended =
        attn.f_narrow(1, attn.size()[1] - response_len as i64, response_len as i64)?;
    let lengths = to_vec(&responses_attended.f_sum_dim_intlist(-1i64, false, Kind::Double)?)?;
    stats("response_length", &lengths, &mut m);
    let clip = |ls: &[f64], max: f64| {
        ls.iter().filter(|&&l| l == max).count() as f64 / ls.len().max(1) as f64
    };
    m.insert(
        "response_length/clip_ratio".into(),
        clip(&lengths, response_len),
    );
    let kept: Vec<f64> = lengths.iter().copied().filter(|&l| l > 0.0).collect();
    stats("response_length_non_aborted", &kept, &mut m);
    m.insert(
        "response_length_non_aborted/clip_ratio".into(),
        clip(&kept, response_len),
    );
    m.insert(
        "response/aborted_ratio".into(),
        1.0 - kept.len() as f64 / lengths.len().max(1) as f64,
    );
    if let Some(turns) = batch.opt(NUM_TURNS) {
        stats("num_turns", &to_vec(turns)?, &mut m);
    }
    // Tool use: calls per sample, the share of samples that called, and the share of calls
    // that failed (unknown tool, bad arguments, an exception, a timeout, a crash).
    if let (Some(calls), Some(failures)) = (batch.opt(TOOL_CALLS), batch.opt(TOOL_FAILURES)) {
        let (calls, failures) = (to_vec(calls)?, to_vec(failures)?);
        stats("tool_calls", &calls, &mut m);
        let callers = calls.iter().filter(|&&c| c > 0.0).count();
        m.insert(
            "tool_calls/sample_ratio".into(),
            callers as f64 / calls.len().max(1) as f64,
        );
        let total: f64 = calls.iter().sum();
        m.insert(
            "tool_calls/failure_ratio".into(),
            if total > 0.0 {
                failures.iter().sum::<f64>() / total
            } else {
                0.0
            },
        );
    }
    let total = attn.size()[1];
    let prompt_width = total - response_len as i64;
    let prompt_lengths = to_vec(&attn.f_narrow(1, 0, prompt_width)?.f_sum_dim_intlist(
        -1i64,
        false,
        Kind::Double,
    )?)?;
    stats("prompt_length", &prompt_lengths, &mut m);
    m.insert(
        "prompt_length/clip_ratio".into(),
        clip(&prompt_lengths, max_prompt_length as f64),
    );
    Ok(m)
}

/// `timing_s/*` and `timing_per_token_ms/*` (response tokens for `gen`, all tokens otherwise).
pub fn timing_metrics(timers: &Timers, batch: &Batch) -> Result<Metrics, TrainerError> {
    let mut m = Metrics::new();
    let response_tokens = batch.num_tokens()?;
    let all_tokens = batch
        .get("attention_mask")?
        .f_sum(Kind::Double)?
        .f_double_value(&[])?;
    for (name, secs) in &timers.0 {
        m.insert(format!("timing_s/{name}"), *secs);
    }
    for name in [
        "gen",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
    ] {
        if let Some(secs) = timers.0.get(name) {
            let tokens = if name == "gen" {
                response_tokens
            } else {
                all_tokens
            };
            m.insert(
                format!("timing_per_token_ms/{name}"),
                secs * 1000.0 / tokens.max(1.0),
            );
        }
    }
    Ok(m)
}

/// `perf/total_num_tokens`, `perf/time_per_step`, `perf/throughput`.
pub fn throughput_metrics(
    timers: &Timers,
    batch: &Batch,
    n_gpus: usize,
) -> Result<Metrics, TrainerError> {
    let tokens = batch
        .get("attention_mask")?
        .f_sum(Kind::Double)?
        .f_double_value(&[])?;
    let time = timers.get("step");
    let mut m = Metrics::new();
    m.insert("perf/total_num_tokens".into(), tokens);
    m.insert("perf/time_per_step".into(), time);
    m.insert(
        "perf/throughput".into(),
        tokens / (time.max(1e-9) * n_gpus.max(1) as f64),
    );
    Ok(m)
}

/// One scored validation response.
#[derive(Debug, Clone)]
pub struct ValRecord {
    pub data_source: String,
    /// The prompt's index in the validation set (groups the `n` samples).
    pub prompt: usize,
    /// `reward` plus the numeric extra outputs of the scorer (e.g. `acc`).
    pub vars: BTreeMap<String, f64>,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn std_pop(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
}

/// verl's `process_validation_metrics`, without its bootstrap: per data source and variable,
/// `mean@n` (mean over prompts of the mean over their `n` responses) and, for `n > 1`,
/// `std@n`, `best@n/mean` and `worst@n/mean` (the exact best/worst of the `n` responses).
/// The core variable (`acc` if the scorer returns it, else `reward`) is logged as
/// `val-core/<source>/<var>/<metric>`, everything else as `val-aux/…`.
pub fn validation_metrics(records: &[ValRecord], n: usize) -> Metrics {
    // source -> var -> prompt -> values
    let mut groups: BTreeMap<&str, BTreeMap<&str, BTreeMap<usize, Vec<f64>>>> = BTreeMap::new();
    for r in records {
        for (var, v) in &r.vars {
            groups
                .entry(&r.data_source)
                .or_default()
                .entry(var)
                .or_default()
                .entry(r.prompt)
                .or_default()
                .push(*v);
        }
    }
    let mut m = Metrics::new();
    for (source, vars) in &groups {
        let core = if vars.contains_key("acc") {
            "acc"
        } else {
            "reward"
        };
        for (var, prompts) in vars {
            let per: Vec<&Vec<f64>> = prompts.values().collect();
            let mut entries = vec![(
                format!("mean@{n}"),
                mean(&per.iter().map(|v| mean(v)).collect::<Vec<_>>()),
            )];
            if n > 1 {
                entries.push((
                    format!("std@{n}"),
                    mean(&per.iter().map(|v| std_pop(v)).collect::<Vec<_>>()),
                ));
                let best: Vec<f64> = per
                    .iter()
                    .map(|v| v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                    .collect();
                let worst: Vec<f64> = per
                    .iter()
                    .map(|v| v.iter().copied().fold(f64::INFINITY, f64::min))
                    .collect();
                entries.push((format!("best@{n}/mean"), mean(&best)));
                entries.push((format!("worst@{n}/mean"), mean(&worst)));
            }
            for (name, value) in entries {
                let is_core =
                    *var == core && (name.starts_with("mean@") || name.starts_with("best@"));
                let prefix = if is_core { "val-core" } else { "val-aux" };
                m.insert(format!("{prefix}/{source}/{var}/{name}"), value);
            }
        }
    }
    m
}

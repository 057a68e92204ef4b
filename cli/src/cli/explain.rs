//! `verlc explain`: derived batch arithmetic and a per-rank memory estimate.

use std::fmt::Write as _;

use verlc_front::check::{CheckOptions, check};
use verlc_front::explain::{Explanation, MemoryBreakdown, MemoryEstimate, RoleBatch, explain, gib};
use verlc_front::rules::ModelDims;

use super::EXIT_ERRORS;
use super::args::{ExplainArgs, Format};
use super::output::{exit_status, usage_error};
use verlc_front::codes;
use verlc_front::render;

pub fn run(a: ExplainArgs) -> u8 {
    let json = a.format == Format::Json;
    let req = match a.config.request() {
        Ok(r) => r,
        Err(msg) => return usage_error(json, &msg),
    };
    let checked = check(
        &req,
        &CheckOptions {
            model_config: a.model_config.clone(),
            only: Vec::new(),
        },
    );
    let report_failure = |extra: &str| {
        if json {
            println!("{}", render::json_checked(&checked));
        } else {
            let color = super::output::stderr_color();
            eprint!("{}", render::human_checked(&checked, color));
            eprintln!("{extra}");
        }
    };
    if let Some(sft) = checked.sft.as_ref() {
        let dims = checked.model.clone().or_else(|| dims_from_flags(&a));
        return explain_sft(sft, &checked, dims.as_ref(), json);
    }
    let Some(cfg) = checked.config.as_ref() else {
        report_failure("explain needs a config that passes the schema; fix the errors above");
        return exit_status(&checked.diagnostics).max(EXIT_ERRORS);
    };
    // A model config.json that cannot be used is an error, not a silent "no model".
    if exit_status(&checked.diagnostics) == super::EXIT_USAGE
        || checked
            .diagnostics
            .iter()
            .any(|d| d.is_error() && d.code == codes::MODEL_CONFIG_UNUSABLE)
    {
        report_failure("explain needs the model's config.json to be usable; fix the errors above");
        return exit_status(&checked.diagnostics);
    }
    let dims = checked.model.clone().or_else(|| dims_from_flags(&a));
    let e = match explain(cfg, dims.as_ref()) {
        Ok(e) => e,
        Err(overflow) => {
            let msg = format!("{overflow}; check the config's sizes");
            if json {
                let d = verlc_front::diag::Diagnostic::error(codes::SIZE_OVERFLOW, msg);
                println!("{}", render::json(&[d], &checked.composed.sources));
            } else {
                eprintln!("error[{}]: {msg}", codes::SIZE_OVERFLOW);
            }
            return EXIT_ERRORS;
        }
    };
    let mut value = serde_json::to_value(&e).unwrap_or_default();
    let mut text = human(&e);
    if let Some(size) = a.gpu_memory {
        if !(size.is_finite() && size > 0.0) {
            return usage_error(
                json,
                &format!("--gpu-memory must be a positive number of GiB, got {size}"),
            );
        }
        let bytes = (size * (1u64 << 30) as f64) as u64;
        let fit = if e.memory.is_none() {
            "no memory estimate without the model's config.json".to_owned()
        } else {
            match verlc_front::explain::device_shortfall(cfg, &e, bytes) {
                Some(short) => {
                    if let Some(m) = value.as_object_mut() {
                        m.insert(
                            "gpu_shortfall".into(),
                            serde_json::to_value(&short).unwrap_or_default(),
                        );
                    }
                    format!("does not fit: {short}")
                }
                None => format!("fits (every trained role's estimate is at most {size} GiB)"),
            }
        };
        if let Some(m) = value.as_object_mut() {
            m.insert("gpu_memory_gib".into(), size.into());
        }
        let _ = writeln!(text, "\nGPU of {size} GiB: {fit}");
    }
    print_explanation(&checked, json, value, text)
}

/// The arithmetic of an SFT config (verl's SFT trainer).
fn explain_sft(
    sft: &verlc_front::sft::SftConfig,
    checked: &verlc_front::check::Checked,
    dims: Option<&ModelDims>,
    json: bool,
) -> u8 {
    let e = verlc_front::sft::explain::explain(sft, dims);
    let mut text = verlc_front::sft::explain::human(&e);
    if let Some(m) = &e.memory {
        memory_table(&mut text, "model", m);
    }
    for n in &e.notes {
        let _ = writeln!(text, "\nnote: {n}");
    }
    print_explanation(
        checked,
        json,
        serde_json::to_value(&e).unwrap_or_default(),
        text,
    )
}

/// Prints an explanation (`value` as JSON, or `text` after the release line), secrets
/// redacted, and notes the check's errors.
fn print_explanation(
    checked: &verlc_front::check::Checked,
    json: bool,
    mut value: serde_json::Value,
    text: String,
) -> u8 {
    let secrets = checked.composed.secrets();
    if json {
        if let Some(m) = value.as_object_mut() {
            m.insert("release".into(), checked.release.clone().into());
        }
        secrets.redact_json(&mut value);
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        let release = format!("verl release               {}\n", checked.release);
        print!("{}", secrets.redact(&(release + &text)));
    }
    if checked.has_errors() {
        eprintln!(
            "note: `verlc check` reports {} error(s) for this config",
            checked.diagnostics.iter().filter(|d| d.is_error()).count()
        );
    }
    0
}

fn dims_from_flags(a: &ExplainArgs) -> Option<ModelDims> {
    Some(ModelDims {
        hidden_size: a.hidden_size?,
        num_attention_heads: a.num_heads?,
        num_key_value_heads: a.num_kv_heads,
        num_hidden_layers: a.num_layers?,
        vocab_size: a.vocab_size?,
        intermediate_size: a.intermediate_size,
        tie_word_embeddings: None,
        head_dim: None,
        model_type: None,
        max_position_embeddings: None,
        attention_bias: None,
        moe: Default::default(),
        linear: Default::default(),
        vision_config: None,
    })
}

fn human(e: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "world size                 {}", e.world_size);
    let _ = writeln!(
        s,
        "responses per step         {}  (train_batch_size × rollout.n)",
        e.responses_per_step
    );
    let _ = writeln!(
        s,
        "tokens per step (max)      {}  (responses × (max_prompt_length + max_response_length))",
        e.tokens_per_step_max
    );
    role(&mut s, &e.actor);
    if let Some(c) = &e.critic {
        role(&mut s, c);
    }
    if let Some(t) = e.training_steps {
        let _ = writeln!(s, "\ntraining steps             {t}");
    }
    if let Some(t) = e.optimizer_steps_total {
        let _ = writeln!(s, "optimizer steps (actor)    {t}");
    }
    if let Some(m) = &e.memory {
        memory_table(&mut s, "actor", m);
    }
    if let Some(m) = &e.critic_memory {
        memory_table(&mut s, "critic", m);
    }
    for n in &e.notes {
        let _ = writeln!(s, "\nnote: {n}");
    }
    s
}

fn memory_table(s: &mut String, role: &str, m: &MemoryEstimate) {
    let active = m.active_params.map_or(String::new(), |a| {
        format!(", {:.2}B active per token", a as f64 / 1e9)
    });
    let _ = writeln!(
        s,
        "\n{role} memory per rank (estimate, {:.2}B params{active})",
        m.params as f64 / 1e9
    );
    let _ = writeln!(s, "  {:<14}{:>12}{:>12}", "", "device GiB", "host GiB");
    let row = |s: &mut String, name: &str, f: fn(&MemoryBreakdown) -> u64| {
        let _ = writeln!(
            s,
            "  {:<14}{:>12.2}{:>12.2}",
            name,
            gib(f(&m.device)),
            gib(f(&m.host))
        );
    };
    row(s, "params", |b| b.params_bytes);
    row(s, "grads", |b| b.grads_bytes);
    row(s, "optimizer", |b| b.optimizer_bytes);
    row(s, "activations", |b| b.activations_bytes);
    if m.device.reference_bytes + m.host.reference_bytes > 0 {
        row(s, "reference", |b| b.reference_bytes);
    }
    row(s, "total", MemoryBreakdown::total);
    for a in &m.assumptions {
        let _ = writeln!(s, "  - {a}");
    }
}

fn role(s: &mut String, r: &RoleBatch) {
    let _ = writeln!(
        s,
        "\n{} ({}, data-parallel size {})",
        r.role, r.strategy, r.dp_size
    );
    let _ = writeln!(
        s,
        "  mini-batch                {} responses ({} per rank)",
        r.mini_batch_responses,
        fmt_num(r.mini_batch_per_rank)
    );
    match (r.micro_batch_per_rank, r.dynamic_token_budget) {
        (_, Some(b)) => {
            let _ = writeln!(
                s,
                "  micro-batch               dynamic, {b} tokens per rank"
            );
        }
        (Some(m), None) => {
            let _ = writeln!(s, "  micro-batch               {m} responses per rank");
        }
        (None, None) => {
            let _ = writeln!(s, "  micro-batch               not set");
        }
    }
    if let Some(g) = r.grad_accum_steps {
        let _ = writeln!(
            s,
            "  gradient accumulation     {}{}",
            fmt_num(g),
            if g.fract() != 0.0 {
                "  (not an integer: verl rejects this)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(
        s,
        "  mini-batches per epoch    {}",
        fmt_num(r.mini_batches_per_epoch)
    );
    let _ = writeln!(
        s,
        "  optimizer steps / step    {}  (ppo_epochs {} × mini-batches)",
        fmt_num(r.optimizer_steps_per_iteration),
        r.ppo_epochs
    );
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{}", x as i64)
    } else {
        format!("{x:.2}")
    }
}

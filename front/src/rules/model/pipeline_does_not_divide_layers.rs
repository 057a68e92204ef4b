//! ## What it checks
//! A Megatron actor (or critic, when it runs) whose `pipeline_model_parallel_size` does not
//! divide the model's `num_hidden_layers`, unless `override_transformer_config` sets the
//! layers of the first or last stage (Megatron's uneven pipeline split). With
//! `account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split` the
//! embedding and the loss count as a layer each, so it is the layers plus those that must
//! divide. Needs the model's `config.json`.
//!
//! ## Why
//! Megatron gives every pipeline stage the same number of decoder layers and asserts that
//! the layer count (plus the embedding and loss where they are accounted for as layers) divides
//! by the pipeline size when it builds the model, after the cluster has started.
//!
//! ## Example
//! ```yaml
//! # a 28-layer model (Qwen2.5-7B)
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     megatron:
//!       pipeline_model_parallel_size: 3
//! ```
//!
//! ## Fix
//! Use a pipeline size that divides the layer count (2, 4, 7 or 14 for 28 layers), or give
//! the first and last stages their own layer counts with
//! `override_transformer_config.num_layers_in_first_pipeline_stage` /
//! `num_layers_in_last_pipeline_stage`.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{divisors, megatron_roles};

const CODE: Code = Code("V205");

/// The options that count the embedding (first stage) and the loss (last stage) as a layer.
const ACCOUNTED: [(&str, &str); 2] = [
    ("account_for_embedding_in_pipeline_split", "embedding"),
    ("account_for_loss_in_pipeline_split", "loss"),
];

const UNEVEN: [&str; 2] = [
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(model) = ctx.model else { return };
    let Ok(layers) = i64::try_from(model.num_hidden_layers) else {
        return;
    };
    if layers <= 0 {
        return;
    }
    let c = ctx.config;
    let roles = megatron_roles(c);
    for (prefix, m) in roles {
        let pp = m.pipeline_model_parallel_size;
        let uneven = UNEVEN.iter().any(|k| {
            m.override_transformer_config
                .get(*k)
                .is_some_and(|v| !v.is_null())
        });
        // Megatron-core counts the embedding and the loss as a layer each where asked to.
        let counted: Vec<&str> = ACCOUNTED
            .iter()
            .filter(|(k, _)| {
                m.override_transformer_config
                    .get(*k)
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false)
            })
            .map(|(_, what)| *what)
            .collect();
        let total = layers + counted.len() as i64;
        if pp <= 1 || total % pp == 0 || uneven {
            continue;
        }
        let plus = if counted.is_empty() {
            String::new()
        } else {
            format!(" plus the {} counted as layers", counted.join(" and "))
        };
        let key = format!("{prefix}.pipeline_model_parallel_size");
        let fits: Vec<String> = divisors(total)
            .into_iter()
            .filter(|d| *d > 1)
            .map(|d| d.to_string())
            .collect();
        out.push(
            Diagnostic::error(
                CODE,
                format!("pipeline parallel size {pp} does not divide the model's {layers} decoder layers{plus}"),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("{pp} pipeline stages"))
            .with_help(format!(
                "use a size that divides {total} ({}), or set `{prefix}.override_transformer_config.num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`",
                fits.join(", ")
            )),
        );
    }
}

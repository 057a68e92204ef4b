//! Reporting the verdicts ([`super::verdicts`]) of the keys a user changed: `B00x` warnings
//! for keys a verlc trainer does not read, `B018` errors for values it cannot honour.
//!
//! A key is reported when the user changed it: its value differs from verlc's built-in
//! default of the same flavour and was written in a user file or an override. Unchanged
//! defaults are never reported, so a config copied from verl stays quiet until someone tunes,
//! say, vLLM's `gpu_memory_utilization`. Two keys have their own report:
//! - B002 `RolloutEngineReplaced`: `rollout.name` names an external engine the binary does not
//!   run (`sglang`, `trtllm`, `hf`, written by the user); it uses its built-in one. `vllm` is
//!   run: the rollout keys its server reads ([`VLLM_KEYS`]) are then honoured, and on a CPU
//!   device B020 says the built-in engine is faster there.
//! - B005: FSDP2's `offload_policy` on an FSDP1 engine, which verl ignores too.

use crate::codes;
use crate::config::{Device, RolloutName, Strategy, VerlConfig};
use crate::diag::Diagnostic;
use crate::load::node::{Node, Scalar, Value, split_key};
use crate::source::{SourceKind, SourceMap};

use super::verdicts::{self, Verdict};

const ROLLOUT: &str = "actor_rollout_ref.rollout";
const ROLLOUT_TP: &str = "actor_rollout_ref.rollout.tensor_model_parallel_size";

/// The rollout keys (under `actor_rollout_ref.rollout.`) that become the vLLM server's
/// settings with `rollout.name: vllm` (the runtime's `rollout::vllm::flags`).
pub const VLLM_KEYS: &[&str] = &[
    "tensor_model_parallel_size",
    "data_parallel_size",
    "expert_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_prefix_caching",
    "enforce_eager",
    "logprobs_mode",
    "disable_log_stats",
    "skip_tokenizer_init",
    "load_format",
    "engine_kwargs.vllm.*",
];

/// vLLM keys that only act on a GPU, with why (reported on `trainer.device=cpu`).
const VLLM_GPU_ONLY: &[(&str, &str)] = &[
    (
        "gpu_memory_utilization",
        "sizes vLLM's KV cache on a GPU; on CPU vLLM takes VLLM_CPU_KVCACHE_SPACE (GiB; verlc sets 1 unless the environment does)",
    ),
    (
        "free_cache_engine",
        "puts vLLM to sleep between generations on a GPU; vLLM has no sleep mode on CPU, so its server keeps its weights and KV cache",
    ),
    (
        "enable_sleep_mode",
        "is vLLM's GPU sleep mode, which it does not support on CPU",
    ),
];

/// `key`'s verdict when vLLM runs the rollout: `None` for keys it does not concern.
fn vllm_verdict(key: &str, cpu: bool) -> Option<Verdict> {
    let rest = key.strip_prefix("actor_rollout_ref.rollout.")?;
    if let Some((_, why)) = VLLM_GPU_ONLY.iter().find(|(k, _)| *k == rest) {
        return Some(if cpu {
            Verdict::NoEffect(codes::BUILD_ROLLOUT_KNOB_UNUSED, why)
        } else {
            Verdict::Implemented("rollout.vllm")
        });
    }
    VLLM_KEYS
        .iter()
        .any(|k| match k.strip_suffix(".*") {
            Some(prefix) => rest.starts_with(prefix) && rest.len() > prefix.len(),
            None => *k == rest,
        })
        .then_some(Verdict::Implemented("rollout.vllm (the server's settings)"))
}

/// The verdict findings of the keys the user changed. `defaults` is the built-in default
/// tree of the config's flavour ([`crate::load::compose::builtin_tree`]).
pub fn verdict_diagnostics(
    cfg: &VerlConfig,
    root: &Node,
    sources: &SourceMap,
    defaults: &Node,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let builtin = |o: &crate::source::Origin| sources.get(o.source).kind == SourceKind::Builtin;
    // Written by the user: not a built-in default, and not a value a `${...}` copied from
    // elsewhere (that key gets its own report where it was written; in a newer release's
    // tree verl's own files copy the user's values around, e.g. the distillation teacher's
    // inference settings from the rollout's).
    let user_written = |n: &Node| !n.origin.as_ref().is_some_and(builtin) && n.via.is_none();

    let name_key = format!("{ROLLOUT}.name");
    let vllm = cfg.actor_rollout_ref.rollout.name == RolloutName::Vllm;
    let cpu = cfg.trainer.device == Device::Cpu;
    if vllm
        && cpu
        && let Some(node) = root
            .get_path(&split_key(&name_key))
            .filter(|n| user_written(n))
    {
        out.push(
            Diagnostic::warning(
                codes::BUILD_VLLM_ON_CPU,
                "vLLM generates on CPU, but slower than verlc's built-in engine (bench/rollout_generate: about 2.3x the time at Qwen2.5-0.5B's width, plus about 30 s for the server to start)",
            )
            .with_key(name_key.clone())
            .with_primary(node.origin.clone(), "`vllm` chosen here")
            .with_help(format!(
                "set `{name_key}=verlc` for the faster built-in engine on CPU; keep `vllm` to check a run that will use it on GPUs"
            )),
        );
    }
    if !matches!(
        cfg.actor_rollout_ref.rollout.name,
        RolloutName::Verlc | RolloutName::Vllm
    ) && let Some(node) = root
        .get_path(&split_key(&name_key))
        .filter(|n| user_written(n))
    {
        let spelled = crate::config::common::spelling(&cfg.actor_rollout_ref.rollout.name);
        out.push(
            Diagnostic::warning(
                codes::BUILD_ROLLOUT_ENGINE_REPLACED,
                format!("the binary generates with its built-in rollout engine, not `{spelled}`"),
            )
            .with_key(name_key.clone())
            .with_primary(node.origin.clone(), format!("`{spelled}` chosen here"))
            .with_help(format!(
                "set `{name_key}=verlc` to say so (the vLLM/SGLang settings then stop mattering)"
            )),
        );
    }

    for (key, leaf) in written_changes(root, defaults, &user_written) {
        if key == name_key
            || key == "defaults"
            || key.starts_with("defaults.")
            || key.starts_with("hydra.")
        {
            continue;
        }
        // A Megatron actor's rollout runs at the written size (lowering checks it fits).
        if key == ROLLOUT_TP && cfg.actor_rollout_ref.actor.strategy == Strategy::Megatron {
            continue;
        }
        let value = leaf.to_json();
        if verdicts::ALREADY_SO
            .iter()
            .any(|(k, v)| *k == key && value.to_string().as_str() == *v)
            || states_the_layout(&key, &value, root)
        {
            continue;
        }
        // Packing is the FSDP engines' (the verdict table's entry); a Megatron role computes
        // padded micro-batches.
        let megatron_packing = match key.as_str() {
            "actor_rollout_ref.model.use_remove_padding" => {
                cfg.actor_rollout_ref.actor.strategy == Strategy::Megatron
            }
            "critic.model.use_remove_padding" => cfg.critic.strategy == Strategy::Megatron,
            _ => false,
        };
        // verl reads `freeze_vision_tower` in its FSDP workers only: its Megatron actor trains
        // the tower, and so does verlc's.
        let megatron_tower = key == "actor_rollout_ref.actor.freeze_vision_tower"
            && cfg.actor_rollout_ref.actor.strategy == Strategy::Megatron
            && value == serde_json::Value::Bool(true);
        let verdict = if let Some(v) = vllm.then(|| vllm_verdict(&key, cpu)).flatten() {
            Some(v)
        } else if megatron_tower {
            Some(Verdict::NoEffect(
                codes::BUILD_NO_EFFECT,
                "has no effect on the Megatron strategy: verl reads it in its FSDP workers only, and its Megatron actor (as verlc's) trains the vision tower",
            ))
        } else if megatron_packing {
            Some(Verdict::NoEffect(
                codes::BUILD_NO_EFFECT,
                "has no effect on the Megatron strategy: verlc's Megatron engine computes padded micro-batches (the same numbers, with the padding's compute)",
            ))
        } else {
            verdicts::verdict(&key).map(|e| e.verdict)
        };
        let (code, why, error) = match verdict {
            Some(Verdict::Implemented(_) | Verdict::Checked(_)) => continue,
            Some(Verdict::NoEffect(code, why)) => (code, why, false),
            Some(Verdict::Unsupported(why)) => (codes::BUILD_UNSUPPORTED_SETTING, why, true),
            None => (
                codes::BUILD_NO_EFFECT,
                "is not read by verlc's trainer",
                false,
            ),
        };
        let d = if error {
            Diagnostic::error(code, format!("`{key}` {why}"))
                .with_help("remove it, or set it back to its default, for verlc builds")
        } else {
            Diagnostic::warning(code, format!("`{key}` {why}")).with_help(
                "remove it from the config for verlc builds (it is kept for runs under verl)",
            )
        };
        out.push(
            d.with_key(key.clone())
                .with_primary(leaf.origin.clone(), "set here"),
        );
    }

    for (prefix, fsdp, strategy) in
        crate::role::Role::all(cfg).map(|r| (r.fsdp_key, r.fsdp, r.strategy))
    {
        if strategy == Strategy::Fsdp && fsdp.is_some_and(|f| f.offload_policy) {
            let key = format!("{prefix}.offload_policy");
            out.push(
                Diagnostic::warning(
                    codes::BUILD_CLUSTER_KEY_UNUSED,
                    format!(
                        "`{key}` applies to `fsdp2` only; with `fsdp` it is ignored (as in verl)"
                    ),
                )
                .with_key(key.clone())
                .with_primary(origin(root, &key), "set here")
                .with_help(
                    "use `strategy: fsdp2`, or `param_offload`/`optimizer_offload` with `fsdp`",
                ),
            );
        }
    }
    out
}

/// Megatron-core settings a config repeats that say what the binary builds anyway: RMSNorm and
/// SwiGLU (every family verlc implements has both), and the role's own context-parallel size.
fn states_the_layout(key: &str, value: &serde_json::Value, root: &Node) -> bool {
    const OVERRIDE: &str = ".megatron.override_transformer_config.";
    let Some((role, setting)) = key.split_once(OVERRIDE) else {
        return false;
    };
    match setting {
        "normalization" => value.as_str() == Some("RMSNorm"),
        "swiglu" => value.as_bool() == Some(true),
        "context_parallel_size" => root
            .get_path(&split_key(&format!(
                "{role}.megatron.context_parallel_size"
            )))
            .is_some_and(|n| n.to_json() == *value),
        _ => false,
    }
}

fn origin(root: &Node, key: &str) -> Option<crate::source::Origin> {
    root.get_path(&split_key(key))
        .and_then(|n| n.origin.clone())
}

/// The leaves (scalars, lists, empty maps) under `root` that `written` accepts and whose value
/// differs from the same key's in `defaults`, with their dotted keys. The two trees are walked
/// together: a config is mostly defaults, whose keys are never spelled out.
fn written_changes<'a>(
    root: &'a Node,
    defaults: &Node,
    written: &dyn Fn(&Node) -> bool,
) -> Vec<(String, &'a Node)> {
    fn go<'a>(
        n: &'a Node,
        default: Option<&Node>,
        key: &mut String,
        written: &dyn Fn(&Node) -> bool,
        out: &mut Vec<(String, &'a Node)>,
    ) {
        match &n.value {
            Value::Map(m) if !m.is_empty() => {
                for (k, e) in m.iter() {
                    let len = key.len();
                    if !key.is_empty() {
                        key.push('.');
                    }
                    key.push_str(k);
                    go(&e.node, default.and_then(|d| d.child(k)), key, written, out);
                    key.truncate(len);
                }
            }
            _ => {
                if written(n) && !default.is_some_and(|d| same_value(d, n)) {
                    out.push((key.clone(), n));
                }
            }
        }
    }
    let mut out = Vec::new();
    go(root, Some(defaults), &mut String::new(), written, &mut out);
    out
}

/// Whether two values are equal as JSON (origins aside; `1` and `1.0` differ, as there).
fn same_value(a: &Node, b: &Node) -> bool {
    match (&a.value, &b.value) {
        (Value::Scalar(Scalar::Float(x)), Value::Scalar(Scalar::Float(y))) => {
            x == y || (x.is_nan() && y.is_nan())
        }
        (Value::Scalar(x), Value::Scalar(y)) => x == y,
        _ => a.to_json() == b.to_json(),
    }
}

/// Every scalar, list and empty map under `node`, with its dotted key.
#[cfg(test)]
pub(crate) fn leaves<'a>(node: &'a Node, key: &str) -> Vec<(String, &'a Node)> {
    let mut out = Vec::new();
    fn go<'a>(n: &'a Node, key: String, out: &mut Vec<(String, &'a Node)>) {
        match &n.value {
            Value::Map(m) if !m.is_empty() => {
                for (k, e) in m.iter() {
                    let child = if key.is_empty() {
                        k.to_string()
                    } else {
                        format!("{key}.{k}")
                    };
                    go(&e.node, child, out);
                }
            }
            _ => out.push((key, n)),
        }
    }
    go(node, key.to_owned(), &mut out);
    out
}

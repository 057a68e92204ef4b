//! Keys the generated binary will not use (`B00x` warnings of `verlc build`).
//!
//! A key is reported when the user changed it — its value differs from verlc's built-in
//! default of the same flavour and was written in a user file or an override — and the
//! binary ignores it. Unchanged defaults are never reported, so a config copied from verl
//! stays quiet until someone tunes, say, vLLM's `gpu_memory_utilization`.
//!
//! - B001 `RolloutKnobUnused`: settings of vLLM/SGLang (memory, CUDA graphs, scheduler,
//!   weight sync, agent loop, multi-turn tools, servers, quantization). The binary generates
//!   with its built-in engine on the actor's own weights.
//! - B002 `RolloutEngineReplaced`: `rollout.name` names an external engine; the binary uses
//!   its built-in one (`verlc`) instead.
//! - B003 `ProfilerUnused`: `global_profiler` and the per-role `profiler` nodes; the binary has
//!   no nsys/torch-profiler integration.
//! - B004 `PythonOnlyKey`: `torch.compile`, Liger and Triton fused kernels, `external_lib`,
//!   `trust_remote_code`, shared-memory staging: Python-side features.
//! - B005 `ClusterKeyUnused`: Ray, TransferQueue, HDFS copies, wandb proxy, worker
//!   implementation switches, capacity-block margins; and FSDP2's `offload_policy` on an FSDP1
//!   engine, which verl ignores too.
//!
//! Logger backends are reported by rule V037.

use crate::codes;
use crate::config::{RolloutName, Strategy, VerlConfig};
use crate::diag::{Code, Diagnostic};
use crate::load::compose::Composed;
use crate::load::node::{Node, Value, split_key};
use crate::source::SourceKind;

struct Group {
    code: Code,
    /// Dotted keys; a key naming a map covers every leaf under it.
    keys: &'static [&'static str],
    /// Completes "`key` ...".
    why: &'static str,
}

const ROLLOUT: &str = "actor_rollout_ref.rollout";

static GROUPS: &[Group] = &[
    Group {
        code: codes::BUILD_ROLLOUT_KNOB_UNUSED,
        keys: &[
            "actor_rollout_ref.rollout.mode",
            "actor_rollout_ref.rollout.gpu_memory_utilization",
            "actor_rollout_ref.rollout.enforce_eager",
            "actor_rollout_ref.rollout.cudagraph_capture_sizes",
            "actor_rollout_ref.rollout.free_cache_engine",
            "actor_rollout_ref.rollout.max_num_batched_tokens",
            "actor_rollout_ref.rollout.max_num_seqs",
            "actor_rollout_ref.rollout.enable_chunked_prefill",
            "actor_rollout_ref.rollout.enable_prefix_caching",
            "actor_rollout_ref.rollout.logprobs_mode",
            "actor_rollout_ref.rollout.load_format",
            "actor_rollout_ref.rollout.disable_log_stats",
            "actor_rollout_ref.rollout.multi_stage_wake_up",
            "actor_rollout_ref.rollout.engine_kwargs",
            "actor_rollout_ref.rollout.multi_turn",
            "actor_rollout_ref.rollout.agent",
            "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
            "actor_rollout_ref.rollout.trace",
            "actor_rollout_ref.rollout.skip_rollout",
            "actor_rollout_ref.rollout.skip_dump_dir",
            "actor_rollout_ref.rollout.skip_tokenizer_init",
            "actor_rollout_ref.rollout.enable_rollout_routing_replay",
            "actor_rollout_ref.rollout.prometheus",
            "actor_rollout_ref.rollout.quantization",
            "actor_rollout_ref.rollout.quantization_config_file",
            "actor_rollout_ref.rollout.layered_summon",
            "actor_rollout_ref.rollout.layer_name_map",
            "actor_rollout_ref.rollout.server",
            "actor_rollout_ref.rollout.sglang_engine_mode",
            "actor_rollout_ref.rollout.enable_sleep_mode",
            "actor_rollout_ref.rollout.custom",
        ],
        why: "is a setting of vLLM/SGLang; the binary's built-in rollout engine does not use it",
    },
    Group {
        code: codes::BUILD_PROFILER_UNUSED,
        keys: &[
            "global_profiler",
            "actor_rollout_ref.actor.profiler",
            "actor_rollout_ref.actor.profile",
            "actor_rollout_ref.ref.profiler",
            "actor_rollout_ref.rollout.profiler",
            "critic.profiler",
        ],
        why: "configures a profiler; the binary has no profiler integration",
    },
    Group {
        code: codes::BUILD_PYTHON_ONLY_KEY,
        keys: &[
            "actor_rollout_ref.model.use_liger",
            "actor_rollout_ref.model.use_fused_kernels",
            "actor_rollout_ref.model.fused_kernel_options",
            "actor_rollout_ref.model.external_lib",
            "actor_rollout_ref.model.trust_remote_code",
            "actor_rollout_ref.model.use_shm",
            "actor_rollout_ref.actor.use_torch_compile",
            "actor_rollout_ref.actor.use_fused_kernels",
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
            "actor_rollout_ref.ref.use_torch_compile",
            "actor_rollout_ref.ref.fsdp_config.use_torch_compile",
            "critic.model.external_lib",
            "critic.model.trust_remote_code",
            "critic.model.use_shm",
            "critic.model.fsdp_config.use_torch_compile",
        ],
        why: "is a Python-side feature (torch.compile, Liger/Triton kernels, remote code); the binary does not use it",
    },
    Group {
        code: codes::BUILD_CLUSTER_KEY_UNUSED,
        keys: &[
            "ray_kwargs",
            "transfer_queue",
            "trainer.ray_wait_register_center_timeout",
            "trainer.default_hdfs_dir",
            "trainer.wandb_proxy",
            "trainer.use_legacy_worker_impl",
            "trainer.esi_redundant_time",
        ],
        why: "configures verl's Ray/cluster machinery; the binary runs its ranks itself and does not use it",
    },
];

/// The warnings for keys the binary will not use. `defaults` is the built-in default tree of
/// the config's flavour ([`super::default_tree`]).
pub fn unused_keys(cfg: &VerlConfig, composed: &Composed, defaults: &Node) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let builtin = |o: &crate::source::Origin| composed.sources.get(o.source).kind == SourceKind::Builtin;
    // Written by the user: not a built-in default, and not a value a built-in `${...}` copied
    // from elsewhere (that key gets its own report where it was written).
    let user_written = |n: &Node| !n.origin.as_ref().is_some_and(builtin) && !n.via.as_ref().is_some_and(builtin);

    let name = &cfg.actor_rollout_ref.rollout.name;
    if *name != RolloutName::Verlc {
        let key = format!("{ROLLOUT}.name");
        let spelled = serde_json::to_value(name).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        out.push(
            Diagnostic::warning(codes::BUILD_ROLLOUT_ENGINE_REPLACED, format!("the binary generates with its built-in rollout engine, not `{spelled}`"))
                .with_key(key.clone())
                .with_primary(origin(&composed.root, &key), format!("`{spelled}` chosen here"))
                .with_help(format!("set `{key}=verlc` to say so (the vLLM/SGLang settings then stop mattering)")),
        );
    }

    for g in GROUPS {
        for key in g.keys {
            let Some(node) = composed.root.get_path(&split_key(key)) else { continue };
            for (leaf_key, leaf) in leaves(node, key) {
                let default = defaults.get_path(&split_key(&leaf_key)).map(Node::to_json);
                if default.as_ref() == Some(&leaf.to_json()) || !user_written(leaf) {
                    continue;
                }
                out.push(
                    Diagnostic::warning(g.code, format!("`{leaf_key}` {}", g.why))
                        .with_key(leaf_key.clone())
                        .with_primary(leaf.origin.clone(), "set here")
                        .with_help("remove it from the config for verlc builds (it is kept for runs under verl)"),
                );
            }
        }
    }

    for (prefix, fsdp, strategy) in [
        ("actor_rollout_ref.actor.fsdp_config", cfg.actor_rollout_ref.actor.fsdp_config.as_ref(), cfg.actor_rollout_ref.actor.strategy),
        ("actor_rollout_ref.ref.fsdp_config", cfg.actor_rollout_ref.reference.fsdp_config.as_ref(), cfg.actor_rollout_ref.reference.strategy),
        ("critic.model.fsdp_config", cfg.critic.model.fsdp_config.as_ref(), cfg.critic.strategy),
    ] {
        if strategy == Strategy::Fsdp && fsdp.is_some_and(|f| f.offload_policy) {
            let key = format!("{prefix}.offload_policy");
            out.push(
                Diagnostic::warning(codes::BUILD_CLUSTER_KEY_UNUSED, format!("`{key}` applies to `fsdp2` only; with `fsdp` it is ignored (as in verl)"))
                    .with_key(key.clone())
                    .with_primary(origin(&composed.root, &key), "set here")
                    .with_help("use `strategy: fsdp2`, or `param_offload`/`optimizer_offload` with `fsdp`"),
            );
        }
    }
    out
}

fn origin(root: &Node, key: &str) -> Option<crate::source::Origin> {
    root.get_path(&split_key(key)).and_then(|n| n.origin.clone())
}

/// Every scalar (and empty container) under `node`, with its dotted key.
fn leaves<'a>(node: &'a Node, key: &str) -> Vec<(String, &'a Node)> {
    let mut out = Vec::new();
    fn go<'a>(n: &'a Node, key: String, out: &mut Vec<(String, &'a Node)>) {
        match &n.value {
            Value::Map(m) if !m.is_empty() => {
                for (k, e) in m {
                    go(&e.node, format!("{key}.{k}"), out);
                }
            }
            _ => out.push((key, n)),
        }
    }
    go(node, key.to_owned(), &mut out);
    out
}

//! Coverage tests of the typed model against verl 0.7.0's own composed trees.
//!
//! The trees are composed by Hydra in the project's `.venv` (created by `scripts/setup`),
//! resolved, dumped as JSON, and deserialized into [`VerlConfig`] with unknown fields denied.
//! Serializing the typed value back must give the same tree, and every key must land in a
//! typed field except inside the open dictionaries listed here.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::*;

/// The project's Python, with hydra-core, omegaconf and verl 0.7.0 installed.
pub(super) fn venv_python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: these tests compare with verl 0.7.0's config tree and need the \
         project venv; run `scripts/setup` first",
        python.display()
    );
    python
}

/// Runs `script` with the venv Python and returns its standard output.
pub(super) fn run_python(script: &str, args: &[&str]) -> String {
    let output = Command::new(venv_python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("failed to start the venv python");
    assert!(
        output.status.success(),
        "python failed (is verl 0.7.0 installed? run `scripts/setup`):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("python printed non-UTF-8")
}

/// Locates verl's config folder without importing verl (which would need torch).
pub(super) const VERL_CONFIG_DIR_PY: &str = r#"
import importlib.util, os
spec = importlib.util.find_spec("verl")
assert spec is not None, "verl is not installed in the venv"
VERL_CONFIG_DIR = os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")
"#;

/// Composes one of verl's entry configs with Hydra, resolves it, prints JSON.
const COMPOSE_PY: &str = r#"
import json, sys
from hydra import initialize_config_dir, compose
from omegaconf import OmegaConf
with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
    cfg = compose(sys.argv[1], overrides=[
        "actor_rollout_ref.rollout.name=vllm",
        "reward_model.rollout.name=vllm",
    ])
print(json.dumps(OmegaConf.to_container(cfg, resolve=True)))
"#;

fn verl_composed(entry: &str) -> Value {
    let script = format!("{VERL_CONFIG_DIR_PY}{COMPOSE_PY}");
    serde_json::from_str(&run_python(&script, &[entry])).expect("compose printed invalid JSON")
}

/// Leaves of a tree; an empty object or list counts as one leaf.
fn leaf_count(value: &Value) -> usize {
    match value {
        Value::Object(map) if !map.is_empty() => map.values().map(leaf_count).sum(),
        _ => 1,
    }
}

/// Structural equality where numbers compare by value (`1` equals `1.0`) and an absent key
/// equals a null one. Returns the first difference.
fn same_tree(a: &Value, b: &Value, path: &str) -> Result<(), String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => Ok(()),
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let left = x.get(key).unwrap_or(&Value::Null);
                let right = y.get(key).unwrap_or(&Value::Null);
                same_tree(left, right, &format!("{path}.{key}"))?;
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                same_tree(l, r, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{path}: {a} != {b}")),
    }
}

/// Follows `$ref`s and picks the object branch of `anyOf` (how schemars writes `Option`).
fn object_schema<'a>(schema: &'a Value, root: &'a Value) -> Option<&'a Value> {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.rsplit('/').next()?;
        return object_schema(root.get("$defs")?.get(name)?, root);
    }
    if let Some(branches) = schema.get("anyOf").and_then(Value::as_array) {
        return branches.iter().find_map(|b| object_schema(b, root));
    }
    let is_object = schema.get("properties").is_some()
        || schema.get("additionalProperties").is_some()
        || schema.get("type") == Some(&Value::from("object"));
    is_object.then_some(schema)
}

/// Collects the paths of non-empty objects whose keys are not typed fields, i.e. the open
/// dictionaries that actually hold content in `value`.
fn open_paths(value: &Value, schema: &Value, root: &Value, path: &str, out: &mut Vec<String>) {
    let Value::Object(map) = value else { return };
    let Some(schema) = object_schema(schema, root) else {
        return;
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    for (key, child) in map {
        match properties.and_then(|p| p.get(key)) {
            Some(sub) => open_paths(child, sub, root, &format!("{path}.{key}"), out),
            None => {
                out.push(path.trim_start_matches('.').to_string());
                return;
            }
        }
    }
}

/// Deserializes verl's composed tree, checks the round trip and the open dictionaries, and
/// returns the leaf count.
fn check_flavour(entry: &str, expected_open: &[&str]) -> usize {
    let tree = verl_composed(entry);
    let typed: VerlConfig = serde_json::from_value(tree.clone())
        .unwrap_or_else(|e| panic!("{entry}: verl's tree does not fit VerlConfig: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    if let Err(diff) = same_tree(&tree, &back, "") {
        panic!("{entry}: the typed round trip changed the tree at {diff}");
    }

    let schema = serde_json::to_value(schemars::schema_for!(VerlConfig)).unwrap();
    let mut open = Vec::new();
    open_paths(&tree, &schema, &schema, "", &mut open);
    let open: BTreeSet<&str> = open.iter().map(String::as_str).collect();
    let expected: BTreeSet<&str> = expected_open.iter().copied().collect();
    assert_eq!(open, expected, "{entry}: keys landed in open dictionaries");
    leaf_count(&tree)
}

const OPEN_IN_BOTH: &[&str] = &[
    "actor_rollout_ref.rollout.engine_kwargs",
    "global_profiler.global_tool_config.nsys.controller_nsight_options",
    "global_profiler.global_tool_config.nsys.worker_nsight_options",
];

#[test]
fn fsdp_tree_is_fully_typed() {
    let leaves = check_flavour("ppo_trainer", OPEN_IN_BOTH);
    assert_eq!(
        leaves, 561,
        "verl 0.7.0's resolved FSDP tree has 561 leaves"
    );
}

#[test]
fn megatron_tree_is_fully_typed() {
    let mut open = OPEN_IN_BOTH.to_vec();
    open.extend([
        "actor_rollout_ref.actor.megatron.override_transformer_config",
        "actor_rollout_ref.ref.megatron.override_transformer_config",
        "critic.megatron.override_transformer_config",
        "reward_model.megatron.override_transformer_config",
        "actor_rollout_ref.model.override_config",
        "critic.model.override_config",
    ]);
    let leaves = check_flavour("ppo_megatron_trainer", &open);
    assert_eq!(
        leaves, 622,
        "verl 0.7.0's resolved Megatron tree has 622 leaves"
    );
}

#[test]
fn unknown_key_is_rejected() {
    let mut tree = verl_composed("ppo_trainer");
    tree["actor_rollout_ref"]["actor"]["ppo_mini_batchsize"] = Value::from(4);
    let err = serde_json::from_value::<VerlConfig>(tree)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ppo_mini_batchsize"), "{err}");
}

#[test]
fn hidden_get_keys_are_accepted() {
    let mut tree = verl_composed("ppo_trainer");
    tree["data"]["gen_batch_size"] = Value::from(2048);
    tree["trainer"]["wandb_proxy"] = Value::from("http://proxy:3128");
    tree["actor_rollout_ref"]["rollout"]["repetition_penalty"] = Value::from(1.05);
    tree["actor_rollout_ref"]["model"]["lora"] = serde_json::json!({"rank": 8, "merge": true});
    tree["algorithm"]["filter_groups"] =
        serde_json::json!({"enable": true, "metric": "acc", "max_num_gen_batches": 4});
    tree["ray_kwargs"]["ray_init"]["runtime_env"] = serde_json::json!({"env_vars": {}});
    let typed: VerlConfig = serde_json::from_value(tree).unwrap();
    assert_eq!(typed.data.gen_batch_size, Some(2048));
    assert_eq!(typed.actor_rollout_ref.model.lora.unwrap().rank, Some(8));
    assert!(typed.ray_kwargs.ray_init.extra.contains_key("runtime_env"));
}

#[test]
fn enums_use_verl_spellings() {
    let names = [
        (
            serde_json::to_value(KlEstimator::LowVarKlPlus).unwrap(),
            "low_var_kl+",
        ),
        (
            serde_json::to_value(LossAggMode::SeqMeanTokenSumNorm).unwrap(),
            "seq-mean-token-sum-norm",
        ),
        (
            serde_json::to_value(LrDecayStyle::InverseSquareRoot).unwrap(),
            "inverse-square-root",
        ),
        (serde_json::to_value(RouterReplayMode::R2).unwrap(), "R2"),
        (serde_json::to_value(RolloutName::Verlc).unwrap(), "verlc"),
        (serde_json::to_value(TorchDtype::Bits32).unwrap(), "32"),
    ];
    for (value, spelling) in names {
        assert_eq!(value, Value::from(spelling));
    }
}

#[test]
fn deprecated_patterns_match_and_fill_in() {
    let entry = DEPRECATED_KEYS
        .iter()
        .find(|k| k.path == "actor_rollout_ref.*.log_prob_micro_batch_size")
        .unwrap();
    assert!(entry.matches("actor_rollout_ref.ref.log_prob_micro_batch_size"));
    assert!(!entry.matches("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"));
    assert_eq!(
        entry
            .replacement_for("actor_rollout_ref.rollout.log_prob_micro_batch_size")
            .as_deref(),
        Some("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu")
    );
}

#[test]
fn deprecated_keys_are_typed_and_marked() {
    let schema = serde_json::to_value(schemars::schema_for!(VerlConfig)).unwrap();
    for key in DEPRECATED_KEYS {
        let concrete = key.path.replace('*', "ref");
        let mut node = &schema;
        for segment in concrete.split('.') {
            let object = object_schema(node, &schema)
                .unwrap_or_else(|| panic!("{}: {segment} is not under an object", key.path));
            node = object
                .get("properties")
                .and_then(|p| p.get(segment))
                .unwrap_or_else(|| panic!("{}: no typed field {segment}", key.path));
        }
        assert_eq!(
            node.get("deprecated"),
            Some(&Value::Bool(true)),
            "{}",
            key.path
        );
    }
}

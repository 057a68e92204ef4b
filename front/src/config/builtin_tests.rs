//! The built-in default tree must be complete (every file embedded) and equivalent to verl
//! 0.7.0's tree, file by file and after Hydra composition. verl's side is read with the
//! project venv's omegaconf/hydra (see `config::tests::venv_python`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::BUILTIN_FILES;
use crate::config::VerlConfig;
use crate::config::tests::{VERL_CONFIG_DIR_PY, run_python};

fn defaults_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("defaults")
}

fn yaml_files_under(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("cannot read the defaults folder") {
        let entry = entry.unwrap();
        let name = entry
            .file_name()
            .into_string()
            .expect("non-UTF-8 file name");
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type().unwrap().is_dir() {
            yaml_files_under(&entry.path(), &rel, out);
        } else if name.ends_with(".yaml") {
            out.insert(rel);
        }
    }
}

#[test]
fn every_defaults_file_is_embedded() {
    let mut on_disk = BTreeSet::new();
    yaml_files_under(&defaults_dir(), "", &mut on_disk);
    let embedded: BTreeSet<String> = BUILTIN_FILES.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(
        embedded.len(),
        BUILTIN_FILES.len(),
        "duplicate paths in BUILTIN_FILES"
    );
    assert_eq!(
        embedded, on_disk,
        "BUILTIN_FILES differs from front/defaults/"
    );
}

/// For every file named on the command line, prints the JSON of our copy and of verl's,
/// both loaded by OmegaConf without resolving interpolations.
const LOAD_PAIRS_PY: &str = r#"
import json, os, sys
from omegaconf import OmegaConf
ours_dir = sys.argv[1]
def dump(path):
    return json.dumps(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
out = {}
for rel in sys.argv[2:]:
    theirs = os.path.join(VERL_CONFIG_DIR, rel)
    out[rel] = [dump(os.path.join(ours_dir, rel)), dump(theirs) if os.path.exists(theirs) else None]
print(json.dumps(out))
"#;

#[test]
fn every_file_matches_verl() {
    let dir = defaults_dir();
    let mut args = vec![dir.to_str().unwrap()];
    args.extend(BUILTIN_FILES.iter().map(|(p, _)| *p));
    let script = format!("{VERL_CONFIG_DIR_PY}{LOAD_PAIRS_PY}");
    let pairs: serde_json::Map<String, Value> =
        serde_json::from_str(&run_python(&script, &args)).unwrap();
    for (rel, pair) in pairs {
        let ours = pair[0].as_str().unwrap();
        let theirs = pair[1]
            .as_str()
            .unwrap_or_else(|| panic!("{rel}: verl 0.7.0 has no such file"));
        // Text equality of the dumps also checks key order and int/float/bool types.
        assert_eq!(ours, theirs, "{rel}: differs from verl 0.7.0's file");
    }
}

/// Composes an entry config from a config folder with Hydra and prints the tree, resolved
/// or not.
const COMPOSE_FROM_PY: &str = r#"
import json, sys
from hydra import initialize_config_dir, compose
from omegaconf import OmegaConf
config_dir, entry, resolve = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
dirs = {"verl": VERL_CONFIG_DIR}
with initialize_config_dir(config_dir=dirs.get(config_dir, config_dir), version_base=None):
    cfg = compose(entry, overrides=[
        "actor_rollout_ref.rollout.name=verlc",
        "reward_model.rollout.name=vllm",
    ])
print(json.dumps(OmegaConf.to_container(cfg, resolve=resolve)))
"#;

fn composed(config_dir: &str, entry: &str, resolve: bool) -> String {
    let script = format!("{VERL_CONFIG_DIR_PY}{COMPOSE_FROM_PY}");
    run_python(
        &script,
        &[config_dir, entry, if resolve { "1" } else { "0" }],
    )
}

fn check_composition(entry: &str) {
    let dir = defaults_dir();
    let ours_dir = dir.to_str().unwrap();
    for resolve in [false, true] {
        let ours = composed(ours_dir, entry, resolve);
        let theirs = composed("verl", entry, resolve);
        assert_eq!(
            ours, theirs,
            "{entry} (resolve={resolve}): composition differs from verl's"
        );
    }
    let tree: Value = serde_json::from_str(&composed(ours_dir, entry, true)).unwrap();
    let typed: Result<VerlConfig, _> = serde_json::from_value(tree);
    typed.unwrap_or_else(|e| panic!("{entry}: our composed tree does not fit VerlConfig: {e}"));
}

#[test]
fn fsdp_composition_matches_verl() {
    check_composition("ppo_trainer");
}

#[test]
fn megatron_composition_matches_verl() {
    check_composition("ppo_megatron_trainer");
}

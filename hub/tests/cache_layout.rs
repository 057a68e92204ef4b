//! A Hub cache laid out on disk as `huggingface_hub` writes it (content-addressed blobs,
//! snapshot symlinks, refs), resolved by us and by `huggingface_hub.snapshot_download` and
//! transformers' `AutoConfig.from_pretrained` with `local_files_only=True`: the same snapshot.

use std::path::{Path, PathBuf};
use std::process::Command;

use verlc_hub::{HubEnv, HubError, ModelLocation, RepoId, find_snapshot, locate};

const MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const DEV: &str = "89abcdef0123456789abcdef0123456789abcdef";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("verlc-hub-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `models--org--tiny` with `main` at one commit (hidden 64) and branch `dev` at another
/// (hidden 32), files stored once as blobs and linked from each snapshot.
fn lay_out(cache: &Path) {
    let repo = cache.join("models--org--tiny");
    for (commit, hidden, branch) in [(MAIN, 64, "main"), (DEV, 32, "dev")] {
        let config = format!(
            "{{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": {hidden}, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100}}"
        );
        let blob = format!("blob{hidden:036}");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs").join(&blob), config).unwrap();
        let snap = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snap).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(&blob),
            snap.join("config.json"),
        )
        .unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join(branch), commit).unwrap();
    }
}

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

/// What huggingface_hub and transformers make of `repo` at `revision` in `cache`.
fn reference(cache: &Path, repo: &str, revision: &str) -> (PathBuf, i64) {
    let script = r#"
import json, sys
from huggingface_hub import snapshot_download
from transformers import AutoConfig
cache, repo, rev = sys.argv[1:4]
path = snapshot_download(repo, revision=rev, cache_dir=cache, local_files_only=True)
cfg = AutoConfig.from_pretrained(repo, revision=rev, cache_dir=cache, local_files_only=True)
print(json.dumps([path, cfg.hidden_size]))
"#;
    let out = Command::new(python())
        .args(["-c", script])
        .arg(cache)
        .args([repo, revision])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("the project venv's python (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "huggingface_hub: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    (
        PathBuf::from(v[0].as_str().unwrap()),
        v[1].as_i64().unwrap(),
    )
}

fn hidden_size(dir: &Path) -> i64 {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["hidden_size"].as_i64().unwrap()
}

#[test]
fn snapshots_resolve_as_huggingface_hub_and_transformers_resolve_them() {
    let cache = scratch("layout");
    lay_out(&cache);
    let env = HubEnv::offline_at(&cache);
    let id = RepoId::parse("org/tiny").unwrap();
    for revision in ["main", "dev", DEV] {
        let ours = find_snapshot(&env, &id, Some(revision)).unwrap();
        let (dir, hidden) = reference(&cache, "org/tiny", revision);
        assert_eq!(
            ours.dir.canonicalize().unwrap(),
            dir.canonicalize().unwrap(),
            "{revision}"
        );
        assert_eq!(hidden_size(&ours.dir), hidden, "{revision}");
    }
    assert_eq!(find_snapshot(&env, &id, None).unwrap().commit, MAIN);
    // A config path: the same through `locate`.
    match locate("org/tiny", None, &env).unwrap() {
        ModelLocation::Hub(s) => assert_eq!(s.commit, MAIN),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn what_is_missing_is_said() {
    let cache = scratch("missing");
    lay_out(&cache);
    let env = HubEnv::offline_at(&cache);
    let err = locate("org/absent", None, &env).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HubError::NotCached { .. }), "{msg}");
    assert!(
        msg.contains("org/absent") && msg.contains(&cache.display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("HF_HUB_OFFLINE"), "offline is named: {msg}");
    let online = HubEnv {
        offline: false,
        ..env.clone()
    };
    let msg = locate("org/absent", None, &online).unwrap_err().to_string();
    assert!(msg.contains("verlc fetch"), "{msg}");
    let msg = locate("org/tiny", Some("v9"), &env)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("revision `v9`"), "{msg}");
    // A snapshot without config.json, and a ref that is not a commit.
    let repo = cache.join("models--org--tiny");
    std::fs::remove_file(repo.join("snapshots").join(DEV).join("config.json")).unwrap();
    let msg = locate("org/tiny", Some("dev"), &env)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("has no config.json"), "{msg}");
    std::fs::write(repo.join("refs/main"), "not-a-hash").unwrap();
    let msg = locate("org/tiny", None, &env).unwrap_err().to_string();
    assert!(msg.contains("commit hash"), "{msg}");
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn local_directories_and_builtin_models_are_not_ids() {
    let env = HubEnv::offline_at("/nonexistent");
    let dir = scratch("local");
    let path = dir.display().to_string();
    assert_eq!(
        locate(&path, None, &env).unwrap(),
        ModelLocation::Local(dir.clone())
    );
    assert_eq!(
        locate("builtin://tiny?layers=2", None, &env).unwrap(),
        ModelLocation::Builtin
    );
    for local in ["./models/x", "~/m", "/abs/path", "a/b/c"] {
        assert!(
            matches!(locate(local, None, &env).unwrap(), ModelLocation::Local(_)),
            "{local}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

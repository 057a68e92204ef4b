//! Hydra's answers, remembered: `tests/hydra/answers.json` holds, per case, whether Hydra
//! accepted it, its error, and a digest of the tree it composed, keyed by everything Hydra
//! read for it (the YAML files of the config dir, of the case's working directory and of the
//! installed verl tree, the absolute `file://` search paths its overrides name, the config
//! name and the overrides, the Hydra and OmegaConf versions, and `compose_many.py` itself).
//!
//! Why: composing the ~800 cases is nearly all of this test's time (about 0.2 s of Python each),
//! and the answers only change when an input does. A case is settled without Hydra only when
//! its key is in the file and verlc's outcome is the remembered one (same verdict and, for an
//! accepted case, the same tree digest); every other case is composed by Hydra as before, so
//! a change in verlc or in a tree can never pass on a stale answer. `VERLC_HYDRA_RECORD=1`
//! composes every case with Hydra and rewrites the file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Where the answers live (committed).
pub fn store_path(workspace: &Path) -> PathBuf {
    workspace.join("tests/hydra/answers.json")
}

/// One remembered answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub ok: bool,
    pub error: Option<String>,
    /// Digest of the composed tree (accepted cases).
    pub digest: Option<String>,
}

/// What Hydra read for the cases: computes keys, caching each directory's digest.
pub struct Keys {
    /// Versions and the composing script: part of every key.
    common: String,
    dirs: HashMap<PathBuf, String>,
    /// This checkout's path (as given and resolved): written as `<checkout>` before hashing,
    /// so that a clone elsewhere (CI's) finds the answers recorded here.
    checkout: Vec<String>,
}

impl Keys {
    pub fn new(workspace: &Path, venv_site: Option<&Path>, verl_tree: &Path) -> Keys {
        let mut common = Sha256::new();
        let script = workspace.join("tests/hydra/compose_many.py");
        common.update(std::fs::read(&script).unwrap_or_default());
        // The Hydra and OmegaConf releases: their dist-info directory names carry them.
        if let Some(site) = venv_site {
            let mut names: Vec<String> = std::fs::read_dir(site)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    (n.starts_with("hydra_core-") || n.starts_with("omegaconf-"))
                        && n.ends_with(".dist-info")
                })
                .collect();
            names.sort();
            common.update(names.join("\n"));
        }
        let mut checkout = vec![workspace.display().to_string()];
        if let Ok(resolved) = workspace.canonicalize() {
            checkout.push(resolved.display().to_string());
        }
        // Longest first: one path may extend the other.
        checkout.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let mut keys = Keys {
            common: String::new(),
            dirs: HashMap::new(),
            checkout,
        };
        // `pkg://verl.trainer.config` answers from the installed tree in every case.
        common.update(keys.dir(verl_tree));
        keys.common = hex(common.finalize().as_slice());
        keys
    }

    /// Digest of the YAML files under `dir` (relative names and contents; missing: a fixed word).
    fn dir(&mut self, dir: &Path) -> String {
        if let Some(d) = self.dirs.get(dir) {
            return d.clone();
        }
        let mut files = Vec::new();
        collect_yaml(dir, dir, &mut files);
        files.sort();
        let mut h = Sha256::new();
        if !dir.is_dir() {
            h.update(b"missing");
        }
        for rel in &files {
            h.update(rel.as_bytes());
            h.update([0]);
            let text = std::fs::read(dir.join(rel)).unwrap_or_default();
            h.update(self.portable(&String::from_utf8_lossy(&text)).as_bytes());
            h.update([0]);
        }
        let d = hex(h.finalize().as_slice());
        self.dirs.insert(dir.to_path_buf(), d.clone());
        d
    }

    /// `text` with this checkout's path written as `<checkout>`.
    pub fn portable(&self, text: &str) -> String {
        self.checkout
            .iter()
            .fold(text.to_string(), |t, p| t.replace(p.as_str(), "<checkout>"))
    }

    /// The key of one case.
    pub fn key(
        &mut self,
        config_dir: &Path,
        config_name: &str,
        overrides: &[String],
        cwd: Option<&Path>,
    ) -> String {
        let mut h = Sha256::new();
        h.update(self.common.as_bytes());
        h.update(self.dir(config_dir).as_bytes());
        if let Some(cwd) = cwd {
            h.update(b"cwd");
            h.update(self.dir(cwd).as_bytes());
        }
        h.update(config_name.as_bytes());
        for o in overrides {
            h.update([0]);
            h.update(self.portable(o).as_bytes());
            // An absolute search path's files are read too.
            for path in absolute_file_urls(o) {
                h.update(self.dir(&path).as_bytes());
            }
        }
        hex(h.finalize().as_slice())
    }
}

fn collect_yaml(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_yaml(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml")
            && let Ok(rel) = p.strip_prefix(root)
        {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// `file:///abs/dir` entries of an override.
fn absolute_file_urls(o: &str) -> Vec<PathBuf> {
    o.match_indices("file://")
        .filter_map(|(i, _)| {
            let rest = &o[i + "file://".len()..];
            let end = rest.find([',', ']', '\'', '"', ' ']).unwrap_or(rest.len());
            let path = &rest[..end];
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Digest of a composed tree: object keys sorted, so the order in which Hydra and verlc
/// write them does not matter (the comparison in the test is by value too).
pub fn tree_digest(v: &Value) -> String {
    fn canonical(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, Value> =
                    m.iter().map(|(k, v)| (k, canonical(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    let text = serde_json::to_string(&canonical(v)).unwrap_or_default();
    hex(Sha256::digest(text.as_bytes()).as_slice())
}

/// The committed answers (empty when the file is missing or unreadable).
pub fn load(path: &Path) -> HashMap<String, Answer> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return HashMap::new();
    };
    v["answers"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, a)| {
            (
                k.clone(),
                Answer {
                    ok: a["ok"].as_bool().unwrap_or(false),
                    error: a["error"].as_str().map(str::to_string),
                    digest: a["digest"].as_str().map(str::to_string),
                },
            )
        })
        .collect()
}

/// Writes `answers` (sorted by key, one per line, so a change shows as a small diff).
pub fn save(path: &Path, answers: &BTreeMap<String, Answer>) {
    let mut text = String::from(
        "{\n  \"about\": \"Hydra's answers for cli/tests/hydra_parity.rs (see its memo module); VERLC_HYDRA_RECORD=1 rewrites this file\",\n  \"answers\": {\n",
    );
    let n = answers.len();
    for (i, (k, a)) in answers.iter().enumerate() {
        let entry = json!({"ok": a.ok, "error": a.error, "digest": a.digest});
        text.push_str(&format!(
            "    {}: {}{}\n",
            Value::String(k.clone()),
            entry,
            if i + 1 < n { "," } else { "" }
        ));
    }
    text.push_str("  }\n}\n");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

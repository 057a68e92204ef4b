//! The `verlc check` pipeline as a library call: compose, validate against the schema,
//! deserialize into the typed model, run the semantic rules. Every stage's problems are
//! collected, so one run reports everything it can.

use std::path::{Path, PathBuf};

use crate::config::VerlConfig;
use crate::diag::{Code, Diagnostic};
use crate::load::compose::{self, Composed, LoadRequest};
use crate::load::node::{Node, Scalar, Value};
use crate::rules::{self, ModelDims, RuleContext};
use crate::{codes, plan, schema};

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// A model `config.json` (or a directory holding one) for model-aware rules; defaults
    /// to `actor_rollout_ref.model.path` when that is a local directory.
    pub model_config: Option<PathBuf>,
    /// Run only these rule ids (all when empty).
    pub only: Vec<String>,
}

pub struct Checked {
    pub composed: Composed,
    /// The typed config, when the tree passed the schema.
    pub config: Option<VerlConfig>,
    pub model: Option<ModelDims>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Checked {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

pub fn check(req: &LoadRequest, opts: &CheckOptions) -> Checked {
    let composed = compose::load(req);
    let mut diagnostics = composed.diagnostics.clone();
    // `???` is "not set yet": verl fails only when it reads such a key, so the schema sees
    // null and a rule decides which missing values verl would actually read.
    let (tree, missing) = unset_mandatory(&composed.root);
    let mut schema_diags = schema::validate(&tree);
    // A `???` whose type cannot be null is a value the user must set: say that, not "null".
    for d in &mut schema_diags {
        if let Some(key) = d.key_path.clone().filter(|k| missing.contains(k)) {
            let origin = d.primary.as_ref().map(|l| l.origin.clone());
            *d = Diagnostic::error(
                codes::MANDATORY_MISSING,
                format!("missing mandatory value `{key}`"),
            )
            .with_key(key.clone())
            .with_primary(origin, "declared mandatory (`???`) here and never set")
            .with_help(mandatory_help(
                &key,
                &schema::schema_at(
                    schema::validation_schema(),
                    &key.split('.').map(String::from).collect::<Vec<_>>(),
                )
                .cloned(),
            ));
        }
    }
    let schema_clean = !schema_diags.iter().any(Diagnostic::is_error);
    diagnostics.extend(merge_same_origin(schema_diags));

    let mut config = None;
    if schema_clean {
        match serde_json::from_value::<VerlConfig>(tree.to_json()) {
            Ok(c) => config = Some(c),
            Err(e) => diagnostics.push(Diagnostic::error(
                codes::SCHEMA_OTHER,
                format!("config does not match the typed model: {e}"),
            )),
        }
    }

    let mut model = None;
    if let Some(cfg) = &config {
        let path = opts
            .model_config
            .clone()
            .or_else(|| model_dir_from_tree(&composed));
        if let Some(p) = path {
            match read_model_dims(&p) {
                Ok(m) => model = Some(m),
                Err(msg) if opts.model_config.is_some() => {
                    diagnostics.push(Diagnostic::error(codes::IO_ERROR, msg))
                }
                Err(_) => {}
            }
        }
        let only: Vec<String> = opts.only.iter().map(|s| s.to_ascii_uppercase()).collect();
        let enabled = |c: Code| only.is_empty() || only.iter().any(|o| o == c.0);
        let ctx = RuleContext {
            config: cfg,
            root: &composed.root,
            sources: &composed.sources,
            model: model.as_ref(),
            missing: &missing,
            defaults: Default::default(),
        };
        diagnostics.extend(rules::run(&ctx, &enabled));
        // What `verlc build` could not bind, reported here at the YAML line (B01x).
        // What verl accepts but verlc's generated trainer cannot bind is a warning here
        // (`verlc check` judges verl validity); `verlc build` keeps it an error.
        diagnostics.extend(
            plan::check_diagnostics(&ctx, &enabled)
                .into_iter()
                .map(|mut d| {
                    if d.is_error() {
                        d.severity = crate::diag::Severity::Warning;
                        d.notes
                            .push("valid for verl; `verlc build` rejects it".into());
                    }
                    d
                }),
        );
    }
    Checked {
        composed,
        config,
        model,
        diagnostics,
    }
}

/// One bad value copied by interpolation (`critic.loss_agg_mode` from the actor's) fails
/// the schema at every copy; report it once, naming the other keys.
fn merge_same_origin(diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut out: Vec<Diagnostic> = Vec::new();
    let mut first_at: std::collections::HashMap<(Code, crate::source::Origin), usize> =
        std::collections::HashMap::new();
    for d in diags {
        let slot = d.primary.as_ref().map(|l| (d.code, l.origin.clone()));
        match (slot.as_ref().and_then(|k| first_at.get(k)), &d.key_path) {
            (Some(&i), Some(key)) => out[i]
                .notes
                .push(format!("`{key}` takes this value too, by interpolation")),
            _ => {
                if let Some(k) = slot {
                    first_at.entry(k).or_insert(out.len());
                }
                out.push(d);
            }
        }
    }
    out
}

fn mandatory_help(key: &str, schema: &Option<serde_json::Value>) -> String {
    let choices: Vec<String> = schema
        .as_ref()
        .and_then(|s| {
            s.get("enum")
                .or_else(|| s.get("oneOf"))
                .and_then(serde_json::Value::as_array)
                .cloned()
        })
        .map(|a| {
            a.iter()
                .filter_map(|v| {
                    v.as_str()
                        .or_else(|| v.get("const").and_then(|c| c.as_str()))
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default();
    if choices.is_empty() {
        format!("set it in your config or on the command line: `{key}=...`")
    } else {
        format!(
            "set it, e.g. `{key}={}` (one of: {})",
            choices[0],
            choices.join(", ")
        )
    }
}

/// The tree with every `???` replaced by null, and the dotted keys that held one.
pub fn unset_mandatory(root: &Node) -> (Node, Vec<String>) {
    fn go(n: &mut Node, path: &mut Vec<String>, out: &mut Vec<String>) {
        if n.is_missing() {
            out.push(path.join("."));
            n.value = Value::Scalar(Scalar::Null);
            return;
        }
        match &mut n.value {
            Value::Map(m) => {
                for (k, e) in m.iter_mut() {
                    path.push(k.clone());
                    go(&mut e.node, path, out);
                    path.pop();
                }
            }
            Value::Seq(items) => {
                for (i, c) in items.iter_mut().enumerate() {
                    path.push(i.to_string());
                    go(c, path, out);
                    path.pop();
                }
            }
            Value::Scalar(_) => {}
        }
    }
    let mut tree = root.clone();
    let mut missing = Vec::new();
    go(&mut tree, &mut Vec::new(), &mut missing);
    (tree, missing)
}

fn model_dir_from_tree(c: &Composed) -> Option<PathBuf> {
    let p = c
        .root
        .get_path(&["actor_rollout_ref", "model", "path"])?
        .as_str()?;
    let p = expand_home(p);
    p.join("config.json").is_file().then_some(p)
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// Read the dimensions of a Hugging Face `config.json` (file or directory).
pub fn read_model_dims(path: &Path) -> Result<ModelDims, String> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read model config {}: {e}", file.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a usable model config.json: {e}", file.display()))
}

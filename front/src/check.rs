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
    /// For a tree of a verl release verlc does not model: that tree composed with only the
    /// user's config-group choices, against which "changed" is judged (verl's own defaults are not
    /// the user's settings). `None`: verlc's built-in defaults are the baseline.
    pub baseline: Option<Node>,
    /// The typed config, when the tree passed the schema (a PPO config).
    pub config: Option<VerlConfig>,
    /// Which of verl's trainers the config is for.
    pub kind: crate::sft::ConfigKind,
    /// The values of an SFT config, when its keys and types passed (see [`crate::sft`]).
    pub sft: Option<crate::sft::SftConfig>,
    /// The verl release the config was judged against: the config dir's (its version file,
    /// else its layout), else verlc's built-in tree's.
    pub release: String,
    /// The release's version (`0.9.1`; for a tree known by its layout alone, what is known).
    pub release_version: String,
    pub model: Option<ModelDims>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Checked {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

pub fn check(req: &LoadRequest, opts: &CheckOptions) -> Checked {
    // The release judged against: the config dir's (its version file, else its layout), else
    // that of the built-in tree its missing configs come from.
    // A config dir that is no verl tree itself (an example's `config/`) is judged by the tree
    // its search path reaches.
    let dir_release = req
        .config_dir
        .as_deref()
        .and_then(crate::load::version::verl_release)
        .or_else(|| crate::load::version::searchpath_release(req));
    let release = dir_release
        .clone()
        .unwrap_or_else(|| format!("{}, verlc's built-in tree", req.builtin.version()));
    let tree_release = dir_release.unwrap_or_else(|| req.builtin.version().to_owned());
    let newer_release =
        Some(tree_release.clone()).filter(|v| !crate::load::version::is_modelled(v));
    // A newer release's tree is also composed as verl ships it with the user's group choices
    // (the baseline below): without a config file of the user's, that is the first composition
    // before its value overrides; with one, a second composition without the file, which
    // starts from the files the first one parsed.
    let user_config = req.config_file.is_some() || req.config_text.is_some();
    let (composed, mut files, mut early_baseline) = match (&newer_release, user_config) {
        (None, _) => (compose::load(req), None, None),
        (Some(_), false) => {
            let (c, b) = compose::load_with_baseline(req);
            (c, None, Some(b))
        }
        (Some(_), true) => {
            let (c, f) = compose::load_keeping_files(req);
            (c, Some(f), None)
        }
    };
    let mut diagnostics = composed.diagnostics.clone();
    let kind = crate::sft::kind_of(&composed.root);
    if kind != crate::sft::ConfigKind::Ppo {
        let user_file = req.config_file.as_ref().map(|f| f.display().to_string());
        return check_sft(
            composed,
            diagnostics,
            kind,
            (release, tree_release),
            (user_file, opts.model_config.as_deref()),
            req.config_text.is_some(),
        );
    }
    // `???` is "not set yet": verl fails only when it reads such a key, so the schema sees
    // null and a rule decides which missing values verl would actually read.
    let (mut tree, missing) = unset_mandatory(&composed.root);
    // On a newer release's tree, findings in verl's own files pass through (see
    // `pass_through_unmodelled`): no "did you mean" is searched for them.
    let user_file = req.config_file.as_ref().map(|f| f.display().to_string());
    let suggest = |o: Option<&crate::source::Origin>| {
        newer_release.is_none()
            || o.is_none_or(|o| !is_verl_file(composed.sources.get(o.source), &user_file))
    };
    let (mut schema_diags, not_built) = schema::validate_counted_with(&tree, &suggest);
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
                    &crate::load::node::split_key(&key),
                )
                .cloned(),
            ));
        }
    }
    // The typed model does not hold them: the check's own copy drops them.
    for key in custom_data_keys(&mut schema_diags, &composed.sources) {
        let path = crate::load::node::split_key(&key);
        if let Some((last, parent)) = path.split_last()
            && let Some(m) = tree.get_path_mut(parent).and_then(Node::as_map_mut)
        {
            m.swap_remove(*last);
        }
    }
    // verlc's defaults of the config's flavour, composed at most once: the repairs below
    // put them in place of values the schema refused.
    let builtin = std::cell::OnceCell::new();
    let defaults = || *builtin.get_or_init(|| builtin_defaults(&composed.root));
    // A tree of another verl release: verl's own keys that differ pass through.
    let mut unmodelled: Vec<String> = Vec::new();
    let mut baseline = None;
    let unmodelled_release = newer_release;
    if let Some(version) = unmodelled_release.clone()
        && let Some((note, keys)) = pass_through_unmodelled(
            req,
            &version,
            &mut schema_diags,
            &mut tree,
            &composed.sources,
            defaults(),
        )
    {
        diagnostics.extend(note);
        unmodelled = keys;
        // verl's own tree as the user's config groups select it (`model_engine=megatron`
        // swaps whole sections): what the user did not write is not theirs.
        baseline = Some(match early_baseline.take() {
            Some(b) => b,
            None => {
                // Composed again: a plain config file's baseline is the base it was merged
                // over, without the file.
                let baseline_req = LoadRequest {
                    config_file: None,
                    config_text: None,
                    config_name: composed.base.clone().or_else(|| req.config_name.clone()),
                    base: None,
                    overrides: group_choices(req),
                    ..req.clone()
                };
                match files.take() {
                    Some(f) => compose::load_tree_with_files(&baseline_req, f),
                    None => compose::load(&baseline_req).root,
                }
            }
        });
    }
    // verl 0.8 removed the legacy per-backend workers (and `trainer.use_legacy_worker_impl`):
    // a newer tree runs the engine workers, so verl 0.7's rules for the legacy ones do not apply.
    if unmodelled_release
        .as_deref()
        .and_then(crate::load::version::minor_version)
        .is_some_and(|v| v >= (0, 8))
        && composed
            .root
            .get_path(&["trainer", "use_legacy_worker_impl"])
            .is_none()
        && let Some(t) = tree.get_path_mut(&["trainer"]).and_then(Node::as_map_mut)
    {
        t.insert(
            "use_legacy_worker_impl".to_owned(),
            crate::load::node::Entry {
                key_origin: None,
                node: Node::scalar(Scalar::Str("disable".into()), None),
            },
        );
    }
    // verl's VeOmni engine: the check's copy holds the FSDP role it equals (`crate::veomni`).
    if let Some(version) = unmodelled_release.as_deref() {
        let minor = crate::load::version::minor_version(version);
        diagnostics.extend(crate::veomni::as_fsdp(&mut tree, &composed.root, minor));
    }
    let schema_clean = !schema_diags.iter().any(Diagnostic::is_error);
    // A composition that failed (unreadable file, missing config or group option) leaves
    // parts of the tree out: the keys it misses are follow-ons, not findings.
    let incomplete = diagnostics
        .iter()
        .any(|d| d.is_error() && INCOMPLETE_TREE.contains(&d.code));
    if incomplete {
        schema_diags
            .retain(|d| d.code != codes::SCHEMA_REQUIRED && d.code != codes::MANDATORY_MISSING);
    }
    // With schema errors the rules still judge what is well-typed: each bad value is
    // replaced by verl's default for the check's own use, and findings about the replaced
    // keys are dropped (the schema error already says what is wrong there).
    // Past a few hundred errors the file is not a verl config: rules would judge defaults.
    // So is a tree of more than a hundred thousand values (verl's has about a thousand): its
    // two repaired copies would only cost memory.
    let repaired = if schema_clean
        || incomplete
        || schema_diags.len() > MAX_REPAIRS
        || tree.count() > MAX_REPAIR_NODES
    {
        None
    } else {
        repair(&tree, &schema_diags, defaults(), false).zip(repair(
            &tree,
            &schema_diags,
            defaults(),
            true,
        ))
    };
    diagnostics.extend(merge_same_origin(schema_diags, &tree));

    let mut config = None;
    if schema_clean && !incomplete {
        match crate::load::node_de::from_node::<VerlConfig>(&tree) {
            Ok(c) => config = Some(c),
            Err(e) => {
                let floats = floats_for_integers(&tree);
                if floats.is_empty() {
                    diagnostics.push(Diagnostic::error(
                        codes::SCHEMA_OTHER,
                        format!("config does not match the typed model: {e}"),
                    ));
                }
                diagnostics.extend(floats);
            }
        }
    }

    // Read whatever else the config has: a bad `--model-config` is reported even when the
    // config has errors of its own.
    let mut model = None;
    let model_path = opts
        .model_config
        .clone()
        .or_else(|| model_dir_from_tree(&composed));
    if let Some(p) = model_path {
        match read_model_dims(&p) {
            Ok(m) => model = Some(m),
            Err(e) => {
                // Named by the config: point at the key; by `--model-config`: at the file.
                let at = opts
                    .model_config
                    .is_none()
                    .then(|| {
                        composed
                            .root
                            .get_path(&["actor_rollout_ref", "model", "path"])
                            .and_then(|n| n.origin.clone())
                    })
                    .flatten();
                let mut d = Diagnostic::error(e.code(), e.to_string())
                    .with_file(e.file().display().to_string())
                    .with_primary(at, "the model named here");
                if opts.model_config.is_none() {
                    d = d.with_key("actor_rollout_ref.model.path");
                }
                diagnostics.push(d.with_help(
                    "the model-aware rules and `verlc explain` read hidden_size, num_attention_heads, num_key_value_heads, num_hidden_layers and vocab_size from it",
                ));
            }
        }
    }
    let only: Vec<String> = opts.only.iter().map(|s| s.to_ascii_uppercase()).collect();
    let enabled = |c: Code| only.is_empty() || only.iter().any(|o| o == c.0);
    let judge = |cfg: &VerlConfig| {
        let ctx = RuleContext {
            config: cfg,
            root: &composed.root,
            sources: &composed.sources,
            model: model.as_ref(),
            missing: &missing,
            defaults: baseline.as_ref(),
            release: unmodelled_release
                .as_deref()
                .and_then(crate::load::version::release_triple),
        };
        let mut out = rules::run(&ctx, &enabled);
        if out.iter().any(|d| d.code == codes::SIZE_OVERFLOW) {
            return out;
        }
        // What `verlc build` could not bind, reported here at the YAML line (B01x).
        // What verl accepts but verlc's generated trainer cannot bind is a warning here
        // (`verlc check` judges verl validity); `verlc build` keeps it an error.
        out.extend(
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
        out
    };
    if let Some(cfg) = &config {
        // Nothing about the keys of another verl release that passed through unchecked, except
        // that a key the release moved or dropped is set (V059), and what `verlc build` makes
        // of a key the user wrote there (a verdict, e.g. `distillation.enabled` refused).
        let user_file = req.config_file.as_ref().map(|f| f.display().to_string());
        let written_by_user = |d: &Diagnostic| {
            d.code.0.starts_with('B')
                && d.primary.as_ref().is_some_and(|l| {
                    let src = composed.sources.get(l.origin.source);
                    src.kind == crate::source::SourceKind::Override
                        || Some(&src.name) == user_file.as_ref()
                })
        };
        diagnostics.extend(
            judge(cfg)
                .into_iter()
                .filter(|d| d.code.0 == "V059" || written_by_user(d) || !about_any(d, &unmodelled)),
        );
    } else if let Some(((a, replaced), (b, _))) = repaired {
        // Findings that change when the replaced values change depend on them: only those
        // the two repairs agree on are reported, and none about a replaced key.
        let other = judge(&b);
        let same = |x: &Diagnostic, y: &Diagnostic| {
            x.code == y.code && x.key_path == y.key_path && x.message == y.message
        };
        diagnostics.extend(
            judge(&a)
                .into_iter()
                .filter(|d| !about_any(d, &replaced) && other.iter().any(|o| same(d, o))),
        );
    }
    cap_diagnostics(&mut diagnostics, not_built);
    // Environment values read by `${oc.env:...}` never reach the output (see `redact`).
    composed.secrets().redact_diagnostics(&mut diagnostics);
    Checked {
        composed,
        baseline,
        config,
        kind,
        sft: None,
        release,
        release_version: tree_release,
        model,
        diagnostics,
    }
}

/// The check of a config of verl's SFT trainer (see [`crate::sft`]): its keys and types
/// against the release's SFT table (0.7.0's legacy config against its own), then the SFT
/// rules.
fn check_sft(
    composed: Composed,
    mut diagnostics: Vec<Diagnostic>,
    kind: crate::sft::ConfigKind,
    (release, tree_release): (String, String),
    (user_file, model_config): (Option<String>, Option<&Path>),
    embedded: bool,
) -> Checked {
    let mut sft = None;
    // The model's dimensions for `explain`'s memory estimate: `--model-config`, else the
    // checkpoint the config names when it is at hand (a local directory or the Hub cache).
    let key: &[&str] = if kind == crate::sft::ConfigKind::LegacySft {
        &["model", "partial_pretrain"]
    } else {
        &["model", "path"]
    };
    let mut model = None;
    if let Some(p) = model_config
        .map(Path::to_path_buf)
        .or_else(|| model_dir_at(&composed, key))
    {
        match read_model_dims(&p) {
            Ok(m) => model = Some(m),
            Err(e) => {
                let at = model_config
                    .is_none()
                    .then(|| composed.root.get_path(key).and_then(|n| n.origin.clone()))
                    .flatten();
                let mut d = Diagnostic::error(e.code(), e.to_string())
                    .with_file(e.file().display().to_string())
                    .with_primary(at, "the model named here");
                if model_config.is_none() {
                    d = d.with_key(key.join("."));
                }
                diagnostics.push(d.with_help(
                    "`verlc explain` reads the model's dimensions from it for its memory estimate",
                ));
            }
        }
    }
    if !composed.has_errors() {
        let users = |o: Option<&crate::source::Origin>| {
            o.is_some_and(|o| !is_verl_file(composed.sources.get(o.source), &user_file))
        };
        // A trainer binary's embedded config: its world is the one the binary launches.
        let world_stated = embedded;
        let checked = crate::sft::check(&composed.root, &tree_release, &users, world_stated);
        let valid = !checked.diagnostics.iter().any(Diagnostic::is_error);
        diagnostics.extend(checked.diagnostics);
        // What verl accepts but a verlc trainer cannot honour: warnings here, errors for
        // `verlc build` (`crate::compile`). Only of a config verl would run.
        if let Some(cfg) = checked.config.as_ref().filter(|_| valid) {
            diagnostics.extend(
                crate::sft::lower::build_diagnostics(cfg, &composed.root, &tree_release, &users)
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
        sft = checked.config;
    }
    composed.secrets().redact_diagnostics(&mut diagnostics);
    Checked {
        composed,
        baseline: None,
        config: None,
        kind,
        sft,
        release,
        release_version: tree_release,
        model,
        diagnostics,
    }
}

/// JSON Schema counts `64.0` as an integer, verl's typed model (and verlc's) does not: each
/// such value, at its key and line.
fn floats_for_integers(tree: &Node) -> Vec<Diagnostic> {
    fn types(s: &serde_json::Value, out: &mut Vec<String>) {
        match s.get("type") {
            Some(serde_json::Value::String(t)) => out.push(t.clone()),
            Some(serde_json::Value::Array(ts)) => {
                out.extend(ts.iter().filter_map(|t| t.as_str().map(str::to_owned)))
            }
            _ => {}
        }
        for branch in s
            .get("anyOf")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
        {
            types(branch, out);
        }
    }
    let mut out = Vec::new();
    tree.walk(&mut |ptr, node, _| {
        let Value::Scalar(Scalar::Float(f)) = &node.value else {
            return;
        };
        let segs: Vec<&str> = ptr.split('/').filter(|s| !s.is_empty()).collect();
        let Some(schema) = schema::schema_at(schema::validation_schema(), &segs) else {
            return;
        };
        let mut ts = Vec::new();
        types(schema, &mut ts);
        if ts.iter().any(|t| t == "integer") && !ts.iter().any(|t| t == "number") {
            let key = segs.join(".");
            out.push(
                Diagnostic::error(
                    codes::SCHEMA_TYPE,
                    format!(
                        "`{key}` must be an integer, got float {}",
                        crate::load::node::format_float(*f)
                    ),
                )
                .with_key(key.clone())
                .with_primary(node.origin.clone(), "expected an integer")
                .with_help(format!(
                    "write it without the fraction: `{key}={}`",
                    *f as i64
                )),
            );
        }
    });
    out
}

/// `+data.<key>=...` adds a key for a custom dataset class (verl hands the whole `data`
/// section to it): a warning that verl accepts it and only that class reads it, not an
/// unknown-key error. Keys written without `+` (and in files) stay errors, with their
/// did-you-mean: a typo there is likelier than a new key.
fn custom_data_keys(diags: &mut [Diagnostic], sources: &crate::source::SourceMap) -> Vec<String> {
    let mut keys = Vec::new();
    for d in diags.iter_mut() {
        let added = d.primary.as_ref().is_some_and(|l| {
            let src = sources.get(l.origin.source);
            src.kind == crate::source::SourceKind::Override
                && src.text.trim_start().starts_with('+')
        });
        let is_data = d
            .key_path
            .as_deref()
            .is_some_and(|k| k.starts_with("data."));
        if d.code == codes::SCHEMA_UNKNOWN_KEY && added && is_data {
            d.severity = crate::diag::Severity::Warning;
            d.message = format!(
                "{} (added with `+` for a custom dataset class, which verl hands the `data` section to)",
                d.message
            );
            d.help = None;
            keys.extend(d.key_path.clone());
        }
    }
    keys
}

pub use crate::diag::MAX_DIAGNOSTICS;

/// Keep the first [`MAX_DIAGNOSTICS`] and say how many more there were, counting the
/// findings the schema stage did not build (`not_built`); an error, so the exit status does
/// not change.
fn cap_diagnostics(diags: &mut Vec<Diagnostic>, not_built: usize) {
    let mut hidden = not_built;
    if diags.len() > MAX_DIAGNOSTICS {
        hidden += diags.len() - MAX_DIAGNOSTICS;
        diags.truncate(MAX_DIAGNOSTICS);
    }
    if hidden > 0 {
        diags.push(schema::not_shown(hidden));
    }
}

/// Most schema errors the check repairs to run the rules anyway.
const MAX_REPAIRS: usize = 200;
/// Largest tree (in nodes) the check repairs.
const MAX_REPAIR_NODES: usize = 100_000;

/// Whether `d` is about one of `keys` (the key itself, inside it, or a section holding it).
fn about_any(d: &Diagnostic, keys: &[String]) -> bool {
    d.key_path
        .as_deref()
        .is_some_and(|k| keys.iter().any(|r| plan::keys_overlap(k, r)))
}

/// verlc's built-in defaults of `root`'s flavour (Megatron when the actor says so), as
/// composed (a repair unsets the `???` of what it takes from them).
fn builtin_defaults(root: &Node) -> &'static Node {
    let megatron = root
        .get_path(&["actor_rollout_ref", "actor", "strategy"])
        .and_then(Node::as_str)
        == Some("megatron");
    let flavour = if megatron {
        crate::config::Flavour::Megatron
    } else {
        crate::config::Flavour::Fsdp
    };
    compose::builtin_tree(flavour)
}

/// Composition errors after which the tree lacks whole parts.
const INCOMPLETE_TREE: &[Code] = &[
    codes::YAML_SYNTAX,
    codes::YAML_LIMIT,
    codes::IO_ERROR,
    codes::DEFAULTS_SYNTAX,
    codes::CONFIG_NOT_FOUND,
    codes::DEFAULTS_CYCLE,
    codes::GROUP_OPTION_UNKNOWN,
];

/// `tree` with the value of every schema error replaced by the default tree's (verl's
/// default of the same flavour) or removed when the default has no such key, typed; and the
/// replaced keys. `None` when an error has no key or the result still fails the schema.
/// `perturbed` replaces with other values instead (numbers moved, booleans flipped), so a
/// finding that depends on a replaced value shows up differently in the two repairs.
fn repair(
    tree: &Node,
    schema_diags: &[Diagnostic],
    defaults: &Node,
    perturbed: bool,
) -> Option<(VerlConfig, Vec<String>)> {
    let mut fixed = tree.clone();
    let keys = repair_tree(&mut fixed, schema_diags, defaults, perturbed)?;
    if schema::validate(&fixed).iter().any(Diagnostic::is_error) {
        return None;
    }
    let cfg = crate::load::node_de::from_node::<VerlConfig>(&fixed).ok()?;
    Some((cfg, keys))
}

/// [`repair`] in place, untyped: the replaced (or removed) keys.
fn repair_tree(
    tree: &mut Node,
    schema_diags: &[Diagnostic],
    defaults: &Node,
    perturbed: bool,
) -> Option<Vec<String>> {
    let mut keys = Vec::new();
    for d in schema_diags.iter().filter(|d| d.is_error()) {
        let key = d.key_path.clone()?;
        let path = crate::load::node::split_key(&key);
        let (parent_path, last) = path.split_last().map(|(l, p)| (p, *l))?;
        // A key inside a section an earlier repair removed (a newer release's section that
        // copies a bad value, `distillation.*.prompt_length`) is gone already.
        let Some(parent) = tree.get_path_mut(parent_path) else {
            keys.push(key);
            continue;
        };
        let parent = parent.as_map_mut()?;
        match defaults.get_path(&path) {
            Some(v) => {
                // The defaults' `???` is "not set" here too (see `unset_mandatory`).
                let v = unset_mandatory(v).0;
                let v = if perturbed {
                    perturb(
                        &v,
                        schema::schema_at(
                            schema::validation_schema(),
                            &crate::load::node::split_key(&key),
                        ),
                    )
                } else {
                    v
                };
                match parent.get_mut(last) {
                    Some(e) => e.node = v,
                    None => {
                        parent.insert(
                            last.to_owned(),
                            crate::load::node::Entry {
                                key_origin: None,
                                node: v,
                            },
                        );
                    }
                }
            }
            // Order does not matter to the typed config, and shifting is quadratic here.
            None => {
                parent.swap_remove(last);
            }
        }
        keys.push(key);
    }
    Some(keys)
}

/// The overrides of `req` that choose a config group option (`model_engine=megatron`,
/// `actor@actor_rollout_ref.actor=dp_actor`): their key names a directory of the config dir.
fn group_choices(req: &LoadRequest) -> Vec<String> {
    // The tree's groups: the config dir's, else the built-in tree's.
    let repo = crate::load::repo::Repo::new(vec![match &req.config_dir {
        Some(dir) => crate::load::repo::SearchDir::Dir(dir.clone()),
        None => crate::load::repo::SearchDir::Builtin(req.builtin),
    }]);
    req.overrides
        .iter()
        .filter(|o| {
            let key = o.split('=').next().unwrap_or_default();
            let key = key.trim_start_matches(['+', '~']);
            let group = key.split('@').next().unwrap_or_default();
            !group.is_empty() && !group.contains('.') && repo.group_exists(group)
        })
        .cloned()
        .collect()
}

/// Whether `src` is one of verl's own config files (of a `--config-dir` tree or a built-in
/// one), not the user's config file or an override.
fn is_verl_file(src: &crate::source::Source, user_file: &Option<String>) -> bool {
    match src.kind {
        crate::source::SourceKind::Builtin => true,
        crate::source::SourceKind::File => Some(&src.name) != user_file.as_ref(),
        crate::source::SourceKind::Override => false,
    }
}

/// The `strategy` values of the engines verl 0.8 and later ship beside FSDP and Megatron.
const NEWER_ENGINE_STRATEGIES: &[&str] = &[
    "veomni",
    "fsdp_turbo",
    "torchtitan",
    "automodel",
    "mindspeed",
    "mindspeed_megatron",
];

/// For a tree of a verl release verlc does not model key by key: the schema findings about
/// verl's own files (not the user's config file, not an override), and keys the release
/// dropped, are taken out of `schema_diags`; `tree` (the check's copy) gets verlc's defaults
/// in their place. Those keys' values (verl's and the user's) are then checked against the
/// release's leaf table ([`crate::load::release_table`]: type errors go back into
/// `schema_diags`); keys no table holds pass through, listed by one `S007` warning. Returns
/// the warning (none when the table holds every key) and all the keys taken out.
fn pass_through_unmodelled(
    req: &LoadRequest,
    version: &str,
    schema_diags: &mut Vec<Diagnostic>,
    tree: &mut Node,
    sources: &crate::source::SourceMap,
    defaults: &Node,
) -> Option<(Option<Diagnostic>, Vec<String>)> {
    let user_file = req.config_file.as_ref().map(|f| f.display().to_string());
    // The strategies of the engines verl 0.8 added (`model_engine=veomni` sets them in verl's
    // own files; users also write them by hand): valid for the release, refused by the build.
    let newer_engine = |d: &Diagnostic| {
        d.code == codes::SCHEMA_ENUM
            && crate::load::version::minor_version(version).is_some_and(|v| v >= (0, 8))
            && d.key_path
                .as_deref()
                .filter(|k| k.ends_with(".strategy"))
                .and_then(|k| tree.get_path(&crate::load::node::split_key(k)))
                .and_then(Node::as_str)
                .is_some_and(|v| NEWER_ENGINE_STRATEGIES.contains(&v))
    };
    // VeOmni's optimizer keys hold VeOmni's values (`adamw`, a `linear` schedule): the release
    // table types them, lowering refuses what FSDP cannot run (`crate::veomni`).
    let veomni_value = |d: &Diagnostic| {
        d.key_path
            .as_deref()
            .is_some_and(|k| crate::veomni::holds_veomni_value(tree, k))
    };
    let table = crate::load::release_table::for_release(version);
    // A key the user wrote in their own file that verlc's schema does not model, but that the
    // release's table holds (verl 0.9's `rollout.nnodes`): judged by that table, as the same
    // key given as an override (which lands on verl's own line) is.
    let release_key = |d: &Diagnostic| {
        d.code == codes::SCHEMA_UNKNOWN_KEY
            && d.key_path
                .as_deref()
                .is_some_and(|k| table.as_ref().is_some_and(|t| t.holds(k)))
    };
    let from_verl = |d: &Diagnostic| {
        if d.code == codes::SCHEMA_REQUIRED || newer_engine(d) || veomni_value(d) {
            return true;
        }
        let schema_code = [
            codes::SCHEMA_UNKNOWN_KEY,
            codes::SCHEMA_TYPE,
            codes::SCHEMA_ENUM,
            codes::SCHEMA_RANGE,
        ]
        .contains(&d.code);
        schema_code
            && (release_key(d)
                || d.primary
                    .as_ref()
                    .is_some_and(|l| is_verl_file(sources.get(l.origin.source), &user_file)))
    };
    let (verl, user): (Vec<Diagnostic>, Vec<Diagnostic>) = std::mem::take(schema_diags)
        .into_iter()
        .partition(|d| d.is_error() && from_verl(d));
    *schema_diags = user;
    if verl.is_empty() {
        return None;
    }
    // The release's own table types these keys (verl's values and the user's alike, read
    // before the repair below replaces them); what it does not hold passes through, said once.
    let mut unchecked: Vec<String> = Vec::new();
    if let Some(table) = &table {
        let mut seen = std::collections::HashSet::new();
        for k in verl.iter().filter_map(|d| d.key_path.as_deref()) {
            if !seen.insert(k) {
                continue;
            }
            // A key of verlc's model this release does not have: nothing to check.
            let known = tree
                .get_path(&crate::load::node::split_key(k))
                .is_none_or(|node| table.check(k, node, schema_diags));
            if !known {
                unchecked.push(k.to_owned());
            }
        }
    }
    let keys = repair_tree(tree, &verl, defaults, false)?;
    if table.is_none() {
        unchecked = keys.clone();
    }
    if unchecked.is_empty() {
        return Some((None, keys));
    }
    let shown: Vec<&str> = unchecked.iter().take(12).map(String::as_str).collect();
    let more = unchecked.len().saturating_sub(shown.len());
    let judged = match &table {
        Some(t) => format!(
            "verlc checked its keys against verl {}'s leaf table",
            t.release
        ),
        None => format!(
            "verlc has no leaf table for it (it carries {})",
            crate::load::release_table::RELEASE_TABLES
                .iter()
                .map(|(r, ..)| *r)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut d = Diagnostic::warning(
        codes::SCHEMA_UNMODELLED_RELEASE,
        format!(
            "this config tree is verl {version}; {judged}: {} key(s) of verl's own files are in no table and pass unchecked",
            unchecked.len()
        ),
    )
    .with_help(format!(
        "keys you set in your own file or on the command line are still checked; a trainer built by `verlc build` runs verl {}'s semantics for these keys",
        crate::load::version::MODELLED
    ));
    d.notes.push(format!(
        "unchecked: {}{}",
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ));
    Some((Some(d), keys))
}

/// Another valid-looking value of the same type: integers and floats moved, booleans flipped,
/// a string of an enum (`schema`, the key's subschema) swapped for another member (other
/// strings, nulls and containers stay). A finding that depends on the replaced value (a
/// mistyped `adv_estimator` replaced by `gae` needs a critic) then differs between the two
/// repairs and is dropped.
fn perturb(n: &Node, schema: Option<&serde_json::Value>) -> Node {
    let mut out = n.clone();
    if let Value::Scalar(s) = &mut out.value {
        match s {
            Scalar::Int(i) => *i = i.saturating_mul(7).saturating_add(3),
            Scalar::Float(f) => *f = (*f + 0.5) / 2.0,
            Scalar::Bool(b) => *b = !*b,
            Scalar::Str(v) => {
                if let Some(other) = schema
                    .and_then(|s| s.get("enum"))
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(serde_json::Value::as_str)
                    .find(|o| o != v)
                {
                    *v = other.to_owned();
                }
            }
            Scalar::Null => {}
        }
    }
    out
}

/// One bad value copied by interpolation (`critic.loss_agg_mode` from the actor's) fails
/// the schema at every copy; report it once, naming the other keys.
/// The key the user wrote leads (`data.max_prompt_length`, not the
/// `actor_rollout_ref.rollout.prompt_length` that copies it).
fn merge_same_origin(diags: Vec<Diagnostic>, tree: &Node) -> Vec<Diagnostic> {
    let copied = |d: &Diagnostic| {
        d.key_path
            .as_deref()
            .and_then(|k| tree.get_path(&crate::load::node::split_key(k)))
            .is_some_and(|n| n.via.is_some())
    };
    let mut out: Vec<Diagnostic> = Vec::new();
    let mut first_at: std::collections::HashMap<(Code, crate::source::Origin), usize> =
        std::collections::HashMap::new();
    for d in diags {
        let slot = d.primary.as_ref().map(|l| (d.code, l.origin.clone()));
        match (slot.as_ref().and_then(|k| first_at.get(k)), &d.key_path) {
            (Some(&i), Some(_)) if copied(&out[i]) && !copied(&d) => {
                let copy = std::mem::replace(&mut out[i], d);
                out[i].notes.extend(copy.notes);
                if let Some(key) = copy.key_path {
                    out[i]
                        .notes
                        .push(format!("`{key}` takes this value too, by interpolation"));
                }
            }
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
    let found = root.paths_where(&Node::is_missing);
    let mut tree = root.clone();
    for path in &found {
        let segments: Vec<&str> = path.iter().map(String::as_str).collect();
        if let Some(n) = tree.get_path_mut(&segments) {
            n.value = Value::Scalar(Scalar::Null);
        }
    }
    (tree, found.iter().map(|p| p.join(".")).collect())
}

fn model_dir_from_tree(c: &Composed) -> Option<PathBuf> {
    model_dir_at(c, &["actor_rollout_ref", "model", "path"])
}

/// The local directory (or cached Hub snapshot) of the model named at `key`.
fn model_dir_at(c: &Composed, key: &[&str]) -> Option<PathBuf> {
    let p = c.root.get_path(key)?.as_str()?;
    let local = expand_home(p);
    // Anything there named config.json is read (and a special file refused), not skipped.
    if local.join("config.json").exists() {
        return Some(local);
    }
    // A Hub id already in the Hub cache (check never downloads; `verlc build` does).
    let env = verlc_hub::HubEnv::from_env();
    match verlc_hub::locate(p, None, &env).ok()? {
        verlc_hub::ModelLocation::Hub(snapshot) => Some(snapshot.dir),
        _ => None,
    }
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// Why a model's `config.json` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelConfigError {
    #[error("cannot use the model config: {0}")]
    Read(crate::load::read::ReadError),
    #[error("{} is not a usable model config.json: {why}", file.display())]
    Invalid { file: PathBuf, why: String },
}

impl ModelConfigError {
    /// An unreadable file is an I/O problem (exit status 2); a file that reads but holds
    /// impossible values is a config problem.
    pub fn code(&self) -> Code {
        match self {
            ModelConfigError::Read(e) => compose::read_error_code(e),
            ModelConfigError::Invalid { .. } => codes::MODEL_CONFIG_UNUSABLE,
        }
    }

    pub fn file(&self) -> &Path {
        match self {
            ModelConfigError::Read(e) => e.path(),
            ModelConfigError::Invalid { file, .. } => file,
        }
    }
}

/// Largest sizes a model config may give: a hundred times today's largest models. Past
/// them the file is not a model (or a typo), and the estimates would be nonsense.
const MAX_HIDDEN: u64 = 1 << 20;
const MAX_VOCAB: u64 = 1 << 24;
const MAX_LAYERS: u64 = 1 << 16;
const MAX_HEADS: u64 = 1 << 16;

/// Read the dimensions of a Hugging Face `config.json` (file or directory). A multimodal
/// config (Qwen2.5-VL, Qwen3.5) keeps the language model's sizes under `text_config`.
pub fn read_model_dims(path: &Path) -> Result<ModelDims, ModelConfigError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let invalid = |why: String| ModelConfigError::Invalid {
        file: file.clone(),
        why,
    };
    let text = crate::load::read::read_text(&file, crate::load::read::MAX_SIDE_FILE_BYTES)
        .map_err(ModelConfigError::Read)?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("not JSON: {e}")))?;
    if json.get("hidden_size").is_none()
        && let Some(text_config) = json.get("text_config").cloned()
        && text_config.is_object()
    {
        let model_type = json.get("model_type").cloned();
        let vision = json.get("vision_config").cloned();
        json = text_config;
        if let Some(m) = json.as_object_mut() {
            // The family and its vision tower are the multimodal config's.
            if let Some(t) = model_type {
                m.insert("model_type".into(), t);
            }
            if let Some(v) = vision {
                m.entry("vision_config").or_insert(v);
            }
        }
    }
    let dims: ModelDims = serde_json::from_value(json).map_err(|e| invalid(e.to_string()))?;
    validate_dims(&dims).map_err(invalid)?;
    Ok(dims)
}

/// Sizes that no model has: zero, beyond the bounds above, heads that do not divide.
fn validate_dims(m: &ModelDims) -> Result<(), String> {
    let sizes = [
        ("hidden_size", Some(m.hidden_size), MAX_HIDDEN),
        (
            "num_attention_heads",
            Some(m.num_attention_heads),
            MAX_HEADS,
        ),
        ("num_key_value_heads", m.num_key_value_heads, MAX_HEADS),
        ("num_hidden_layers", Some(m.num_hidden_layers), MAX_LAYERS),
        ("vocab_size", Some(m.vocab_size), MAX_VOCAB),
        ("intermediate_size", m.intermediate_size, MAX_VOCAB),
        ("head_dim", m.head_dim, MAX_HIDDEN),
    ];
    for (key, value, max) in sizes {
        match value {
            Some(0) => return Err(format!("`{key}` is 0")),
            Some(v) if v > max => return Err(format!("`{key}` is {v}, beyond {max}")),
            _ => {}
        }
    }
    let kv = m.kv_heads();
    if !m.num_attention_heads.is_multiple_of(kv) {
        return Err(format!(
            "`num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({kv})",
            m.num_attention_heads
        ));
    }
    if m.head_dim.is_none() && !m.hidden_size.is_multiple_of(m.num_attention_heads) {
        return Err(format!(
            "`hidden_size` ({}) does not divide by `num_attention_heads` ({}) and no `head_dim` is given",
            m.hidden_size, m.num_attention_heads
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes_of(overrides: &[&str], file: Option<&str>) -> Vec<&'static str> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let req = LoadRequest {
            config_file: file.map(|f| root.join(f)),
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            cwd: root,
            ..LoadRequest::default()
        };
        let mut c: Vec<&'static str> = check(&req, &CheckOptions::default())
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.code.0)
            .collect();
        c.sort();
        c
    }

    /// A key of an enclosing section written one level too deep is pointed at its place
    /// (verl's SAPO scripts write the actor's `tau_pos` under `policy_loss`).
    #[test]
    fn an_unknown_key_of_an_enclosing_section_is_pointed_at_its_place() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let req = LoadRequest {
            config_file: Some(root.join("examples/quickstart.yaml")),
            overrides: vec!["+actor_rollout_ref.actor.policy_loss.tau_pos=1.0".into()],
            cwd: root,
            ..LoadRequest::default()
        };
        let checked = check(&req, &CheckOptions::default());
        let d = checked
            .diagnostics
            .iter()
            .find(|d| d.code == codes::SCHEMA_UNKNOWN_KEY)
            .expect("an unknown key");
        assert_eq!(
            d.help.as_deref(),
            Some(
                "`tau_pos` is a key of an enclosing section: did you mean `actor_rollout_ref.actor.tau_pos`?"
            ),
            "{d:?}"
        );
    }

    #[test]
    fn schema_errors_do_not_hide_semantic_findings() {
        let qs = Some("examples/quickstart.yaml");
        // A type error elsewhere, and a mini-batch larger than the step (V002).
        assert_eq!(
            codes_of(
                &[
                    "data.max_prompt_length=abc",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=1000"
                ],
                qs
            ),
            ["S002", "V002"]
        );
        // No finding that only the stand-in value caused: with `rollout.n` replaced, the
        // quickstart's micro-batch of 128 would not divide 16 × 1 responses (V006).
        assert_eq!(
            codes_of(
                &[
                    "data.max_prompt_length=abc",
                    "actor_rollout_ref.rollout.n=-2"
                ],
                qs
            ),
            ["S002", "S004"]
        );
        // Nor one that an enum's stand-in caused: `gae` in place of a mistyped estimator would
        // need a critic and its micro-batch (V009).
        assert_eq!(codes_of(&["algorithm.adv_estimator=grpoo"], qs), ["S003"]);
    }

    #[test]
    fn a_failed_composition_yields_no_follow_on_errors() {
        // A group option that does not exist, a config that cannot be found.
        assert_eq!(
            codes_of(
                &["actor_rollout_ref/rollout=nope"],
                Some("examples/quickstart.yaml")
            ),
            ["H011"]
        );
        let missing = LoadRequest {
            config_name: Some("no_such_config".into()),
            ..LoadRequest::default()
        };
        let errors: Vec<_> = check(&missing, &CheckOptions::default())
            .diagnostics
            .into_iter()
            .filter(Diagnostic::is_error)
            .map(|d| d.code.0)
            .collect();
        assert_eq!(errors, ["H002"]);
    }

    #[test]
    fn the_key_the_user_wrote_leads_an_error_copied_by_interpolation() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let req = LoadRequest {
            config_file: Some(root.join("examples/quickstart.yaml")),
            overrides: vec!["data.max_prompt_length=abc".into()],
            cwd: root,
            ..LoadRequest::default()
        };
        let c = check(&req, &CheckOptions::default());
        let d = c
            .diagnostics
            .iter()
            .find(|d| d.code == codes::SCHEMA_TYPE)
            .expect("S002");
        assert_eq!(d.key_path.as_deref(), Some("data.max_prompt_length"));
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("actor_rollout_ref.rollout.prompt_length")),
            "{:?}",
            d.notes
        );
    }

    fn diagnostics_of(overrides: &[&str]) -> Vec<Diagnostic> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let req = LoadRequest {
            config_file: Some(root.join("examples/quickstart.yaml")),
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            cwd: root,
            ..LoadRequest::default()
        };
        check(&req, &CheckOptions::default()).diagnostics
    }

    #[test]
    fn case_slips_and_list_items_get_a_did_you_mean() {
        let d = diagnostics_of(&[
            "algorithm.adv_estimator=GRPO",
            "actor_rollout_ref.rollout.name=vLLM",
            "trainer.logger=[console,wandbb]",
        ]);
        let help = |key: &str| {
            d.iter()
                .find(|x| x.key_path.as_deref() == Some(key))
                .and_then(|x| x.help.clone())
                .unwrap_or_default()
        };
        assert_eq!(help("algorithm.adv_estimator"), "did you mean `grpo`?");
        assert_eq!(
            help("actor_rollout_ref.rollout.name"),
            "did you mean `vllm`?"
        );
        assert_eq!(help("trainer.logger"), "did you mean `wandb`?");
        assert!(
            d.iter().any(|x| x.message.contains("lists `wandbb`")),
            "{d:#?}"
        );
    }

    #[test]
    fn verl_accepts_numeric_names_and_custom_data_keys() {
        let d = diagnostics_of(&[
            "trainer.experiment_name=20251123",
            "+data.my_dataset_option=3",
        ]);
        assert!(!d.iter().any(Diagnostic::is_error), "{d:#?}");
        assert!(
            d.iter().any(|x| x.code == codes::SCHEMA_UNKNOWN_KEY
                && x.key_path.as_deref() == Some("data.my_dataset_option")),
            "the custom key is still named: {d:#?}"
        );
        // Without `+` (a likely typo) it stays an error.
        let typo = diagnostics_of(&["data.max_prompt_lenght=3"]);
        assert!(typo.iter().any(Diagnostic::is_error));
    }
}

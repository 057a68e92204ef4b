//! JSON Schemas generated from the typed config model ([`crate::config::VerlConfig`]).
//!
//! Subschemas are inlined, so every key path has its own schema object: the same type
//! (an optimizer, an engine) can then carry different defaults at different places
//! (`actor.optim.lr` 1e-6, `critic.optim.lr` 1e-5). Defaults come from verlc's built-in
//! tree, composed and resolved, so the schema and the defaults cannot drift apart.
//!
//! Two flavours:
//! - the *validation* schema ([`validation_schema`]): what `verlc check` runs on a composed
//!   config; every key required.
//! - the *editor* schemas written to `schemas/` ([`all_files`]): nothing required, `${...}`
//!   interpolations and `???` accepted for every value, `defaults:` (and `hydra:` at the
//!   root) allowed, enum values with their descriptions (`enumDescriptions`), deprecated
//!   keys documented and not suggested, one schema for the whole config and one per group
//!   file.
//!
//! Both start from the same normalized schema: schemars' `oneOf` of documented `const`s
//! becomes a plain `enum` (editors complete enum values, and validation errors can list
//! them), and `Option<T>` leaves become `type: [T, "null"]`.

#[cfg(test)]
mod keywords;
mod release_keys;
mod validator;

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::codes;
use crate::config::{BUILTIN_FILES, DEPRECATED_KEYS, Flavour, VerlConfig};
use crate::diag::{Diagnostic, did_you_mean};
use crate::load::compose;
use crate::load::node::Node;
use crate::load::yaml;
use crate::schema::validator::Instance;
use crate::source::{Source, SourceId, SourceKind};

/// A group schema: the schema of the node a group file is merged into.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    /// File stem under `schemas/` (`optim` -> `optim.schema.json`).
    pub name: &'static str,
    /// Key path(s) of the node in the full config. With two paths (FSDP and Megatron
    /// engines), the group schema is the union of both, so either kind of file completes.
    pub paths: &'static [&'static str],
    /// Where the group's `default`s come from.
    pub defaults: GroupDefaults,
    /// One line for the schema's description.
    pub about: &'static str,
}

/// Source of a group schema's `default` values.
#[derive(Clone, Copy, Debug)]
pub enum GroupDefaults {
    /// The built-in group files themselves (first file wins): for groups mounted at several
    /// places with different values (`optim` under the actor and the critic), only the
    /// file's own value is the same everywhere.
    Files(&'static [&'static str]),
    /// The node's value in the composed built-in tree (FSDP flavour, then Megatron).
    Tree,
}

/// Group schemas written next to the root one.
pub const GROUPS: &[Group] = &[
    Group {
        name: "optim",
        paths: &["actor_rollout_ref.actor.optim"],
        defaults: GroupDefaults::Files(&[
            "optim/fsdp.yaml",
            "optim/megatron.yaml",
            "optim/veomni.yaml",
            "optim/torchtitan.yaml",
        ]),
        about: "an `optim/` group file (FSDP, Megatron, VeOmni or torchtitan optimizer), mounted at `actor.optim` and `critic.optim`",
    },
    Group {
        name: "engine",
        paths: &[
            "actor_rollout_ref.actor.fsdp_config",
            "actor_rollout_ref.actor.megatron",
            "actor_rollout_ref.actor.veomni",
            "actor_rollout_ref.actor.torchtitan",
        ],
        defaults: GroupDefaults::Files(&[
            "engine/fsdp.yaml",
            "engine/megatron.yaml",
            "engine/veomni.yaml",
            "engine/torchtitan.yaml",
        ]),
        about: "an `engine/` group file (FSDP, Megatron, VeOmni or torchtitan engine), mounted at `fsdp_config`, `megatron`, `veomni` or `torchtitan` of a role",
    },
    Group {
        name: "actor",
        paths: &["actor_rollout_ref.actor"],
        defaults: GroupDefaults::Tree,
        about: "an `actor/` group file, mounted at `actor_rollout_ref.actor`",
    },
    Group {
        name: "ref",
        paths: &["actor_rollout_ref.ref"],
        defaults: GroupDefaults::Tree,
        about: "a `ref/` group file (reference policy), mounted at `actor_rollout_ref.ref`",
    },
    Group {
        name: "rollout",
        paths: &["actor_rollout_ref.rollout"],
        defaults: GroupDefaults::Tree,
        about: "a `rollout/` group file, mounted at `actor_rollout_ref.rollout`",
    },
    Group {
        name: "model",
        paths: &["actor_rollout_ref.model"],
        defaults: GroupDefaults::Tree,
        about: "a `model/` group file, mounted at `actor_rollout_ref.model`",
    },
    Group {
        name: "critic",
        paths: &["critic"],
        defaults: GroupDefaults::Tree,
        about: "a `critic/` group file, mounted at `critic`",
    },
    Group {
        name: "reward_model",
        paths: &["reward_model"],
        defaults: GroupDefaults::Tree,
        about: "a `reward_model/` group file, mounted at `reward_model`",
    },
    Group {
        name: "data",
        paths: &["data"],
        defaults: GroupDefaults::Tree,
        about: "a `data/` group file, mounted at `data`",
    },
    Group {
        name: "algorithm",
        paths: &["algorithm"],
        defaults: GroupDefaults::Tree,
        about: "a file holding the `algorithm` section (verl's own `algorithm/` group holds only `rollout_correction`, see rollout_correction.schema.json)",
    },
    Group {
        name: "rollout_correction",
        paths: &["algorithm.rollout_correction"],
        defaults: GroupDefaults::Tree,
        about: "verl's `algorithm/rollout_correction.yaml`, mounted at `algorithm.rollout_correction`",
    },
    Group {
        name: "trainer",
        paths: &["trainer"],
        defaults: GroupDefaults::Tree,
        about: "a file holding the `trainer` section",
    },
    Group {
        name: "reward",
        paths: &["reward"],
        defaults: GroupDefaults::Files(&["reward/reward.yaml"]),
        about: "verl's `reward/` group file (verl 0.7.1+), mounted at `reward`",
    },
    Group {
        name: "distillation",
        paths: &["distillation"],
        defaults: GroupDefaults::Files(&["distillation/distillation.yaml"]),
        about: "verl's `distillation/` group file (verl 0.9+), mounted at `distillation`",
    },
];

/// Name of the root schema file.
pub const ROOT_FILE: &str = "verl.schema.json";
/// The editor schema of verl's SFT trainer config ([`sft_editor_schema`]).
pub const SFT_FILE: &str = "verl-sft.schema.json";

/// The editor schema of verl's SFT trainer config (`sft_trainer_engine`), with its `$id`.
pub fn sft_editor_schema() -> Value {
    let mut s = release_keys::sft_editor_schema();
    if let Some(m) = s.as_object_mut() {
        m.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        m.insert(
            "$id".into(),
            json!(format!("https://verlc.dev/schemas/{SFT_FILE}")),
        );
    }
    s
}

/// Every schema file verlc ships, as (file name, pretty JSON text ending in a newline):
/// the root schema first, then one per [`GROUPS`] entry.
pub fn all_files() -> Vec<(String, String)> {
    let mut out = vec![(ROOT_FILE.to_string(), pretty(&root_editor_schema()))];
    for g in GROUPS {
        if let Some(s) = group_editor_schema(g.name) {
            out.push((format!("{}.schema.json", g.name), pretty(&s)));
        }
    }
    out.push((SFT_FILE.to_string(), pretty(&sft_editor_schema())));
    out.push((
        VALIDATION_FILE.to_string(),
        pretty(&validator::without_annotations(&generated())),
    ));
    out
}

/// The schema `verlc check` validates with, as generated from the types ([`generated`]) and
/// without annotations (descriptions and the like are for editors), committed so that
/// start-up parses it instead of generating it (several times faster);
/// `tests/schema_fresh.rs` keeps it equal to what the types generate.
const VALIDATION_FILE: &str = "verl.validation.json";
const VALIDATION_JSON: &str = include_str!("../../../schemas/verl.validation.json");

/// The text a schema file is written with.
pub fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// The schema generated from the types, subschemas inlined, `required` as derived,
/// normalized (see the module doc).
fn generated() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true);
    let schema = settings
        .into_generator()
        .into_root_schema_for::<VerlConfig>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    strip_formats(&mut v);
    normalize(&mut v);
    v
}

/// `format: double/int64/uint` carry no validation value for configs and confuse editors.
fn strip_formats(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("format").and_then(Value::as_str).is_some_and(|f| {
                matches!(
                    f,
                    "double"
                        | "float"
                        | "int64"
                        | "int32"
                        | "uint64"
                        | "uint32"
                        | "uint"
                        | "uint8"
                        | "uint16"
                        | "int8"
                        | "int16"
                )
            }) {
                m.remove("format");
            }
            m.values_mut().for_each(strip_formats);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

/// Bottom-up rewrites that keep the meaning of the schema and give editors and the
/// validator simpler shapes:
/// - `oneOf` whose branches are all `const`s becomes `enum` (+ `enumDescriptions`);
/// - an `anyOf` branch that is itself an annotation-free `anyOf` is spliced into its parent;
/// - `anyOf [leaf, {type: null}]` becomes the leaf with `null` added to its `type` (and
///   to its `enum`).
fn normalize(v: &mut Value) {
    match v {
        Value::Array(a) => a.iter_mut().for_each(normalize),
        Value::Object(m) => {
            m.values_mut().for_each(normalize);
            consts_to_enum(m);
            splice_any_of(m);
            fold_nullable(m);
        }
        _ => {}
    }
}

fn consts_to_enum(m: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = m.get("oneOf") else {
        return;
    };
    if branches.is_empty() || !branches.iter().all(|b| b.get("const").is_some()) {
        return;
    }
    let mut values = Vec::new();
    let mut descs = Vec::new();
    let mut types: Vec<String> = Vec::new();
    for b in branches {
        values.push(b.get("const").cloned().unwrap_or(Value::Null));
        descs.push(
            b.get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        );
        let t = b
            .get("type")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| json_type(b.get("const").unwrap_or(&Value::Null)));
        if !types.contains(&t) {
            types.push(t);
        }
    }
    m.remove("oneOf");
    m.insert(
        "type".into(),
        if types.len() == 1 {
            json!(types[0])
        } else {
            json!(types)
        },
    );
    m.insert("enum".into(), Value::Array(values));
    if descs.iter().any(|d| !d.is_empty()) {
        m.insert("enumDescriptions".into(), json!(descs));
    }
}

fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
    .into()
}

/// Keywords that only annotate a value (enum descriptions belong with their `enum`); they
/// stay at the property's level when its constraints move into an `anyOf` branch.
const ANNOTATIONS: &[&str] = &[
    "description",
    "markdownDescription",
    "title",
    "default",
    "examples",
    "deprecated",
    "doNotSuggest",
    "x-verlc-flavour",
];

fn splice_any_of(m: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = m.get_mut("anyOf") else {
        return;
    };
    let mut out = Vec::new();
    for b in branches.drain(..) {
        let inner_only = b.as_object().is_some_and(|o| {
            o.contains_key("anyOf") && o.keys().all(|k| k == "anyOf" || k == "description")
        });
        match b {
            Value::Object(mut o) if inner_only => {
                if let Some(Value::Array(inner)) = o.remove("anyOf") {
                    out.extend(inner);
                }
            }
            other => out.push(other),
        }
    }
    *branches = out;
}

fn fold_nullable(m: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = m.get("anyOf") else {
        return;
    };
    if branches.len() != 2 {
        return;
    }
    let is_null = |b: &Value| {
        b.get("type") == Some(&json!("null")) && b.as_object().is_some_and(|o| o.len() == 1)
    };
    let (leaf, _) = match (is_null(&branches[0]), is_null(&branches[1])) {
        (false, true) => (&branches[0], &branches[1]),
        (true, false) => (&branches[1], &branches[0]),
        _ => return,
    };
    let Some(leaf) = leaf.as_object() else { return };
    // Only plain leaves: objects keep their `anyOf` (editors complete them fine) and
    // composite branches would change meaning.
    let composite = ["anyOf", "oneOf", "allOf", "properties", "$ref", "not", "if"]
        .iter()
        .any(|k| leaf.contains_key(*k));
    let Some(ty) = leaf.get("type") else { return };
    if composite || ty == "object" {
        return;
    }
    let mut leaf = leaf.clone();
    let mut types: Vec<Value> = match ty {
        Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    };
    if !types.contains(&json!("null")) {
        types.push(json!("null"));
    }
    leaf.insert("type".into(), Value::Array(types));
    if let Some(Value::Array(e)) = leaf.get_mut("enum")
        && !e.contains(&Value::Null)
    {
        e.push(Value::Null);
        if let Some(Value::Array(d)) = leaf.get_mut("enumDescriptions") {
            d.push(json!("null: not set"));
        }
    }
    m.remove("anyOf");
    // The property's own annotations win over the type's.
    for (k, v) in leaf {
        if !m.contains_key(&k) {
            m.insert(k, v);
        }
    }
}

/// The schema `verlc check` validates a composed config against.
pub fn validation_schema() -> &'static Value {
    static S: OnceLock<Value> = OnceLock::new();
    // Debug builds (the tests) always generate, so a stale committed file cannot hide a
    // change of the types from them; the freshness test then says to regenerate it.
    S.get_or_init(|| {
        let generate = || validator::without_annotations(&generated());
        if cfg!(debug_assertions) {
            return generate();
        }
        serde_json::from_str::<Value>(VALIDATION_JSON)
            .ok()
            .filter(|v| v.get("properties").is_some())
            .unwrap_or_else(generate)
    })
}

/// The built-in defaults of one flavour, composed and resolved (as JSON). `???` values
/// (verl's "must be set", e.g. `actor_rollout_ref.rollout.name`) stay `"???"`.
pub fn builtin_defaults(flavour: Flavour) -> Value {
    compose::builtin_tree(flavour).to_json()
}

fn flavour_defaults() -> &'static [Value; 2] {
    static D: OnceLock<[Value; 2]> = OnceLock::new();
    D.get_or_init(|| {
        [
            builtin_defaults(Flavour::Fsdp),
            builtin_defaults(Flavour::Megatron),
        ]
    })
}

/// A built-in group file as JSON, without its `defaults:` list: verlc's defaults (verl
/// 0.7.0's layout), else the newest built-in release's file of that name.
fn builtin_file_json(path: &str) -> Option<Value> {
    let newest = crate::load::version::BuiltinRelease::default().files();
    let (_, text) = BUILTIN_FILES
        .iter()
        .chain(newest)
        .find(|(p, _)| *p == path)?;
    let src = Source::new(
        format!("<verlc defaults>/{path}"),
        *text,
        SourceKind::Builtin,
    );
    let mut v = yaml::parse(&src, SourceId(0)).ok()?.to_json();
    if let Some(m) = v.as_object_mut() {
        m.remove("defaults");
    }
    Some(v)
}

/// Root editor schema: `schemas/verl.schema.json`.
pub fn root_editor_schema() -> Value {
    let mut s = generated();
    for d in flavour_defaults() {
        inject_defaults(&mut s, d);
    }
    release_keys::add_newest_release_keys(&mut s);
    mark_deprecated(&mut s, &mut Vec::new(), &[""]);
    editorize_root(&mut s);
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("defaults".into(), defaults_list_schema());
        props.insert(
            "hydra".into(),
            json!({
                "type": "object",
                "description": "Hydra settings of a primary config. verlc reads `hydra.searchpath`: `pkg://verl.trainer.config` is verlc's built-in tree, `file://dir` a directory."
            }),
        );
    }
    if let Some(m) = s.as_object_mut() {
        m.insert("title".into(), json!("verl trainer config (verlc)"));
        m.insert(
            "description".into(),
            json!("A verl PPO trainer config (FSDP `ppo_trainer` or Megatron `ppo_megatron_trainer` flavour), generated by `verlc schema`. Defaults are verlc's built-in defaults, which follow verl's."),
        );
        m.insert(
            "$id".into(),
            json!(format!("https://verlc.dev/schemas/{ROOT_FILE}")),
        );
    }
    order_keys(&mut s)
}

/// Editor schema of one group file (e.g. an `optim/*.yaml`); `None` for an unknown name.
/// Like the root schema, it holds the newest built-in release's keys (VeOmni's engine and
/// optimizer keys, `reward`, `distillation`, ...) beside the typed model's.
pub fn group_editor_schema(name: &str) -> Option<Value> {
    let g = GROUPS.iter().find(|g| g.name == name)?;
    let mut full = generated();
    release_keys::add_newest_release_keys(&mut full);
    let mut s: Option<Value> = None;
    for path in g.paths {
        let sub = schema_at(&full, &crate::load::node::split_key(path))?.clone();
        s = Some(match s {
            None => sub,
            Some(prev) => union(prev, sub),
        });
    }
    let mut s = s?;
    match g.defaults {
        GroupDefaults::Files(files) => {
            let defaults: Vec<(&str, Value)> = files
                .iter()
                .filter_map(|f| Some((*f, builtin_file_json(f)?)))
                .collect();
            for (_, d) in &defaults {
                inject_defaults(&mut s, d);
            }
            mark_differing_defaults(&mut s, &defaults);
        }
        GroupDefaults::Tree => {
            for d in flavour_defaults() {
                let mut cur = Some(d);
                for seg in g.paths[0].split('.') {
                    cur = cur.and_then(|c| c.get(seg));
                }
                if let Some(c) = cur {
                    inject_defaults(&mut s, c);
                }
            }
        }
    }
    mark_deprecated(&mut s, &mut Vec::new(), g.paths);
    editorize_root(&mut s);
    let m = s.as_object_mut()?;
    // A group file is a mapping, whatever the node's optionality or flavour in the tree.
    for k in ["x-verlc-flavour", "deprecated", "doNotSuggest", "default"] {
        m.remove(k);
    }
    m.insert("type".into(), json!("object"));
    if let Some(props) = m.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("defaults".into(), defaults_list_schema());
    }
    m.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    m.insert(
        "$id".into(),
        json!(format!("https://verlc.dev/schemas/{name}.schema.json")),
    );
    m.insert(
        "title".into(),
        json!(format!("verl `{name}` group file (verlc)")),
    );
    let about = format!("Schema of {}, generated by `verlc schema`.", g.about);
    m.insert("description".into(), json!(about.clone()));
    m.insert("markdownDescription".into(), json!(about));
    Some(order_keys(&mut s))
}

/// Schema keywords first, then annotations, then the (large) `properties`: easier to read.
fn order_keys(v: &mut Value) -> Value {
    const FIRST: &[&str] = &[
        "$schema",
        "$id",
        "title",
        "description",
        "markdownDescription",
        "type",
        "$defs",
    ];
    let Some(m) = v.as_object_mut() else {
        return v.take();
    };
    let mut out = Map::new();
    for k in FIRST {
        if let Some(x) = m.remove(*k) {
            out.insert((*k).into(), x);
        }
    }
    out.append(m);
    Value::Object(out)
}

/// The union of two schemas of the same node (an FSDP and a Megatron engine): properties
/// of both; a key in both with different schemas accepts either (enums are merged so
/// completion lists all values).
fn union(a: Value, b: Value) -> Value {
    if a == b {
        return a;
    }
    match (a, b) {
        (Value::Object(mut a), Value::Object(b))
            if a.contains_key("properties") && b.contains_key("properties") =>
        {
            let bprops = b
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if let Some(Value::Object(ap)) = a.get_mut("properties") {
                for (k, bv) in bprops {
                    let merged = match ap.remove(&k) {
                        Some(av) => union(av, bv),
                        None => bv,
                    };
                    ap.insert(k, merged);
                }
            }
            a.remove("required");
            Value::Object(a)
        }
        (Value::Object(mut a), Value::Object(b))
            if a.contains_key("enum") && b.contains_key("enum") =>
        {
            let pairs = |o: &Map<String, Value>| -> Vec<(Value, String)> {
                let vals = o
                    .get("enum")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let descs = o
                    .get("enumDescriptions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                vals.into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        (
                            v,
                            descs
                                .get(i)
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                        )
                    })
                    .collect()
            };
            let mut all = pairs(&a);
            for (v, d) in pairs(&b) {
                if !all.iter().any(|(x, _)| *x == v) {
                    all.push((v, d));
                }
            }
            let types = union_of_types(&a, &b);
            a.insert("type".into(), types);
            a.insert(
                "enum".into(),
                Value::Array(all.iter().map(|(v, _)| v.clone()).collect()),
            );
            if all.iter().any(|(_, d)| !d.is_empty()) {
                a.insert(
                    "enumDescriptions".into(),
                    json!(all.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>()),
                );
            }
            Value::Object(a)
        }
        // A value the other kind of file sets for a key this one lists (VeOmni's `strategy:
        // veomni` beside FSDP's enum): one more enum member, so completion keeps the list.
        (Value::Object(mut a), Value::Object(b))
            if a.contains_key("enum")
                && !b.contains_key("enum")
                && b.get("default").is_some_and(Value::is_string) =>
        {
            if let (Some(Value::Array(values)), Some(d)) = (a.get_mut("enum"), b.get("default"))
                && !values.contains(d)
            {
                let at = values
                    .iter()
                    .position(Value::is_null)
                    .unwrap_or(values.len());
                values.insert(at, d.clone());
                for k in ["enumDescriptions", "markdownEnumDescriptions"] {
                    if let Some(Value::Array(descs)) = a.get_mut(k) {
                        descs.insert(at.min(descs.len()), json!(""));
                    }
                }
            }
            Value::Object(a)
        }
        (Value::Object(mut a), Value::Object(b)) if same_but_type(&a, &b) => {
            let types = union_of_types(&a, &b);
            a.insert("type".into(), types);
            Value::Object(a)
        }
        (a, b) => {
            let mut out = Map::new();
            for k in ["description", "default"] {
                if let Some(x) = a.get(k).or_else(|| b.get(k)) {
                    out.insert(k.into(), x.clone());
                }
            }
            out.insert(
                "anyOf".into(),
                json!([strip_annotations(a), strip_annotations(b)]),
            );
            Value::Object(out)
        }
    }
}

/// Whether two leaf schemas differ only in `type` (and annotations).
/// The `type` allowing what either schema's `type` allows (one name, or a list of them).
fn union_of_types(a: &Map<String, Value>, b: &Map<String, Value>) -> Value {
    let mut types: Vec<Value> = Vec::new();
    for t in [a.get("type"), b.get("type")].into_iter().flatten() {
        for t in t.as_array().cloned().unwrap_or_else(|| vec![t.clone()]) {
            if !types.contains(&t) {
                types.push(t);
            }
        }
    }
    if types.len() == 1 {
        types.remove(0)
    } else {
        Value::Array(types)
    }
}

fn same_but_type(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    let core = |m: &Map<String, Value>| -> Map<String, Value> {
        m.iter()
            .filter(|(k, _)| *k != "type" && !ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    a.contains_key("type")
        && b.contains_key("type")
        && !a.contains_key("properties")
        && core(a) == core(b)
}

fn strip_annotations(mut v: Value) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.remove("description");
        m.remove("default");
    }
    v
}

fn defaults_list_schema() -> Value {
    let d = "Hydra defaults list: `group@package: option`, `../group@pkg: option`, `override group: option`, sibling config names and `_self_`.";
    json!({
        "type": "array",
        "description": d,
        "markdownDescription": d,
        "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}
    })
}

/// Set `default` on every property that has a value in `defaults` (the first call for a
/// key wins, so the FSDP flavour's value is kept where the flavours differ). `???` is
/// "no default".
fn inject_defaults(schema: &mut Value, defaults: &Value) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(dmap) = defaults.as_object() else {
        return;
    };
    for (k, sub) in props.iter_mut() {
        let Some(dv) = dmap.get(k) else { continue };
        if dv.as_str() == Some("???") {
            continue;
        }
        if dv.is_object() && sub.get("properties").is_some() {
            inject_defaults(sub, dv);
            continue;
        }
        // Optional sections are `anyOf [{...object...}, null]`: descend into the object branch.
        if dv.is_object()
            && let Some(branches) = sub.get_mut("anyOf").and_then(Value::as_array_mut)
            && branches.iter().any(|b| b.get("properties").is_some())
        {
            for b in branches
                .iter_mut()
                .filter(|b| b.get("properties").is_some())
            {
                inject_defaults(b, dv);
            }
            continue;
        }
        if let Some(m) = sub.as_object_mut() {
            m.entry("default").or_insert_with(|| dv.clone());
        }
    }
}

/// Keys the group's files set to different values (optim `lr_scheduler_type`: `constant` in
/// FSDP's file, `cosine` in VeOmni's): no `default`, which would be one file's; the description
/// says which file sets what.
fn mark_differing_defaults(schema: &mut Value, files: &[(&str, Value)]) {
    fn leaves(v: &Value, at: &mut Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    at.push(k.clone());
                    leaves(c, at, out);
                    at.pop();
                }
            }
            Value::String(s) if s == "???" => {}
            _ => out.push((at.clone(), v.clone())),
        }
    }
    // Each key (in file order) with the value each file sets it to.
    let mut by_key = indexmap::IndexMap::<Vec<String>, Vec<(&str, Value)>>::new();
    for (file, d) in files {
        let mut found = Vec::new();
        leaves(d, &mut Vec::new(), &mut found);
        for (path, value) in found {
            by_key.entry(path).or_default().push((file, value));
        }
    }
    for (path, seen) in by_key {
        if seen.iter().all(|(_, v)| *v == seen[0].1) {
            continue;
        }
        let Some(m) = property_mut(schema, &path) else {
            continue;
        };
        m.remove("default");
        let by_file: Vec<String> = seen
            .iter()
            .map(|(f, v)| match v.as_str() {
                Some(text) => format!("`{text}` in {f}"),
                None => format!("`{v}` in {f}"),
            })
            .collect();
        let note = format!("Default by file: {}.", by_file.join(", "));
        for k in ["description", "markdownDescription"] {
            let text = match m.get(k).and_then(Value::as_str) {
                Some(d) if !d.is_empty() => format!("{d} {note}"),
                _ => note.clone(),
            };
            m.insert(k.into(), Value::String(text));
        }
    }
}

/// The schema of the property at `path` (through `properties`, and into the object branch of
/// an optional section's `anyOf`).
fn property_mut<'a>(schema: &'a mut Value, path: &[String]) -> Option<&'a mut Map<String, Value>> {
    let Some((first, rest)) = path.split_first() else {
        return schema.as_object_mut();
    };
    let child = object_branch_mut(schema)
        .get_mut("properties")?
        .get_mut(first.as_str())?;
    property_mut(child, rest)
}

/// Deprecated keys (from [`DEPRECATED_KEYS`], matched at every mount path, or marked
/// `deprecated` by the model) are not suggested (`doNotSuggest`), and their description
/// starts with the migration. No `deprecationMessage`: yaml-language-server reports it as
/// an error, which verl's own files (that still carry some of these keys) do not deserve.
fn mark_deprecated(schema: &mut Value, rel: &mut Vec<String>, mounts: &[&str]) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        if let Some(branches) = schema.get_mut("anyOf").and_then(Value::as_array_mut) {
            for b in branches.iter_mut() {
                mark_deprecated(b, rel, mounts);
            }
        }
        return;
    };
    for (k, sub) in props.iter_mut() {
        rel.push(k.clone());
        let rel_path = rel.join(".");
        let hit = mounts.iter().find_map(|m| {
            let full = if m.is_empty() {
                rel_path.clone()
            } else {
                format!("{m}.{rel_path}")
            };
            DEPRECATED_KEYS
                .iter()
                .find(|d| d.matches(&full))
                .map(|d| (d, full, *m))
        });
        let note = hit.map(|(d, full, mount)| match d.replacement_for(&full) {
            // Name the replacement the way it is written in this file.
            Some(r) => {
                let r = if mount.is_empty() {
                    r.as_str()
                } else {
                    r.strip_prefix(&format!("{mount}.")).unwrap_or(&r)
                };
                format!("Deprecated: use `{r}` instead; {}.", d.note)
            }
            None => format!("Deprecated: {}.", d.note),
        });
        let flagged = note.is_some() || sub.get("deprecated") == Some(&Value::Bool(true));
        if let (true, Some(m)) = (flagged, sub.as_object_mut()) {
            m.insert("deprecated".into(), json!(true));
            m.insert("doNotSuggest".into(), json!(true));
            let desc = m
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if let Some(note) = note
                && !desc.starts_with("Deprecated")
            {
                let joined = if desc.is_empty() {
                    note
                } else {
                    format!("{note}\n\n{desc}")
                };
                m.insert("description".into(), json!(joined));
            }
        }
        mark_deprecated(sub, rel, mounts);
        rel.pop();
    }
}

/// The interpolation alternative added to every value in the editor schemas, kept once
/// under `$defs` and referenced.
fn interp_def() -> Value {
    let d = "An OmegaConf interpolation (`${path}`, `${oc.select:path,default}`, `text_${path}`) or `???` (must be set later).";
    json!({
        "type": "string",
        "pattern": "\\$\\{.*\\}|^\\?\\?\\?$",
        "description": d,
        "markdownDescription": d
    })
}

const INTERP_REF: &str = "#/$defs/interpolation";

fn interp_schema() -> Value {
    json!({"$ref": INTERP_REF})
}

/// Editor relaxations for a whole schema (root or group): nothing required, every value
/// may be an interpolation, descriptions unwrapped and given a markdown twin.
fn editorize_root(s: &mut Value) {
    editorize(s);
    if let Some(m) = s.as_object_mut() {
        m.remove("deprecated");
        let defs = m.entry("$defs").or_insert_with(|| json!({}));
        if let Some(defs) = defs.as_object_mut() {
            defs.insert("interpolation".into(), interp_def());
        }
    }
}

fn editorize(v: &mut Value) {
    let Value::Object(m) = v else { return };
    m.remove("required");
    text_fields(m);
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        for sub in props.values_mut() {
            editorize(sub);
            allow_interpolation(sub);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(items)) = m.get_mut(key) {
            items.iter_mut().for_each(editorize);
        }
    }
    if let Some(sub @ Value::Object(_)) = m.get_mut("items") {
        editorize(sub);
        allow_interpolation(sub);
    }
    if let Some(sub @ Value::Object(_)) = m.get_mut("additionalProperties") {
        editorize(sub);
    }
}

/// Doc comments arrive hard-wrapped; editors show each line break as a paragraph break.
fn text_fields(m: &mut Map<String, Value>) {
    if let Some(Value::String(d)) = m.get("description") {
        let d = unwrap_lines(d);
        if is_markdown(&d) {
            m.insert("markdownDescription".into(), json!(d.clone()));
        }
        m.insert("description".into(), json!(d));
    }
    if let Some(Value::Array(descs)) = m.get("enumDescriptions") {
        // One of the two: editors prefer the markdown one when it is there.
        let descs: Vec<String> = descs
            .iter()
            .map(|d| unwrap_lines(d.as_str().unwrap_or("")))
            .collect();
        if descs.iter().any(|d| is_markdown(d)) {
            m.remove("enumDescriptions");
            m.insert("markdownEnumDescriptions".into(), json!(descs));
        } else {
            m.insert("enumDescriptions".into(), json!(descs));
        }
    }
}

fn is_markdown(s: &str) -> bool {
    s.contains('`') || s.contains("](") || s.contains("**")
}

/// Join the lines of each paragraph; keep breaks before list items and indented lines.
pub fn unwrap_lines(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_blank = true;
    for line in s.split('\n') {
        let t = line.trim_end();
        if t.is_empty() {
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            prev_blank = true;
            continue;
        }
        let keeps_break = t.starts_with("- ")
            || t.starts_with("* ")
            || t.starts_with(' ')
            || t.starts_with('|')
            || t.split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if !prev_blank {
            out.push(if keeps_break { '\n' } else { ' ' });
        }
        out.push_str(t);
        prev_blank = false;
    }
    out.trim_end().to_string()
}

/// Accept `${...}` and `???` for this value unless it already takes any string.
fn allow_interpolation(sub: &mut Value) {
    let Value::Object(m) = sub else { return };
    if takes_any_string(m) {
        return;
    }
    if let Some(Value::Array(branches)) = m.get_mut("anyOf") {
        if !branches
            .iter()
            .any(|b| b.as_object().is_some_and(takes_any_string))
        {
            branches.push(interp_schema());
        }
        return;
    }
    // Keep the annotations (description, default, enum descriptions) at this level, where
    // editors read them for hovers and completion; move the constraints into a branch.
    let mut inner = Map::new();
    let keys: Vec<String> = m
        .keys()
        .filter(|k| !ANNOTATIONS.contains(&k.as_str()))
        .cloned()
        .collect();
    if keys.is_empty() {
        return; // accepts anything already
    }
    for k in keys {
        if let Some(x) = m.remove(&k) {
            inner.insert(k, x);
        }
    }
    m.insert(
        "anyOf".into(),
        json!([Value::Object(inner), interp_schema()]),
    );
}

/// Whether a schema object accepts every string (so `${...}` needs no extra branch).
fn takes_any_string(m: &Map<String, Value>) -> bool {
    let string_type = match m.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    string_type
        && ![
            "enum",
            "const",
            "pattern",
            "minLength",
            "maxLength",
            "format",
            "anyOf",
            "oneOf",
            "allOf",
        ]
        .iter()
        .any(|k| m.contains_key(*k))
}

/// Validate a composed config; each error becomes a diagnostic pointing at the YAML (or
/// override) text of the offending key or value.
pub fn validate(root: &Node) -> Vec<Diagnostic> {
    validate_counted(root).0
}

/// [`validate`], with the number of findings past the check's report limit that were only
/// counted, not built.
pub fn validate_counted(root: &Node) -> (Vec<Diagnostic>, usize) {
    validate_counted_with(root, &|_| true)
}

/// [`validate_counted`], computing "did you mean" for an unknown key only where `suggest`
/// says its origin's findings are kept (a newer release's own files are passed through, and
/// their hundreds of unknown keys would each cost a search of their siblings).
pub fn validate_counted_with(
    root: &Node,
    suggest: &dyn Fn(Option<&crate::source::Origin>) -> bool,
) -> (Vec<Diagnostic>, usize) {
    let mut out = Vec::new();
    // Findings past the check's report limit are only counted (a generated file of 450k
    // unknown keys would otherwise build a diagnostic, and a "did you mean", for each).
    let limit = crate::diag::MAX_DIAGNOSTICS;
    let mut uncounted = 0usize;
    for err in validator::violations(&validator::VALIDATION, root) {
        if out.len() >= limit {
            uncounted += match &err.kind {
                validator::Violation::AdditionalProperties { unexpected } => unexpected.len(),
                _ => 1,
            };
            continue;
        }
        let segs = &err.path;
        let key = segs.join(".");
        // The validator walked the tree itself: the instance is the node at `segs`.
        let node = err.instance;
        let origin = node.origin.clone();
        // The schema's own JSON (parsed once, on the first finding that needs it).
        let schema_here = || schema_at(validation_schema(), segs);
        use validator::Violation as K;
        let d = match &err.kind {
            K::AdditionalProperties { unexpected } => {
                let mut known: Option<Vec<String>> = None;
                for u in unexpected {
                    if out.len() >= limit {
                        uncounted += 1;
                        continue;
                    }
                    let full = if key.is_empty() {
                        u.clone()
                    } else {
                        format!("{key}.{u}")
                    };
                    let key_origin = node
                        .as_map()
                        .and_then(|m| m.get(u))
                        .and_then(|e| e.key_origin.clone().or(e.node.origin.clone()));
                    let mut d = Diagnostic::error(
                        codes::SCHEMA_UNKNOWN_KEY,
                        format!("unknown key `{full}`"),
                    )
                    .with_key(full.clone())
                    .with_primary(key_origin.clone(), "not a key of this section");
                    if !suggest(key_origin.as_ref()) {
                        out.push(d);
                        continue;
                    }
                    let known = known.get_or_insert_with(|| {
                        schema_here()
                            .and_then(|s| s.get("properties"))
                            .and_then(Value::as_object)
                            .map(|p| p.keys().cloned().collect())
                            .unwrap_or_default()
                    });
                    // A key of an enclosing section written one level too deep (verl's SAPO
                    // scripts put the actor's `tau_pos` under `policy_loss`).
                    let above = (1..segs.len()).rev().find_map(|n| {
                        schema_at(validation_schema(), &segs[..n])
                            .and_then(|s| s.get("properties"))
                            .and_then(Value::as_object)
                            .filter(|p| p.contains_key(u.as_str()))
                            .map(|_| format!("{}.{u}", segs[..n].join(".")))
                    });
                    d = match (did_you_mean(u, known.iter().map(String::as_str)), above) {
                        (Some(s), _) => d.with_help(format!("did you mean `{s}`?")),
                        (None, Some(up)) => d.with_help(format!(
                            "`{u}` is a key of an enclosing section: did you mean `{up}`?"
                        )),
                        (None, None) if known.is_empty() => d,
                        (None, None) => d.with_help(format!(
                            "`{}` accepts: {}",
                            if key.is_empty() { "<root>" } else { &key },
                            short_list(known)
                        )),
                    };
                    out.push(d);
                }
                continue;
            }
            K::Enum { options } => {
                let opts: Vec<String> = options.iter().map(|o| o.to_string()).collect();
                let got = err.instance.to_json().to_string();
                let plain: Vec<String> = opts
                    .iter()
                    .map(|o| o.trim_matches('"').to_string())
                    .collect();
                let mut d = Diagnostic::error(
                    codes::SCHEMA_ENUM,
                    format!("`{key}` must be one of {}, not {got}", opts.join(", ")),
                )
                .with_key(key.clone())
                .with_primary(origin, "not an allowed value");
                if let Some(s) = err
                    .instance
                    .as_str()
                    .and_then(|g| did_you_mean(g, plain.iter().map(String::as_str)))
                {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                d
            }
            K::Minimum { limit }
            | K::ExclusiveMinimum { limit }
            | K::Maximum { limit }
            | K::ExclusiveMaximum { limit } => {
                let rel = match &err.kind {
                    K::Minimum { .. } => ">=",
                    K::ExclusiveMinimum { .. } => ">",
                    K::Maximum { .. } => "<=",
                    _ => "<",
                };
                Diagnostic::error(
                    codes::SCHEMA_RANGE,
                    format!(
                        "`{key}` must be {rel} {limit}, got {}",
                        err.instance.to_json()
                    ),
                )
                .with_key(key.clone())
                .with_primary(origin, format!("must be {rel} {limit}"))
            }
            K::Required { property } => {
                let p = *property;
                let full = if key.is_empty() {
                    p.to_string()
                } else {
                    format!("{key}.{p}")
                };
                Diagnostic::error(codes::SCHEMA_REQUIRED, format!("missing key `{full}`"))
                    .with_key(full.clone())
                    .with_primary(origin, format!("`{p}` is required in this section"))
                    .with_help("it was deleted (`~key`) or replaced by a value without it; verl reads this key")
            }
            K::Type { expected } => {
                let expected = type_names(expected);
                Diagnostic::error(
                    codes::SCHEMA_TYPE,
                    format!(
                        "`{key}` must be {expected}, got {}",
                        describe(&err.instance.to_json())
                    ),
                )
                .with_key(key.clone())
                .with_primary(origin, format!("expected {expected}"))
            }
            K::AnyOf
                if let (Some(items), Some(choices)) =
                    (err.instance.items(), schema_here().and_then(item_choices))
                    && let Some(bad) = items
                        .iter()
                        .filter_map(Node::as_str)
                        .find(|i| !choices.iter().any(|c| c == i)) =>
            {
                // A list of choices (`trainer.logger: [console, wandb]`): name the item.
                let mut d = Diagnostic::error(
                    codes::SCHEMA_ENUM,
                    format!(
                        "`{key}` lists `{bad}`, which is not one of {}",
                        choices.join(", ")
                    ),
                )
                .with_key(key.clone())
                .with_primary(origin, format!("`{bad}` is not an allowed value"));
                if let Some(s) = did_you_mean(bad, choices.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                d
            }
            K::AnyOf => {
                // Mostly `Option<T>`: report against the non-null branch.
                let expected = schema_here()
                    .map(describe_schema)
                    .unwrap_or_else(|| "a valid value".into());
                Diagnostic::error(
                    codes::SCHEMA_TYPE,
                    format!(
                        "`{key}` must be {expected}, got {}",
                        describe(&err.instance.to_json())
                    ),
                )
                .with_key(key.clone())
                .with_primary(origin, format!("expected {expected}"))
            }
            K::Const { .. } | K::Not | K::MinItems { .. } | K::MaxItems { .. } => {
                Diagnostic::error(
                    codes::SCHEMA_OTHER,
                    format!(
                        "`{key}`: {}",
                        other_message(&err.kind, &err.instance.to_json())
                    ),
                )
                .with_key(key.clone())
                .with_primary(origin, "here")
            }
        };
        out.push(d);
    }
    (out, uncounted)
}

/// The one diagnostic that stands for findings past the report limit (an error: each of
/// them would have been one).
pub fn not_shown(count: usize) -> Diagnostic {
    Diagnostic::error(
        codes::YAML_LIMIT,
        format!(
            "{count} more findings not shown: verlc reports at most {}",
            crate::diag::MAX_DIAGNOSTICS
        ),
    )
}

/// The allowed strings of a list's items, when a branch of `schema` is an array of choices
/// (`OneOrMany<LoggerBackend>`: one logger or a list of them).
fn item_choices(schema: &'static Value) -> Option<Vec<String>> {
    let root = validation_schema();
    let resolve = |v: &'static Value| -> &'static Value {
        v.get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/"))
            .and_then(|path| path.split('/').try_fold(root, |cur, seg| cur.get(seg)))
            .unwrap_or(v)
    };
    let branches = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))?
        .as_array()?;
    branches.iter().find_map(|b| {
        let b = resolve(b);
        if b.get("type").and_then(Value::as_str) != Some("array") {
            return None;
        }
        let items = resolve(b.get("items")?);
        let strings = |vals: &Vec<Value>| -> Vec<String> {
            vals.iter()
                .filter_map(|v| {
                    v.as_str()
                        .or_else(|| v.get("const").and_then(Value::as_str))
                        .map(String::from)
                })
                .collect()
        };
        items
            .get("enum")
            .or_else(|| items.get("oneOf"))
            .and_then(Value::as_array)
            .map(strings)
            .filter(|c| !c.is_empty())
    })
}

fn short_list(keys: &[String]) -> String {
    if keys.len() <= 12 {
        keys.join(", ")
    } else {
        format!("{}, … ({} keys)", keys[..12].join(", "), keys.len())
    }
}

/// The (inlined) schema object governing a key path.
pub fn schema_at<'a, S: AsRef<str>>(schema: &'a Value, segs: &[S]) -> Option<&'a Value> {
    let mut cur = schema;
    for s in segs {
        cur = object_branch(cur);
        cur = cur
            .get("properties")
            .and_then(|p| p.get(s.as_ref()))
            .or_else(|| cur.get("items"))?;
    }
    Some(object_branch(cur))
}

fn object_branch(s: &Value) -> &Value {
    match object_branch_index(s) {
        Some(i) => &s["anyOf"][i],
        None => s,
    }
}

/// [`object_branch`], to change it.
fn object_branch_mut(s: &mut Value) -> &mut Value {
    match object_branch_index(s) {
        Some(i) => &mut s["anyOf"][i],
        None => s,
    }
}

/// Which `anyOf` branch of a schema without `properties` of its own has them (an optional
/// section's object branch).
fn object_branch_index(s: &Value) -> Option<usize> {
    if s.get("properties").is_some() {
        return None;
    }
    s.get("anyOf")?
        .as_array()?
        .iter()
        .position(|b| b.get("properties").is_some())
}

/// The message of a violation the schema rarely produces (`const`, `not`, item counts).
fn other_message(kind: &validator::Violation, instance: &Value) -> String {
    use validator::Violation as K;
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    match kind {
        K::Const { expected } => format!("{expected} was expected"),
        K::Not => format!("{instance} is not allowed here"),
        K::MinItems { limit } => {
            format!("{instance} has less than {limit} item{}", plural(*limit))
        }
        K::MaxItems { limit } => {
            format!("{instance} has more than {limit} item{}", plural(*limit))
        }
        _ => format!("{instance} is not valid here"),
    }
}

fn type_names(types: &[&str]) -> String {
    let name = |t: &str| match t {
        "integer" => "an integer".to_string(),
        "number" => "a number".to_string(),
        "boolean" => "a boolean (true/false)".to_string(),
        "string" => "a string".to_string(),
        "object" => "a mapping".to_string(),
        "array" => "a list".to_string(),
        "null" => "null".to_string(),
        other => other.to_string(),
    };
    types
        .iter()
        .map(|t| name(t))
        .collect::<Vec<_>>()
        .join(" or ")
}

fn describe_schema(s: &Value) -> String {
    let mut parts = Vec::new();
    let branches: Vec<&Value> = match s
        .get("anyOf")
        .or_else(|| s.get("oneOf"))
        .and_then(Value::as_array)
    {
        Some(a) => a.iter().collect(),
        None => vec![s],
    };
    for b in branches {
        if let Some(e) = b.get("enum").and_then(Value::as_array) {
            parts.push(format!(
                "one of {}",
                e.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        } else if let Some(t) = b.get("type") {
            let ts: Vec<String> = match t {
                Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect(),
                Value::String(x) => vec![x.clone()],
                _ => vec![],
            };
            for t in ts {
                parts.push(match t.as_str() {
                    "integer" => "an integer".into(),
                    "number" => "a number".into(),
                    "boolean" => "a boolean".into(),
                    "object" => "a mapping".into(),
                    "array" => "a list".into(),
                    "string" => "a string".into(),
                    other => other.into(),
                });
            }
        } else if let Some(c) = b.get("const") {
            parts.push(c.to_string());
        }
    }
    parts.dedup();
    if parts.is_empty() {
        "a valid value".into()
    } else {
        parts.join(" or ")
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string \"{s}\""),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

//! JSON Schemas generated from the typed config model ([`crate::config::VerlConfig`]).
//!
//! Subschemas are inlined, so every key path has its own schema object: the same type
//! (an optimizer, an engine) can then carry different defaults at different places
//! (`actor.optim.lr` 1e-6, `critic.optim.lr` 1e-5). Defaults come from verlc's built-in
//! tree, composed and resolved, so the schema and the defaults cannot drift apart.
//!
//! Two flavours: the *validation* schema (what `verlc check` runs on a composed config;
//! every key required) and the *editor* schemas written to `schemas/` (nothing required,
//! `${...}` interpolations accepted everywhere, `defaults:`/`hydra:` allowed) for the root
//! and for each group file.

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::codes;
use crate::config::VerlConfig;
use crate::diag::{Diagnostic, did_you_mean};
use crate::load::compose::{self, LoadRequest};
use crate::load::node::Node;

/// Group schemas written next to the root one: (file stem, key path whose schema it is).
pub const GROUPS: &[(&str, &str)] = &[
    ("optim", "actor_rollout_ref.actor.optim"),
    ("ref", "actor_rollout_ref.ref"),
    ("actor", "actor_rollout_ref.actor"),
    ("critic", "critic"),
    ("rollout", "actor_rollout_ref.rollout"),
    ("engine", "actor_rollout_ref.actor.fsdp_config"),
    ("model", "actor_rollout_ref.model"),
    ("data", "data"),
    ("algorithm", "algorithm"),
    ("trainer", "trainer"),
];

/// The schema generated from the types, subschemas inlined, `required` as derived.
fn generated() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true);
    let schema = settings.into_generator().into_root_schema_for::<VerlConfig>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    strip_formats(&mut v);
    v
}

/// `format: double/int64/uint` carry no validation value for configs and confuse editors.
fn strip_formats(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("format").and_then(Value::as_str).is_some_and(|f| matches!(f, "double" | "float" | "int64" | "int32" | "uint64" | "uint32" | "uint" | "uint8" | "uint16" | "int8" | "int16")) {
                m.remove("format");
            }
            m.values_mut().for_each(strip_formats);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

/// The schema `verlc check` validates a composed config against.
pub fn validation_schema() -> &'static Value {
    static S: OnceLock<Value> = OnceLock::new();
    S.get_or_init(generated)
}

fn validator() -> Option<&'static jsonschema::Validator> {
    static V: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    V.get_or_init(|| jsonschema::options().should_validate_formats(false).build(validation_schema()).ok()).as_ref()
}

/// The built-in defaults for both flavours, composed and resolved (as JSON).
pub fn builtin_defaults(base: &str) -> Value {
    let req = LoadRequest { base: Some(base.into()), overrides: vec!["actor_rollout_ref.rollout.name=verlc".into()], ..Default::default() };
    compose::load(&req).root.to_json()
}

/// Root editor schema: `schemas/verl.schema.json`.
pub fn root_editor_schema() -> Value {
    let mut s = generated();
    let fsdp = builtin_defaults(compose::FSDP_BASE);
    let mega = builtin_defaults(compose::MEGATRON_BASE);
    inject_defaults(&mut s, &fsdp);
    inject_defaults(&mut s, &mega);
    editorize(&mut s);
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("defaults".into(), defaults_list_schema());
        props.insert(
            "hydra".into(),
            json!({"type": "object", "description": "Hydra settings of a primary config; verlc reads `hydra.searchpath` (`pkg://verl.trainer.config` means verlc's built-in tree, `file://dir` a directory)."}),
        );
    }
    if let Some(m) = s.as_object_mut() {
        m.insert("title".into(), json!("verl trainer config (verlc)"));
        m.insert("$id".into(), json!("https://verlc.dev/schemas/verl.schema.json"));
    }
    s
}

/// Editor schema of one group file (e.g. an `optim/*.yaml`).
pub fn group_editor_schema(name: &str) -> Option<Value> {
    let (_, path) = GROUPS.iter().find(|(n, _)| *n == name)?;
    let root = root_editor_schema();
    let mut cur = &root;
    for seg in path.split('.') {
        cur = cur.get("properties")?.get(seg)?;
    }
    let mut s = cur.clone();
    // In a group file the node may appear in any flavour: merge the Megatron variant's keys.
    if name == "optim" || name == "engine" {
        let alt = if name == "optim" { "actor_rollout_ref.actor.optim" } else { "actor_rollout_ref.actor.megatron" };
        let mut other = &root;
        for seg in alt.split('.') {
            other = other.get("properties").and_then(|p| p.get(seg)).unwrap_or(&Value::Null);
        }
        if let (Some(dst), Some(src)) = (s.get_mut("properties").and_then(Value::as_object_mut), other.get("properties").and_then(Value::as_object)) {
            for (k, v) in src {
                dst.entry(k.clone()).or_insert(v.clone());
            }
        }
    }
    let m = s.as_object_mut()?;
    m.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
    m.insert("title".into(), json!(format!("verl `{name}` group file (verlc)")));
    if let Some(props) = m.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("defaults".into(), defaults_list_schema());
    }
    Some(s)
}

fn defaults_list_schema() -> Value {
    json!({
        "type": "array",
        "description": "Hydra defaults list: `group@package: option`, `../group@pkg: option`, sibling config names and `_self_`.",
        "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}
    })
}

/// Set `default` on every property that has a value in the built-in tree (first flavour wins).
fn inject_defaults(schema: &mut Value, defaults: &Value) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { return };
    let Some(dmap) = defaults.as_object() else { return };
    for (k, sub) in props.iter_mut() {
        let Some(dv) = dmap.get(k) else { continue };
        if dv.is_object() && sub.get("properties").is_some() {
            inject_defaults(sub, dv);
            continue;
        }
        // Optional nodes are `anyOf [{...object...}, null]`: descend into the object branch.
        if dv.is_object()
            && let Some(branches) = sub.get_mut("anyOf").and_then(Value::as_array_mut)
        {
            for b in branches.iter_mut().filter(|b| b.get("properties").is_some()) {
                inject_defaults(b, dv);
            }
            continue;
        }
        if let Some(m) = sub.as_object_mut() {
            m.entry("default").or_insert_with(|| dv.clone());
        }
    }
}

/// Editor relaxations: nothing required, `${...}` allowed for any value.
fn editorize(v: &mut Value) {
    if let Value::Object(m) = v {
        m.remove("required");
        for key in ["properties", "$defs"] {
            if let Some(Value::Object(props)) = m.get_mut(key) {
                for sub in props.values_mut() {
                    editorize(sub);
                    allow_interpolation(sub);
                }
            }
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(items)) = m.get_mut(key) {
                items.iter_mut().for_each(editorize);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub @ Value::Object(_)) = m.get_mut(key) {
                editorize(sub);
            }
        }
    }
}

fn allow_interpolation(sub: &mut Value) {
    let Value::Object(m) = sub else { return };
    let is_plain_string = m.get("type") == Some(&json!("string")) && !m.contains_key("enum");
    if is_plain_string || m.contains_key("properties") {
        return;
    }
    let interp = json!({"type": "string", "pattern": "\\$\\{.*\\}", "description": "an OmegaConf interpolation"});
    if let Some(Value::Array(branches)) = m.get_mut("anyOf") {
        branches.push(interp);
        return;
    }
    // Keep the annotations (description, default) at this level for hovers.
    let mut inner = Map::new();
    for k in ["type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items", "const", "oneOf"] {
        if let Some(x) = m.remove(k) {
            inner.insert(k.into(), x);
        }
    }
    if inner.is_empty() {
        return;
    }
    m.insert("anyOf".into(), json!([Value::Object(inner), interp]));
}

/// Validate a composed config; each error becomes a diagnostic pointing at the YAML (or
/// override) text of the offending key or value.
pub fn validate(root: &Node) -> Vec<Diagnostic> {
    let Some(v) = validator() else {
        return vec![Diagnostic::error(codes::SCHEMA_OTHER, "internal error: the generated schema does not compile")];
    };
    let json = root.to_json();
    let mut out = Vec::new();
    for err in v.iter_errors(&json) {
        let ptr = err.instance_path().as_str().to_string();
        let segs: Vec<String> = ptr.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~")).collect();
        let key = segs.join(".");
        let node = node_at(root, &segs);
        let origin = node.and_then(|n| n.origin.clone());
        let schema_here = schema_at(validation_schema(), &segs);
        use jsonschema::error::ValidationErrorKind as K;
        let d = match err.kind() {
            K::AdditionalProperties { unexpected } => {
                let known: Vec<String> = schema_here
                    .and_then(|s| s.get("properties"))
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                for u in unexpected {
                    let full = if key.is_empty() { u.clone() } else { format!("{key}.{u}") };
                    let key_origin = node.and_then(|n| n.as_map()).and_then(|m| m.get(u)).and_then(|e| e.key_origin.clone().or(e.node.origin.clone()));
                    let mut d = Diagnostic::error(codes::SCHEMA_UNKNOWN_KEY, format!("unknown key `{full}`"))
                        .with_key(full.clone())
                        .with_primary(key_origin, "not a key of this section");
                    d = match did_you_mean(u, known.iter().map(String::as_str)) {
                        Some(s) => d.with_help(format!("did you mean `{s}`?")),
                        None if known.is_empty() => d,
                        None => d.with_help(format!("`{}` accepts: {}", if key.is_empty() { "<root>" } else { &key }, short_list(&known))),
                    };
                    out.push(d);
                }
                continue;
            }
            K::Enum { options } => {
                let opts: Vec<String> = options.as_array().map(|a| a.iter().map(|o| o.to_string()).collect()).unwrap_or_default();
                let got = err.instance().to_string();
                let plain: Vec<String> = opts.iter().map(|o| o.trim_matches('"').to_string()).collect();
                let mut d = Diagnostic::error(codes::SCHEMA_ENUM, format!("`{key}` must be one of {}, not {got}", opts.join(", ")))
                    .with_key(key.clone())
                    .with_primary(origin, "not an allowed value");
                if let Some(s) = err.instance().as_str().and_then(|g| did_you_mean(g, plain.iter().map(String::as_str))) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                d
            }
            K::Minimum { limit } | K::ExclusiveMinimum { limit } | K::Maximum { limit } | K::ExclusiveMaximum { limit } => {
                let rel = match err.kind() {
                    K::Minimum { .. } => ">=",
                    K::ExclusiveMinimum { .. } => ">",
                    K::Maximum { .. } => "<=",
                    _ => "<",
                };
                Diagnostic::error(codes::SCHEMA_RANGE, format!("`{key}` must be {rel} {limit}, got {}", err.instance()))
                    .with_key(key.clone())
                    .with_primary(origin, format!("must be {rel} {limit}"))
            }
            K::Required { property } => {
                let p = property.as_str().unwrap_or("?");
                let full = if key.is_empty() { p.to_string() } else { format!("{key}.{p}") };
                Diagnostic::error(codes::SCHEMA_REQUIRED, format!("missing key `{full}`"))
                    .with_key(full.clone())
                    .with_primary(origin, format!("`{p}` is required in this section"))
                    .with_help("it was deleted (`~key`) or replaced by a value without it; verl reads this key")
            }
            K::Type { kind } => {
                let expected = type_names(kind);
                Diagnostic::error(codes::SCHEMA_TYPE, format!("`{key}` must be {expected}, got {}", describe(err.instance())))
                    .with_key(key.clone())
                    .with_primary(origin, format!("expected {expected}"))
            }
            K::AnyOf { .. } | K::OneOfNotValid { .. } => {
                // Mostly `Option<T>`: report against the non-null branch.
                let expected = schema_here.map(describe_schema).unwrap_or_else(|| "a valid value".into());
                Diagnostic::error(codes::SCHEMA_TYPE, format!("`{key}` must be {expected}, got {}", describe(err.instance())))
                    .with_key(key.clone())
                    .with_primary(origin, format!("expected {expected}"))
            }
            _ => Diagnostic::error(codes::SCHEMA_OTHER, format!("`{key}`: {err}")).with_key(key.clone()).with_primary(origin, "here"),
        };
        out.push(d);
    }
    out
}

fn short_list(keys: &[String]) -> String {
    if keys.len() <= 12 { keys.join(", ") } else { format!("{}, … ({} keys)", keys[..12].join(", "), keys.len()) }
}

fn node_at<'a>(root: &'a Node, segs: &[String]) -> Option<&'a Node> {
    let mut cur = root;
    for s in segs {
        cur = cur.child(s)?;
    }
    Some(cur)
}

/// The (inlined) schema object governing a key path.
pub fn schema_at<'a>(schema: &'a Value, segs: &[String]) -> Option<&'a Value> {
    let mut cur = schema;
    for s in segs {
        cur = object_branch(cur);
        cur = cur.get("properties").and_then(|p| p.get(s)).or_else(|| cur.get("items"))?;
    }
    Some(object_branch(cur))
}

fn object_branch(s: &Value) -> &Value {
    if s.get("properties").is_some() {
        return s;
    }
    if let Some(b) = s.get("anyOf").and_then(Value::as_array).and_then(|a| a.iter().find(|b| b.get("properties").is_some())) {
        return b;
    }
    s
}

fn type_names(kind: &jsonschema::error::TypeKind) -> String {
    use jsonschema::error::TypeKind;
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
    match kind {
        TypeKind::Single(t) => name(&t.to_string()),
        TypeKind::Multiple(set) => set.iter().map(|t| name(&t.to_string())).collect::<Vec<_>>().join(" or "),
    }
}

fn describe_schema(s: &Value) -> String {
    let mut parts = Vec::new();
    let branches: Vec<&Value> = match s.get("anyOf").or_else(|| s.get("oneOf")).and_then(Value::as_array) {
        Some(a) => a.iter().collect(),
        None => vec![s],
    };
    for b in branches {
        if let Some(e) = b.get("enum").and_then(Value::as_array) {
            parts.push(format!("one of {}", e.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")));
        } else if let Some(t) = b.get("type") {
            let ts: Vec<String> = match t {
                Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(String::from)).collect(),
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
    if parts.is_empty() { "a valid value".into() } else { parts.join(" or ") }
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

//! The editor schema's keys of the newest release verlc carries that its 0.7 typed model
//! lacks (`distillation`, `rollout.checkpoint_engine`, `critic.fsdp.qat`, ...): typed from the
//! release's leaf table ([`crate::load::release_table`]) with the defaults of the built-in tree,
//! so an editor completes and checks a config written for the default release, not only 0.7's
//! keys. Keys the model has keep the model's schema (descriptions, enums, ranges).

use serde_json::{Map, Value, json};

use crate::load::compose::{self, LoadRequest};
use crate::load::version::BuiltinRelease;

/// Adds the newest built-in release's keys missing from `schema` (the generated root schema,
/// before editor annotations are applied).
pub(super) fn add_newest_release_keys(schema: &mut Value) {
    let release = BuiltinRelease::default();
    let Some(table) = crate::load::release_table::for_release(release.version()) else {
        return;
    };
    let defaults = newest_release_defaults();
    let note = format!(
        "verl {} (typed from the release's own files)",
        release.version()
    );
    for (key, types) in table.leaves() {
        let path: Vec<&str> = key.split('.').collect();
        // Hydra's metadata (`_target_`) is not a setting.
        if path.iter().any(|p| p.starts_with('_')) {
            continue;
        }
        let default = lookup(defaults, &path);
        insert(schema, &path, &types, default, &note);
    }
    // The class each section of the release's tree names (also in sections the model has).
    let mut targets = Vec::new();
    for tree in defaults {
        target_paths(tree, &mut Vec::new(), &mut targets);
    }
    for path in targets {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        insert(schema, &path, &["string"], None, &note);
    }
}

/// The paths of every `_target_` key in `tree`.
fn target_paths(tree: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Value::Object(m) = tree else { return };
    for (k, v) in m {
        at.push(k.clone());
        if k == "_target_" {
            out.push(at.clone());
        } else {
            target_paths(v, at, out);
        }
        at.pop();
    }
}

/// [`release_defaults`] of the newest built-in release, composed once per process (the root
/// schema and every group schema read them).
fn newest_release_defaults() -> &'static [Value] {
    static DEFAULTS: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    DEFAULTS.get_or_init(|| release_defaults(BuiltinRelease::default()))
}

/// Both flavours of the release's built-in tree, composed and resolved (FSDP first), then the
/// FSDP flavour on VeOmni's and torchtitan's engines (their sections' defaults).
fn release_defaults(release: BuiltinRelease) -> Vec<Value> {
    let flavours = [compose::FSDP_BASE, compose::MEGATRON_BASE].map(|b| (b, None));
    let engines = ["veomni", "torchtitan"].map(|e| (compose::FSDP_BASE, Some(e)));
    flavours
        .into_iter()
        .chain(engines)
        .map(|(base, engine)| {
            compose::load(&LoadRequest {
                base: Some(base.into()),
                builtin: release,
                overrides: engine
                    .map(|e| vec![format!("model_engine={e}")])
                    .unwrap_or_default(),
                ..LoadRequest::default()
            })
            .root
            .to_json()
        })
        .collect()
}

/// A key's default: its value in the first flavour that has it, unless it is `???` or an
/// interpolation (neither is a value an editor should offer).
fn lookup<'a>(trees: &'a [Value], path: &[&str]) -> Option<&'a Value> {
    trees.iter().find_map(|t| {
        let mut cur = t;
        for p in path {
            cur = cur.get(*p)?;
        }
        match cur {
            Value::String(s) if s == "???" || s.contains("${") => None,
            Value::Object(_) => None,
            v => Some(v),
        }
    })
}

/// Places `path` (`*` for an entry of a dict of configs) in `schema` where the model has no
/// schema for it; a node the model types without listing properties (a free-form map, a
/// union) is left as it is.
fn insert(schema: &mut Value, path: &[&str], types: &[&str], default: Option<&Value>, note: &str) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(m) = schema.as_object_mut() else {
        return;
    };
    let child = if *first == "*" {
        match m.get("additionalProperties") {
            Some(Value::Object(_)) => {}
            // A map the model leaves open (or that this table created) takes entries of this
            // shape.
            _ => {
                m.insert("additionalProperties".into(), section(note));
            }
        }
        m.get_mut("additionalProperties")
    } else {
        let created = !m.contains_key("properties");
        if created && m.contains_key("type") && m.get("type") != Some(&json!("object")) {
            return;
        }
        if created && (m.contains_key("anyOf") || m.contains_key("oneOf")) {
            return;
        }
        let props = m
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(props) = props.as_object_mut() else {
            return;
        };
        if !props.contains_key(*first) {
            let node = if rest.is_empty() {
                leaf(types, default, note)
            } else {
                section(note)
            };
            props.insert((*first).to_owned(), node);
        } else if rest.is_empty() {
            // The model's own schema for the key, widened to the release's null (verl 0.7.1+
            // keeps the 0.7 reward keys as null stubs).
            if (types.contains(&"null") || default == Some(&Value::Null))
                && let Some(existing) = props.get_mut(*first)
            {
                admit_null(existing);
            }
            return;
        }
        props.get_mut(*first)
    };
    if let Some(child) = child
        && !rest.is_empty()
    {
        insert(child, rest, types, default, note);
    }
}

/// A section the model does not have: an object whose keys the table lists (others are typos),
/// and the class verl builds it into.
fn section(note: &str) -> Value {
    json!({
        "type": "object",
        "description": format!("A section of {note}."),
        "properties": {
            "_target_": {
                "type": "string",
                "description": "The class verl builds this section into (Hydra's `_target_`).",
            },
        },
        "additionalProperties": false,
    })
}

/// Lets a leaf schema take null too (its `type`, its `enum`, or a branch of its union).
fn admit_null(schema: &mut Value) {
    let Some(m) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(branches)) = m.get_mut("anyOf") {
        if !branches
            .iter()
            .any(|b| b.get("type") == Some(&json!("null")))
        {
            branches.push(json!({"type": "null"}));
        }
        return;
    }
    match m.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            m.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(ts)) if !ts.contains(&json!("null")) => ts.push(json!("null")),
        _ => {}
    }
    if let Some(Value::Array(values)) = m.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
}

/// A leaf of the table: its types (none for "any"), its default.
fn leaf(types: &[&str], default: Option<&Value>, note: &str) -> Value {
    let mut m = Map::new();
    if !types.contains(&"any") {
        let names: Vec<Value> = types.iter().map(|t| json!(t)).collect();
        m.insert(
            "type".into(),
            if names.len() == 1 {
                names[0].clone()
            } else {
                Value::Array(names)
            },
        );
    }
    if let Some(d) = default {
        m.insert("default".into(), d.clone());
    }
    m.insert("description".into(), json!(format!("A key of {note}.")));
    Value::Object(m)
}

//! The leaf tables of verl releases verlc does not model key by key: every key of the
//! release's generated trees with the types its value may take, derived from verl's own files
//! (its dataclass annotations, else its defaults) by `scripts/release_leaves.py` and committed
//! under `compiler/releases/` (kept fresh by `tests/release_tables.rs`).
//!
//! `verlc check` on such a release's tree reads the table for the keys its 0.7 model does not
//! know (or types otherwise): their values, verl's and the user's, are checked by type here
//! instead of passing through; only keys the table does not hold either still pass through
//! (`S007`).

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::codes;
use crate::diag::Diagnostic;
use crate::load::node::{Node, Scalar, Value};

/// One release's table.
#[derive(Debug)]
pub struct ReleaseTable {
    pub release: String,
    leaves: HashMap<String, Vec<LeafType>>,
}

/// A type a leaf's value may take, as verl's config machinery (OmegaConf) converts values:
/// numbers and booleans from strings, anything scalar into a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeafType {
    Any,
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl LeafType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "any" => LeafType::Any,
            "null" => LeafType::Null,
            "boolean" => LeafType::Boolean,
            "integer" => LeafType::Integer,
            "number" => LeafType::Number,
            "string" => LeafType::String,
            "array" => LeafType::Array,
            "object" => LeafType::Object,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            LeafType::Any => "anything",
            LeafType::Null => "null",
            LeafType::Boolean => "a boolean",
            LeafType::Integer => "an integer",
            LeafType::Number => "a number",
            LeafType::String => "a string",
            LeafType::Array => "a list",
            LeafType::Object => "a map",
        }
    }

    fn admits(self, v: &Value) -> bool {
        use Scalar::{Bool, Float, Int, Null, Str};
        match (self, v) {
            (LeafType::Any, _) => true,
            // An unresolved interpolation's type is its target's.
            (_, Value::Scalar(Str(s))) if s.contains("${") => true,
            (LeafType::Null, Value::Scalar(Null)) => true,
            (LeafType::Boolean, Value::Scalar(Bool(_))) => true,
            (LeafType::Boolean, Value::Scalar(Int(i))) => *i == 0 || *i == 1,
            (LeafType::Boolean, Value::Scalar(Str(s))) => matches!(
                s.trim().to_ascii_lowercase().as_str(),
                "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "1" | "0"
            ),
            (LeafType::Integer, Value::Scalar(Int(_))) => true,
            (LeafType::Integer, Value::Scalar(Str(s))) => s.trim().parse::<i64>().is_ok(),
            (LeafType::Number, Value::Scalar(Int(_) | Float(_))) => true,
            (LeafType::Number, Value::Scalar(Str(s))) => s.trim().parse::<f64>().is_ok(),
            (LeafType::String, Value::Scalar(s)) => !matches!(s, Null),
            (LeafType::Array, Value::Seq(_)) => true,
            (LeafType::Object, Value::Map(_)) => true,
            _ => false,
        }
    }
}

/// The committed tables, by release.
const TABLES: &[(&str, &str)] = &[
    ("0.8.0", include_str!("../../releases/verl-0.8.0.json")),
    ("0.9.1", include_str!("../../releases/verl-0.9.1.json")),
];

fn tables() -> &'static [ReleaseTable] {
    static PARSED: OnceLock<Vec<ReleaseTable>> = OnceLock::new();
    PARSED.get_or_init(|| {
        TABLES
            .iter()
            .filter_map(|(release, text)| {
                let json: serde_json::Value = serde_json::from_str(text).ok()?;
                let leaves = json
                    .get("leaves")?
                    .as_object()?
                    .iter()
                    .map(|(k, v)| {
                        let types = v
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|t| t.as_str().and_then(LeafType::parse))
                            .collect();
                        (k.clone(), types)
                    })
                    .collect();
                Some(ReleaseTable {
                    release: (*release).to_owned(),
                    leaves,
                })
            })
            .collect()
    })
}

/// The table for release `version` (`0.9.1`): its own, else the newest of the same minor
/// release (a 0.9.0 tree is read with 0.9.1's: a patch release changes no key).
pub fn for_release(version: &str) -> Option<&'static ReleaseTable> {
    // A tree recognised by its layout alone could be any later release.
    if version.starts_with("newer than") {
        return None;
    }
    let minor = crate::load::version::minor_version(version)?;
    let all = tables();
    all.iter().find(|t| t.release == version).or_else(|| {
        all.iter()
            .rev()
            .find(|t| crate::load::version::minor_version(&t.release) == Some(minor))
    })
}

/// `key`, then `key` with each one of its segments as `*`.
fn variants(key: &str) -> impl Iterator<Item = String> + '_ {
    let segments: Vec<&str> = key.split('.').collect();
    let n = segments.len();
    std::iter::once(key.to_owned()).chain((0..n).map(move |i| {
        let mut s = segments.clone();
        s[i] = "*";
        s.join(".")
    }))
}

impl ReleaseTable {
    /// Checks the subtree `node` at dotted `key` against the table: a type error for each value
    /// the release's types refuse (at the value's origin), pushed to `out`. Returns whether the
    /// table knows every key of the subtree (a key it does not hold still passes through).
    pub fn check(&self, key: &str, node: &Node, out: &mut Vec<Diagnostic>) -> bool {
        let children = |out: &mut Vec<Diagnostic>| match &node.value {
            Value::Map(m) => m
                .iter()
                // Hydra's metadata (`_target_`): the class verl builds, not a setting.
                .filter(|(k, _)| !k.starts_with('_'))
                // Every child is checked (each may add an error), then whether all were known.
                .map(|(k, e)| self.check(&format!("{key}.{k}"), &e.node, out))
                .collect::<Vec<bool>>()
                .into_iter()
                .all(|known| known),
            _ => true,
        };
        if key
            .rsplit('.')
            .next()
            .is_some_and(|leaf| leaf.starts_with('_'))
        {
            return true;
        }
        match self.types(key) {
            Some(types) if !types.iter().any(|t| t.admits(&node.value)) => {
                out.push(self.type_error(key, node, types));
                true
            }
            // A map the table takes whole (a dict of settings): entries it lists are checked,
            // others are free.
            Some(_) => {
                if self.has_below(key) {
                    children(out);
                }
                true
            }
            None if matches!(node.value, Value::Map(_)) && self.has_below(key) => children(out),
            // A key the release's files do not have.
            None => false,
        }
    }

    /// The types of `key`: its own entry, else one where a segment is `*` (an entry of a dict
    /// of configs by name, as `distillation.teacher_models.<name>`).
    fn types(&self, key: &str) -> Option<&[LeafType]> {
        variants(key).find_map(|k| self.leaves.get(&k).map(Vec::as_slice))
    }

    /// Whether the table holds keys below `key` (a section of the release).
    fn has_below(&self, key: &str) -> bool {
        variants(key).any(|k| {
            let prefix = format!("{k}.");
            self.leaves.keys().any(|l| l.starts_with(&prefix))
        })
    }

    fn type_error(&self, key: &str, node: &Node, types: &[LeafType]) -> Diagnostic {
        let want: Vec<&str> = types.iter().map(|t| t.name()).collect();
        let got = match &node.value {
            Value::Scalar(Scalar::Null) => "null".to_owned(),
            Value::Scalar(Scalar::Bool(b)) => format!("boolean {b}"),
            Value::Scalar(Scalar::Int(i)) => format!("integer {i}"),
            Value::Scalar(Scalar::Float(f)) => format!("number {f}"),
            Value::Scalar(Scalar::Str(s)) => format!("string {s:?}"),
            Value::Seq(_) => "a list".to_owned(),
            Value::Map(_) => "a map".to_owned(),
        };
        Diagnostic::error(
            codes::SCHEMA_TYPE,
            format!("`{key}` must be {}, got {got}", want.join(" or ")),
        )
        .with_key(key.to_owned())
        .with_primary(node.origin.clone(), "this value")
        .with_help(format!(
            "verl {}'s type for this key (its dataclass annotation or default)",
            self.release
        ))
    }
}

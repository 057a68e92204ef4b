//! The evaluator against the `jsonschema` crate, on verlc's validation schema and configs
//! broken in every way a user can break one.

use serde_json::{Value, json};

use std::cmp::Ordering;

use super::*;
use crate::config::Flavour;
use crate::load::node::{Node, Scalar, Value as NodeValue};

use super::super::keywords::ASSERTIONS;

/// The keyword a violation breaks.
fn keyword(v: &Violation) -> &'static str {
    {
        match v {
            Violation::AdditionalProperties { .. } => "additionalProperties",
            Violation::Enum { .. } => "enum",
            Violation::Const { .. } => "const",
            Violation::Minimum { .. } => "minimum",
            Violation::ExclusiveMinimum { .. } => "exclusiveMinimum",
            Violation::Maximum { .. } => "maximum",
            Violation::ExclusiveMaximum { .. } => "exclusiveMaximum",
            Violation::Required { .. } => "required",
            Violation::Type { .. } => "type",
            Violation::MinItems { .. } => "minItems",
            Violation::MaxItems { .. } => "maxItems",
            Violation::AnyOf => "anyOf",
            Violation::Not => "not",
        }
    }
}

/// Keywords of `schema` (recursively) that are neither evaluated here nor annotations.
fn unknown_keywords(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_unknown(schema, &mut out);
    out.sort();
    out.dedup();
    out
}

fn collect_unknown(schema: &Value, out: &mut Vec<String>) {
    let Value::Object(s) = schema else { return };
    for (k, v) in s {
        if !ASSERTIONS.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
            out.push(k.clone());
        }
        match k.as_str() {
            "properties" => v
                .as_object()
                .into_iter()
                .flat_map(|p| p.values())
                .for_each(|x| collect_unknown(x, out)),
            "anyOf" => v
                .as_array()
                .into_iter()
                .flatten()
                .for_each(|x| collect_unknown(x, out)),
            "items" | "additionalProperties" | "not" => collect_unknown(v, out),
            _ => {}
        }
    }
}

/// A violation in a form both validators can be compared in.
type Finding = (String, &'static str, String);

fn ours<I: Instance>(doc: &I) -> Vec<Finding> {
    let mut v: Vec<Finding> = violations(&VALIDATION, doc)
        .into_iter()
        .map(|e| {
            let detail = match &e.kind {
                Violation::AdditionalProperties { unexpected } => unexpected.join(","),
                Violation::Required { property } => property.to_string(),
                Violation::Type { expected } => expected.join(","),
                _ => String::new(),
            };
            (e.path.join("/"), keyword(&e.kind), detail)
        })
        .collect();
    v.sort();
    v
}

fn reference(validator: &jsonschema::Validator, doc: &Value) -> Vec<Finding> {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    let mut v: Vec<Finding> = validator
        .iter_errors(doc)
        .map(|e| {
            let detail = match e.kind() {
                K::AdditionalProperties { unexpected } => unexpected.join(","),
                K::Required { property } => property.as_str().unwrap_or("?").to_string(),
                K::Type { kind } => match kind {
                    TypeKind::Single(t) => t.to_string(),
                    TypeKind::Multiple(set) => set
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                },
                _ => String::new(),
            };
            let path = e
                .instance_path()
                .as_str()
                .trim_start_matches('/')
                .to_string();
            let kw: &'static str = ASSERTIONS
                .iter()
                .copied()
                .find(|k| *k == e.kind().keyword())
                .unwrap_or("other");
            (path, kw, detail)
        })
        .collect();
    v.sort();
    v
}

/// Every leaf (and every mapping) of `doc`, as a path of keys and indices.
fn paths(doc: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(prefix.clone());
    match doc {
        Value::Object(m) => {
            for (k, v) in m {
                prefix.push(k.clone());
                paths(v, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                prefix.push(i.to_string());
                paths(v, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, seg| match cur {
        Value::Object(m) => m.get_mut(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

/// Values that break (or happen to fit) any kind of key.
fn replacements() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!("fsdp2"),
        json!(-1),
        json!(0),
        json!(1.0),
        json!(2.5),
        json!(-0.5),
        json!(u64::MAX),
        json!(i64::MIN),
        json!([]),
        json!([1, "x"]),
        json!(["console", "wandb"]),
        json!({"unknown": 1}),
        json!({}),
    ]
}

#[test]
fn agrees_with_jsonschema() {
    let schema = crate::schema::validation_schema();
    let reference_validator = jsonschema::options()
        .should_validate_formats(false)
        .build(schema)
        .expect("the generated schema compiles");
    let values = replacements();
    let mut compared = 0;
    for flavour in [Flavour::Fsdp, Flavour::Megatron] {
        let doc = crate::schema::builtin_defaults(flavour);
        assert_eq!(ours(&doc), reference(&reference_validator, &doc));
        let mut all = Vec::new();
        paths(&doc, &mut Vec::new(), &mut all);
        for (i, path) in all.iter().enumerate() {
            // Each place gets a few of the replacements (rotating), a deletion and an extra key.
            let mut variants = Vec::new();
            for j in 0..3 {
                let mut d = doc.clone();
                if let Some(slot) = at_mut(&mut d, path) {
                    *slot = values[(i * 3 + j) % values.len()].clone();
                }
                variants.push(d);
            }
            if let Some((last, parent)) = path.split_last() {
                let mut d = doc.clone();
                if let Some(Value::Object(m)) = at_mut(&mut d, parent) {
                    m.shift_remove(last);
                }
                variants.push(d);
            }
            let mut d = doc.clone();
            if let Some(Value::Object(m)) = at_mut(&mut d, path) {
                m.insert("not_a_key".into(), json!(1));
                variants.push(d);
            }
            for d in &variants {
                assert_eq!(
                    ours(d),
                    reference(&reference_validator, d),
                    "at {}",
                    path.join(".")
                );
                compared += 1;
            }
        }
    }
    assert!(compared > 2000, "only {compared} documents compared");
}

#[test]
fn schema_uses_only_known_keywords() {
    assert_eq!(
        unknown_keywords(crate::schema::validation_schema()),
        Vec::<String>::new()
    );
}

#[test]
fn numbers_compare_by_value_and_exactly() {
    let n = |v: Value| match v {
        Value::Number(n) => n,
        _ => unreachable!(),
    };
    assert_eq!(compare(&n(json!(1.0)), Lit::Int(1)), Some(Ordering::Equal));
    assert!(json!(1.0).equal(Lit::Int(1)));
    assert!(!json!(1).equal(Lit::Str("1")));
    // Exact at the edges of i64/u64, where f64 would round.
    assert_eq!(
        compare(&n(json!(9223372036854775808u64)), Lit::Int(i64::MAX)),
        Some(Ordering::Greater)
    );
    assert_eq!(
        compare(
            &n(json!(9223372036854775807u64)),
            Lit::Uint(9223372036854775808)
        ),
        Some(Ordering::Less)
    );
    assert_eq!(compare(&n(json!(-1)), Lit::Uint(0)), Some(Ordering::Less));
    assert_eq!(
        compare(&n(json!(u64::MAX)), Lit::Int(-1)),
        Some(Ordering::Greater)
    );
    assert_eq!(
        compare(&n(json!(0.5)), Lit::Int(0)),
        Some(Ordering::Greater)
    );
    assert_eq!(json!(2.0).type_bits(), 4 | 8);
    assert_eq!(json!(2.5).type_bits(), 8);
}

/// The composed tree as the validator's instance: what `Node::to_json` makes of it.
fn node_of(v: &Value) -> Option<Node> {
    let scalar = |s| Some(Node::scalar(s, None));
    match v {
        Value::Null => scalar(Scalar::Null),
        Value::Bool(b) => scalar(Scalar::Bool(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => scalar(Scalar::Int(i)),
            // Above i64: no YAML integer verlc reads.
            _ if n.is_u64() => None,
            (None, Some(f)) => scalar(Scalar::Float(f)),
            _ => None,
        },
        Value::String(s) => scalar(Scalar::Str(s.clone())),
        Value::Array(items) => Some(Node::new(
            NodeValue::Seq(items.iter().map(node_of).collect::<Option<_>>()?),
            None,
        )),
        Value::Object(m) => {
            let mut out = Node::empty_map(None);
            let map = out.as_map_mut()?;
            for (k, v) in m {
                map.insert(
                    k.clone(),
                    crate::load::node::Entry {
                        key_origin: None,
                        node: node_of(v)?,
                    },
                );
            }
            Some(out)
        }
    }
}

#[test]
fn the_tree_validates_as_its_json_does() {
    // Every broken variant of both default trees, as a tree and as JSON.
    let values = replacements();
    let mut compared = 0;
    for flavour in [Flavour::Fsdp, Flavour::Megatron] {
        let doc = crate::schema::builtin_defaults(flavour);
        let mut all = Vec::new();
        paths(&doc, &mut Vec::new(), &mut all);
        for (i, path) in all.iter().enumerate() {
            let mut d = doc.clone();
            if let Some(slot) = at_mut(&mut d, path) {
                *slot = values[i % values.len()].clone();
            }
            let Some(node) = node_of(&d) else { continue };
            assert_eq!(node.to_json(), d);
            assert_eq!(ours(&node), ours(&d), "at {}", path.join("."));
            compared += 1;
        }
    }
    assert!(compared > 500, "only {compared} trees compared");
    // A non-finite float is a string to JSON (`to_json` writes `inf`): so it is here.
    let inf = Node::scalar(Scalar::Float(f64::INFINITY), None);
    assert_eq!(inf.type_bits(), 16);
    assert!(inf.equal(Lit::Str("inf")));
    assert_eq!(inf.compare(Lit::Int(0)), None);
    assert_eq!(inf.to_json(), json!("inf"));
    let third = Node::scalar(Scalar::Float(2.5), None);
    assert_eq!(third.compare(Lit::Int(3)), Some(Ordering::Less));
    assert_eq!(
        Node::scalar(Scalar::Int(-1), None).compare(Lit::Uint(0)),
        Some(Ordering::Less)
    );
    assert!(Node::scalar(Scalar::Int(2), None).equal(Lit::Float(2.0)));
}

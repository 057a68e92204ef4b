//! Turns two committed, generated JSON files into Rust statics, so `verlc check` does not
//! read or compose them at every start:
//! - the validation schema (`schemas/verl.validation.json`), types in
//!   `src/schema/validator.rs`;
//! - the composed built-in default trees (`defaults/composed.json`), types in
//!   `src/load/snapshot.rs`;
//! - the leaf tables of verl releases (`releases/verl-*.json`, from
//!   `scripts/release_leaves.py`), read by `src/load/release_table.rs`;
//! - the built-in trees of newer releases (`releases/verl-<release>/`, from
//!   `scripts/builtin_tree.py`), embedded as files for `src/config/builtin.rs`.
//!
//! `tests/schema_fresh.rs` keeps both files equal to what the sources generate.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

include!("src/schema/keywords.rs");
include!("src/load/leaf_types.rs");

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let out_dir = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=build.rs");

    let schema = read_json(&Path::new(&manifest).join("../schemas/verl.validation.json"));
    let mut out = String::from("pub static VALIDATION: Schema = ");
    schema_expr(&schema, &mut out);
    out.push_str(";\n");
    write(&Path::new(&out_dir).join("validation_schema.rs"), &out);

    // Missing only while it is first generated (`tests/schema_fresh.rs` writes it): empty
    // trees then, which that test reports as stale.
    let trees_path = Path::new(&manifest).join("defaults/composed.json");
    let trees = if trees_path.exists() {
        read_json(&trees_path)
    } else {
        println!("cargo:rerun-if-changed={}", trees_path.display());
        println!(
            "cargo:warning=defaults/composed.json is missing; run `VERLC_UPDATE_SCHEMAS=1 cargo test -p verlc --test schema_fresh`"
        );
        serde_json::json!({})
    };
    let empty = serde_json::json!({});
    let mut out = String::new();
    for (name, base) in [
        ("BUILTIN_FSDP", "ppo_trainer"),
        ("BUILTIN_MEGATRON", "ppo_megatron_trainer"),
    ] {
        let tree = trees.get(base).unwrap_or(&empty);
        let _ = write!(out, "pub static {name}: StaticNode = ");
        node_expr(tree, &mut out);
        out.push_str(";\n");
    }
    write(&Path::new(&out_dir).join("builtin_trees.rs"), &out);

    // Each release's leaves sorted by key, their types as a bit mask (release_table.rs): the
    // PPO trainer's tables, and those of verl's SFT trainer (`verl-<release>.sft.json`, 0.7.0's
    // too: verlc's own 0.7.0 model is the PPO trainer's).
    let mut out = String::from(
        "/// (release, its leaves and their type bits, its dicts of configs by name).\n\
         pub type Table = (&'static str, &'static [(&'static str, u8)], &'static [&'static str]);\n",
    );
    tables(&manifest, "RELEASE_TABLES", RELEASES, "json", &mut out);
    tables(&manifest, "SFT_TABLES", SFT_RELEASES, "sft.json", &mut out);
    tables(
        &manifest,
        "LEGACY_SFT_TABLES",
        &["0.7.0"],
        "legacy_sft.json",
        &mut out,
    );
    write(&Path::new(&out_dir).join("release_tables.rs"), &out);

    // The built-in trees of newer releases (`releases/verl-<release>/`, from
    // `scripts/builtin_tree.py`): each file embedded under its path in the tree.
    let mut out = String::from("pub static RELEASE_TREES: &[(&str, &[(&str, &str)])] = &[\n");
    for release in BUILTIN_RELEASE_TREES {
        let root = Path::new(&manifest).join(format!("releases/verl-{release}"));
        println!("cargo:rerun-if-changed={}", root.display());
        let mut files = Vec::new();
        yaml_files(&root, &root, &mut files);
        files.sort();
        let _ = writeln!(out, "    ({release:?}, &[");
        for (rel, path) in &files {
            println!("cargo:rerun-if-changed={path}");
            let _ = writeln!(out, "        ({rel:?}, include_str!({path:?})),");
        }
        out.push_str("    ]),\n");
    }
    out.push_str("];\n");
    write(&Path::new(&out_dir).join("release_trees.rs"), &out);
}

/// The releases whose config tree verlc embeds besides its own 0.7.0 tree (`defaults/`):
/// every release it carries (`--verl-version`), each judged with its own leaf table.
const BUILTIN_RELEASE_TREES: &[&str] = RELEASES;

/// Every `.yaml` file under `dir` as (path relative to `root` with `/`, absolute path).
fn yaml_files(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            yaml_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push((rel.join("/"), path.display().to_string()));
        }
    }
}

/// The releases with a committed leaf table.
const RELEASES: &[&str] = &["0.7.1", "0.8.0", "0.9.0", "0.9.1"];

/// The releases with a committed leaf table of the SFT trainer.
const SFT_RELEASES: &[&str] = &["0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1"];

/// `pub static NAME: &[Table]` from `releases/verl-<release>.<ext>` of each release.
fn tables(manifest: &str, name: &str, releases: &[&str], ext: &str, out: &mut String) {
    let _ = writeln!(out, "pub static {name}: &[Table] = &[");
    for release in releases {
        let table = read_json(&Path::new(manifest).join(format!("releases/verl-{release}.{ext}")));
        let mut leaves: Vec<(&String, u8)> = table["leaves"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                let mask = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|t| {
                        LEAF_TYPES
                            .iter()
                            .position(|n| *n == t)
                            .map_or(0, |i| 1u8 << i)
                    })
                    .fold(0, |m, b| m | b);
                (k, mask)
            })
            .collect();
        leaves.sort();
        // The dicts of configs by name (their entries' leaves are under `<dict>.*`).
        let mut dicts: Vec<&str> = leaves
            .iter()
            .filter_map(|(k, _)| k.find(".*.").map(|i| &k[..i]))
            .collect();
        dicts.sort();
        dicts.dedup();
        let _ = write!(out, "    ({release:?}, &[");
        for (k, mask) in &leaves {
            let _ = write!(out, "({k:?}, {mask}),");
        }
        let _ = writeln!(out, "], &{dicts:?}),");
    }
    out.push_str("];\n");
}

fn read_json(path: &Path) -> Value {
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// A composed default tree as `StaticNode` (src/load/snapshot.rs).
fn node_expr(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("StaticNode::Null"),
        Value::Bool(b) => {
            let _ = write!(out, "StaticNode::Bool({b})");
        }
        Value::Number(n) => match n.as_i64() {
            Some(i) if !n.is_f64() => {
                let _ = write!(out, "StaticNode::Int({i})");
            }
            _ => {
                let f = n.as_f64().unwrap_or(f64::NAN);
                let _ = write!(out, "StaticNode::Float({f:?})");
            }
        },
        Value::String(s) => {
            let _ = write!(out, "StaticNode::Str({s:?})");
        }
        Value::Array(items) => {
            out.push_str("StaticNode::Seq(&[");
            for i in items {
                node_expr(i, out);
                out.push(',');
            }
            out.push_str("])");
        }
        Value::Object(m) => {
            out.push_str("StaticNode::Map(&[");
            for (k, v) in m {
                let _ = write!(out, "({k:?},");
                node_expr(v, out);
                out.push_str("),");
            }
            out.push_str("])");
        }
    }
}

/// JSON Schema type names as the bits of `Schema::types`.
fn type_bit(name: &str) -> u8 {
    match name {
        "null" => 1,
        "boolean" => 2,
        "integer" => 4,
        "number" => 8,
        "string" => 16,
        "array" => 32,
        "object" => 64,
        other => panic!("unknown JSON Schema type `{other}`"),
    }
}

fn lit(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("Lit::Null"),
        Value::Bool(b) => {
            let _ = write!(out, "Lit::Bool({b})");
        }
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "Lit::Int({i})");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "Lit::Uint({u})");
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                let _ = write!(out, "Lit::Float({f:?})");
            }
        }
        Value::String(s) => {
            let _ = write!(out, "Lit::Str({s:?})");
        }
        other => panic!("unsupported literal in the validation schema: {other}"),
    }
}

fn opt_lit(v: Option<&Value>, out: &mut String) {
    match v {
        Some(v) => {
            out.push_str("Some(");
            lit(v, out);
            out.push(')');
        }
        None => out.push_str("None"),
    }
}

/// `Some(&Schema {...})` or `None`.
fn opt_schema(v: Option<&Value>, out: &mut String) {
    match v {
        Some(s) => {
            out.push_str("Some(&");
            schema_expr(s, out);
            out.push(')');
        }
        None => out.push_str("None"),
    }
}

fn schema_expr(v: &Value, out: &mut String) {
    let Value::Object(m) = v else {
        panic!("the validation schema holds a non-object schema: {v}");
    };
    // The schema is written without annotations: every key must be an assertion.
    if let Some(k) = m.keys().find(|k| !ASSERTIONS.contains(&k.as_str())) {
        panic!("the validation schema uses `{k}`, which src/schema/validator.rs does not evaluate");
    }
    out.push_str("Schema {");
    let types = match m.get("type") {
        Some(Value::String(t)) => type_bit(t),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(type_bit)
            .fold(0, |a, b| a | b),
        _ => 0,
    };
    let _ = write!(out, "types: {types},");
    match m.get("enum").and_then(Value::as_array) {
        Some(opts) => {
            out.push_str("options: Some(&[");
            for o in opts {
                lit(o, out);
                out.push(',');
            }
            out.push_str("]),");
        }
        None => out.push_str("options: None,"),
    }
    out.push_str("constant: ");
    opt_lit(m.get("const"), out);
    for (field, key) in [
        ("minimum", "minimum"),
        ("exclusive_minimum", "exclusiveMinimum"),
        ("maximum", "maximum"),
        ("exclusive_maximum", "exclusiveMaximum"),
    ] {
        let _ = write!(out, ",{field}: ");
        opt_lit(m.get(key), out);
    }
    out.push_str(",properties: &[");
    if let Some(Value::Object(props)) = m.get("properties") {
        // Sorted by name: the validator looks keys up by binary search.
        let mut names: Vec<&String> = props.keys().collect();
        names.sort();
        for name in names {
            let _ = write!(out, "({name:?},");
            schema_expr(&props[name], out);
            out.push_str("),");
        }
    }
    out.push_str("],additional: ");
    match m.get("additionalProperties") {
        None | Some(Value::Bool(true)) => out.push_str("Additional::Any"),
        Some(Value::Bool(false)) => out.push_str("Additional::Forbidden"),
        Some(s) => {
            out.push_str("Additional::Schema(&");
            schema_expr(s, out);
            out.push(')');
        }
    }
    out.push_str(",required: &[");
    for r in m
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let _ = write!(out, "{r:?},");
    }
    out.push_str("],items: ");
    opt_schema(m.get("items"), out);
    for (field, key) in [("min_items", "minItems"), ("max_items", "maxItems")] {
        match m.get(key).and_then(Value::as_u64) {
            Some(n) => {
                let _ = write!(out, ",{field}: Some({n})");
            }
            None => {
                let _ = write!(out, ",{field}: None");
            }
        }
    }
    out.push_str(",any_of: &[");
    for b in m
        .get("anyOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        schema_expr(b, out);
        out.push(',');
    }
    out.push_str("],not: ");
    opt_schema(m.get("not"), out);
    out.push('}');
}

//! The keys of an SFT config and the types of their values, against the release's SFT leaf
//! table: a key verl's SFT trainer does not have is reported at the line that wrote it (an
//! error inside a section verl builds a dataclass from, whose constructor refuses unknown
//! keywords; a warning elsewhere, where verl never reads it), and a value of a type verl does
//! not take is an error at its line.

use crate::codes;
use crate::diag::Diagnostic;
use crate::load::node::{Node, Scalar, Value};
use crate::load::release_table::{self, ReleaseTable};
use crate::source::Origin;

/// Keys whose values verl's SFT code takes in more forms than its YAML default shows (the
/// table types a key from its dataclass annotation, else from its default).
const WIDER: &[(&str, &[Form])] = &[
    // A file or a list of files (verl's datasets take both).
    ("data.train_files", &[Form::Str, Form::List]),
    ("data.val_files", &[Form::Str, Form::List, Form::Null]),
    // An interval in steps, or `after_each_epoch` (sft_trainer.py).
    ("trainer.save_freq", &[Form::Int, Form::Str]),
    ("trainer.test_freq", &[Form::Int, Form::Str]),
    ("trainer.total_training_steps", &[Form::Int, Form::Null]),
    // One backend's name or a list of them.
    ("trainer.logger", &[Form::Str, Form::List]),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Str,
    List,
    Int,
    Null,
}

impl Form {
    fn admits(self, v: &Value) -> bool {
        matches!(
            (self, v),
            (Form::Str, Value::Scalar(Scalar::Str(_)))
                | (Form::List, Value::Seq(_))
                | (Form::Int, Value::Scalar(Scalar::Int(_)))
                | (Form::Null, Value::Scalar(Scalar::Null))
        )
    }

    fn name(self) -> &'static str {
        match self {
            Form::Str => "a string",
            Form::List => "a list",
            Form::Int => "an integer",
            Form::Null => "null",
        }
    }
}

/// Checks every key of `root`; false when a value has a type verl does not take (the typed
/// view is then not built, nor the rules run). Without a table for `release`, one warning says the keys pass
/// unchecked.
///
/// Only what the user wrote is judged (`users` tells an origin of theirs): verl's own files
/// are what its trainer runs with.
pub fn check(
    root: &Node,
    release: &str,
    legacy: bool,
    users: &dyn Fn(Option<&Origin>) -> bool,
    out: &mut Vec<Diagnostic>,
) -> bool {
    let table = if legacy {
        release_table::legacy_sft_for_release(release)
    } else {
        release_table::sft_for_release(release)
    };
    let Some(table) = table else {
        out.push(Diagnostic::warning(
            codes::SCHEMA_UNMODELLED_RELEASE,
            format!(
                "verlc has no table of verl {release}'s SFT trainer: its keys and their types pass unchecked"
            ),
        ));
        return true;
    };
    let mut found = Vec::new();
    // The legacy trainer builds no dataclass from its sections (its `optim` is read as a
    // plain map): a key it does not have is never read, not refused.
    walk(&table, root, &mut String::new(), false, legacy, &mut found);
    found.retain(|d| users(d.primary.as_ref().map(|l| &l.origin)));
    // Unknown keys do not keep the rules from judging the values.
    let ok = !found
        .iter()
        .any(|d| d.is_error() && d.code == codes::SCHEMA_TYPE);
    out.extend(found);
    ok
}

fn walk(
    table: &ReleaseTable,
    node: &Node,
    key: &mut String,
    built: bool,
    legacy: bool,
    out: &mut Vec<Diagnostic>,
) {
    let Some(map) = node.as_map() else {
        return;
    };
    // A section with `_target_` becomes a dataclass in verl: unknown keys fail its constructor.
    let built = !legacy && (built || map.contains_key("_target_"));
    for (k, e) in map.iter() {
        if k.starts_with('_') {
            continue;
        }
        let len = key.len();
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(k);
        if let Some((_, forms)) = WIDER.iter().find(|(w, _)| *w == key.as_str()) {
            if !forms.iter().any(|f| f.admits(&e.node.value)) {
                let want: Vec<&str> = forms.iter().map(|f| f.name()).collect();
                out.push(
                    Diagnostic::error(
                        codes::SCHEMA_TYPE,
                        format!("`{key}` must be {}", want.join(" or ")),
                    )
                    .with_key(key.clone())
                    .with_primary(e.node.origin.clone(), "this value"),
                );
            }
        } else if table.holds(key) {
            let section = e.node.as_map().is_some() && table.has_below(key);
            if section && !table.takes_whole(key) {
                walk(table, &e.node, key, built, legacy, out);
            } else {
                table.check(key, &e.node, out);
            }
        } else if !table.in_free_map(key) {
            out.push(unknown(key, e, built, table.release));
        }
        key.truncate(len);
    }
}

fn unknown(key: &str, e: &crate::load::node::Entry, built: bool, release: &str) -> Diagnostic {
    let section = key.split('.').next().unwrap_or(key);
    let origin = e.key_origin.clone().or_else(|| e.node.origin.clone());
    if built {
        Diagnostic::error(
            codes::SCHEMA_UNKNOWN_KEY,
            format!("verl {release}'s SFT trainer has no key `{key}`"),
        )
        .with_key(key.to_owned())
        .with_primary(origin, "not a field of this section")
        .with_help(format!(
            "verl builds `{section}` into a dataclass, which refuses a keyword it does not have: the run would fail at start-up"
        ))
    } else {
        Diagnostic::warning(
            codes::SCHEMA_UNKNOWN_KEY,
            format!("verl {release}'s SFT trainer does not read `{key}`"),
        )
        .with_key(key.to_owned())
        .with_primary(origin, "added here")
        .with_help("it has no effect on the run; remove it, or check its spelling")
    }
}

//! Hydra's command-line override grammar: `key=value`, `+key=value` (add), `++key=value`
//! (add or set), `~key[=value]` (delete), `group@pkg=option`, with values that are
//! primitives (typed like Hydra: ints, floats, bools, null, else strings), quoted strings,
//! `[lists]`, `{dicts}`, `${interpolations}` and the casts `int()`, `float()`, `str()`,
//! `bool()`. Sweeps (`a,b`, `choice()`, `range()` ...) need `--multirun` and are rejected.

use super::node::Node;
pub use super::override_value::type_primitive;
use super::override_value::{parse_py_int, parse_value};
use crate::codes;
use crate::diag::Diagnostic;
use crate::source::{Origin, SourceId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideKind {
    /// `key=value`: the key must exist.
    Set,
    /// `+key=value`: the key must not exist.
    Add,
    /// `++key=value`: add or set.
    ForceAdd,
    /// `~key` or `~key=value`.
    Delete,
}

#[derive(Clone, Debug)]
pub struct Override {
    pub kind: OverrideKind,
    /// Dotted key or group path, without the `@package` part.
    pub key: String,
    pub package: Option<String>,
    /// None for `~key`.
    pub value: Option<Node>,
    /// The whole override text, as the user wrote it.
    pub text: String,
    pub source: SourceId,
    pub key_origin: Origin,
}

impl Override {
    /// `group@pkg` as Hydra's defaults matching spells it.
    pub fn key_with_package(&self) -> String {
        match &self.package {
            Some(p) => format!("{}@{}", self.key, p),
            None => self.key.clone(),
        }
    }

    pub fn origin(&self) -> Origin {
        Origin::new(self.source, 0..self.text.len())
    }

    pub fn value_origin(&self) -> Origin {
        self.value
            .as_ref()
            .and_then(|v| v.origin.clone())
            .unwrap_or_else(|| self.origin())
    }
}

/// Parse one override; `text` is the source text registered under `source`.
pub fn parse_override(text: &str, source: SourceId) -> Result<Override, Diagnostic> {
    let err = |span: std::ops::Range<usize>, msg: String| {
        let code = if msg.contains("--multirun") {
            codes::OVERRIDE_SWEEP
        } else {
            codes::OVERRIDE_SYNTAX
        };
        Diagnostic::error(code, format!("invalid override `{text}`: {msg}"))
            .with_primary(Some(Origin::new(source, span)), msg)
    };
    let (kind, key_start) = if text.starts_with("++") {
        (OverrideKind::ForceAdd, 2)
    } else if text.starts_with('+') {
        (OverrideKind::Add, 1)
    } else if text.starts_with('~') {
        (OverrideKind::Delete, 1)
    } else {
        (OverrideKind::Set, 0)
    };
    let eq = text.find('=');
    let key_end = eq.unwrap_or(text.len());
    let key_full = &text[key_start..key_end];
    if eq.is_none() && kind != OverrideKind::Delete {
        return Err(err(0..text.len(), "expected `key=value`".into())
            .with_help("write `key=value`; `~key` deletes a key, `+key=value` adds one"));
    }
    if key_full.is_empty() {
        return Err(err(0..key_end.max(1).min(text.len()), "missing key".into()));
    }
    let (key, package) = match key_full.split_once('@') {
        Some((k, p)) => (k.to_string(), Some(p.to_string())),
        None => (key_full.to_string(), None),
    };
    if let Some(msg) = key_problem(&key, package.as_deref()) {
        return Err(err(key_start..key_end, msg));
    }
    if key.split('.').count() > super::yaml::MAX_DEPTH {
        return Err(err(key_start..key_end, "key nests too deeply".into()));
    }
    let key_origin = Origin::new(source, key_start..key_end);
    let value = match eq {
        None => None,
        Some(i) => {
            // Hydra's `=` token takes the whitespace after it.
            let from =
                i + 1 + text[i + 1..].len() - text[i + 1..].trim_start_matches([' ', '\t']).len();
            Some(parse_value(text, from, source).map_err(|(span, msg)| err(span, msg))?)
        }
    };
    Ok(Override {
        kind,
        key,
        package,
        value,
        text: text.to_string(),
        source,
        key_origin,
    })
}

/// Why a key does not fit Hydra's key grammar: `a.b.c` (segments are `[A-Za-z_$][A-Za-z0-9_$-]*`
/// or list indices), `group/sub` (names only), optionally `@package` (a dotted key or empty).
fn key_problem(key: &str, package: Option<&str>) -> Option<String> {
    let bad = |what: &str| {
        Some(format!(
            "`{what}` is not a valid key: keys are dotted names like `a.b_c.0`, groups are `group/sub`"
        ))
    };
    let ok = if key.contains('/') {
        key.split('/').all(is_id)
    } else {
        is_package(key) && !key.is_empty()
    };
    if !ok {
        return bad(key);
    }
    match package {
        Some(p) if !is_package(p) => bad(p),
        _ => None,
    }
}

fn is_id(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == '-')
}

fn is_key_special(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == '$')
        && c.all(|x| x.is_ascii_alphanumeric() || matches!(x, '_' | '-' | '$'))
}

fn is_int_unsigned(s: &str) -> bool {
    s == "0"
        || (s.starts_with(|c: char| ('1'..='9').contains(&c))
            && parse_py_int(s).is_some()
            && !s.contains(['+', '-', ' ']))
}

/// `package: ( | ID | KEY_SPECIAL | DOT_PATH)`
fn is_package(s: &str) -> bool {
    s.is_empty()
        || is_key_special(s)
        || (s.contains('.')
            && s.split('.')
                .all(|seg| is_key_special(seg) || is_int_unsigned(seg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: &str) -> Override {
        parse_override(t, SourceId(0)).unwrap()
    }

    fn v(t: &str) -> serde_json::Value {
        p(t).value.unwrap().to_json()
    }

    #[test]
    fn kinds_and_keys() {
        assert_eq!(p("a.b=1").kind, OverrideKind::Set);
        assert_eq!(p("+a.b=1").kind, OverrideKind::Add);
        assert_eq!(p("++a.b=1").kind, OverrideKind::ForceAdd);
        let d = p("~a.b");
        assert_eq!((d.kind, d.value.is_none()), (OverrideKind::Delete, true));
        let g = p("actor@actor_rollout_ref.actor=megatron_actor");
        assert_eq!(
            (g.key.as_str(), g.package.as_deref()),
            ("actor", Some("actor_rollout_ref.actor"))
        );
    }

    #[test]
    fn values_are_typed_like_hydra() {
        use serde_json::json;
        assert_eq!(v("a=1e-6"), json!(1e-6));
        assert_eq!(v("a=1_000"), json!(1000));
        assert_eq!(v("a=True"), json!(true));
        assert_eq!(v("a=NULL"), json!(null));
        assert_eq!(v("a="), json!(""));
        assert_eq!(v("a=010"), json!("010"));
        assert_eq!(v("a=[1, 'x', 2.5]"), json!([1, "x", 2.5]));
        assert_eq!(v("a={x: 1, y: [a,b]}"), json!({"x": 1, "y": ["a", "b"]}));
        assert_eq!(v("a='a,b'"), json!("a,b"));
        assert_eq!(v("a=\"it\\\"s\""), json!("it\"s"));
        assert_eq!(v("a=${data.x}"), json!("${data.x}"));
        assert_eq!(v("a=${oc.select:x.y,1}"), json!("${oc.select:x.y,1}"));
        assert_eq!(v("a=hello world"), json!("hello world"));
        assert_eq!(v("a=str(1)"), json!("1"));
        assert_eq!(v("a= 5"), json!(5), "`=` takes the whitespace after it");
        assert_eq!(v("a=[\"console\",\"wandb\"]"), json!(["console", "wandb"]));
        assert_eq!(v("a=$HOME/x"), json!("$HOME/x"));
    }

    #[test]
    fn sweeps_and_bad_syntax_are_errors() {
        for t in [
            "a=[1,2",
            "noequals",
            "=1",
            "a={x 1}",
            "a='open",
            "a=~/models/q",
            "a=<path>",
            "a=run}",
        ] {
            let e = parse_override(t, SourceId(0)).unwrap_err();
            assert_eq!(e.code, codes::OVERRIDE_SYNTAX, "{t}");
        }
        for t in ["a=1,2", "a=choice(1,2)", "a=int(1,2)"] {
            let e = parse_override(t, SourceId(0)).unwrap_err();
            assert_eq!(e.code, codes::OVERRIDE_SWEEP, "{t}");
        }
    }

    /// Hydra's key grammar: dotted names (`$` and `-` allowed after the first character,
    /// list indices as segments), `group/sub` paths, an optional `@package`.
    #[test]
    fn keys_follow_hydras_grammar() {
        for t in [
            "+trainer.a-b=1",
            "+trainer.$x=1",
            "+trainer.0=1",
            "+trainer/x=1",
            "hydra/launcher=basic",
            "db@=x",
            "~a.b.0",
        ] {
            assert!(parse_override(t, SourceId(0)).is_ok(), "{t}");
        }
        for t in [
            "a..b=1", "a.=1", ".a=1", "a[0]=1", "0=1", "a b=1", "a =1", "a.b/c=1", "-a=1",
            "a@b c=1",
        ] {
            let e = parse_override(t, SourceId(0)).unwrap_err();
            assert_eq!(e.code, codes::OVERRIDE_SYNTAX, "{t}");
        }
    }
}

//! `builtin://name?key=value&…` addresses of things that need no files: the synthetic
//! datasets (`builtin://digit_reversal?split=train`) and the tiny model (`builtin://tiny`).

use std::collections::BTreeMap;
use std::str::FromStr;

pub const SCHEME: &str = "builtin://";

/// A parsed `builtin://` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltinUri {
    pub name: String,
    pub params: BTreeMap<String, String>,
}

impl BuiltinUri {
    /// `None` when `s` is not a `builtin://` address; an error for a malformed one.
    pub fn parse(s: &str) -> Option<Result<Self, String>> {
        let rest = s.strip_prefix(SCHEME)?;
        let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Some(Err(format!("`{s}`: invalid builtin name `{name}`")));
        }
        let mut params = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                return Some(Err(format!("`{s}`: parameter `{pair}` is not key=value")));
            };
            params.insert(k.to_owned(), v.to_owned());
        }
        Some(Ok(BuiltinUri {
            name: name.to_owned(),
            params,
        }))
    }

    /// A typed parameter, `default` when absent.
    pub fn get<T: FromStr>(&self, key: &str, default: T) -> Result<T, String> {
        match self.params.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("builtin://{}: invalid value `{v}` for `{key}`", self.name)),
        }
    }

    /// Fails on parameters outside `known`.
    pub fn check_keys(&self, known: &[&str]) -> Result<(), String> {
        match self.params.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(format!(
                "builtin://{}: unknown parameter `{k}` (known: {})",
                self.name,
                known.join(", ")
            )),
            None => Ok(()),
        }
    }
}

//! The environment `huggingface_hub` reads: cache location, offline mode, endpoint and token.

use std::path::{Path, PathBuf};

/// Where the Hub cache is and whether the network may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEnv {
    /// The hub cache (`models--*` folders live here).
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`): never download.
    pub offline: bool,
    /// `HF_ENDPOINT`, default `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file `huggingface-cli login` writes (`$HF_HOME/token`).
    pub token: Option<String>,
}

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

impl HubEnv {
    /// From this process's environment.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// From the variables `var` returns (`None`: unset), with `huggingface_hub`'s precedence:
    /// `HF_HUB_CACHE`, then the legacy `HUGGINGFACE_HUB_CACHE`, then `$HF_HOME/hub`, where
    /// `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, itself `~/.cache/huggingface`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let home = var("HOME").map(PathBuf::from).unwrap_or_default();
        let expand = |p: String| expand_user(&p, &home);
        let hf_home = var("HF_HOME").map(expand).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(expand)
                .unwrap_or_else(|| home.join(".cache"))
                .join("huggingface")
        });
        let cache = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(expand)
            .unwrap_or_else(|| hf_home.join("hub"));
        let truthy = |k: &str| {
            var(k).is_some_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.to_uppercase().as_str()))
        };
        let token = var("HF_TOKEN").or_else(|| {
            let file = var("HF_TOKEN_PATH")
                .map(expand)
                .unwrap_or_else(|| hf_home.join("token"));
            std::fs::read_to_string(file)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
        });
        HubEnv {
            cache,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
            token,
        }
    }

    /// A cache at `cache`, offline, default endpoint, no token (tests, explicit setups).
    pub fn offline_at(cache: impl Into<PathBuf>) -> Self {
        HubEnv {
            cache: cache.into(),
            offline: true,
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            token: None,
        }
    }
}

/// `~` and `~/...` relative to `home`, as Python's `expanduser`.
fn expand_user(p: &str, home: &Path) -> PathBuf {
    match p.strip_prefix('~') {
        Some("") => home.to_path_buf(),
        Some(rest) if rest.starts_with('/') => home.join(&rest[1..]),
        _ => PathBuf::from(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> HubEnv {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn cache_location_follows_huggingface_hub_precedence() {
        let home = [("HOME", "/h")];
        assert_eq!(env(&home).cache, PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(
            env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]).cache,
            PathBuf::from("/x/huggingface/hub")
        );
        assert_eq!(
            env(&[
                ("HOME", "/h"),
                ("XDG_CACHE_HOME", "/x"),
                ("HF_HOME", "~/hf")
            ])
            .cache,
            PathBuf::from("/h/hf/hub")
        );
        assert_eq!(
            env(&[("HF_HOME", "/a"), ("HUGGINGFACE_HUB_CACHE", "/legacy")]).cache,
            PathBuf::from("/legacy")
        );
        assert_eq!(
            env(&[
                ("HUGGINGFACE_HUB_CACHE", "/legacy"),
                ("HF_HUB_CACHE", "/new")
            ])
            .cache,
            PathBuf::from("/new")
        );
    }

    #[test]
    fn offline_mode_takes_the_true_spellings() {
        for v in ["1", "on", "YES", "True"] {
            assert!(env(&[("HF_HUB_OFFLINE", v)]).offline, "{v}");
            assert!(env(&[("TRANSFORMERS_OFFLINE", v)]).offline, "{v}");
        }
        for v in ["0", "no", "false", "2"] {
            assert!(!env(&[("HF_HUB_OFFLINE", v)]).offline, "{v}");
        }
        assert!(!env(&[]).offline);
        assert_eq!(env(&[]).endpoint, DEFAULT_ENDPOINT);
    }
}

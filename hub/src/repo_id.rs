//! Hub repository ids, validated as `huggingface_hub.utils.validate_repo_id` does.

use crate::HubError;

/// `name` or `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RepoId(String);

impl RepoId {
    /// Rules: one `/` at most; each part of `[A-Za-z0-9_.-]`, not starting or ending with `-`
    /// or `.`; the name at most 96 characters; no `--` or `..`; not ending in `.git`.
    pub fn parse(id: &str) -> Result<Self, HubError> {
        let bad = |reason: &str| HubError::BadId {
            id: id.to_owned(),
            reason: reason.to_owned(),
        };
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() > 2 {
            return Err(bad("a Hub id is `name` or `namespace/name`"));
        }
        for part in &parts {
            if part.is_empty() {
                return Err(bad("empty namespace or name"));
            }
            if !part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(bad("only letters, digits, `-`, `_` and `.` are allowed"));
            }
            if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
                return Err(bad("a part cannot start or end with `-` or `.`"));
            }
        }
        if parts.last().is_some_and(|name| name.len() > 96) {
            return Err(bad("the name is longer than 96 characters"));
        }
        if id.contains("--") || id.contains("..") {
            return Err(bad("`--` and `..` are not allowed"));
        }
        if id.ends_with(".git") {
            return Err(bad("an id cannot end in `.git`"));
        }
        Ok(RepoId(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The repository's folder in the cache: `models--namespace--name`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.0.replace('/', "--"))
    }
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid_ids() {
        for ok in [
            "gpt2",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "foo/bar_baz.v1",
            "123",
        ] {
            assert!(RepoId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a/b/c",
            "/abs",
            "./rel",
            "a/",
            ".hidden",
            "x-",
            "a--b",
            "a..b",
            "m.git",
            "with space",
            "ümlaut",
            "org/na:me",
        ] {
            assert!(RepoId::parse(bad).is_err(), "{bad}");
        }
        assert!(RepoId::parse(&"n".repeat(96)).is_ok());
        assert!(RepoId::parse(&"n".repeat(97)).is_err());
    }

    #[test]
    fn cache_folder_name() {
        let id = RepoId::parse("Qwen/Qwen2.5-0.5B").unwrap();
        assert_eq!(id.cache_folder(), "models--Qwen--Qwen2.5-0.5B");
        assert_eq!(
            RepoId::parse("gpt2").unwrap().cache_folder(),
            "models--gpt2"
        );
    }
}

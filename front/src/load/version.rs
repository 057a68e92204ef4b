//! Which verl release a config tree belongs to. verlc's schema and rules model verl 0.7; a
//! tree of another release (found through `--config-dir`) has keys verlc does not know, and
//! lacks some it does: `verlc check` then types those keys from the release's leaf table
//! ([`super::release_table`], 0.7.1, 0.8.0 and 0.9.x), and passes through, saying so once,
//! only what no table holds (a later release's keys).

use std::path::Path;

/// The verl release verlc models (its schema, defaults and rules). Not its whole minor
/// version: 0.7.1 rewrote the reward section and added the `model_engine` group, so its tree is
/// judged as a newer release's is (its own leaf table).
pub const MODELLED: &str = "0.7.0";

/// A verl release whose config tree verlc carries, composed when no `--config-dir` is
/// given: 0.7.0's is verlc's own mirror of it (`front/defaults/`, the release verlc's
/// schema models key by key); newer ones are derived from the release's files by
/// `scripts/builtin_tree.py` (`front/releases/verl-<release>/`) and judged as a tree of
/// that release given with `--config-dir` is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BuiltinRelease {
    V0_7_0,
    V0_7_1,
    V0_8_0,
    V0_9_0,
    /// The newest supported release: the default.
    #[default]
    V0_9_1,
}

impl BuiltinRelease {
    /// Every carried release, oldest first.
    pub const ALL: [BuiltinRelease; 5] = [
        BuiltinRelease::V0_7_0,
        BuiltinRelease::V0_7_1,
        BuiltinRelease::V0_8_0,
        BuiltinRelease::V0_9_0,
        BuiltinRelease::V0_9_1,
    ];

    /// Its version (`0.9.1`).
    pub fn version(self) -> &'static str {
        match self {
            BuiltinRelease::V0_7_0 => "0.7.0",
            BuiltinRelease::V0_7_1 => "0.7.1",
            BuiltinRelease::V0_8_0 => "0.8.0",
            BuiltinRelease::V0_9_0 => "0.9.0",
            BuiltinRelease::V0_9_1 => "0.9.1",
        }
    }

    /// Its files as (path relative to the tree, text), sorted by path.
    pub fn files(self) -> &'static [(&'static str, &'static str)] {
        match self {
            BuiltinRelease::V0_7_0 => crate::config::BUILTIN_FILES,
            other => crate::config::builtin::release_tree(other.version()),
        }
    }

    /// Whether verlc's schema models this release key by key (see [`is_modelled`]).
    pub fn is_modelled(self) -> bool {
        is_modelled(self.version())
    }

    /// The built-in tree `--verl-version` names: a release (`0.9.1`) or its minor version
    /// (`0.9`: the newest of it). Anything else is refused with the releases there are.
    pub fn parse(version: &str) -> Result<BuiltinRelease, String> {
        let v = version.trim();
        let v = v.strip_prefix('v').unwrap_or(v);
        let exact = Self::ALL.into_iter().find(|r| r.version() == v);
        let newest_of_minor = Self::ALL
            .into_iter()
            .rev()
            .find(|r| r.version().rsplit_once('.').is_some_and(|(m, _)| m == v));
        exact.or(newest_of_minor).ok_or_else(|| {
            format!(
                "verlc has no built-in tree of verl {version}: it carries {}; for another release give its tree with `--config-dir <site-packages>/verl/trainer/config`",
                Self::ALL.map(BuiltinRelease::version).join(", ")
            )
        })
    }

    /// The built-in tree of release `version` (an installed verl's, or the one a trainer was
    /// built for): that release's own, else the newest of the same minor version (a later
    /// patch release, a `.post` build), else none.
    pub fn same_minor(version: &str) -> Option<BuiltinRelease> {
        if let Some(exact) = Self::ALL.into_iter().find(|r| r.version() == version) {
            return Some(exact);
        }
        let minor = minor_version(version)?;
        Self::ALL
            .into_iter()
            .rev()
            .find(|r| minor_version(r.version()) == Some(minor))
    }
}

/// The release of the verl package whose `verl/trainer/config` is `config_dir`: its
/// `verl/version/version` file (as shipped in verl's repository and wheels).
pub fn verl_version(config_dir: &Path) -> Option<String> {
    // A marker file of a few bytes: anything else there (a FIFO, a huge file) is no release.
    let text = super::read::read_text(&config_dir.join("../../version/version"), 1024).ok()?;
    let v = text.trim();
    (!v.is_empty() && v.len() < 40).then(|| v.to_owned())
}

/// The release of the tree at `config_dir`: its version file ([`verl_version`]), else what
/// its layout says. A tree copied without `verl/version/version` but holding verl's
/// `model_engine/` group (added after 0.7.0) is a newer release than the modelled one; the
/// label names how it was found.
pub fn verl_release(config_dir: &Path) -> Option<String> {
    verl_version(config_dir).or_else(|| {
        config_dir.join("model_engine").is_dir().then(|| {
            "newer than 0.7.0 (its model_engine/ group; no verl/version/version file)".to_owned()
        })
    })
}

/// The release of the tree a config's `hydra.searchpath` reaches, for a primary config whose
/// own directory is no verl tree (an example's `config/` dir that extends verl's tree): the
/// first entry that resolves to a directory with a release (its version file, else its
/// layout), or to verl's package (`pkg://verl.trainer.config`, or a `file://` path to a verl
/// tree that is not there: the built-in tree, whose release the caller chose as the active
/// Python's verl). `None` where the config names no search path. The primary is read as
/// composition reads it (bounded); a file that cannot be read or parsed says nothing here,
/// composition reports it.
pub fn searchpath_release(req: &super::compose::LoadRequest) -> Option<String> {
    use super::repo::{Repo, SearchDir};
    let primary = match (&req.config_file, &req.config_dir) {
        (Some(f), _) => f.clone(),
        (None, Some(dir)) => {
            let name = req.config_name.as_deref().unwrap_or("ppo_trainer");
            dir.join(format!("{}.yaml", name.trim_end_matches(".yaml")))
        }
        (None, None) => return None,
    };
    let text = super::read::read_text(&primary, super::read::MAX_CONFIG_FILE_BYTES).ok()?;
    // Most configs name no search path: a text scan, not a second parse of the file.
    if !text.contains("searchpath") {
        return None;
    }
    let source = crate::source::Source::new(
        primary.display().to_string(),
        super::read::strip_bom(text),
        crate::source::SourceKind::File,
    );
    let node = super::yaml::parse(&source, crate::source::SourceId(0)).ok()?;
    let list = node.child("hydra")?.child("searchpath")?;
    let super::node::Value::Seq(items) = &list.value else {
        return None;
    };
    items.iter().filter_map(|i| i.as_str()).find_map(|url| {
        match Repo::search_dir_from_url(url, &req.cwd, req.builtin).ok()? {
            SearchDir::Dir(dir) => verl_release(&dir),
            SearchDir::Builtin(release) => Some(release.version().to_owned()),
        }
    })
}

/// `(major, minor)` of a release label (`0.9.1` -> `(0, 9)`); a tree recognised only by its
/// layout (no version file, a `model_engine/` group) is at least 0.8, where that group and the
/// engine workers became the only ones. A development snapshot before a minor release
/// (`0.8.0.dev`, verl's main branch) counts as the release before it: what the release changed
/// may not have landed yet (verl main of January 2026 still loaded 0.7's reward managers).
pub fn minor_version(release: &str) -> Option<(u32, u32)> {
    if release.starts_with("newer than") {
        return Some((0, 8));
    }
    if let Some(base) = release.strip_suffix(".dev")
        && let Some((major, minor)) = minor_version(base)
        && base.ends_with(".0")
    {
        return Some(if minor > 0 {
            (major, minor - 1)
        } else {
            (major, minor)
        });
    }
    let mut parts = release.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// `(major, minor, patch)` of a release label (`0.9.1`, `0.9.1.post1` -> `(0, 9, 1)`); a
/// development snapshot before a release (`0.8.0.dev`) is the last patch of the release before
/// it (`(0, 7, u32::MAX)`: after every 0.7.x, before 0.8.0); a tree recognised only by its
/// layout is 0.8.0 (see [`minor_version`]).
pub fn release_triple(release: &str) -> Option<(u32, u32, u32)> {
    let (major, minor) = minor_version(release)?;
    if release.starts_with("newer than") {
        return Some((major, minor, 0));
    }
    if release.ends_with(".dev") && release.trim_end_matches(".dev").ends_with(".0") {
        return Some((major, minor, u32::MAX));
    }
    let patch: String = release
        .split('.')
        .nth(2)
        .unwrap_or("0")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor, patch.parse().unwrap_or(0)))
}

/// Whether verlc models release `version` (`0.7.0`, and its development or post builds
/// `0.7.0.dev`, `0.7.0.post1`).
pub fn is_modelled(version: &str) -> bool {
    version == MODELLED || version.starts_with(&format!("{MODELLED}."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_versions() {
        assert_eq!(minor_version("0.9.1"), Some((0, 9)));
        assert_eq!(
            minor_version("0.8.0.dev"),
            Some((0, 7)),
            "before 0.8's changes"
        );
        assert_eq!(minor_version("0.8.1.dev"), Some((0, 8)));
        assert_eq!(minor_version("0.10rc1"), Some((0, 10)));
        assert_eq!(
            minor_version(
                "newer than 0.7.0 (its model_engine/ group; no verl/version/version file)"
            ),
            Some((0, 8))
        );
        assert_eq!(minor_version("main"), None);
    }

    #[test]
    fn release_triples() {
        assert_eq!(release_triple("0.9.1"), Some((0, 9, 1)));
        assert_eq!(release_triple("0.9.0"), Some((0, 9, 0)));
        assert_eq!(release_triple("0.9.1.post1"), Some((0, 9, 1)));
        assert_eq!(release_triple("0.8.0.dev"), Some((0, 7, u32::MAX)));
        assert_eq!(release_triple("0.10.0.dev"), Some((0, 9, u32::MAX)));
        assert_eq!(release_triple("0.10rc1"), Some((0, 10, 0)));
        assert!(release_triple("0.9.0") < release_triple("0.9.1"));
        assert!(release_triple("0.8.0.dev") < release_triple("0.8.0"));
        assert!(release_triple("0.8.0.dev") > release_triple("0.7.1"));
        assert_eq!(release_triple("main"), None);
    }

    #[test]
    fn only_the_modelled_release_is_modelled() {
        assert!(is_modelled("0.7.0"));
        assert!(is_modelled("0.7.0.post1"));
        // Its reward section and engines are 0.8's: judged from its own leaf table.
        assert!(!is_modelled("0.7.1"));
        assert!(!is_modelled("0.8.0.dev"));
        assert!(!is_modelled("0.9.1"));
        assert!(!is_modelled("0.70.0"));
        assert!(!is_modelled("0.6.1"));
        assert!(!is_modelled(
            "newer than 0.7.0 (its model_engine/ group; no verl/version/version file)"
        ));
    }
}

//! Which verl release a config tree belongs to. verlc's schema and rules model verl 0.7; a
//! tree of another release (found through `--config-dir`) has keys verlc does not know, and
//! lacks some it does: `verlc check` then types those keys from the release's leaf table
//! ([`super::release_table`], 0.8.0 and 0.9.x), and passes through, saying so once, only
//! what no table holds (a later release's keys).

use std::path::Path;

/// The verl release verlc models (its schema, defaults and rules).
pub const MODELLED: &str = "0.7";

/// The release of verlc's built-in tree (the default when no `--config-dir` is given).
pub const BUILTIN: &str = "0.7.0";

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

/// Whether verlc models release `version` (`0.7.0`, `0.7.1`, `0.7.0.dev`).
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
    fn releases_of_the_modelled_minor_version_are_modelled() {
        assert!(is_modelled("0.7.0"));
        assert!(is_modelled("0.7.1"));
        assert!(!is_modelled("0.8.0.dev"));
        assert!(!is_modelled("0.9.1"));
        assert!(!is_modelled("0.70.0"));
        assert!(!is_modelled("0.6.1"));
        assert!(!is_modelled(
            "newer than 0.7.0 (its model_engine/ group; no verl/version/version file)"
        ));
    }
}

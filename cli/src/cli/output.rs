//! What every subcommand shares at the process edge: the exit-status contract and writing
//! output files.
//!
//! Exit status: 0 clean (warnings allowed), 1 the config has errors, 2 a usage or I/O
//! problem (a bad flag, an unreadable or special file, wherever in the composition it is).

use std::io::{IsTerminal, Write};
use std::path::Path;

use verlc_front::codes;
use verlc_front::diag::Diagnostic;

pub const EXIT_ERRORS: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

/// The exit status of a run that reported `diags`.
pub fn exit_status(diags: &[Diagnostic]) -> u8 {
    if diags
        .iter()
        .any(|d| d.is_error() && (d.code == codes::IO_ERROR || d.code == codes::USAGE))
    {
        EXIT_USAGE
    } else if diags.iter().any(Diagnostic::is_error) {
        EXIT_ERRORS
    } else {
        0
    }
}

/// Whether diagnostics on stderr get colour: a terminal, and no `NO_COLOR`.
pub fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Report a usage problem in the requested format (JSON output stays JSON) and return the
/// exit status for it.
pub fn usage_error(json: bool, message: &str) -> u8 {
    if json {
        let d = Diagnostic::error(codes::USAGE, message);
        println!(
            "{}",
            verlc_front::render::json(&[d], &verlc_front::source::SourceMap::new())
        );
    } else {
        eprintln!("error[{}]: {message}", codes::USAGE);
    }
    EXIT_USAGE
}

/// Write `bytes` to `path` atomically: into a new file beside it, then renamed over it. A
/// symlink at `path` is replaced, never followed, and a reader never sees half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_beside(path)?;
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        rename_over(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Rewrite the user's file at `path` in place, atomically, keeping its permissions: a symlink
/// is followed and its target rewritten (the link stays a link). Anything but a regular file
/// at the end of the links is refused.
pub fn rewrite_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = std::fs::canonicalize(path)?;
    let meta = std::fs::metadata(&target)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", target.display()),
        ));
    }
    write_atomic(&target, bytes)?;
    std::fs::set_permissions(&target, meta.permissions())
}

/// Copy `from` to `to` atomically (as [`write_atomic`]), keeping its permissions.
pub fn copy_atomic(from: &Path, to: &Path) -> std::io::Result<()> {
    let tmp = temp_beside(to)?;
    let copied = std::fs::copy(from, &tmp).and_then(|_| rename_over(&tmp, to));
    if copied.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    copied
}

fn temp_beside(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Ok(path.with_file_name(format!(
        ".{}.{}.{nanos}.tmp",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// `rename` replaces a file or a symlink, but would move a file into nothing useful over a
/// directory: refuse that with a clear error.
fn rename_over(tmp: &Path, path: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_a_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("out.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "new");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(write_atomic(&sub, b"x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    }
}

//! Reading the files a config names, treated as untrusted input: only regular files are
//! read (a FIFO would block forever, `/dev/zero` never ends), each within a size limit, and
//! the files of one composition within a total. PyYAML's byte-order-mark handling is
//! applied here, so every later stage sees the text OmegaConf parses.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest config file (YAML) verlc reads. verl's largest group file is about 30 KB.
pub const MAX_CONFIG_FILE_BYTES: u64 = 8 << 20;
/// Largest total of config text one composition reads (every file, each counted once).
pub const MAX_TOTAL_CONFIG_BYTES: u64 = 32 << 20;
/// Largest JSON file read beside a config (a model's `config.json`, a release marker).
pub const MAX_SIDE_FILE_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Nothing at the path.
    #[error("{} does not exist", path.display())]
    NotFound { path: PathBuf },
    /// A directory: a search for `x.yaml` passes over it, as Hydra's does.
    #[error("{} is a directory, not a regular file", path.display())]
    IsDirectory { path: PathBuf },
    /// A FIFO, a device or a socket: refused without reading (it could block or never end).
    #[error("{} is {kind}, not a regular file", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{} is larger than {limit} bytes, the limit for one file", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{} is not UTF-8 text (invalid byte at offset {offset})", path.display())]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ReadError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::NotFound { path }
            | ReadError::IsDirectory { path }
            | ReadError::NotRegular { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::NotUtf8 { path, .. }
            | ReadError::Io { path, .. } => path,
        }
    }
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// The text of the regular file at `path` (symlinks followed), at most `limit` bytes, with
/// a leading UTF-8 byte-order mark removed (PyYAML drops it too).
pub fn read_text(path: &Path, limit: u64) -> Result<String, ReadError> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It does not
    // change reads of a regular file, the only kind read below.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => {
                ReadError::NotFound {
                    path: path.to_owned(),
                }
            }
            _ => ReadError::Io {
                path: path.to_owned(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| ReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    if meta.is_dir() {
        return Err(ReadError::IsDirectory {
            path: path.to_owned(),
        });
    }
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow while it is read: never take more than the limit.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Io {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        path: path.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    Ok(strip_bom(text))
}

/// PyYAML reads a stream starting with a UTF-8 byte-order mark as the text after it.
pub fn strip_bom(text: String) -> String {
    match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// What one composition may still read (see [`MAX_TOTAL_CONFIG_BYTES`]).
#[derive(Debug)]
pub struct ReadBudget {
    left: u64,
}

impl Default for ReadBudget {
    fn default() -> Self {
        ReadBudget {
            left: MAX_TOTAL_CONFIG_BYTES,
        }
    }
}

impl ReadBudget {
    /// Read a config file within both the per-file limit and what is left of the total.
    pub fn read(&mut self, path: &Path) -> Result<String, ReadError> {
        let limit = MAX_CONFIG_FILE_BYTES.min(self.left);
        let text = read_text(path, limit).map_err(|e| match e {
            ReadError::TooLarge { path, .. } if limit < MAX_CONFIG_FILE_BYTES => {
                ReadError::TooLarge {
                    path,
                    limit: MAX_TOTAL_CONFIG_BYTES,
                }
            }
            e => e,
        })?;
        self.left -= text.len() as u64;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_without_reading() {
        let e = read_text(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.yaml");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_text(&fifo, 1 << 20).unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::NotRegular {
                    kind: "a FIFO (named pipe)",
                    ..
                }
            ),
            "{e}"
        );
        let e = read_text(dir.path(), 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::IsDirectory { .. }), "{e}");
        assert_eq!(e.path(), dir.path());
    }

    #[test]
    fn limits_bom_and_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.yaml");
        std::fs::write(&p, "\u{feff}a: 1\n").unwrap();
        assert_eq!(read_text(&p, 100).unwrap(), "a: 1\n");
        assert!(matches!(
            read_text(&p, 4).unwrap_err(),
            ReadError::TooLarge { limit: 4, .. }
        ));
        std::fs::write(&p, b"a: \xff\n").unwrap();
        assert!(matches!(
            read_text(&p, 100).unwrap_err(),
            ReadError::NotUtf8 { offset: 3, .. }
        ));
        assert!(matches!(
            read_text(&dir.path().join("none.yaml"), 100).unwrap_err(),
            ReadError::NotFound { .. }
        ));
        let mut budget = ReadBudget { left: 10 };
        std::fs::write(&p, "a: 1234\n").unwrap();
        assert!(budget.read(&p).is_ok());
        let e = budget.read(&p).unwrap_err();
        assert!(matches!(
            e,
            ReadError::TooLarge {
                limit: MAX_TOTAL_CONFIG_BYTES,
                ..
            }
        ));
    }
}

//! The rendezvous key-value store (c10d TCPStore, or a PrefixStore over one).
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::{DistError, Result};
use crate::ffi;

/// A c10d store handle; clones share the same store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

struct StoreInner(NonNull<ffi::vlc_store>);

// SAFETY: c10d stores are used from any thread by torch itself; TCPStore serialises its
// socket traffic internally.
unsafe impl Send for StoreInner {}
unsafe impl Sync for StoreInner {}

impl Drop for StoreInner {
    fn drop(&mut self) {
        // SAFETY: created by vlc_tcpstore_new / vlc_prefixstore_new, freed once.
        unsafe { ffi::vlc_store_free(self.0.as_ptr()) }
    }
}

fn cstring(op: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| DistError::Store {
        op,
        message: format!("{s:?} contains a NUL byte"),
    })
}

impl Store {
    /// Connects to (rank 0: serves) the TCPStore at `host:port`, waiting up to `timeout` for
    /// the server and, on the server, for all `world_size` clients.
    pub fn tcp(
        host: &str,
        port: u16,
        world_size: usize,
        is_server: bool,
        timeout: Duration,
    ) -> Result<Self> {
        let chost = cstring("connect", host)?;
        let mut out = std::ptr::null_mut();
        let ws = i32::try_from(world_size)
            .map_err(|_| DistError::Invalid(format!("world size {world_size}")))?;
        // SAFETY: valid C string and out-pointer; errors come back as strings.
        let err = unsafe {
            ffi::vlc_tcpstore_new(
                chost.as_ptr(),
                port,
                ws,
                is_server as i32,
                millis(timeout),
                &mut out,
            )
        };
        ffi::take_error(err).map_err(|message| DistError::Store {
            op: "connect",
            message: format!("{host}:{port}: {message}"),
        })?;
        Self::wrap(out, "connect")
    }

    /// A view of this store whose keys are prefixed with `prefix` (one per process group).
    pub fn prefixed(&self, prefix: &str) -> Result<Self> {
        let cp = cstring("prefix", prefix)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: self.inner is a live store.
        let err = unsafe { ffi::vlc_prefixstore_new(cp.as_ptr(), self.inner.0.as_ptr(), &mut out) };
        ffi::take_error(err).map_err(|message| DistError::Store {
            op: "prefix",
            message,
        })?;
        Self::wrap(out, "prefix")
    }

    fn wrap(p: *mut ffi::vlc_store, op: &'static str) -> Result<Self> {
        let p = NonNull::new(p).ok_or(DistError::Store {
            op,
            message: "null store".into(),
        })?;
        Ok(Store {
            inner: Arc::new(StoreInner(p)),
        })
    }

    pub(crate) fn raw(&self) -> *const ffi::vlc_store {
        self.inner.0.as_ptr()
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let k = cstring("set", key)?;
        // SAFETY: live store, valid buffer.
        let err = unsafe {
            ffi::vlc_store_set(
                self.inner.0.as_ptr(),
                k.as_ptr(),
                value.as_ptr(),
                value.len(),
            )
        };
        ffi::take_error(err).map_err(|message| DistError::Store { op: "set", message })
    }

    /// Blocks until `key` exists (bounded by the store timeout).
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let k = cstring("get", key)?;
        let mut data = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live store; on success `data` is a malloc'd buffer of `len` bytes.
        let err =
            unsafe { ffi::vlc_store_get(self.inner.0.as_ptr(), k.as_ptr(), &mut data, &mut len) };
        ffi::take_error(err).map_err(|message| DistError::Store { op: "get", message })?;
        if data.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: `data` holds `len` bytes and is freed right after the copy.
        let v = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
        unsafe { ffi::vlc_free_bytes(data) };
        Ok(v)
    }

    /// Atomically adds `delta` to the integer at `key`, returning the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let k = cstring("add", key)?;
        let mut out = 0i64;
        // SAFETY: live store.
        let err = unsafe { ffi::vlc_store_add(self.inner.0.as_ptr(), k.as_ptr(), delta, &mut out) };
        ffi::take_error(err).map_err(|message| DistError::Store { op: "add", message })?;
        Ok(out)
    }

    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        // SAFETY: live store.
        let err = unsafe { ffi::vlc_store_set_timeout(self.inner.0.as_ptr(), millis(timeout)) };
        ffi::take_error(err).map_err(|message| DistError::Store {
            op: "set_timeout",
            message,
        })
    }
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

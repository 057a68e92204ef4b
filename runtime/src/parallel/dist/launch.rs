//! A local launcher: re-executes a program once per rank with torchrun's environment set.
use std::ffi::{OsStr, OsString};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::{DistError, Result};

/// Spawns `nproc` ranks on this machine (`--nproc-per-node N` of a trainer). By default it
/// re-executes the current binary with the current arguments.
#[derive(Debug, Clone)]
pub struct LocalLauncher {
    nproc: usize,
    program: Option<PathBuf>,
    args: Option<Vec<OsString>>,
    envs: Vec<(OsString, OsString)>,
    master_addr: String,
    master_port: Option<u16>,
}

impl LocalLauncher {
    pub fn new(nproc: usize) -> Self {
        LocalLauncher {
            nproc,
            program: None,
            args: None,
            envs: Vec::new(),
            master_addr: "127.0.0.1".to_owned(),
            master_port: None,
        }
    }

    /// Program to run instead of the current executable.
    pub fn program(mut self, p: impl Into<PathBuf>) -> Self {
        self.program = Some(p.into());
        self
    }

    /// Arguments instead of the current process's.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args = Some(args.into_iter().map(|a| a.as_ref().to_owned()).collect());
        self
    }

    /// An extra environment variable for every rank.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// MASTER_PORT to use; a free port is picked otherwise.
    pub fn master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }

    pub fn spawn(&self) -> Result<LaunchedRanks> {
        if self.nproc == 0 {
            return Err(DistError::Invalid("nproc must be positive".into()));
        }
        let program = match &self.program {
            Some(p) => p.clone(),
            None => {
                std::env::current_exe().map_err(|source| DistError::Launch { rank: 0, source })?
            }
        };
        let args: Vec<OsString> = match &self.args {
            Some(a) => a.clone(),
            None => std::env::args_os().skip(1).collect(),
        };
        let port = match self.master_port {
            Some(p) => p,
            None => free_port(&self.master_addr)
                .map_err(|source| DistError::Launch { rank: 0, source })?,
        };
        let mut children = Vec::with_capacity(self.nproc);
        for rank in 0..self.nproc {
            let mut cmd = Command::new(&program);
            cmd.args(&args)
                .envs(rank_env(rank, self.nproc, &self.master_addr, port));
            for (k, v) in &self.envs {
                cmd.env(k, v);
            }
            match cmd.spawn() {
                Ok(c) => children.push(c),
                Err(source) => {
                    let mut launched = LaunchedRanks { children };
                    launched.kill_all();
                    return Err(DistError::Launch { rank, source });
                }
            }
        }
        Ok(LaunchedRanks { children })
    }
}

/// torchrun's environment for `rank` of `nproc` ranks on this machine (one node), meeting at
/// `master_addr:port`.
pub fn rank_env(
    rank: usize,
    nproc: usize,
    master_addr: &str,
    port: u16,
) -> [(&'static str, String); 7] {
    [
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", nproc.to_string()),
        ("LOCAL_WORLD_SIZE", nproc.to_string()),
        ("GROUP_RANK", "0".to_owned()),
        ("MASTER_ADDR", master_addr.to_owned()),
        ("MASTER_PORT", port.to_string()),
    ]
}

/// Running ranks. Dropping this kills the ones still running.
#[derive(Debug)]
pub struct LaunchedRanks {
    children: Vec<Child>,
}

impl LaunchedRanks {
    pub fn pid(&self, rank: usize) -> Option<u32> {
        self.children.get(rank).map(Child::id)
    }

    /// Kills one rank (SIGKILL), e.g. to test failure handling.
    pub fn kill(&mut self, rank: usize) -> std::io::Result<()> {
        match self.children.get_mut(rank) {
            Some(c) => {
                c.kill()?;
                c.wait().map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// Exit status of one rank if it has finished.
    pub fn try_status(&mut self, rank: usize) -> std::io::Result<Option<ExitStatus>> {
        match self.children.get_mut(rank) {
            Some(c) => c.try_wait(),
            None => Ok(None),
        }
    }

    fn kill_all(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Waits for every rank. The first rank to fail makes the others get killed (torchrun's
    /// fail-fast) and is reported; `timeout` bounds the whole wait.
    pub fn wait(mut self, timeout: Option<Duration>) -> Result<Vec<ExitStatus>> {
        let start = Instant::now();
        let mut status: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        loop {
            for (rank, c) in self.children.iter_mut().enumerate() {
                if status[rank].is_some() {
                    continue;
                }
                match c.try_wait() {
                    Ok(Some(s)) => {
                        status[rank] = Some(s);
                        if !s.success() {
                            self.kill_all();
                            return Err(DistError::RankFailed {
                                rank,
                                status: s.to_string(),
                            });
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.kill_all();
                        return Err(DistError::RankFailed {
                            rank,
                            status: e.to_string(),
                        });
                    }
                }
            }
            if status.iter().all(Option::is_some) {
                return Ok(status.into_iter().flatten().collect());
            }
            if timeout.is_some_and(|t| start.elapsed() > t) {
                let rank = status.iter().position(Option::is_none).unwrap_or(0);
                self.kill_all();
                return Err(DistError::RankFailed {
                    rank,
                    status: "timed out, killed".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LaunchedRanks {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// A TCP port that was free a moment ago on `addr` and that no other process on this machine
/// has chosen with this function while it runs.
///
/// Chosen below Linux's ephemeral range (32768-60999 by default), as torchrun's 29500 is: a
/// port the kernel picked with `bind(0)` is one it also hands out as the source port of
/// outgoing connections, and Gloo's mesh makes many, so between choosing the port and the
/// rendezvous server binding it another rank's connection could take it (EADDRINUSE).
///
/// Between the choice and the bind another launcher can choose the same port (two test
/// binaries side by side did: one job's rank 0 found its port taken, the other's ranks met
/// strangers and waited two minutes). Each chosen port is therefore claimed with an advisory
/// lock on a file named after it (`verlc-ports/` in the temporary directory), held until this
/// process ends (the kernel drops it then, whatever the exit); a port another process holds is
/// skipped.
pub fn free_port(addr: &str) -> std::io::Result<u16> {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    // A start that differs between processes and calls; then probe upwards.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let seed = nanos ^ std::process::id().wrapping_mul(2_654_435_761) ^ call.wrapping_mul(40_503);
    for i in 0..64 {
        let port = (LOW + (seed.wrapping_add(i * 7_919)) % SPAN) as u16;
        if claim(port) && TcpListener::bind((addr, port)).is_ok() {
            return Ok(port);
        }
    }
    let l = TcpListener::bind((addr, 0))?;
    Ok(l.local_addr()?.port())
}

/// Whether this process holds (or now takes) the lock of `port`'s claim file. Without a
/// writable temporary directory nothing is claimed and every port counts as free.
fn claim(port: u16) -> bool {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("verlc-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return true;
    };
    match file.try_lock() {
        Ok(()) => {
            if let Ok(mut held) = HELD.lock() {
                held.push(file);
            }
            true
        }
        // Ours already (a lock on another handle of this process conflicts too) or another's.
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chosen port stays claimed: this process does not choose it again, and its claim file
    /// is locked (another process's `free_port` skips it).
    #[test]
    fn a_chosen_port_is_claimed_until_the_process_ends() {
        let a = free_port("127.0.0.1").unwrap();
        let b = free_port("127.0.0.1").unwrap();
        assert_ne!(a, b);
        assert!(!claim(a), "port {a} is held");
        let file =
            std::fs::File::open(std::env::temp_dir().join("verlc-ports").join(a.to_string()))
                .unwrap();
        assert!(
            file.try_lock_shared().is_err(),
            "the claim file of {a} is locked"
        );
    }
}

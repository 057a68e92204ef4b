//! Rank and world size from the launcher's environment (torchrun, SLURM, our [`LocalLauncher`]).
//!
//! [`LocalLauncher`]: super::LocalLauncher
use super::{DistError, Result};

/// Where this process sits in the job, as torchrun describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// torchrun's agent already serves the rendezvous store at MASTER_ADDR:MASTER_PORT
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`, static rendezvous): every rank connects as a
    /// client instead of rank 0 serving, as torch's own `env://` rendezvous does.
    pub agent_store: bool,
}

impl DistEnv {
    /// A one-process job (no launcher).
    pub fn single() -> Self {
        DistEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".to_owned(),
            master_port: 29500,
            agent_store: false,
        }
    }

    /// Reads the process environment; `Ok(None)` when no launcher set RANK / WORLD_SIZE.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`from_env`](Self::from_env) over any key lookup (tests pass a map).
    ///
    /// torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT
    /// win; SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE fill in for
    /// `srun` launches. MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500 only for a
    /// world of one.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let pick =
            |primary: &'static str, fallback: &'static str| -> Option<(&'static str, String)> {
                get(primary)
                    .map(|v| (primary, v))
                    .or_else(|| get(fallback).map(|v| (fallback, v)))
            };
        let Some((rank_var, rank)) = pick("RANK", "SLURM_PROCID") else {
            return Ok(None);
        };
        let rank = parse_usize(rank_var, &rank)?;
        let (ws_var, world) = pick("WORLD_SIZE", "SLURM_NTASKS").ok_or(DistError::MissingEnv {
            var: "WORLD_SIZE",
            needed_by: "RANK",
        })?;
        let world_size = parse_usize(ws_var, &world)?;
        if world_size == 0 {
            return Err(DistError::BadEnv {
                var: ws_var,
                value: world,
                reason: "must be positive".into(),
            });
        }
        if rank >= world_size {
            return Err(DistError::BadEnv {
                var: rank_var,
                value: rank.to_string(),
                reason: format!("must be below WORLD_SIZE={world_size}"),
            });
        }
        let local_rank = match pick("LOCAL_RANK", "SLURM_LOCALID") {
            Some((var, v)) => parse_usize(var, &v)?,
            None => rank,
        };
        let local_world_size = match pick("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE") {
            Some((var, v)) => parse_usize(var, v.split('(').next().unwrap_or(&v))?,
            None => world_size,
        };
        let master_addr = match get("MASTER_ADDR") {
            Some(a) if !a.is_empty() => a,
            _ if world_size == 1 => "127.0.0.1".to_owned(),
            _ => {
                return Err(DistError::MissingEnv {
                    var: "MASTER_ADDR",
                    needed_by: "WORLD_SIZE > 1",
                });
            }
        };
        let master_port = match get("MASTER_PORT") {
            Some(p) => p.trim().parse::<u16>().map_err(|e| DistError::BadEnv {
                var: "MASTER_PORT",
                value: p.clone(),
                reason: e.to_string(),
            })?,
            None if world_size == 1 => 29500,
            None => {
                return Err(DistError::MissingEnv {
                    var: "MASTER_PORT",
                    needed_by: "WORLD_SIZE > 1",
                });
            }
        };
        Ok(Some(DistEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            agent_store: get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"),
        }))
    }
}

fn parse_usize(var: &'static str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|e| DistError::BadEnv {
            var,
            value: value.to_owned(),
            reason: e.to_string(),
        })
}

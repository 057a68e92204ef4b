//! Metric loggers behind `trainer.logger` (verl's `Tracking`; docs/build-and-run.md):
//!
//! - `console`: verl's `step:N - key:value - …` lines on stdout, and a progress bar on stderr
//!   when it is a terminal ([`ConsoleLogger`]).
//! - `file`: verl's JSONL lines `{"step": N, "data": {...}}` at `$VERL_FILE_LOGGER_PATH`, else
//!   `{$VERL_FILE_LOGGER_ROOT or .}/{project}/{experiment}.jsonl` ([`FileLogger`]).
//! - `tensorboard`: event files in `$TENSORBOARD_DIR`, else
//!   `tensorboard_log/{project}/{experiment}` ([`tensorboard::TensorboardLogger`]).
//!
//! - `wandb`, `mlflow`: the trackers' Python SDKs in a side process ([`tracker`]).
//!
//! Other verl backends (swanlab, clearml, …) never reach the runtime: `verlc check` reports
//! them (B018) and `verlc build` refuses them.

pub mod tensorboard;
pub mod tracker;

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use verlc_spec::trainer::LoggerKind;

use crate::engine::Metrics;

/// Errors of the loggers.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Format { path: PathBuf, msg: String },
}

/// A metrics sink.
pub trait Logger {
    fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), LogError>;
    /// Called once after the last step.
    fn finish(&mut self) {}
}

/// Where the loggers write and what they know of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackingOptions {
    pub project: String,
    pub experiment: String,
    /// Total training steps (the progress bar's length).
    pub total_steps: u64,
    /// The run resumes after this step: the JSONL file keeps its lines up to it and drops
    /// later ones (written by an interrupted run) instead of starting empty.
    pub resume_from_step: Option<u64>,
    /// Print the console lines (tests turn them off).
    pub console_lines: bool,
    /// The run's config as wandb and MLflow record it.
    pub config: Value,
    /// The interpreter of the wandb / MLflow side process.
    pub python: String,
    /// Extra environment of that process (tests; it inherits the trainer's).
    pub tracker_env: Vec<(String, String)>,
}

/// All configured loggers.
pub struct Tracking {
    loggers: Vec<Box<dyn Logger>>,
}

impl std::fmt::Debug for Tracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracking")
            .field("loggers", &self.loggers.len())
            .finish()
    }
}

impl Tracking {
    /// Opens the `backends` (each once, in order).
    pub fn new(backends: &[LoggerKind], opts: &TrackingOptions) -> Result<Self, LogError> {
        let mut loggers: Vec<Box<dyn Logger>> = Vec::new();
        let mut seen = Vec::new();
        for b in backends {
            if seen.contains(b) {
                continue;
            }
            seen.push(*b);
            match b {
                LoggerKind::Console => loggers.push(Box::new(
                    ConsoleLogger::new(opts.total_steps, opts.console_lines)
                        .resumed_at(opts.resume_from_step.unwrap_or(0)),
                )),
                LoggerKind::File => loggers.push(Box::new(FileLogger::open(
                    &FileLogger::default_path(&opts.project, &opts.experiment),
                    opts.resume_from_step,
                )?)),
                LoggerKind::Tensorboard => {
                    let dir = match std::env::var("TENSORBOARD_DIR") {
                        Ok(d) if !d.is_empty() => PathBuf::from(d),
                        _ => Path::new("tensorboard_log")
                            .join(&opts.project)
                            .join(&opts.experiment),
                    };
                    loggers.push(Box::new(tensorboard::TensorboardLogger::create(&dir)?));
                }
                LoggerKind::Wandb | LoggerKind::Mlflow => {
                    let backend = if *b == LoggerKind::Wandb {
                        tracker::Backend::Wandb
                    } else {
                        tracker::Backend::Mlflow
                    };
                    let settings = tracker::TrackerSettings {
                        python: opts.python.clone(),
                        project: opts.project.clone(),
                        experiment: opts.experiment.clone(),
                        config: opts.config.clone(),
                        env: opts.tracker_env.clone(),
                        finish_timeout: std::time::Duration::from_secs(120),
                    };
                    if let Some(t) = tracker::PythonTracker::start(backend, &settings) {
                        loggers.push(Box::new(t));
                    }
                }
            }
        }
        Ok(Tracking { loggers })
    }

    /// Tracking with the given loggers (tests, embedding).
    pub fn from_loggers(loggers: Vec<Box<dyn Logger>>) -> Self {
        Tracking { loggers }
    }

    pub fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), LogError> {
        for l in &mut self.loggers {
            l.log(step, metrics)?;
        }
        Ok(())
    }

    pub fn finish(&mut self) {
        for l in &mut self.loggers {
            l.finish();
        }
    }
}

/// verl's `concat_dict_to_str`: `step:N - key:value - …` with 3 decimals.
pub fn console_line(step: u64, metrics: &Metrics) -> String {
    let mut parts = vec![format!("step:{step}")];
    parts.extend(metrics.iter().map(|(k, v)| format!("{k}:{v:.3}")));
    parts.join(" - ")
}

/// Console lines and a progress bar.
#[derive(Debug)]
pub struct ConsoleLogger {
    total: u64,
    lines: bool,
    bar: bool,
    start: std::time::Instant,
    /// The step the run resumed from (0 for a new run): the rate and ETA count only the
    /// steps this process ran.
    resumed: u64,
}

impl ConsoleLogger {
    pub fn new(total: u64, lines: bool) -> Self {
        ConsoleLogger {
            total,
            lines,
            bar: std::io::stderr().is_terminal(),
            start: std::time::Instant::now(),
            resumed: 0,
        }
    }

    /// The same logger for a run resumed at `step`.
    pub fn resumed_at(mut self, step: u64) -> Self {
        self.resumed = step;
        self
    }

    /// `[#####-----] 12/60 steps, 0m37s elapsed, 3.1 s/step, eta 2m28s`: `done` of `total`
    /// steps, `ran` of them in `elapsed_s` seconds by this process (fewer after a resume).
    pub fn bar_text(done: u64, total: u64, ran: u64, elapsed_s: f64) -> String {
        let width = 30usize;
        let frac = if total == 0 {
            1.0
        } else {
            (done as f64 / total as f64).min(1.0)
        };
        let filled = (frac * width as f64).round() as usize;
        let per = if ran > 0 { elapsed_s / ran as f64 } else { 0.0 };
        let eta = per * total.saturating_sub(done) as f64;
        let mmss = |s: f64| format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64);
        format!(
            "[{}{}] {done}/{total} steps, {} elapsed, {per:.1} s/step, eta {}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            mmss(elapsed_s),
            mmss(eta)
        )
    }
}

impl Logger for ConsoleLogger {
    fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), LogError> {
        if self.bar {
            eprint!("\r\x1b[2K");
        }
        if self.lines {
            println!("{}", console_line(step, metrics));
        }
        if self.bar && step > 0 {
            eprint!(
                "{}",
                Self::bar_text(
                    step,
                    self.total,
                    step.saturating_sub(self.resumed),
                    self.start.elapsed().as_secs_f64()
                )
            );
            let _ = std::io::stderr().flush();
        }
        Ok(())
    }

    fn finish(&mut self) {
        if self.bar {
            eprintln!();
        }
    }
}

/// verl's file logger: one JSON line per step.
#[derive(Debug)]
pub struct FileLogger {
    path: PathBuf,
    out: File,
}

impl FileLogger {
    /// `$VERL_FILE_LOGGER_PATH`, else `{$VERL_FILE_LOGGER_ROOT or .}/{project}/{experiment}.jsonl`.
    pub fn default_path(project: &str, experiment: &str) -> PathBuf {
        if let Ok(p) = std::env::var("VERL_FILE_LOGGER_PATH")
            && !p.is_empty()
        {
            return PathBuf::from(p);
        }
        let root = std::env::var("VERL_FILE_LOGGER_ROOT")
            .ok()
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| ".".into());
        Path::new(&root)
            .join(project)
            .join(format!("{experiment}.jsonl"))
    }

    /// Opens `path`: empty for a fresh run; on resume after step `s`, keeping the lines of
    /// steps `<= s`.
    pub fn open(path: &Path, resume_from_step: Option<u64>) -> Result<Self, LogError> {
        let io = |e: std::io::Error| LogError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut kept = Vec::new();
        if let (Some(s), Ok(f)) = (resume_from_step, File::open(path)) {
            for line in BufReader::new(f).lines() {
                let line = line.map_err(io)?;
                let step = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|v| v.get("step").and_then(Value::as_u64));
                if step.is_some_and(|st| st <= s) {
                    kept.push(line);
                }
            }
        }
        let mut out = File::create(path).map_err(io)?;
        for l in kept {
            writeln!(out, "{l}").map_err(io)?;
        }
        Ok(FileLogger {
            path: path.to_path_buf(),
            out,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Logger for FileLogger {
    fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), LogError> {
        let data: Map<String, Value> = metrics.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        let line = json!({"step": step, "data": data});
        writeln!(self.out, "{line}").map_err(|e| LogError::Io {
            path: self.path.clone(),
            source: e,
        })
    }
}

#[cfg(test)]
mod bar_tests {
    use super::ConsoleLogger;

    #[test]
    fn the_bar_shows_elapsed_rate_and_eta_of_this_process() {
        assert_eq!(
            ConsoleLogger::bar_text(12, 60, 12, 37.2),
            format!(
                "[{}{}] 12/60 steps, 0m37s elapsed, 3.1 s/step, eta 2m28s",
                "#".repeat(6),
                "-".repeat(24)
            )
        );
        // Resumed at 50: two steps ran in 10 s, so 5 s/step for the 8 to go.
        let resumed = ConsoleLogger::bar_text(52, 60, 2, 10.0);
        assert!(
            resumed.ends_with("0m10s elapsed, 5.0 s/step, eta 0m40s"),
            "{resumed}"
        );
        assert!(ConsoleLogger::bar_text(0, 0, 0, 0.0).contains("0/0 steps"));
    }
}

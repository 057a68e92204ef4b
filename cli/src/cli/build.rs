//! `verlc build`: check the config (plus the build-only warnings), lower it to a plan,
//! generate the trainer crate and compile it in the shared cache; then copy the binary to
//! `-o PATH`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::codegen::{self, BuildError, CrateSpec, Event, Paths, Profile, WrittenCrate};
use indicatif::{ProgressBar, ProgressStyle};
use verlc_front::check::CheckOptions;
use verlc_front::plan::Planned;

use super::args::{BuildArgs, CompileArgs};
use super::{EXIT_ERRORS, EXIT_USAGE};
use verlc_front::render;

/// A compiled trainer in the cache.
pub(super) struct Compiled {
    pub binary: PathBuf,
    /// Packages compiled by this build (`name@version`), not found fresh.
    pub compiled: Vec<String>,
    pub plan: Planned,
    pub krate: WrittenCrate,
    pub seconds: f64,
}

pub fn run(a: BuildArgs) -> u8 {
    let compiled = match compile(&a.compile) {
        Ok(Compile::Built(c)) => c,
        Ok(Compile::Planned(plan)) => {
            if a.json {
                let j = serde_json::json!({ "plan": plan });
                println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
            }
            return 0;
        }
        Err(code) => return code,
    };
    let out = if a.output.is_dir() {
        a.output.join(&compiled.krate.rendered.package)
    } else {
        a.output.clone()
    };
    if let Err(e) = install(&compiled.binary, &out) {
        eprintln!("error: cannot write {}: {e}", out.display());
        return EXIT_USAGE;
    }
    if a.json {
        let j = serde_json::json!({
            "binary": out,
            "config_hash": compiled.krate.rendered.config_hash,
            "crate": compiled.krate.dir,
            "seconds": compiled.seconds,
            "compiled": compiled.compiled,
            "plan": compiled.plan,
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    }
    let n = compiled.compiled.len();
    eprintln!(
        "built {} in {:.1} s ({}; config {}; {n} crate{} compiled)",
        out.display(),
        compiled.seconds,
        compiled.plan.binding(),
        short_hash(&compiled.krate.rendered.config_hash),
        if n == 1 { "" } else { "s" }
    );
    0
}

fn short_hash(h: &str) -> &str {
    h.get(..19).unwrap_or(h)
}

/// Copy the binary out of the cache, replacing `out` atomically (it may be running; a
/// symlink there is replaced, not followed).
fn install(binary: &Path, out: &Path) -> std::io::Result<()> {
    // `-o dist/trainer` in a fresh checkout: the directory is made, as cargo's `--out-dir` does.
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    super::output::copy_atomic(binary, out)
}

/// What [`compile`] got to: the binary, or with `--plan` only the plan.
pub(super) enum Compile {
    Built(Box<Compiled>),
    Planned(Box<Planned>),
}

/// Check, plan, generate and compile (with `--plan`, stop at the plan); `Err` is the exit
/// code after the problem was printed.
pub(super) fn compile(a: &CompileArgs) -> Result<Compile, u8> {
    let req = match a.config.request() {
        Ok(r) => r,
        Err(msg) => return Err(super::output::usage_error(false, &msg)),
    };
    let source = match (&req.config_file, &req.config_name) {
        (Some(f), _) => f.display().to_string(),
        (None, Some(n)) => n.clone(),
        (None, None) => req.base.clone().unwrap_or_else(|| "ppo_trainer".into()),
    };
    let opts = CheckOptions {
        model_config: a.model_config.clone(),
        only: Vec::new(),
    };
    // What `check` reports as warnings (valid for verl) are errors for a build, and the keys
    // the binary will not use are reported too.
    let compiled = verlc_front::compile::compile(
        &req,
        &opts,
        verlc_front::compile::Mode::Build {
            deny_warnings: a.deny_warnings,
        },
    );
    let checked = &compiled.checked;
    let color = super::output::stderr_color();
    eprint!("{}", render::human_checked(checked, color));
    if super::output::exit_status(&checked.diagnostics) == EXIT_USAGE {
        return Err(EXIT_USAGE);
    }
    let Some(plan) = compiled.planned else {
        eprintln!("error: not building {source}: the config has errors");
        return Err(EXIT_ERRORS);
    };
    eprintln!(
        "plan: {}",
        codegen::render::summary(&plan).replace('\n', "\n      ")
    );
    if a.plan {
        return Ok(Compile::Planned(Box::new(plan)));
    }
    // Models named by Hub id: in the Hub cache before the trainer exists (it never downloads).
    {
        let missing = match &plan {
            Planned::Rl(rl) => super::fetch::models_for_build(rl, &checked.composed.root),
            Planned::Sft(sft) => {
                super::fetch::sft_models_for_build(&sft.spec, &checked.composed.root)
            }
        };
        if !missing.is_empty() {
            eprint!(
                "{}",
                render::human(&missing, &checked.composed.sources, color)
            );
            eprintln!("error: not building {source}: a model is unavailable");
            return Err(EXIT_ERRORS);
        }
    }

    let paths = Paths::from_env(a.cache_dir.clone(), a.target_dir.clone());
    // A `--config-dir` tree goes into the trainer, whose run-time overrides are then judged
    // against it (verlc's built-in trees are in every trainer already).
    let verl_tree = match &req.config_dir {
        Some(dir) => match verlc_front::load::carried_tree::CarriedTree::read(dir)
            .and_then(|t| serde_json::to_string(&t).map_err(|e| e.to_string()))
        {
            Ok(json) => json,
            Err(e) => {
                eprintln!("error: reading the config dir {}: {e}", dir.display());
                return Err(EXIT_ERRORS);
            }
        },
        None => String::new(),
    };
    let spec = CrateSpec {
        plan: &plan,
        root: &checked.composed.root,
        source: source.clone(),
        runtime_dir: String::new(),
        macros_dir: String::new(),
        verl_release: checked.release_version.clone(),
        verl_tree,
    };
    let krate = match codegen::write_crate(spec, &paths) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(EXIT_USAGE);
        }
    };
    let profile = if a.release {
        Profile::Release
    } else {
        Profile::Dev
    };
    eprintln!(
        "compiling {} (crate {}, target {})",
        krate.rendered.package,
        krate.dir.display(),
        paths.target.display()
    );
    let start = Instant::now();
    let mut progress = Progress::new(Plan::Later(krate.clone(), paths.clone()));
    let built = codegen::build(&krate, &paths, profile, &mut |e| progress.event(e));
    progress.finish();
    match built {
        Ok(b) => Ok(Compile::Built(Box::new(Compiled {
            binary: b.executable,
            compiled: b.compiled,
            plan,
            krate,
            seconds: start.elapsed().as_secs_f64(),
        }))),
        Err(BuildError::Cargo(f)) => {
            eprintln!("error: cargo failed to build the trainer for {source}\n{f}");
            eprintln!("note: the generated crate is {}", krate.dir.display());
            Err(EXIT_ERRORS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(EXIT_USAGE)
        }
    }
}

/// The total for "N of M crates": `cargo metadata` costs a few hundred milliseconds, about a
/// third of a warm build (the trainer crate and a link), so it runs only once cargo compiles
/// a dependency, in a thread beside the build.
enum Plan {
    /// Not asked yet: what to ask about.
    Later(WrittenCrate, Paths),
    Asked(std::sync::mpsc::Receiver<Option<usize>>),
    Known(Option<usize>),
}

impl Plan {
    fn ask(&mut self) {
        if let Plan::Later(krate, paths) = self {
            let (krate, paths) = (krate.clone(), paths.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(codegen::planned_artifacts(&krate, &paths)));
            *self = Plan::Asked(rx);
        }
    }

    fn total(&mut self) -> Option<usize> {
        if let Plan::Asked(rx) = self
            && let Ok(n) = rx.try_recv()
        {
            *self = Plan::Known(n);
        }
        match self {
            Plan::Known(n) => *n,
            _ => None,
        }
    }
}

/// Progress while cargo runs: a spinner with cargo's current step on a terminal, else a line
/// per verlc crate compiled and a heartbeat.
struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    last_line: Instant,
    artifacts: usize,
    /// Artifacts the whole build produces, for "N of M".
    plan: Plan,
}

impl Progress {
    fn new(plan: Plan) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} [{elapsed}] {prefix} {wide_msg}")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            start: Instant::now(),
            last_line: Instant::now(),
            artifacts: 0,
            plan,
        }
    }

    fn event(&mut self, e: Event) {
        if let Event::Status(line) = &e
            && line.starts_with("Compiling")
            && !line.starts_with("Compiling verlc-trainer-")
        {
            self.plan.ask();
        }
        match e {
            Event::Artifact(n) => {
                self.artifacts = n;
                if self.bar.is_some() {
                    let count = self.count();
                    if let Some(b) = &self.bar {
                        b.set_prefix(count);
                    }
                }
            }
            Event::Status(line) => {
                if let Some(b) = &self.bar {
                    if line.starts_with("Compiling")
                        || line.starts_with("Building")
                        || line.starts_with("Blocking")
                    {
                        b.set_message(line);
                    }
                    return;
                }
                // Plain output: verlc's own crates (path dependencies) and cargo's waits.
                let ours = line.starts_with("Compiling") && line.contains("(/");
                if ours || line.starts_with("Blocking") {
                    eprintln!("  {line}");
                    self.last_line = Instant::now();
                } else if self.last_line.elapsed() > Duration::from_secs(15) {
                    let count = self.count();
                    eprintln!(
                        "  … {count} done, {:.0} s",
                        self.start.elapsed().as_secs_f64()
                    );
                    self.last_line = Instant::now();
                }
            }
        }
    }

    /// `12 of 240 crates` (with the plan), else `12 crates`.
    fn count(&mut self) -> String {
        match self.plan.total() {
            Some(total) => format!(
                "{} of {} crates",
                self.artifacts.min(total),
                total.max(self.artifacts)
            ),
            None => format!("{} crates", self.artifacts),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

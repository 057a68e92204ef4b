//! Command-line arguments.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use verlc_front::load::compose::{FSDP_BASE, LoadRequest, MEGATRON_BASE};

#[derive(Parser, Debug)]
#[command(
    name = "verlc",
    version,
    about = "Compiler for verl RL training configs: check, explain, schema, build, run"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a config: composition, schema and verl's cross-field rules.
    Check(CheckArgs),
    /// Print derived batch arithmetic and a per-rank memory estimate.
    Explain(ExplainArgs),
    /// Write (or check) the JSON Schemas used for editor completion.
    Schema(SchemaArgs),
    /// Describe a diagnostic id (`verlc rule V012`) or list them all.
    Rule(RuleArgs),
    /// Rewrite a config (file and overrides) written for verl 0.7.0 into 0.9.1's layout: moved
    /// keys at their new place, dropped keys reported; prints a diff (`--write` to apply).
    Migrate(MigrateArgs),
    /// Build the specialized training binary for a config.
    Build(BuildArgs),
    /// Build (cached) and run the training binary: `verlc run CONFIG [overrides] [-- args]`.
    Run(RunArgs),
    /// Run the config's own run for a few steps on this machine's CPUs before it gets GPUs:
    /// its data, tokenizer, chat template, reward and algorithm as written, the model by a
    /// scaled-down stand-in of the same family, 2 CPU ranks, small batches; then a checkpoint
    /// save and a resume. Exit 0: it ran; 1: problems found; 2: usage.
    Smoke(SmokeArgs),
    /// Download a model by Hugging Face Hub id into the Hub cache (as `huggingface-cli
    /// download` does); prints its snapshot directory.
    Fetch(FetchArgs),
}

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// The model's Hub id (`Qwen/Qwen2.5-0.5B-Instruct`).
    #[arg(value_name = "MODEL")]
    pub model: String,
    /// Branch, tag or commit hash (default: main).
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
    /// Only the configs, tokenizer files and chat templates, no weights: what `verlc smoke`
    /// reads of a model.
    #[arg(long)]
    pub no_weights: bool,
}

/// How to find and compose the config (shared by check and explain).
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// A config file (`.yaml`) and/or Hydra overrides (`key=value`, `+key=value`,
    /// `++key=value`, `~key`, `group@pkg=option`).
    #[arg(value_name = "CONFIG|OVERRIDE")]
    pub args: Vec<String>,
    /// Hydra's config directory (`--config-path` is accepted too).
    #[arg(long, alias = "config-path", short = 'd', value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
    /// Primary config name inside the config directory (default: ppo_trainer).
    #[arg(long, short = 'n', value_name = "NAME")]
    pub config_name: Option<String>,
    /// Built-in base for a file without `defaults:` (ppo_trainer or ppo_megatron_trainer).
    #[arg(long, value_name = "NAME")]
    pub base: Option<String>,
    /// The verl release whose built-in tree the config composes with when no `--config-dir`
    /// holds it: 0.9.1 or 0.7.0 (default: the release of the verl installed in the active
    /// Python, `$VERLC_PYTHON` else the active virtualenv's else `python3`, when verlc carries it;
    /// else 0.9.1).
    #[arg(long, value_name = "VERSION")]
    pub verl_version: Option<String>,
}

impl ConfigArgs {
    /// What to compose; a usage error (exit status 2) for arguments that cannot mean a run:
    /// a second config file, or a `--base` that is not one of verl's trainer configs.
    pub fn request(&self) -> Result<LoadRequest, String> {
        let mut file = None;
        let mut overrides = Vec::new();
        for a in &self.args {
            let looks_like_file = !a.contains('=') && !a.starts_with('~') && !a.starts_with('+');
            if looks_like_file && file.is_none() && overrides.is_empty() {
                file = Some(PathBuf::from(a));
            } else if looks_like_file
                && (a.ends_with(".yaml") || a.ends_with(".yml") || Path::new(a).is_file())
            {
                return Err(match &file {
                    Some(first) => format!(
                        "`{a}`: verlc reads one config file (`{}` is the first); compose several with a `defaults:` list",
                        first.display()
                    ),
                    None => format!(
                        "`{a}`: the config file comes first, before the overrides (`key=value`)"
                    ),
                });
            } else {
                overrides.push(a.clone());
            }
        }
        if let Some(base) = &self.base {
            let name = base.trim_end_matches(".yaml");
            if ![FSDP_BASE, MEGATRON_BASE].contains(&name) {
                return Err(format!(
                    "--base `{base}`: the base is one of verl's trainer configs, `{FSDP_BASE}` or `{MEGATRON_BASE}`"
                ));
            }
        }
        let (builtin, note) =
            super::release::choose(self.verl_version.as_deref(), self.config_dir.as_deref())?;
        if let Some(note) = note {
            eprintln!("{note}");
        }
        Ok(LoadRequest {
            config_file: file,
            config_dir: self.config_dir.clone(),
            config_name: self.config_name.clone(),
            base: self.base.clone(),
            overrides,
            cwd: std::env::current_dir().unwrap_or_default(),
            builtin,
            config_text: None,
        })
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// Model `config.json` (or its directory) for model-aware rules.
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<PathBuf>,
    /// Run only these rules (repeatable).
    #[arg(long, value_name = "CODE")]
    pub only: Vec<String>,
    /// Treat warnings as errors.
    #[arg(long)]
    pub deny_warnings: bool,
    /// Print the composed, resolved config (YAML-like JSON) after checking.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// Model `config.json` (or its directory); default: actor_rollout_ref.model.path.
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<PathBuf>,
    /// Model dims when no config.json is at hand: hidden size.
    #[arg(long)]
    pub hidden_size: Option<u64>,
    #[arg(long)]
    pub num_layers: Option<u64>,
    #[arg(long)]
    pub num_heads: Option<u64>,
    #[arg(long)]
    pub num_kv_heads: Option<u64>,
    #[arg(long)]
    pub intermediate_size: Option<u64>,
    #[arg(long)]
    pub vocab_size: Option<u64>,
    /// The memory of one GPU in GiB (80 for an A100/H100 80GB): says whether each trained
    /// role's per-rank estimate fits it, and what would make it fit (the trainer checks the
    /// same at start on the GPUs it finds).
    #[arg(long, value_name = "GIB")]
    pub gpu_memory: Option<f64>,
}

#[derive(Args, Debug)]
pub struct SchemaArgs {
    /// Directory to write `verl.schema.json` and the group schemas into.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print one schema (`root` or a group: optim, ref, actor, critic, rollout, engine,
    /// model, data, algorithm, trainer) to stdout.
    #[arg(long, value_name = "NAME")]
    pub print: Option<String>,
    /// Exit 1 if the schemas in DIR differ from what this verlc generates.
    #[arg(long)]
    pub check: bool,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The config file (`.yaml`) and/or Hydra overrides (`key=value`).
    #[arg(value_name = "CONFIG|OVERRIDE")]
    pub args: Vec<String>,
    /// The release whose layout to write (verl 0.9.1 is the one verlc migrates to).
    #[arg(long, value_name = "VERSION", default_value = "0.9.1")]
    pub to: String,
    /// Rewrite the file in place instead of printing the diff (a symlink's target is rewritten,
    /// atomically).
    #[arg(long)]
    pub write: bool,
    /// `json`: one object with the diff, the overrides as a list and every change.
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// The primary config the overrides compose on (`ppo_megatron_trainer` becomes
    /// `ppo_trainer` with `model_engine=megatron`).
    #[arg(long, alias = "config-name", value_name = "NAME")]
    pub base: Option<String>,
}

#[derive(Args, Debug)]
pub struct RuleArgs {
    /// A diagnostic id such as V012.
    pub code: Option<String>,
    /// List every id with its one-line summary.
    #[arg(long)]
    pub list: bool,
}

/// How `verlc build` and `verlc run` compile the trainer (shared flags).
#[derive(Args, Debug, Clone)]
pub struct CompileArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Model `config.json` (or its directory) for model-aware rules.
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<PathBuf>,
    /// Treat warnings (keys the binary will not use, …) as errors.
    #[arg(long)]
    pub deny_warnings: bool,
    /// Build with the optimized release profile (the default dev profile shares the verlc
    /// workspace's compiled runtime and builds fastest).
    #[arg(long)]
    pub release: bool,
    /// Shared cargo target directory for all generated crates (default: $VERLC_TARGET_DIR, else
    /// <cache>/target).
    #[arg(long, value_name = "DIR")]
    pub target_dir: Option<PathBuf>,
    /// Cache directory holding the generated crates (default: $VERLC_CACHE_DIR, else
    /// ~/.cache/verlc).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Only print the diagnostics and the plan; generate and compile nothing.
    #[arg(long)]
    pub plan: bool,
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    pub compile: CompileArgs,
    /// Where to put the binary.
    #[arg(long, short = 'o', value_name = "PATH", default_value = "trainer")]
    pub output: PathBuf,
    /// Print the plan as JSON on stdout (after building, or alone with --plan).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub compile: CompileArgs,
    /// Arguments for the trainer binary, after `--` (e.g. `-- --nproc-per-node 2`).
    #[arg(last = true, value_name = "BINARY_ARGS")]
    pub binary_args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SmokeArgs {
    #[command(flatten)]
    pub compile: CompileArgs,
    /// Training steps to run before the checkpoint (one more runs after resuming it).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub steps: u64,
    /// Where the stand-in run writes its checkpoints and logs (default: a fresh temporary
    /// directory, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Output format of the report.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// The rollout engine: `builtin` (verlc's, the default) stands in for every server
    /// engine; `vllm` keeps a config's vLLM rollout where vLLM is installed (one CPU engine).
    #[arg(long, value_enum, default_value_t = SmokeRollout::Builtin)]
    pub rollout: SmokeRollout,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmokeRollout {
    Builtin,
    Vllm,
}

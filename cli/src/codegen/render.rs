//! The generated crate's files, rendered from `templates/` (embedded at compile time, so a
//! `verlc` binary works from any directory).

use minijinja::{Environment, Value, context};
use sha2::{Digest, Sha256};

use super::BuildError;
use verlc_front::load::node::Node;
use verlc_front::plan::{BuildPlan, Planned, RewardPlan, SftPlan, embed};

const TEMPLATES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../templates/Cargo.toml.j2"),
    ),
    ("build.rs", include_str!("../../../templates/build.rs.j2")),
    ("src/main.rs", include_str!("../../../templates/main.rs.j2")),
    (
        "trainer.yaml",
        include_str!("../../../templates/trainer.yaml.j2"),
    ),
];

/// What goes into the templates besides the plan.
#[derive(Clone, Debug)]
pub struct CrateSpec<'a> {
    pub plan: &'a Planned,
    /// The resolved config tree (embedded as `trainer.yaml`).
    pub root: &'a Node,
    /// The config as the user named it (`examples/quickstart.yaml`).
    pub source: String,
    /// Directory of the `runtime` crate (`verlc-runtime`).
    pub runtime_dir: String,
    /// Directory of the `macros` crate (`verlc-macros`).
    pub macros_dir: String,
    /// The verl release the config was judged against (`0.9.1`; `Checked::release_version`).
    pub verl_release: String,
    /// The `--config-dir` tree it was judged against, carried into the trainer
    /// (`verl_tree.json`, a `CarriedTree`); empty on verlc's built-in tree.
    pub verl_tree: String,
}

/// The rendered crate: relative path -> contents.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// Package and binary name, unique per config (`verlc-trainer-quickstart-1a2b3c4d`).
    pub package: String,
    /// `sha256:<hex>` of `trainer.yaml`.
    pub config_hash: String,
    pub files: Vec<(&'static str, String)>,
}

fn env() -> Result<Environment<'static>, BuildError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .trim_blocks(true)
        .build()
        .map_err(|source| BuildError::Template {
            name: "syntax",
            source,
        })?;
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    // A Rust string literal (`"a\"b"`).
    env.add_filter("rust_string", |s: String| format!("{s:?}"));
    // A TOML basic string; JSON's escapes are valid TOML.
    env.add_filter("toml_string", |s: String| {
        serde_json::to_string(&s).unwrap_or_else(|_| format!("{s:?}"))
    });
    for (name, text) in TEMPLATES {
        env.add_template(name, text)
            .map_err(|source| BuildError::Template { name, source })?;
    }
    Ok(env)
}

fn render(env: &Environment, name: &'static str, ctx: &Value) -> Result<String, BuildError> {
    env.get_template(name)
        .and_then(|t| t.render(ctx))
        .map_err(|source| BuildError::Template { name, source })
}

/// A crate-name-safe stem of the config file name (`gsm8k_qwen2.5_fsdp` -> `gsm8k-qwen2-5-fsdp`).
fn stem(source: &str) -> String {
    let base = std::path::Path::new(source)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("config");
    let mut out = String::new();
    for c in base.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-');
    if out.is_empty() {
        "config".into()
    } else {
        out.chars().take(40).collect()
    }
}

/// One paragraph about the plan, for the generated `main.rs` docs.
pub fn summary(plan: &Planned) -> String {
    match plan {
        Planned::Rl(p) => rl_summary(p),
        Planned::Sft(p) => sft_summary(p),
    }
}

fn sft_summary(plan: &SftPlan) -> String {
    let s = &plan.spec;
    let batching = match s.batching.token_budget {
        Some(t) => format!("micro-batches of up to {t} tokens"),
        None => format!("micro-batches of {} conversations", s.batching.micro_batch),
    };
    let trainer = if s.trainer.is_legacy() {
        "verl 0.7.0's legacy fsdp_sft_trainer"
    } else {
        "verl's sft_trainer"
    };
    format!(
        "Binding: {}.\nSupervised fine-tuning ({trainer}): {} conversations a step, {batching}.\nRanks: {} node(s) × {} on {}.",
        plan.binding,
        s.batching.global_batch,
        s.world.nnodes,
        s.world.n_gpus_per_node,
        match s.world.device {
            verlc_spec::trainer::DeviceKind::Cpu => "cpu",
            verlc_spec::trainer::DeviceKind::Cuda => "cuda",
        },
    )
}

fn rl_summary(plan: &BuildPlan) -> String {
    let mut roles = vec!["actor", "rollout"];
    if plan.roles.reference {
        roles.push("reference policy");
    }
    if plan.roles.critic {
        roles.push("critic");
    }
    let reward = match &plan.roles.reward {
        RewardPlan::Function {
            custom_path: Some(p),
        } => format!("reward function from {p}"),
        RewardPlan::Function { custom_path: None } => "built-in reward functions".into(),
        RewardPlan::Model => "reward model".into(),
    };
    let name = |v: serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_default();
    format!(
        "Binding: {}.\nRoles: {}; {}. Algorithm: {} advantages, {} policy loss.\nRanks: {} node(s) × {} on {}.",
        plan.binding,
        roles.join(", "),
        reward,
        name(serde_json::to_value(plan.algorithm.adv_estimator).unwrap_or_default()),
        name(serde_json::to_value(plan.algorithm.loss_mode).unwrap_or_default()),
        plan.world.nnodes,
        plan.world.n_gpus_per_node,
        name(serde_json::to_value(plan.world.device).unwrap_or_default()),
    )
}

/// Render every file of the crate.
pub fn render_crate(spec: &CrateSpec) -> Result<Rendered, BuildError> {
    let env = env()?;
    let plan = spec.plan;
    let b = plan.binding();
    let common = context! {
        verlc_version => env!("CARGO_PKG_VERSION"),
        source => spec.source.clone(),
        binding => b.to_string(),
    };

    let yaml = render(
        &env,
        "trainer.yaml",
        &context! { body => embed::to_yaml(spec.root), ..common.clone() },
    )?;
    let digest = Sha256::digest(yaml.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let config_hash = format!("sha256:{hex}");
    let package = format!("verlc-trainer-{}-{}", stem(&spec.source), &hex[..8]);
    let features: Vec<&str> = if plan.cuda() { vec!["cuda"] } else { vec![] };

    let ctx = context! {
        package => package.clone(),
        config_hash => config_hash.clone(),
        runtime_dir => spec.runtime_dir.clone(),
        macros_dir => spec.macros_dir.clone(),
        features => features,
        strategy => b.strategy.name(),
        precision => b.precision.marker(),
        summary => summary(plan),
        verl_release => spec.verl_release.clone(),
        ..common
    };
    let spec_json = serde_json::to_string_pretty(&plan.spec_json().map_err(BuildError::Spec)?)
        .map_err(BuildError::Spec)?
        + "\n";
    // The keys whose values decided the binding, decided here once: the trainer refuses a
    // run-time override that changes one without lowering its config again.
    let bound_json =
        serde_json::to_string_pretty(plan.bound_keys()).map_err(BuildError::Spec)? + "\n";
    let mut files = vec![
        ("trainer.yaml", yaml),
        ("trainer.spec.json", spec_json),
        ("trainer.bound.json", bound_json),
        ("verl_tree.json", spec.verl_tree.clone()),
    ];
    for name in ["Cargo.toml", "build.rs", "src/main.rs"] {
        files.push((name, render(&env, name, &ctx)?));
    }
    Ok(Rendered {
        package,
        config_hash,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_are_crate_safe() {
        assert_eq!(
            stem("examples/gsm8k_qwen2.5_fsdp.yaml"),
            "gsm8k-qwen2-5-fsdp"
        );
        assert_eq!(stem("Quick Start.yaml"), "quick-start");
        assert_eq!(stem("__.yaml"), "config");
    }

    #[test]
    fn templates_parse() {
        assert!(env().is_ok());
    }

    /// The generated build script keeps libtorch_cuda (and the CUDA libraries behind it) loaded
    /// only in a CUDA trainer: a CPU trainer's processes start without them.
    #[test]
    fn only_a_cuda_trainer_links_libtorch_cuda() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let build_rs = |device: &str| {
            let req = verlc_front::load::compose::LoadRequest {
                config_file: Some(root.join("examples/quickstart.yaml")),
                overrides: vec![format!("trainer.device={device}")],
                cwd: root.clone(),
                ..Default::default()
            };
            let compiled = verlc_front::compile::compile(
                &req,
                &verlc_front::check::CheckOptions::default(),
                verlc_front::compile::Mode::Build {
                    deny_warnings: false,
                },
            );
            let plan = compiled.planned.expect("the quickstart plans");
            let spec = CrateSpec {
                plan: &plan,
                root: &compiled.checked.composed.root,
                source: "quickstart.yaml".into(),
                runtime_dir: String::new(),
                macros_dir: String::new(),
                verl_release: compiled.checked.release_version.clone(),
                verl_tree: String::new(),
            };
            let rendered = render_crate(&spec).expect("renders");
            let (_, text) = rendered
                .files
                .into_iter()
                .find(|(name, _)| *name == "build.rs")
                .expect("a build script");
            text
        };
        let (cpu, cuda) = (build_rs("cpu"), build_rs("cuda"));
        assert!(cpu.contains("-rpath") && !cpu.contains("-ltorch"), "{cpu}");
        assert!(
            cuda.contains("--no-as-needed") && cuda.contains("-ltorch"),
            "{cuda}"
        );
    }
}

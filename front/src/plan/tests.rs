use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::binding::{self, Dtype, OffloadFlags, StrategyKind as S};
use super::*;
use crate::check::{CheckOptions, Checked, check};
use crate::codes;
use crate::diag::{Diagnostic, Severity};
use crate::load::compose::LoadRequest;

const BUILD: crate::compile::Mode<'static> = crate::compile::Mode::Build {
    deny_warnings: false,
};

/// A YAML config written to a fresh temp file, checked like `verlc check` and lowered like
/// `verlc build`.
struct Case {
    checked: Checked,
    lowered: Lowered,
    file: PathBuf,
}

fn case(yaml: &str, overrides: &[&str]) -> Case {
    case_on(
        yaml,
        overrides,
        crate::load::version::BuiltinRelease::V0_7_0,
    )
}

/// [`case`] composed on a carried release's built-in tree.
fn case_on(yaml: &str, overrides: &[&str], release: crate::load::version::BuiltinRelease) -> Case {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("verlc-plan-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join(format!("case{}.yaml", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&file, yaml).expect("write case");
    let req = LoadRequest {
        config_file: Some(file.clone()),
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        cwd: dir,
        builtin: release,
        ..LoadRequest::default()
    };
    let checked = check(&req, &CheckOptions::default());
    let cfg = match &checked.config {
        Some(c) => c.clone(),
        None => panic!("config did not type-check: {:#?}", checked.diagnostics),
    };
    let lowered = lower_for_build(
        &cfg,
        &checked.composed,
        algo_release(&checked.release_version),
    );
    Case {
        checked,
        lowered,
        file,
    }
}

impl Case {
    fn binding(&self) -> Binding {
        self.lowered.plan.binding
    }

    /// Where the actor's engine spec places parameters, gradients and optimizer state.
    fn actor_offload(&self) -> OffloadFlags {
        use verlc_spec::trainer::EngineSpec;
        match &self.lowered.plan.spec.actor.engine {
            EngineSpec::Fsdp(f) => OffloadFlags {
                params: f.param_offload,
                grads: f.param_offload,
                optimizer: f.optimizer_offload,
            },
            EngineSpec::Megatron(m) => OffloadFlags {
                params: m.param_offload,
                grads: m.grad_offload,
                optimizer: m.optimizer_offload,
            },
        }
    }

    /// `(code, line)` of every plan diagnostic whose primary label is in the case file.
    fn at_lines(&self) -> Vec<(&'static str, usize)> {
        let name = self.file.display().to_string();
        self.lowered
            .diagnostics
            .iter()
            .filter_map(|d| {
                let o = &d.primary.as_ref()?.origin;
                let src = self.checked.composed.sources.get(o.source);
                (src.name == name).then(|| (d.code.0, src.line_col(o.span.start).0))
            })
            .collect()
    }

    /// The codes of the build's findings, without the host-dependent B007 (bf16 on a CPU
    /// without native bf16: see `bf16_on_a_cpu_without_native_bf16_warns`).
    fn codes(&self) -> Vec<&'static str> {
        self.all_codes()
            .into_iter()
            .filter(|c| *c != "B007")
            .collect()
    }

    fn all_codes(&self) -> Vec<&'static str> {
        self.lowered.diagnostics.iter().map(|d| d.code.0).collect()
    }

    /// `verlc check` saw the same B01x errors.
    fn check_codes(&self) -> Vec<&'static str> {
        self.checked
            .diagnostics
            .iter()
            .filter(|d| d.code.0.starts_with('B') && d.code.0 != "B007")
            .map(|d| d.code.0)
            .collect()
    }
}

const BASE: &str = "\
data:
  train_files: builtin://digit_reversal?split=train
  val_files: builtin://digit_reversal?split=test
  train_batch_size: 32
  max_prompt_length: 32
  max_response_length: 16
actor_rollout_ref:
  model:
    path: builtin://tiny
  actor:
    ppo_mini_batch_size: 16
    ppo_micro_batch_size_per_gpu: 16
  rollout:
    name: verlc
    n: 4
    tensor_model_parallel_size: 1
    log_prob_micro_batch_size_per_gpu: 32
  ref:
    log_prob_micro_batch_size_per_gpu: 32
algorithm:
  adv_estimator: grpo
trainer:
  device: cpu
  nnodes: 1
  n_gpus_per_node: 1
  logger: [console]
";

/// BASE with `extra` lines inserted under `actor_rollout_ref.actor:` (indented by the caller).
fn with_actor(extra: &str) -> String {
    BASE.replace(
        "    ppo_micro_batch_size_per_gpu: 16\n",
        &format!("    ppo_micro_batch_size_per_gpu: 16\n{extra}"),
    )
}

/// [`BASE`] with a Megatron actor and reference computing in fp32.
fn megatron_fp32() -> String {
    with_actor("    strategy: megatron\n    megatron:\n      dtype: float32\n")
        .replace("  ref:\n", "  ref:\n    strategy: megatron\n")
}

#[test]
fn default_fsdp_binds_bf16_without_offload() {
    let c = case(BASE, &[]);
    assert_eq!(
        c.binding(),
        Binding {
            strategy: S::Fsdp,
            precision: Dtype::Bf16,
        }
    );
    assert_eq!(c.actor_offload(), OffloadFlags::NONE);
    // Nothing but, on a CPU without native bf16, the B007 cost warning.
    assert!(
        c.lowered.diagnostics.iter().all(|d| d.code.0 == "B007"),
        "{:#?}",
        c.lowered.diagnostics
    );
    let plan = &c.lowered.plan;
    assert_eq!(plan.spec.strategy, verlc_spec::trainer::StrategyName::Fsdp);
    assert!(plan.roles.actor && plan.roles.rollout);
    assert!(!plan.roles.critic && !plan.roles.reference);
    assert_eq!(plan.world.size(), 1);
    assert_eq!(plan.algorithm.adv_estimator, AdvEstimator::Grpo);
    assert_eq!(plan.algorithm.loss_mode, PolicyLossMode::Vanilla);
    assert!(plan.algorithm.kl_loss.is_none());
}

/// bf16 on CPU warns (B007) exactly when this host has no native bf16; fp32 never does.
#[test]
fn bf16_on_a_cpu_without_native_bf16_warns() {
    let bf16 = case(BASE, &[]);
    let warned = bf16.all_codes().contains(&"B007");
    assert_eq!(
        warned,
        super::host::native_bf16() == Some(false),
        "{:#?}",
        bf16.lowered.diagnostics
    );
    if let Some(d) = bf16.lowered.diagnostics.iter().find(|d| d.code.0 == "B007") {
        assert!(!d.is_error() && d.primary.is_some());
        assert!(
            d.help
                .as_deref()
                .is_some_and(|h| h.contains("param_dtype: fp32"))
        );
    }
    let fp32 = case(
        &with_actor("    fsdp_config:\n      mixed_precision:\n        param_dtype: fp32\n"),
        &[],
    );
    assert!(!fp32.all_codes().contains(&"B007"));
}

/// `megatron.dtype: float32`, verlc's extension, binds Fp32 (V050 says verl refuses it).
#[test]
fn megatron_float32_binds_fp32() {
    let yaml = megatron_fp32().replace(
        "    ppo_micro_batch_size_per_gpu: 16\n",
        "    ppo_micro_batch_size_per_gpu: 16\n    data_loader_seed: 1\n",
    );
    let c = case(&yaml, &[]);
    assert_eq!(c.binding().precision, Dtype::Fp32);
    assert!(
        c.lowered.diagnostics.iter().all(|d| !d.is_error()),
        "{:#?}",
        c.lowered.diagnostics
    );
}

/// `use_remove_padding` packs on FSDP (implemented: quiet either way); a Megatron actor
/// computes padded, so a value changed from the Megatron default (off) warns once (B006), and
/// the default stays quiet.
#[test]
fn packing_on_megatron_warns_only_when_changed() {
    let yaml = megatron_fp32();
    let key = "actor_rollout_ref.model.use_remove_padding";
    let (on, off) = (format!("{key}=true"), format!("{key}=false"));
    let about = |c: &Case| {
        c.lowered
            .diagnostics
            .iter()
            .filter(|d| d.code.0 == "B006" && d.key_path.as_deref() == Some(key))
            .count()
    };
    assert_eq!(about(&case(&yaml, &[])), 0, "verl's default");
    assert_eq!(about(&case(&yaml, &[&on])), 1, "changed on Megatron");
    assert_eq!(about(&case(BASE, &[&off])), 0, "FSDP runs it as written");
}

#[test]
fn rollout_tensor_parallel_runs_as_written_on_a_megatron_actor() {
    let yaml = megatron_fp32();
    let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
    let about = |c: &Case| {
        c.lowered
            .diagnostics
            .iter()
            .filter(|d| d.key_path.as_deref() == Some(key))
            .map(|d| d.code.0)
            .collect::<Vec<_>>()
    };
    let layout = |gpus: usize, tp: usize, pp: usize| {
        vec![
            format!("trainer.n_gpus_per_node={gpus}"),
            format!("actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}"),
            format!("actor_rollout_ref.ref.megatron.tensor_model_parallel_size={tp}"),
            format!("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}"),
            format!("actor_rollout_ref.ref.megatron.pipeline_model_parallel_size={pp}"),
        ]
    };
    let with = |base: Vec<String>, r: usize| {
        let mut o = base;
        o.push(format!("{key}={r}"));
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        case(&yaml, &o)
    };
    // The actor's own size: the rollout decodes from the actor's shards as they are.
    let c = with(layout(2, 2, 1), 2);
    assert!(about(&c).is_empty());
    assert_eq!(c.lowered.plan.spec.rollout.tensor_parallel, None);
    // Smaller (dividing the actor's TP) and larger (spanning data-parallel ranks): honoured.
    for (base, r) in [
        (layout(2, 2, 1), 1),
        (layout(4, 1, 1), 2),
        (layout(4, 2, 1), 4),
    ] {
        let c = with(base, r);
        assert!(about(&c).is_empty(), "rollout TP {r}: {:?}", about(&c));
        assert_eq!(c.lowered.plan.spec.rollout.tensor_parallel, Some(r));
    }
    // The config's own 1 under a TP 2 actor is a size like any other.
    let two: Vec<String> = layout(2, 2, 1);
    let two: Vec<&str> = two.iter().map(String::as_str).collect();
    assert_eq!(
        case(&yaml, &two).lowered.plan.spec.rollout.tensor_parallel,
        Some(1)
    );
    // Larger than the actor's TP with no data-parallel ranks to span: refused at the line.
    let c = with(layout(2, 1, 2), 2);
    assert_eq!(about(&c), vec!["B018"]);
    let help = c
        .lowered
        .diagnostics
        .iter()
        .find(|d| d.key_path.as_deref() == Some(key))
        .and_then(|d| d.help.clone());
    assert_eq!(help.as_deref(), Some("use one of 1"));
}

#[test]
fn rollout_tensor_parallel_must_split_the_model() {
    // Qwen2.5-7B: 28 attention heads, 4 key/value heads, intermediate 18944. A TP 8 actor's
    // rollout at TP 2 splits them; at 8 the actor itself could not hold them (V201/V202).
    let yaml = megatron_fp32();
    let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
    let dir = std::env::temp_dir().join(format!("verlc-plan-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("case.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/rules/models/qwen2_5_7b.json");
    let findings = |r: usize| {
        let req = LoadRequest {
            config_file: Some(file.clone()),
            overrides: [
                "trainer.n_gpus_per_node=8".to_owned(),
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1".to_owned(),
                "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1".to_owned(),
                format!("{key}={r}"),
            ]
            .to_vec(),
            cwd: dir.clone(),
            builtin: crate::load::version::BuiltinRelease::V0_7_0,
            ..LoadRequest::default()
        };
        let opts = CheckOptions {
            model_config: Some(model.clone()),
            ..CheckOptions::default()
        };
        crate::compile::compile(&req, &opts, BUILD)
            .checked
            .diagnostics
            .iter()
            .filter(|d| d.key_path.as_deref() == Some(key) && d.code.0 == "B018")
            .map(|d| (d.message.clone(), d.help.clone()))
            .collect::<Vec<_>>()
    };
    assert!(findings(2).is_empty(), "{:?}", findings(2));
    let bad = findings(8);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].0.contains("4 key/value heads"), "{}", bad[0].0);
    assert_eq!(
        bad[0].1.as_deref(),
        Some("use a size that splits them: 1, 2, 4")
    );
}

#[test]
fn mixed_precision_param_dtype_decides_precision() {
    let c = case(
        &with_actor("    fsdp_config:\n      mixed_precision:\n        param_dtype: fp32\n"),
        &[],
    );
    assert_eq!(c.binding().precision, Dtype::Fp32);
    let c = case(
        &with_actor("    fsdp_config:\n      mixed_precision:\n        param_dtype: bf16\n"),
        &[],
    );
    assert_eq!(c.binding().precision, Dtype::Bf16);
    let c = case(
        &with_actor("    fsdp_config:\n      mixed_precision:\n        param_dtype: float16\n"),
        &[],
    );
    assert_eq!(c.binding().precision, Dtype::Fp16);
    assert!(c.binding().precision.loss_scaling());
}

#[test]
fn engine_dtype_decides_precision_without_mixed_precision() {
    let c = case(
        &with_actor("    fsdp_config:\n      dtype: float16\n      model_dtype: bf16\n"),
        &[],
    );
    assert_eq!(c.binding().precision, Dtype::Fp16);
    let keys: Vec<&str> = c
        .lowered
        .plan
        .bound_keys
        .iter()
        .map(|b| b.key.as_str())
        .collect();
    assert!(
        keys.contains(&"actor_rollout_ref.actor.fsdp_config.dtype"),
        "{keys:?}"
    );
}

/// `model_dtype: bf16` under bf16 compute trains bf16 shards (verl's FSDP engine loads and
/// steps the model in bf16); fp16, or bf16 under fp32 compute, is refused at its line.
#[test]
fn model_dtype_sets_the_main_dtype_or_is_refused_at_its_line() {
    use verlc_spec::trainer::EngineSpec;
    let main = |c: &Case| match &c.lowered.plan.spec.actor.engine {
        EngineSpec::Fsdp(f) => f.main_dtype,
        EngineSpec::Megatron(_) => panic!("an FSDP actor"),
    };
    let ok = case(
        &with_actor("    fsdp_config:\n      model_dtype: bfloat16\n"),
        &[],
    );
    assert_eq!(ok.binding().precision, Dtype::Bf16);
    assert_eq!(main(&ok), Dtype::Bf16);
    assert!(!ok.codes().contains(&"B018"), "{:?}", ok.codes());
    assert_eq!(main(&case(BASE, &[])), Dtype::Fp32);
    for (dtype, compute) in [("fp16", "bf16"), ("bf16", "fp32")] {
        let c = case(
            &with_actor(&format!(
                "    fsdp_config:\n      model_dtype: {dtype}\n      mixed_precision:\n        param_dtype: {compute}\n"
            )),
            &[],
        );
        let refused: Vec<_> = c
            .at_lines()
            .into_iter()
            .filter(|(code, _)| *code == "B018")
            .collect();
        assert_eq!(refused, vec![("B018", 14)], "{dtype} under {compute}");
        assert_eq!(main(&c), Dtype::Fp32);
    }
    // LoRA's adapter dtype under bf16 weights differs between verl releases: refused.
    let lora = case(
        &with_actor("    fsdp_config:\n      model_dtype: bf16\n"),
        &["actor_rollout_ref.model.lora_rank=8"],
    );
    let refused: Vec<_> = lora
        .at_lines()
        .into_iter()
        .filter(|(code, _)| *code == "B018")
        .collect();
    assert_eq!(refused, vec![("B018", 14)], "{:?}", lora.codes());
}

#[test]
fn fsdp_offload_flags() {
    let c = case(
        &with_actor("    fsdp_config:\n      optimizer_offload: true\n"),
        &[],
    );
    assert_eq!(
        c.actor_offload(),
        OffloadFlags {
            params: false,
            grads: false,
            optimizer: true
        }
    );
    let c = case(
        &with_actor("    fsdp_config:\n      param_offload: true\n"),
        &[],
    );
    assert_eq!(
        c.actor_offload(),
        OffloadFlags {
            params: true,
            grads: true,
            optimizer: false
        }
    );
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        ],
    );
    assert_eq!(
        c.actor_offload(),
        OffloadFlags {
            params: true,
            grads: true,
            optimizer: true
        }
    );
}

#[test]
fn fsdp2_offload_policy_offloads_everything() {
    let c = case(
        &with_actor("    strategy: fsdp2\n    fsdp_config:\n      offload_policy: true\n"),
        &[],
    );
    assert_eq!(
        c.binding(),
        Binding {
            strategy: S::Fsdp,
            precision: Dtype::Bf16,
        }
    );
    assert_eq!(
        c.actor_offload(),
        OffloadFlags {
            params: true,
            grads: true,
            optimizer: true
        }
    );
    assert_eq!(
        c.lowered.plan.spec.strategy,
        verlc_spec::trainer::StrategyName::Fsdp2
    );
    assert!(c.codes().is_empty(), "{:?}", c.codes());
}

#[test]
fn offload_policy_on_fsdp1_is_an_unused_key_warning_at_its_line() {
    let yaml = with_actor("    fsdp_config:\n      offload_policy: true\n");
    let line = yaml
        .lines()
        .position(|l| l.contains("offload_policy"))
        .map(|i| i + 1);
    let c = case(&yaml, &[]);
    assert_eq!(c.actor_offload(), OffloadFlags::NONE);
    assert_eq!(c.at_lines(), vec![("B005", line.unwrap_or(0))]);
}

#[test]
fn megatron_precision_and_offload() {
    let yaml = with_actor(
        "    strategy: megatron\n    megatron:\n      dtype: float16\n      grad_offload: true\n      optimizer_offload: true\n",
    )
    .replace("  ref:\n", "  ref:\n    strategy: megatron\n")
    .replace("    ppo_micro_batch_size_per_gpu: 16\n", "    ppo_micro_batch_size_per_gpu: 16\n    data_loader_seed: 1\n");
    let c = case(
        &yaml,
        &[
            "critic.strategy=megatron",
            "actor_rollout_ref.ref.megatron.dtype=float16",
        ],
    );
    assert_eq!(
        c.binding(),
        Binding {
            strategy: S::Megatron,
            precision: Dtype::Fp16,
        }
    );
    // Each of Megatron's offload keys places its own target.
    assert_eq!(
        c.actor_offload(),
        OffloadFlags {
            params: false,
            grads: true,
            optimizer: true
        }
    );
    assert_eq!(
        c.lowered.plan.spec.strategy,
        verlc_spec::trainer::StrategyName::Megatron
    );
    assert!(
        matches!(c.lowered.plan.spec.actor.engine, verlc_spec::trainer::EngineSpec::Megatron(m) if m.grad_offload && !m.param_offload && m.optimizer_offload),
        "{:?}",
        c.lowered.plan.spec.actor.engine
    );
    assert!(c.at_lines().is_empty(), "{:?}", c.at_lines());
    assert!(
        c.lowered.diagnostics.iter().all(|d| !d.is_error()),
        "{:#?}",
        c.lowered.diagnostics
    );
}

#[test]
fn fp16_with_fsdp_param_offload_is_rejected_at_the_precision_line() {
    let yaml = with_actor(
        "    fsdp_config:\n      param_offload: true\n      mixed_precision:\n        param_dtype: fp16\n",
    );
    let line = yaml
        .lines()
        .position(|l| l.contains("param_dtype: fp16"))
        .map_or(0, |i| i + 1);
    let c = case(&yaml, &[]);
    assert_eq!(c.at_lines(), vec![("B012", line)]);
    assert_eq!(c.check_codes(), vec!["B012"]);
    // Valid for verl: `verlc check` warns, the build (and the trainer) make it an error.
    assert!(
        c.checked
            .diagnostics
            .iter()
            .filter(|d| d.code.0 == "B012")
            .all(|d| !d.is_error())
    );
    let promoted = crate::compile::compile(
        &LoadRequest {
            config_file: Some(c.file.clone()),
            cwd: std::env::temp_dir(),
            builtin: crate::load::version::BuiltinRelease::V0_7_0,
            ..LoadRequest::default()
        },
        &CheckOptions::default(),
        BUILD,
    )
    .checked;
    let b012: Vec<_> = promoted
        .diagnostics
        .iter()
        .filter(|d| d.code.0 == "B012")
        .collect();
    assert!(b012.len() == 1 && b012[0].is_error(), "{b012:?}");
    let d = &c.lowered.diagnostics[0];
    assert_eq!(d.severity, Severity::Error);
    assert!(d.message.contains("Fp16Mixed"), "{}", d.message);
    assert!(d.help.as_deref().unwrap_or("").contains("bf16"));
    assert!(
        !d.secondary.is_empty(),
        "points at the param_offload line too"
    );
}

#[test]
fn the_value_loss_takes_the_critics_loss_scale_factor_where_the_release_has_one() {
    use crate::load::version::BuiltinRelease;
    let gae = BASE.replace("adv_estimator: grpo", "adv_estimator: gae");
    let critic = [
        "critic.model.path=builtin://tiny",
        "critic.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.loss_scale_factor=64",
    ];
    let factor = |c: &Case| {
        c.lowered
            .plan
            .spec
            .critic
            .as_ref()
            .map(|c| c.update.loss_scale_factor)
    };
    // verl 0.9.1's critic copies the actor's factor; 0.7.0's value loss has none.
    let c = case_on(&gae, &critic, BuiltinRelease::V0_9_1);
    assert_eq!(factor(&c), Some(Some(64.0)), "{:#?}", c.lowered.diagnostics);
    let mut own = critic.to_vec();
    own.push("critic.loss_scale_factor=8");
    let c = case_on(&gae, &own, BuiltinRelease::V0_9_1);
    assert_eq!(factor(&c), Some(Some(8.0)));
    let c = case(&gae, &critic);
    assert_eq!(factor(&c), Some(None));
}

#[test]
fn critic_and_reference_roles() {
    let c = case(
        &BASE.replace("adv_estimator: grpo", "adv_estimator: gae"),
        &[
            "critic.model.path=builtin://tiny",
            "critic.ppo_micro_batch_size_per_gpu=16",
        ],
    );
    assert!(c.lowered.plan.roles.critic);
    let c = case(
        BASE,
        &[
            "critic.enable=true",
            "critic.model.path=builtin://tiny",
            "critic.ppo_micro_batch_size_per_gpu=16",
        ],
    );
    assert!(c.lowered.plan.roles.critic);
    let c = case(
        &BASE.replace("adv_estimator: grpo", "adv_estimator: gae"),
        &["critic.enable=false"],
    );
    assert!(!c.lowered.plan.roles.critic);
    let c = case(BASE, &["actor_rollout_ref.actor.use_kl_loss=true"]);
    assert!(c.lowered.plan.roles.reference);
    assert_eq!(
        c.lowered.plan.algorithm.kl_loss,
        Some(KlEstimator::LowVarKl)
    );
    let c = case(BASE, &["algorithm.use_kl_in_reward=true"]);
    assert!(c.lowered.plan.roles.reference);
}

#[test]
fn critic_precision_must_match_the_actor_and_its_offload_is_its_own() {
    let yaml = format!(
        "{}critic:\n  model:\n    path: builtin://tiny\n    fsdp_config:\n      dtype: float16\n      optimizer_offload: true\n  ppo_micro_batch_size_per_gpu: 16\n",
        BASE.replace("adv_estimator: grpo", "adv_estimator: gae")
    );
    let dtype_line = yaml
        .lines()
        .position(|l| l.contains("dtype: float16"))
        .map_or(0, |i| i + 1);
    let c = case(&yaml, &[]);
    let mut got = c.at_lines();
    got.sort();
    assert_eq!(got, vec![("B011", dtype_line)]);
    let critic = c.lowered.plan.spec.critic.as_ref().expect("critic");
    assert!(
        matches!(&critic.engine, verlc_spec::trainer::EngineSpec::Fsdp(f) if f.optimizer_offload),
        "{:?}",
        critic.engine
    );
    assert_eq!(c.actor_offload(), OffloadFlags::NONE);
}

#[test]
fn other_strategy_engine_offload_is_ignored_and_reported() {
    // An FSDP-flavoured tree whose actor is switched to megatron: no `megatron` section, and
    // the FSDP offload switch would silently do nothing.
    let yaml = format!(
        "defaults:\n  - ppo_trainer\n  - _self_\n{}",
        with_actor("    strategy: megatron\n    fsdp_config:\n      param_offload: true\n")
    );
    let line = yaml
        .lines()
        .position(|l| l.contains("param_offload: true"))
        .map_or(0, |i| i + 1);
    let strategy_line = yaml
        .lines()
        .position(|l| l.contains("strategy: megatron"))
        .map_or(0, |i| i + 1);
    let c = case(&yaml, &[]);
    let got = c.at_lines();
    assert!(got.contains(&("B013", line)), "{got:?}");
    assert!(got.contains(&("B015", strategy_line)), "{got:?}");
}

#[test]
fn npu_is_rejected() {
    let c = case(BASE, &["trainer.device=npu"]);
    assert!(c.codes().contains(&"B017"), "{:?}", c.codes());
}

#[test]
fn reward_models_lower_as_verl_runs_them() {
    use verlc_spec::trainer::{Dtype, RewardModelInput};
    let rm = |overrides: &[&str]| {
        let c = case(BASE, overrides);
        (c.lowered.plan.spec.reward_model.clone(), c)
    };
    // The reward loop: the reward model's chat template, special tokens added, no limit,
    // in `reward_model.rollout.dtype`.
    let (spec, c) = rm(&[
        "reward_model.enable=true",
        "reward_model.model.path=builtin://tiny",
        "reward_model.rollout.dtype=float32",
    ]);
    let spec = spec.expect("a reward model");
    assert!(
        !c.codes().iter().any(|c| c.starts_with("B01")),
        "{:?}",
        c.codes()
    );
    assert_eq!(spec.model_path, "builtin://tiny");
    assert_eq!(spec.dtype, Some(Dtype::Fp32));
    assert!(matches!(
        spec.input,
        RewardModelInput::Chat {
            add_special_tokens: true,
            max_length: None,
            ..
        }
    ));
    assert!(!spec.scores_validation);
    let (spec, _) = rm(&[
        "reward_model.enable=true",
        "reward_model.enable_resource_pool=true",
        "reward_model.n_gpus_per_node=1",
        "reward_model.nnodes=1",
    ]);
    assert!(spec.expect("a reward model").scores_validation);

    // The legacy worker: bf16, the policy's tokens when input_tokenizer is null, otherwise
    // the chat template cut at max_length (default: prompt + response length).
    let legacy = [
        "reward_model.enable=true",
        "reward_model.use_reward_loop=false",
        "reward_model.micro_batch_size_per_gpu=3",
    ];
    let (spec, _) = rm(&[&legacy[..], &["reward_model.model.input_tokenizer=null"]].concat());
    let spec = spec.expect("a reward model");
    assert_eq!(
        (spec.input, spec.dtype, spec.micro_batch),
        (RewardModelInput::PolicyTokens, Some(Dtype::Bf16), 3)
    );
    let (spec, _) = rm(&[&legacy[..], &["reward_model.max_length=100"]].concat());
    assert!(matches!(
        spec.expect("a reward model").input,
        RewardModelInput::Chat {
            add_special_tokens: false,
            max_length: Some(100),
            ..
        }
    ));
    let (_, c) = rm(&[
        &legacy[..],
        &["reward_model.model.input_tokenizer=/elsewhere"],
    ]
    .concat());
    assert!(c.codes().contains(&"B018"), "{:?}", c.codes());
    let (_, c) = rm(&[
        "reward_model.enable=true",
        "reward_model.use_reward_loop=false",
        "reward_model.micro_batch_size_per_gpu=null",
    ]);
    assert!(
        c.codes().contains(&"B018"),
        "no micro-batch size: {:?}",
        c.codes()
    );

    // The reward loop with a custom function: verl serves the model to the function (a
    // generative reward model), which verlc cannot; refused at the switch.
    let (spec, c) = rm(&[
        "reward_model.enable=true",
        "custom_reward_function.path=reward.py",
    ]);
    assert!(spec.is_none());
    let d = c
        .lowered
        .diagnostics
        .iter()
        .find(|d| d.code.0 == "B018" && d.key_path.as_deref() == Some("reward_model.enable"));
    assert!(
        d.is_some_and(|d| d.is_error()),
        "{:#?}",
        c.lowered.diagnostics
    );
}

#[test]
fn vllm_keys_are_honoured_or_warned_at_their_line() {
    let yaml = BASE.replace(
        "    name: verlc\n",
        "    name: vllm\n    gpu_memory_utilization: 0.7\n    enforce_eager: false\n    max_num_seqs: 64\n    engine_kwargs:\n      vllm:\n        swap_space: 4\n",
    );
    let line = |needle: &str| {
        yaml.lines()
            .position(|l| l.contains(needle))
            .map_or(0, |i| i + 1)
    };
    let c = case(&yaml, &["trainer.ray_wait_register_center_timeout=30"]);
    let mut got = c.at_lines();
    got.sort();
    // vLLM runs: its keys become the server's flags (max_num_seqs, engine_kwargs.vllm.*);
    // gpu_memory_utilization cannot act on a CPU device; B020 says the built-in engine is
    // faster there. enforce_eager: false is verl's default: not reported.
    assert_eq!(
        got,
        vec![
            ("B001", line("gpu_memory_utilization")),
            ("B020", line("name: vllm"))
        ]
    );
    let vllm = c
        .lowered
        .plan
        .spec
        .rollout
        .vllm
        .as_ref()
        .expect("rollout.vllm");
    assert_eq!(vllm.max_num_seqs, 64);
    assert_eq!(
        vllm.engine_kwargs,
        vec![("swap_space".to_owned(), serde_json::json!(4))]
    );
    let from_override = c
        .lowered
        .diagnostics
        .iter()
        .find(|d| d.code == codes::BUILD_CLUSTER_KEY_UNUSED);
    assert!(from_override.is_some_and(|d| d.severity == Severity::Warning && d.primary.is_some()));
    // `verlc check` reports the same verdicts (every key that has no effect is reported).
    let mut check_codes = c.check_codes();
    check_codes.sort();
    assert_eq!(check_codes, vec!["B001", "B005", "B020"]);

    // An engine the binary does not run: the built-in one generates, every vLLM/SGLang knob
    // is reported.
    let sglang = yaml.replace("name: vllm", "name: sglang");
    let c = case(&sglang, &[]);
    let mut got = c.at_lines();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("B001", line("gpu_memory_utilization")),
            ("B001", line("max_num_seqs")),
            ("B001", line("swap_space")),
            ("B002", line("name: vllm"))
        ]
    );
    assert!(c.lowered.plan.spec.rollout.vllm.is_none());
}

#[test]
fn profiler_and_python_only_keys_warn() {
    let c = case(
        BASE,
        &[
            "global_profiler.tool=nsys",
            "actor_rollout_ref.model.use_liger=true",
        ],
    );
    let mut codes = c.codes();
    codes.sort();
    assert_eq!(codes, vec!["B003", "B004"]);
}

#[test]
fn bound_keys_are_the_deciding_keys() {
    let c = case(BASE, &["actor_rollout_ref.actor.use_kl_loss=true"]);
    let plan = &c.lowered.plan;
    assert!(is_bound(plan, "actor_rollout_ref.actor.strategy"));
    assert!(is_bound(
        plan,
        "actor_rollout_ref.actor.fsdp_config.mixed_precision"
    ));
    // Placement is data of the spec: an override lowers it again, no rebuild.
    assert!(!is_bound(
        plan,
        "actor_rollout_ref.actor.fsdp_config.param_offload"
    ));
    assert!(is_bound(plan, "actor_rollout_ref.ref.strategy"));
    assert!(is_bound(plan, "trainer.device"));
    assert!(!is_bound(plan, "actor_rollout_ref.actor.optim.lr"));
    assert!(!is_bound(plan, "trainer.n_gpus_per_node"));
    assert!(!is_bound(
        plan,
        "actor_rollout_ref.actor.fsdp_config.param_offload_x"
    ));
}

#[test]
fn examples_lower_without_errors() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for name in [
        "quickstart.yaml",
        "gsm8k_qwen2.5_fsdp.yaml",
        "gsm8k_qwen2.5_megatron.yaml",
    ] {
        let req = LoadRequest {
            config_file: Some(root.join(name)),
            cwd: root.clone(),
            builtin: crate::load::version::BuiltinRelease::V0_7_0,
            ..LoadRequest::default()
        };
        let checked = check(&req, &CheckOptions::default());
        let cfg = checked
            .config
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: {:#?}", checked.diagnostics));
        let lowered = lower_for_build(
            cfg,
            &checked.composed,
            algo_release(&checked.release_version),
        );
        assert!(!lowered.has_errors(), "{name}: {:#?}", lowered.diagnostics);
        assert!(lowered.plan.binding.validate().is_ok());
    }
}

#[test]
fn support_table() {
    // Every strategy × precision binds; placement is checked per role.
    assert_eq!(binding::supported().count(), 6);
    let count = |strategy, precision| {
        binding::supported_offload(Binding {
            strategy,
            precision,
        })
        .count()
    };
    // Megatron: every subset of {params, grads, optimizer}; FSDP: params and grads together,
    // and not with fp16.
    assert_eq!(count(S::Megatron, Dtype::Fp16), 8);
    assert_eq!(count(S::Fsdp, Dtype::Bf16), 4);
    assert_eq!(count(S::Fsdp, Dtype::Fp16), 2);
    let params = OffloadFlags {
        params: true,
        grads: true,
        optimizer: false,
    };
    assert!(binding::validate_offload(S::Fsdp, Dtype::Fp16, params).is_err());
    assert!(binding::validate_offload(S::Megatron, Dtype::Fp16, params).is_ok());
    let grads_alone = OffloadFlags {
        params: false,
        grads: true,
        optimizer: false,
    };
    assert!(binding::validate_offload(S::Fsdp, Dtype::Bf16, grads_alone).is_err());
}

#[test]
fn build_codes_are_unique_and_not_rule_ids() {
    let mut seen: Vec<&str> = codes::BUILD_CODES.iter().map(|(c, _)| c.0).collect();
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n);
    for r in crate::rules::RULES {
        assert!(!seen.contains(&r.code.0));
    }
}

#[test]
fn embedded_config_reloads_to_the_same_tree() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for name in [
        "quickstart.yaml",
        "gsm8k_qwen2.5_fsdp.yaml",
        "gsm8k_qwen2.5_megatron.yaml",
    ] {
        let req = LoadRequest {
            config_file: Some(root.join(name)),
            cwd: root.clone(),
            builtin: crate::load::version::BuiltinRelease::V0_7_0,
            ..LoadRequest::default()
        };
        let checked = check(&req, &CheckOptions::default());
        let text = embed::embedded_file(&checked.composed.root, "generated for a test");
        let c = case(&text, &[]);
        assert_eq!(
            c.checked.composed.root.to_json(),
            checked.composed.root.to_json(),
            "{name}"
        );
        assert_eq!(
            c.lowered.plan,
            lower(
                c.checked.config.as_ref().expect("typed"),
                &checked.composed.root,
                algo_release(&checked.release_version),
            )
            .plan,
            "{name}"
        );
    }
}

#[test]
fn every_leaf_of_every_carried_release_has_a_verdict() {
    use crate::load::version::BuiltinRelease;
    let mut missing: Vec<String> = Vec::new();
    for release in BuiltinRelease::ALL {
        for base in [compose::FSDP_BASE, compose::MEGATRON_BASE] {
            let root = compose::load(&LoadRequest {
                base: Some(base.to_owned()),
                builtin: release,
                ..LoadRequest::default()
            })
            .root;
            let leaves = verdict_report::leaves(&root, "");
            assert!(
                leaves.len() > 500,
                "{} {base}: only {} leaves",
                release.version(),
                leaves.len()
            );
            for (k, _) in &leaves {
                if k.as_str() != "defaults" && verdicts::verdict(k).is_none() {
                    missing.push(format!("{} {base}: {k}", release.version()));
                }
            }
        }
        // The leaf table holds what the two bases do not compose: the other engines'
        // sections (`model_engine=veomni`, `torchtitan`, ...).
        let Some(table) = crate::load::release_table::for_release(release.version()) else {
            continue;
        };
        for (k, _) in table.leaves() {
            if verdicts::verdict(k).is_none() {
                missing.push(format!("{} leaf table: {k}", release.version()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} leaves without a verdict: {missing:#?}",
        missing.len()
    );
}

/// `key` (set by `o`) gets B018 as a warning from `check` (verl runs it) and as an error from
/// the build (the binary cannot).
fn warned_then_refused(c: &Case, o: &str, key: &str) {
    let (in_check, in_build) = finding(c, "B018", key);
    assert!(
        in_check.is_some_and(|(s, _)| s == Severity::Warning),
        "{o}: {:#?}",
        c.checked.diagnostics
    );
    assert!(
        in_build.is_some_and(|(s, _)| s == Severity::Error),
        "{o}: {:#?}",
        c.lowered.diagnostics
    );
}

/// Severity and line of a diagnostic.
type At = Option<(Severity, usize)>;

/// `(severity, line)` of the first `code` diagnostic about `key`, in check and in build.
fn finding(c: &Case, code: &str, key: &str) -> (At, At) {
    let at = |d: &Diagnostic| {
        let o = &d.primary.as_ref()?.origin;
        Some((
            d.severity,
            c.checked
                .composed
                .sources
                .get(o.source)
                .line_col(o.span.start)
                .0,
        ))
    };
    let find = |ds: &[Diagnostic]| {
        ds.iter()
            .find(|d| d.code.0 == code && d.key_path.as_deref() == Some(key))
            .and_then(at)
    };
    (find(&c.checked.diagnostics), find(&c.lowered.diagnostics))
}

/// `rollout.over_sample_rate`, which verl's examples set, is read by no code of verl 0.7.0 to
/// 0.9.1 (a config field only): a warning that it has no effect, in check and in build.
#[test]
fn over_sample_rate_has_no_effect_in_any_release() {
    use crate::load::version::BuiltinRelease;
    let o = "actor_rollout_ref.rollout.over_sample_rate=0.1";
    let key = "actor_rollout_ref.rollout.over_sample_rate";
    for release in [BuiltinRelease::V0_7_0, BuiltinRelease::V0_9_1] {
        let c = case_on(BASE, &[o], release);
        let (in_check, in_build) = finding(&c, "B006", key);
        assert!(
            in_check.is_some_and(|(s, _)| s == Severity::Warning),
            "{:#?}",
            c.checked.diagnostics
        );
        assert!(
            in_build.is_some_and(|(s, _)| s == Severity::Warning),
            "{:#?}",
            c.lowered.diagnostics
        );
        assert!(
            !c.lowered.diagnostics.iter().any(|d| d.is_error()),
            "{:#?}",
            c.lowered.diagnostics
        );
    }
}

/// `freeze_vision_tower` is read by verl's FSDP workers only: on Megatron (verl's and
/// verlc's train the tower) setting it is a warning at its key; on FSDP it is honoured.
#[test]
fn freeze_vision_tower_has_no_effect_on_megatron() {
    let key = "actor_rollout_ref.actor.freeze_vision_tower";
    let o = [
        "actor_rollout_ref.model.path='builtin://tiny?arch=qwen2_5_vl'",
        "actor_rollout_ref.actor.freeze_vision_tower=true",
    ];
    let c = case(&megatron_fp32(), &o);
    let (in_check, in_build) = finding(&c, "B006", key);
    assert!(
        in_check.is_some_and(|(s, _)| s == Severity::Warning)
            && in_build.is_some_and(|(s, _)| s == Severity::Warning),
        "{:#?}",
        c.lowered.diagnostics
    );
    let c = case(BASE, &o);
    assert_eq!(finding(&c, "B006", key), (None, None));
}

/// Settings of verl 0.7.1 to 0.9.1 that change what training computes and that a verlc
/// trainer does not do: a warning from `check` (verl runs them), an error from `build`.
#[test]
fn newer_settings_that_change_training_are_build_errors_at_their_key() {
    use crate::load::version::BuiltinRelease;
    let megatron = megatron_fp32();
    for (yaml, o) in [
        (BASE, "actor_rollout_ref.actor.fsdp_config.qat.enable=true"),
        (BASE, "actor_rollout_ref.model.mtp.enable=true"),
        (BASE, "actor_rollout_ref.rollout.quantization=fp8"),
        (BASE, "trainer.checkpoint_callback_class=my.hooks.Upload"),
        (
            megatron.as_str(),
            "actor_rollout_ref.actor.optim.exp_avg_dtype=bf16",
        ),
        (
            megatron.as_str(),
            "actor_rollout_ref.actor.megatron.dynamic_context_parallel=true",
        ),
        (
            megatron.as_str(),
            "actor_rollout_ref.actor.megatron.use_megatron_fsdp=true",
        ),
    ] {
        let key = o.split('=').next().unwrap_or_default();
        let c = case_on(yaml, &[o], BuiltinRelease::V0_9_1);
        warned_then_refused(&c, o, key);
    }
}

#[test]
fn unsupported_settings_are_reported_at_their_line_before_any_build() {
    for (setting, key) in [
        (
            "  model:\n    path: builtin://tiny\n    lora_rank: 32\n    target_modules: (q_proj\n",
            "actor_rollout_ref.model.target_modules",
        ),
        (
            "    ulysses_sequence_parallel_size: 2\n",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        ),
        (
            "    optim:\n      optimizer: Adafactor\n",
            "actor_rollout_ref.actor.optim.optimizer",
        ),
        (
            "    policy_loss:\n      loss_mode: bypass_mode\n",
            "actor_rollout_ref.actor.policy_loss.loss_mode",
        ),
    ] {
        let yaml = if setting.starts_with("  model:") {
            BASE.replace("  model:\n    path: builtin://tiny\n", setting)
        } else {
            with_actor(setting)
        };
        let needle = setting.trim_end().lines().last().unwrap_or_default().trim();
        let line = yaml
            .lines()
            .position(|l| l.trim() == needle)
            .map_or(0, |i| i + 1);
        let c = case(&yaml, &[]);
        let (in_check, in_build) = finding(&c, "B018", key);
        assert_eq!(
            in_check,
            Some((Severity::Warning, line)),
            "{key}: {:#?}",
            c.checked.diagnostics
        );
        assert_eq!(
            in_build,
            Some((Severity::Error, line)),
            "{key}: {:#?}",
            c.lowered.diagnostics
        );
    }
    // From overrides: a logger verlc has not, a second tokenizer, a Ulysses degree the one
    // rank cannot hold; wandb (the logger verl's examples use) and a scheduler are implemented.
    for (o, key) in [
        ("trainer.logger=[console,swanlab]", "trainer.logger"),
        ("trainer.logger=[console,wandb,mlflow]", ""),
        ("data.tokenizer=other/tokenizer", "data.tokenizer"),
        (
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        ),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", ""),
    ] {
        let c = case(BASE, &[o]);
        if key.is_empty() {
            // Implemented: nothing to report.
            assert!(
                !c.codes().contains(&"B018"),
                "{o}: {:#?}",
                c.lowered.diagnostics
            );
            continue;
        }
        warned_then_refused(&c, o, key);
    }
}

/// `enable_gradient_checkpointing: false` binds into the actor's FSDP engine; with several
/// ranks `verlc check` says once what it costs (the reference runs no backward).
#[test]
fn gradient_checkpointing_binds_and_says_what_it_costs() {
    const KEY: &str = "actor_rollout_ref.model.enable_gradient_checkpointing";
    let about_key = |c: &Case| {
        c.lowered
            .diagnostics
            .iter()
            .filter(|d| d.code.0 == "B006" && d.key_path.as_deref() == Some(KEY))
            .count()
    };
    let off = format!("{KEY}=false");
    let c = case(BASE, &[&off]);
    let verlc_spec::trainer::EngineSpec::Fsdp(f) = c.lowered.plan.spec.actor.engine else {
        panic!("an FSDP actor")
    };
    assert!(!f.gradient_checkpointing);
    assert_eq!(about_key(&c), 0, "one rank: {:#?}", c.lowered.diagnostics);
    let c = case(BASE, &[&off, "trainer.n_gpus_per_node=2"]);
    assert_eq!(about_key(&c), 1, "{:#?}", c.lowered.diagnostics);
    let c = case(BASE, &["trainer.n_gpus_per_node=2"]);
    assert_eq!(
        about_key(&c),
        0,
        "verl's default: {:#?}",
        c.lowered.diagnostics
    );
}

/// `use_remove_padding` and a Ulysses degree reach the FSDP engine spec of actor, reference
/// and critic; the data-parallel size (and so the per-rank batch) is the world over Ulysses,
/// and verl's token budgets scale by it.
#[test]
fn packing_and_ulysses_lower_to_the_engine_specs() {
    use verlc_spec::trainer::EngineSpec;
    let c = case(
        BASE,
        &[
            "trainer.n_gpus_per_node=2",
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.model.use_remove_padding=true",
            "critic.model.use_remove_padding=true",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "critic.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48",
        ],
    );
    assert!(!c.codes().contains(&"B018"), "{:#?}", c.lowered.diagnostics);
    let s = &c.lowered.plan.spec;
    let critic = s.critic.as_ref().expect("a critic");
    let reference = s.reference.as_ref().expect("a reference");
    for engine in [&s.actor.engine, &critic.engine, &reference.engine] {
        let EngineSpec::Fsdp(f) = engine else {
            panic!("FSDP engines")
        };
        assert!(f.remove_padding && f.ulysses == 2, "{f:?}");
    }
    // 32 prompts × 4 samples over one data-parallel rank (2 ranks / Ulysses 2).
    assert_eq!(s.actor.update.ppo_mini_batch_size, 16 * 4);
    assert_eq!(s.actor.update.ppo_max_token_len, Some(96));
    // Packing is verl's default; switched off, verl refuses Ulysses (V020 in check).
    let c = case(
        BASE,
        &[
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.model.use_remove_padding=false",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        ],
    );
    assert!(
        c.checked
            .diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error),
        "{:#?}",
        c.checked.diagnostics
    );
}

#[test]
fn no_effect_keys_warn_only_when_changed() {
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.model.enable_activation_offload=true",
            "data.dataloader_num_workers=2",
        ],
    );
    let codes = c.codes();
    assert_eq!(
        codes.iter().filter(|c| **c == "B006").count(),
        2,
        "{:#?}",
        c.lowered.diagnostics
    );
    assert!(
        c.lowered.diagnostics.iter().all(|d| !d.is_error()),
        "{:#?}",
        c.lowered.diagnostics
    );
    // verl's defaults stay quiet, and so does a value that states what the binary does anyway
    // (no data-loader workers, which V048 asks of a config with a sampler class).
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.model.enable_activation_offload=false",
            "data.dataloader_num_workers=0",
        ],
    );
    assert!(!c.codes().contains(&"B006"), "{:#?}", c.lowered.diagnostics);
}

#[test]
fn the_spec_carries_the_batch_arithmetic_once() {
    // Deprecated global micro-batch over 2 data-parallel ranks: per rank 8 / 2 = 4 (verl).
    let c = case(
        BASE,
        &[
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
        ],
    );
    let s = &c.lowered.plan.spec;
    assert_eq!(s.actor.update.ppo_micro_batch_size, 4);
    // mini-batch in responses per rank: 16 prompts × 4 samples / 2 ranks.
    assert_eq!(s.actor.update.ppo_mini_batch_size, 32);
    assert_eq!(s.world.size(), 2);
    // FSDP1 ignores offload_policy (verl too): the spec does not offload.
    let c = case(
        BASE,
        &["actor_rollout_ref.actor.fsdp_config.offload_policy=true"],
    );
    assert!(
        matches!(c.lowered.plan.spec.actor.engine, verlc_spec::trainer::EngineSpec::Fsdp(f) if !f.param_offload && !f.optimizer_offload)
    );
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.ref.strategy=fsdp2",
            "critic.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
        ],
    );
    assert!(
        matches!(c.lowered.plan.spec.actor.engine, verlc_spec::trainer::EngineSpec::Fsdp(f) if f.param_offload && f.optimizer_offload)
    );
    // The role's grad_clip is what verl's FSDP worker clips with.
    let c = case(BASE, &["actor_rollout_ref.actor.grad_clip=0.25"]);
    assert_eq!(c.lowered.plan.spec.actor.optim.clip_grad, 0.25);
    // The spec round-trips through the JSON the binary embeds.
    let json = serde_json::to_string(&c.lowered.plan.spec).expect("serialize");
    let back: verlc_spec::TrainerSpec = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, c.lowered.plan.spec);
}

#[test]
fn reward_managers_naive_and_dapo_lower_with_their_arguments() {
    use verlc_spec::trainer::{OverlongBufferSpec, RewardManagerSpec};
    let dapo = [
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=64",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
        "+reward_model.reward_kwargs.max_resp_len=256",
    ];
    let c = case(BASE, &dapo);
    assert!(!c.codes().contains(&"B018"), "{:#?}", c.lowered.diagnostics);
    assert_eq!(
        c.lowered.plan.spec.reward_manager,
        RewardManagerSpec::Dapo {
            overlong_buffer: Some(OverlongBufferSpec {
                max_resp_len: 256.0,
                len: 64.0,
                penalty_factor: 0.5,
                log: false
            })
        }
    );
    let c = case(BASE, &["reward_manager.name=dapo"]);
    assert_eq!(
        c.lowered.plan.spec.reward_manager,
        RewardManagerSpec::Dapo {
            overlong_buffer: None
        }
    );
    // A buffer longer than the response budget, an argument the manager does not take, a
    // manager verlc does not implement: each refused at its key.
    for (extra, key) in [
        (
            "+reward_model.reward_kwargs.max_resp_len=32",
            "reward_model.reward_kwargs.max_resp_len",
        ),
        (
            "+reward_model.reward_kwargs.tokenizer_mode=x",
            "reward_model.reward_kwargs.tokenizer_mode",
        ),
    ] {
        let mut o: Vec<&str> = dapo
            .iter()
            .copied()
            .filter(|o| !o.contains("max_resp_len") || !extra.contains("max_resp_len"))
            .collect();
        o.push(extra);
        let c = case(BASE, &o);
        assert!(
            c.lowered
                .diagnostics
                .iter()
                .any(|d| d.code.0 == "B018" && d.key_path.as_deref() == Some(key)),
            "{extra}: {:?}",
            c.codes()
        );
    }
    let c = case(BASE, &["+reward_model.reward_kwargs.max_resp_len=32"]);
    assert!(
        c.codes().contains(&"B018"),
        "naive takes no arguments: {:?}",
        c.codes()
    );
    // A class of the user's: its keys are read (no "no effect" warning), it runs in Python.
    let c = case(
        BASE,
        &[
            "reward_manager.source=importlib",
            "reward_manager.module.path=my_rm.py",
            "reward_manager.name=MyManager",
        ],
    );
    assert!(
        !c.codes().iter().any(|code| ["B006", "B018"].contains(code)),
        "{:#?}",
        c.lowered.diagnostics
    );
    assert!(matches!(
        &c.lowered.plan.spec.reward_manager,
        RewardManagerSpec::Python(m) if m.class.as_ref().is_some_and(|k| k.name == "MyManager")
    ));
    // verl 0.7.0's `prime` and `batch` run verl's own classes in Python, with their arguments.
    for name in ["prime", "batch"] {
        let o = format!("reward_manager.name={name}");
        let c = case(BASE, &[&o, "+reward_model.reward_kwargs.max_resp_len=32"]);
        assert!(!c.codes().contains(&"B018"), "{name}: {:?}", c.codes());
        match &c.lowered.plan.spec.reward_manager {
            RewardManagerSpec::Python(m) => {
                assert!(m.class.is_none(), "verl's registered class");
                assert_eq!(m.registered, name);
                assert!(m.kwargs.contains_key("max_resp_len"));
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn pf_ppo_lowers_with_gae_and_warns_elsewhere() {
    use verlc_spec::trainer::{PfPpoMethod, PfPpoSpec};
    let c = case(
        BASE,
        &[
            "algorithm.adv_estimator=gae",
            "algorithm.use_pf_ppo=true",
            "algorithm.pf_ppo.reweight_method=max_min",
            "critic.ppo_micro_batch_size_per_gpu=2",
        ],
    );
    assert_eq!(
        c.lowered.plan.spec.algorithm.pf_ppo,
        Some(PfPpoSpec {
            method: PfPpoMethod::MaxMin,
            weight_pow: 2.0
        })
    );
    let c = case(
        BASE,
        &["algorithm.adv_estimator=grpo", "algorithm.use_pf_ppo=true"],
    );
    assert_eq!(c.lowered.plan.spec.algorithm.pf_ppo, None);
    assert!(
        c.lowered
            .diagnostics
            .iter()
            .any(|d| d.code.0 == "B006" && d.key_path.as_deref() == Some("algorithm.use_pf_ppo")),
        "{:?}",
        c.codes()
    );
}

#[test]
fn rollout_correction_lowers_in_decoupled_mode() {
    use verlc_spec::trainer::{IsLevel, RsLevel};
    let on = ["actor_rollout_ref.rollout.calculate_log_probs=true"];
    let c = case(
        BASE,
        &[
            on[0],
            "algorithm.rollout_correction.rollout_is=sequence",
            "algorithm.rollout_correction.rollout_rs=geometric",
            "algorithm.rollout_correction.rollout_rs_threshold=1.2",
        ],
    );
    let rc = c
        .lowered
        .plan
        .spec
        .algorithm
        .rollout_correction
        .expect("rollout correction");
    assert_eq!(rc.is_level, Some(IsLevel::Sequence));
    let rs = rc.rejection.expect("rejection");
    assert_eq!((rs.level, rs.upper), (RsLevel::Geometric, 1.2));
    assert!((rs.lower - 1.0 / 1.2).abs() < 1e-12);
    // Without the rollout's log-probs verl skips it: a warning, nothing lowered.
    let c = case(BASE, &["algorithm.rollout_correction.rollout_is=token"]);
    assert!(c.lowered.plan.spec.algorithm.rollout_correction.is_none());
    assert!(c.codes().contains(&"B006"), "{:?}", c.codes());
    // Bypass mode: the actor's loss, not a batch step.
    let c = case(
        BASE,
        &[
            on[0],
            "algorithm.rollout_correction.bypass_mode=true",
            "algorithm.rollout_correction.loss_type=reinforce",
            "algorithm.rollout_correction.rollout_is=token",
        ],
    );
    let spec = &c.lowered.plan.spec;
    assert!(spec.algorithm.rollout_correction.is_none());
    let b = spec.actor.update.bypass.clone().expect("bypass");
    assert_eq!(b.loss, verlc_spec::trainer::BypassLoss::Reinforce);
    assert_eq!(b.correction.is_level, Some(IsLevel::Token));
    // What verl raises on: refused at the key.
    for (o, key, log_probs) in [
        (
            "algorithm.rollout_correction.rollout_rs=token",
            "algorithm.rollout_correction.rollout_rs",
            true,
        ),
        (
            "algorithm.rollout_correction.bypass_mode=true",
            "algorithm.rollout_correction.bypass_mode",
            false,
        ),
    ] {
        let c = if log_probs {
            case(BASE, &[on[0], o])
        } else {
            case(BASE, &[o])
        };
        assert!(
            c.lowered
                .diagnostics
                .iter()
                .any(|d| d.code.0 == "B018" && d.key_path.as_deref() == Some(key)),
            "{o}: {:?}",
            c.codes()
        );
    }
}

#[test]
fn megatron_hybrid_optimizer_offload_lowers_and_other_arguments_are_refused() {
    let yaml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/quickstart_megatron.yaml"),
    )
    .expect("example");
    let key = "actor_rollout_ref.actor.optim.override_optimizer_config";
    let c = case(
        &yaml,
        &[
            &format!("+{key}.optimizer_cpu_offload=true"),
            &format!("+{key}.optimizer_offload_fraction=0.25"),
            &format!("+{key}.use_precision_aware_optimizer=true"),
        ],
    );
    assert_eq!(c.lowered.plan.spec.actor.optim.offload_fraction, 0.25);
    assert!(!c.codes().contains(&"B018"), "{:?}", c.codes());
    let c = case(&yaml, &[&format!("+{key}.exp_avg_dtype=bf16")]);
    assert!(
        c.lowered.diagnostics.iter().any(|d| d.code.0 == "B018"
            && d.key_path.as_deref() == Some(&format!("{key}.exp_avg_dtype"))),
        "{:?}",
        c.codes()
    );
    // FSDP hands them to torch.optim's constructor: refused.
    let c = case(BASE, &[&format!("+{key}.optimizer_cpu_offload=true")]);
    assert_eq!(c.lowered.plan.spec.actor.optim.offload_fraction, 0.0);
    assert!(c.codes().contains(&"B018"), "{:?}", c.codes());
}

#[test]
fn model_config_overrides_lower_for_the_keys_the_loader_applies() {
    let c = case(
        BASE,
        &["+actor_rollout_ref.model.override_config.max_position_embeddings=4096"],
    );
    assert_eq!(
        c.lowered
            .plan
            .spec
            .actor
            .config_overrides
            .get("max_position_embeddings"),
        Some(&serde_json::json!(4096))
    );
    assert!(!c.codes().contains(&"B018"), "{:?}", c.codes());
    let c = case(
        BASE,
        &["+actor_rollout_ref.model.override_config.attn_implementation=eager"],
    );
    assert!(
        c.lowered.diagnostics.iter().any(|d| d.code.0 == "B018"
            && d.key_path.as_deref()
                == Some("actor_rollout_ref.model.override_config.attn_implementation")),
        "{:?}",
        c.codes()
    );
}

/// `dir/name` holding the `config.json` of a small decoder of `model_type`, with `keys` (more
/// JSON members, `"k": v, ...`) added.
fn small_checkpoint(dir: &Path, name: &str, model_type: &str, keys: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).expect("temp dir");
    let extra = if keys.is_empty() {
        String::new()
    } else {
        format!(", {keys}")
    };
    std::fs::write(
        d.join("config.json"),
        format!(
            r#"{{"model_type": "{model_type}", "hidden_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300{extra}}}"#
        ),
    )
    .expect("config");
    d
}

/// A trained model whose config sets a dropout (Seed-OSS's config class defaults both to 0.1)
/// is refused at its key, as a checkpoint and as smoke's stand-in of it, with the override
/// that turns it off in the help; with that override (which lowers without B018) nothing is
/// refused. Gemma is not refused.
#[test]
fn dropout_in_a_trained_model_is_refused_until_overridden_to_zero() {
    let dir = std::env::temp_dir().join(format!("verlc-plan-dropout-{}", std::process::id()));
    let (seed, gemma) = (
        small_checkpoint(&dir, "seed", "seed_oss", ""),
        small_checkpoint(&dir, "gemma", "gemma", ""),
    );
    let env = verlc_hub::HubEnv::from_env();
    let off = [
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "+actor_rollout_ref.model.override_config.residual_dropout=0.0",
    ];
    let checkpoint = format!("actor_rollout_ref.model.path={}", seed.display());
    let stand_in = format!(
        "actor_rollout_ref.model.path='builtin://scaled?from={}'",
        seed.display()
    );
    let gemma = format!("actor_rollout_ref.model.path={}", gemma.display());
    let half = [checkpoint.as_str(), off[0]];
    let whole = [checkpoint.as_str(), off[0], off[1]];
    for (overrides, refused) in [
        (
            &[checkpoint.as_str()][..],
            &["attention_dropout", "residual_dropout"][..],
        ),
        (
            &[stand_in.as_str()][..],
            &["attention_dropout", "residual_dropout"][..],
        ),
        (&half[..], &["residual_dropout"][..]),
        (&whole[..], &[][..]),
        (&[gemma.as_str()][..], &[][..]),
    ] {
        let c = case(BASE, overrides);
        assert!(
            !c.codes().contains(&"B018"),
            "{overrides:?}: {:?}",
            c.codes()
        );
        let problems = models::model_problems(&c.lowered.plan.spec, &env);
        let dropout: Vec<_> = problems
            .iter()
            .filter(|p| p.message.contains("dropout"))
            .collect();
        if refused.is_empty() {
            assert!(dropout.is_empty(), "{overrides:?}: {dropout:#?}");
            continue;
        }
        assert_eq!(dropout.len(), 1, "{overrides:?}: {problems:#?}");
        let p = dropout[0];
        assert_eq!(p.key, "actor_rollout_ref.model.path");
        for key in refused {
            assert!(p.message.contains(&format!("{key} = 0.1")), "{}", p.message);
            assert!(
                p.help.contains(&format!(
                    "actor_rollout_ref.model.override_config.{key}=0.0"
                )),
                "{}",
                p.help
            );
        }
    }
}

/// A checkpoint whose MLP activation the trainer does not compute is refused at build, not at
/// the trainer's start: `relu` anywhere, GELU with experts; Gemma without the key takes its
/// config class's tanh-GELU, which the trainer computes.
#[test]
fn an_activation_the_trainer_lacks_is_refused_at_build() {
    let dir = std::env::temp_dir().join(format!("verlc-plan-act-{}", std::process::id()));
    let env = verlc_hub::HubEnv::from_env();
    for (name, model_type, act, refused) in [
        ("relu", "llama", Some("relu"), true),
        ("moe_gelu", "qwen3_moe", Some("gelu"), true),
        ("gelu", "llama", Some("gelu"), false),
        ("gemma", "gemma", None, false),
    ] {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("temp dir");
        let mut cfg = serde_json::json!({"model_type": model_type, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 300});
        if let Some(a) = act {
            cfg["hidden_act"] = a.into();
        }
        std::fs::write(d.join("config.json"), cfg.to_string()).expect("config");
        let model = format!("actor_rollout_ref.model.path={}", d.display());
        let c = case(BASE, &[model.as_str()]);
        let problems = models::model_problems(&c.lowered.plan.spec, &env);
        let hit = problems.iter().any(|p| p.message.contains("hidden_act"));
        assert_eq!(hit, refused, "{name}: {problems:#?}");
    }
}

/// `weight_decay_incr_style` runs as verl runs it: Megatron's scheduler with start = end =
/// weight_decay over `total_training_steps`, so the decay stays at `weight_decay`.
#[test]
fn weight_decay_incr_style_runs_as_verl_does() {
    let c = case(
        &with_actor(
            "    strategy: megatron\n    data_loader_seed: 1\n    optim:\n      weight_decay: 0.05\n      weight_decay_incr_style: linear\n",
        )
        .replace("  ref:\n", "  ref:\n    strategy: megatron\n"),
        &["critic.strategy=megatron"],
    );
    assert!(!c.codes().contains(&"B018"), "{:?}", c.codes());
    let settings = c.lowered.plan.spec.actor.optim.resolve(10);
    match settings.schedule {
        verlc_spec::optim::SchedulerSettings::Megatron(m) => {
            assert_eq!(m.wd_incr_style, verlc_spec::optim::WdIncrStyle::Linear);
            assert_eq!((m.start_wd, m.end_wd, m.wd_incr_steps), (0.05, 0.05, 10.0));
        }
        other => panic!("expected Megatron's scheduler, got {other:?}"),
    }
}

#[test]
fn multi_turn_lowers_to_the_tool_agent_loop_or_is_refused_at_its_key() {
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        ],
    );
    assert!(!c.lowered.has_errors(), "{:?}", c.codes());
    let mt = c
        .lowered
        .plan
        .spec
        .rollout
        .multi_turn
        .as_ref()
        .expect("multi_turn");
    assert_eq!(mt.max_assistant_turns, 3);
    assert_eq!(mt.max_user_turns, 0, "null: no limit");
    assert_eq!(mt.tool_config_path.as_deref(), Some("tools.yaml"));
    assert_eq!(mt.tool_response_truncate_side, "middle");
    assert_eq!(mt.format, "hermes");
    // The XML format of Qwen3.5, and verl 0.7's interactions, lower.
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=qwen3_coder",
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml",
        ],
    );
    let mt = c.lowered.plan.spec.rollout.multi_turn.expect("lowered");
    assert_eq!(mt.format, "qwen3_coder");
    assert_eq!(mt.interaction_config_path.as_deref(), Some("i.yaml"));
    // Off by default: single turns, no agent loop.
    assert!(
        case(BASE, &[])
            .lowered
            .plan
            .spec
            .rollout
            .multi_turn
            .is_none()
    );
    // What the loop cannot honour is refused at its key; a left/right side says its meaning.
    let c = case(
        BASE,
        &[
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=gpt-oss",
            "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
            "actor_rollout_ref.rollout.agent.default_agent_loop=my_agent",
        ],
    );
    let keys: Vec<String> = c
        .lowered
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .filter_map(|d| d.key_path.clone())
        .collect();
    for k in [
        "actor_rollout_ref.rollout.multi_turn.format",
        "actor_rollout_ref.rollout.agent.default_agent_loop",
    ] {
        assert!(keys.iter().any(|x| x == k), "{k} not refused: {keys:?}");
    }
    assert!(
        c.lowered
            .diagnostics
            .iter()
            .any(|d| !d.is_error() && d.message.contains("keeps the end of a long tool response"))
    );
    // On Megatron: a replica that is the actor's model-parallel group lowers (TP=1, and TP=2
    // with rollout TP=2); a replica that regroups data-parallel ranks is refused.
    let yaml = megatron_fp32();
    let megatron = |tp: usize, rollout_tp: usize| {
        let o = [
            "actor_rollout_ref.rollout.multi_turn.enable=true".to_owned(),
            "trainer.n_gpus_per_node=2".to_owned(),
            format!("actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}"),
            format!("actor_rollout_ref.ref.megatron.tensor_model_parallel_size={tp}"),
            format!("actor_rollout_ref.rollout.tensor_model_parallel_size={rollout_tp}"),
        ];
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        case(&yaml, &o)
    };
    assert!(
        megatron(1, 1)
            .lowered
            .plan
            .spec
            .rollout
            .multi_turn
            .is_some()
    );
    assert!(
        megatron(2, 2)
            .lowered
            .plan
            .spec
            .rollout
            .multi_turn
            .is_some()
    );
    let c = megatron(1, 2);
    assert!(
        c.lowered.diagnostics.iter().any(|d| d.is_error()
            && d.key_path.as_deref() == Some("actor_rollout_ref.rollout.multi_turn.enable")
            && d.message.contains("one Megatron model-parallel group")),
        "{:#?}",
        c.lowered.diagnostics
    );
}

/// Megatron's router settings from `override_transformer_config`: z-loss and the
/// load-balancing loss (only with a load-balancing type; its coefficient alone warns, as verl
/// sets the type to `none`), the fp32 router; an unimplemented type and an updated expert bias
/// are refused at their keys.
#[test]
fn megatron_router_settings_lower_from_override_transformer_config() {
    use verlc_spec::trainer::EngineSpec;
    let yaml = megatron_fp32();
    let otc = "actor_rollout_ref.actor.megatron.override_transformer_config";
    let router = |c: &Case| match &c.lowered.plan.spec.actor.engine {
        EngineSpec::Megatron(m) => m.router,
        EngineSpec::Fsdp(_) => panic!("expected Megatron"),
    };
    let at = |c: &Case, code: &str, leaf: &str| {
        c.lowered
            .diagnostics
            .iter()
            .filter(|d| d.code.0 == code && d.key_path.as_deref() == Some(&format!("{otc}.{leaf}")))
            .count()
    };
    let c = case(
        &yaml,
        &[
            &format!("+{otc}.moe_z_loss_coeff=0.001"),
            &format!("+{otc}.moe_aux_loss_coeff=0.01"),
            &format!("+{otc}.moe_router_dtype=fp32"),
        ],
    );
    let r = router(&c);
    assert!(!r.load_balancing && r.fp32 && r.z_loss_coeff == 0.001);
    assert_eq!(
        at(&c, "B006", "moe_aux_loss_coeff"),
        1,
        "{:#?}",
        c.lowered.diagnostics
    );
    let c = case(
        &yaml,
        &[
            &format!("+{otc}.moe_router_load_balancing_type=aux_loss"),
            &format!("+{otc}.moe_aux_loss_coeff=0.01"),
        ],
    );
    let r = router(&c);
    assert!(r.load_balancing && r.load_balancing_coeff == Some(0.01));
    assert!(
        c.lowered.diagnostics.iter().all(|d| !d.is_error()),
        "{:#?}",
        c.lowered.diagnostics
    );
    let c = case(
        &yaml,
        &[
            &format!("+{otc}.moe_router_load_balancing_type=sinkhorn"),
            &format!("+{otc}.moe_router_enable_expert_bias=true"),
        ],
    );
    assert_eq!(at(&c, "B018", "moe_router_load_balancing_type"), 1);
    assert_eq!(at(&c, "B018", "moe_router_enable_expert_bias"), 1);
    // A bias that is never updated stays zero: accepted.
    let c = case(
        &yaml,
        &[
            &format!("+{otc}.moe_router_enable_expert_bias=true"),
            &format!("+{otc}.moe_router_bias_update_rate=0"),
        ],
    );
    assert_eq!(at(&c, "B018", "moe_router_enable_expert_bias"), 0);
}

/// verl 0.9's rejection options lower to criteria: duplicates dropped, one threshold per option
/// or one shared, `k1`'s `lower_upper` or a bare upper bound (its reciprocal the lower); what
/// verl's parser raises on is refused at the threshold or the option.
#[test]
fn rejection_options_of_verl_0_9_lower_to_criteria() {
    use verlc_spec::algo::KlKind;
    use verlc_spec::trainer::RsAggregate;
    let lower = |rs: &str, threshold: &str| {
        case(
            BASE,
            &[
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                &format!("algorithm.rollout_correction.rollout_rs='{rs}'"),
                &format!("algorithm.rollout_correction.rollout_rs_threshold='{threshold}'"),
            ],
        )
    };
    let criteria = |rs: &str, threshold: &str| {
        let c = lower(rs, threshold);
        let rc = c.lowered.plan.spec.algorithm.rollout_correction;
        rc.expect("correction").criteria
    };
    let got: Vec<_> = criteria("token_k1, seq_max_k2,token_k1", "0.6_1.6,2.5")
        .into_iter()
        .map(|c| (c.name, c.aggregate, c.estimator, c.lower, c.upper))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "token_k1".to_owned(),
                RsAggregate::Token,
                KlKind::K1,
                Some(0.6),
                1.6
            ),
            (
                "seq_max_k2".to_owned(),
                RsAggregate::SeqMax,
                KlKind::K2,
                None,
                2.5
            ),
        ]
    );
    let shared = criteria("seq_sum_k1,seq_mean_k3", "2.0");
    assert_eq!(shared[0].lower, Some(0.5));
    assert_eq!((shared[1].lower, shared[1].upper), (None, 2.0));
    let threshold = Some("algorithm.rollout_correction.rollout_rs_threshold");
    let option = Some("algorithm.rollout_correction.rollout_rs");
    for (rs, t, key) in [
        ("token_k2", "0.5_2.0", threshold),
        ("token_k1,token_k2,token_k3", "1.5,2.0", threshold),
        ("token_k1", "2.0_0.5", threshold),
        ("seq_max_k1", "2.0", option),
        ("token_kl", "2.0", option),
    ] {
        let c = lower(rs, t);
        assert!(
            c.lowered
                .diagnostics
                .iter()
                .any(|d| d.code.0 == "B018" && d.key_path.as_deref() == key),
            "{rs} {t}: {:?}",
            c.codes()
        );
    }
}

#[test]
fn expert_degrees_warn_only_for_a_dense_model() {
    let ep = [
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
    ];
    let warned = |c: &Case| {
        c.checked.diagnostics.iter().any(|d| {
            d.code == codes::BUILD_NO_EFFECT
                && d.key_path.as_deref()
                    == Some("actor_rollout_ref.actor.megatron.expert_model_parallel_size")
        })
    };
    let dense = case(&megatron_fp32(), &ep);
    assert!(warned(&dense), "{:#?}", dense.checked.diagnostics);
    let moe_path = "actor_rollout_ref.model.path='builtin://tiny?arch=qwen3_moe'";
    let moe = case(&megatron_fp32(), &[ep[0], ep[1], moe_path]);
    assert!(!warned(&moe), "{:#?}", moe.checked.diagnostics);
}

/// `verlc smoke`'s stand-in (`builtin://scaled?from=DIR`) is checked at build as a model of
/// DIR's family: a Qwen2.5-VL stand-in with a text-only critic is refused there, as the
/// checkpoint itself would be, not at the trainer's start; on FSDP (LoRA and Ulysses too,
/// beside a vision-language critic) and on Megatron (its rollout at the actor's
/// tensor-parallel size or another, beside a vision-language critic) it is not refused.
#[test]
fn a_scaled_stand_in_is_checked_as_its_sources_family() {
    let dir = std::env::temp_dir().join(format!("verlc-plan-scaled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "qwen2_5_vl", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}"#,
    )
    .expect("config");
    let model = format!(
        "actor_rollout_ref.model.path='builtin://scaled?from={}'",
        dir.display()
    );
    let env = verlc_hub::HubEnv::from_env();
    // LoRA and Ulysses are not refused for it on FSDP.
    let lora_ulysses = [
        model.as_str(),
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.use_remove_padding=true",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    ];
    // A text-only critic is refused at the actor's model (verl's critic reads the images
    // too); a vision-language critic trains beside it on either strategy.
    let critic = [
        model.as_str(),
        "algorithm.adv_estimator=gae",
        "critic.model.path='builtin://tiny'",
    ];
    let vl_critic = [
        model.as_str(),
        "algorithm.adv_estimator=gae",
        "critic.model.path='builtin://tiny?arch=qwen2_5_vl'",
    ];
    let tp2 = |rollout: &'static str| {
        [
            model.as_str(),
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
            rollout,
        ]
    };
    let same = tp2("actor_rollout_ref.rollout.tensor_model_parallel_size=2");
    let resharded = tp2("actor_rollout_ref.rollout.tensor_model_parallel_size=1");
    for (yaml, overrides, refused) in [
        (megatron_fp32(), &lora_ulysses[..1], false),
        (megatron_fp32(), &same[..], false),
        (megatron_fp32(), &resharded[..], false),
        (BASE.to_owned(), &lora_ulysses[..1], false),
        (BASE.to_owned(), &lora_ulysses[..], false),
        (BASE.to_owned(), &critic[..], true),
        (BASE.to_owned(), &vl_critic[..], false),
        (megatron_fp32(), &vl_critic[..], false),
        (megatron_fp32(), &critic[..], true),
    ] {
        let c = case(&yaml, overrides);
        let problems = models::model_problems(&c.lowered.plan.spec, &env);
        assert_eq!(
            problems.iter().any(|p| p.message.contains("Qwen2.5-VL")),
            refused,
            "{:#?}",
            problems.iter().map(|p| &p.message).collect::<Vec<_>>()
        );
    }
}

/// An image-text model with the vLLM rollout or a critic: a Qwen3.5 checkpoint (trained as
/// text before verlc had its tower) trains on text prompts beside a critic, with a B022
/// warning at the model's key; with the vLLM rollout its prompts' images go to the server, on
/// CPU where vLLM's Gated DeltaNet kernel serves it (bfloat16, key heads of 128; B018 at the
/// rollout's name otherwise, as for the text model); a Qwen2.5-VL checkpoint trains with the
/// vLLM rollout and beside a vision-language critic, and is refused beside a text-only critic
/// (B018: it would not see the images); with the built-in rollout neither is limited.
#[test]
fn image_text_models_with_vllm_or_a_critic_train_on_text_or_are_refused() {
    use crate::codes::{BUILD_TEXT_PROMPTS_ONLY, BUILD_UNSUPPORTED_SETTING};
    let env = verlc_hub::HubEnv::from_env();
    let vllm: &[&str] = &["actor_rollout_ref.rollout.name=vllm"];
    let vllm_bf16: &[&str] = &[
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=bfloat16",
    ];
    let vllm_fp32: &[&str] = &[
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32",
    ];
    let critic: &[&str] = &[
        "algorithm.adv_estimator=gae",
        "critic.model.path='builtin://tiny'",
    ];
    let vl_critic: &[&str] = &[
        "algorithm.adv_estimator=gae",
        "critic.model.path='builtin://tiny?arch=qwen2_5_vl'",
    ];
    let served = "qwen3_5_vl&hidden=256&heads=2";
    for (arch, extra, want, says) in [
        (
            served,
            vllm_fp32,
            Some(BUILD_UNSUPPORTED_SETTING),
            "bfloat16 only",
        ),
        (
            "qwen3_5_vl",
            vllm_bf16,
            Some(BUILD_UNSUPPORTED_SETTING),
            "key heads of 128",
        ),
        (served, vllm_bf16, None, ""),
        (
            "qwen3_5_moe_vl",
            vllm_bf16,
            Some(BUILD_UNSUPPORTED_SETTING),
            "key heads of 128",
        ),
        (
            "qwen3_5_vl",
            critic,
            Some(BUILD_TEXT_PROMPTS_ONLY),
            "text prompts only",
        ),
        ("qwen2_5_vl", vllm, None, ""),
        (
            "qwen2_5_vl",
            critic,
            Some(BUILD_UNSUPPORTED_SETTING),
            "beside a text-only critic",
        ),
        ("qwen2_5_vl", vl_critic, None, ""),
        ("qwen3_5_vl", &[], None, ""),
        // The text model's layers are the same.
        (
            "qwen3_5",
            vllm,
            Some(BUILD_UNSUPPORTED_SETTING),
            "key heads of 128",
        ),
    ] {
        let model = format!("actor_rollout_ref.model.path='builtin://tiny?arch={arch}'");
        let mut overrides = vec![model.as_str()];
        overrides.extend(extra);
        let c = case(BASE, &overrides);
        let problems = models::model_problems(&c.lowered.plan.spec, &env);
        let codes: Vec<_> = problems.iter().map(|p| p.code).collect();
        assert_eq!(
            codes.first().copied(),
            want,
            "{arch} {extra:?}: {problems:#?}"
        );
        if want.is_some() {
            assert!(problems[0].message.contains(says), "{problems:#?}");
        }
        if want == Some(BUILD_TEXT_PROMPTS_ONLY) {
            assert_eq!(problems.len(), 1, "{problems:#?}");
            let d = problems[0].diagnostic(&c.checked.composed.root);
            assert_eq!(d.severity, crate::diag::Severity::Warning);
            assert_eq!(problems[0].key, "actor_rollout_ref.model.path");
        }
    }
}

/// A Qwen3-VL checkpoint on Megatron: its DeepStack layers (the first three here) may reach
/// past the first pipeline stage (the features travel with the hidden states), so two stages
/// of two layers build as one stage does.
#[test]
fn a_qwen3_vl_split_across_its_deepstack_layers_builds() {
    let dir = std::env::temp_dir().join(format!("verlc-plan-deepstack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "qwen3_vl",
            "text_config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "vocab_size": 300},
            "vision_config": {"deepstack_visual_indexes": [1, 2, 3], "out_hidden_size": 64}}"#,
    )
    .expect("config");
    let model = format!("actor_rollout_ref.model.path='{}'", dir.display());
    let env = verlc_hub::HubEnv::from_env();
    let pp2 = [
        model.as_str(),
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    ];
    for overrides in [&pp2[..1], &pp2[..]] {
        let c = case(&megatron_fp32(), overrides);
        let problems = models::model_problems(&c.lowered.plan.spec, &env);
        assert!(
            problems.is_empty(),
            "{:#?}",
            problems.iter().map(|p| &p.message).collect::<Vec<_>>()
        );
    }
}

/// Megatron-core settings verl's Ascend examples pass that choose kernels or how activations
/// and optimizer state are spread (sequence parallelism, the context-parallel exchange, fused
/// RMSNorm and SwiGLU): warned as having no effect, built, not refused.
#[test]
fn megatron_kernel_and_layout_overrides_have_no_effect() {
    let megatron = megatron_fp32();
    for key in [
        "sequence_parallel",
        "context_parallel_algo",
        "use_distributed_optimizer",
        "use_fused_rmsnorm",
        "use_fused_swiglu",
    ] {
        let full = format!("actor_rollout_ref.actor.megatron.override_transformer_config.{key}");
        let value = if key == "context_parallel_algo" {
            "kvallgather_cp_algo"
        } else {
            "true"
        };
        let o = format!("+{full}={value}");
        let c = case(&megatron, &[o.as_str()]);
        let (_, in_build) = finding(&c, "B006", &full);
        assert!(
            in_build.is_some_and(|(s, _)| s == Severity::Warning),
            "{o}: {:#?}",
            c.lowered.diagnostics
        );
        assert!(
            !c.lowered.diagnostics.iter().any(|d| d.is_error()),
            "{o}: {:#?}",
            c.lowered.diagnostics
        );
    }
}

/// Megatron-core settings that repeat what verlc builds anyway (RMSNorm, SwiGLU, the role's own
/// context-parallel size, as verl's Ascend Qwen3-235B example writes them) are not reported;
/// other values are refused at their key.
#[test]
fn megatron_overrides_that_state_the_model_are_quiet() {
    let megatron = megatron_fp32();
    let prefix = "actor_rollout_ref.actor.megatron";
    let cp = format!("{prefix}.context_parallel_size=2");
    let quiet = [
        format!("+{prefix}.override_transformer_config.normalization=RMSNorm"),
        format!("+{prefix}.override_transformer_config.swiglu=true"),
        format!("+{prefix}.override_transformer_config.context_parallel_size=2"),
    ];
    let mut o: Vec<&str> = quiet.iter().map(String::as_str).collect();
    o.extend(["trainer.n_gpus_per_node=2", cp.as_str()]);
    let c = case(&megatron, &o);
    for key in ["normalization", "swiglu", "context_parallel_size"] {
        let full = format!("{prefix}.override_transformer_config.{key}");
        assert!(
            !c.lowered
                .diagnostics
                .iter()
                .any(|d| d.key_path.as_deref() == Some(full.as_str())),
            "{key}: {:#?}",
            c.lowered.diagnostics
        );
    }
    let other = format!("+{prefix}.override_transformer_config.normalization=LayerNorm");
    let c = case(&megatron, &[other.as_str()]);
    let (_, in_build) = finding(
        &c,
        "B018",
        &format!("{prefix}.override_transformer_config.normalization"),
    );
    assert!(
        in_build.is_some_and(|(s, _)| s == Severity::Error),
        "{:#?}",
        c.lowered.diagnostics
    );
}

/// LoRA on a Gated DeltaNet family with `target_modules: all-linear` is refused at build (PEFT
/// adapts the DeltaNet's projections too, verlc's adapters do not yet); a list of modules is
/// not, nor `all-linear` on a family without those layers.
#[test]
fn all_linear_lora_on_a_gated_deltanet_model_is_refused() {
    let env = verlc_hub::HubEnv::from_env();
    for (arch, targets, refused) in [
        ("qwen3_5", None, true),
        (
            "qwen3_5",
            Some("actor_rollout_ref.model.target_modules=[q_proj,v_proj]"),
            false,
        ),
        ("qwen3_moe", None, false),
    ] {
        let model = format!("actor_rollout_ref.model.path='builtin://tiny?arch={arch}'");
        let mut overrides = vec![
            model.as_str(),
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.target_modules=all-linear",
        ];
        overrides.extend(targets);
        let c = case(BASE, &overrides);
        let problems = models::model_problems(&c.lowered.plan.spec, &env);
        assert_eq!(
            problems
                .iter()
                .any(|p| p.message.contains("Gated DeltaNet")),
            refused,
            "{arch} {targets:?}: {:#?}",
            problems.iter().map(|p| &p.message).collect::<Vec<_>>()
        );
    }
}

/// The build's model problems (messages) of `yaml` with the policy at `model` and `extra`.
fn model_messages(yaml: &str, model: &str, extra: &[&str]) -> Vec<String> {
    let env = verlc_hub::HubEnv::from_env();
    let mut overrides = vec![model];
    overrides.extend_from_slice(extra);
    let c = case(yaml, &overrides);
    models::model_problems(&c.lowered.plan.spec, &env)
        .into_iter()
        .map(|p| p.message)
        .collect()
}

/// gpt-oss trains on the FSDP engine and on Megatron with whole experts, with the built-in
/// rollout; Megatron's split experts and context parallelism, and vLLM on CPU (which verlc
/// has not run it on), are refused at build.
#[test]
fn gpt_oss_is_refused_where_its_layers_are_not_computed() {
    let model = "actor_rollout_ref.model.path='builtin://tiny?arch=gpt_oss&hidden=128&heads=4'";
    let problems = |yaml: &str, extra: &[&str]| model_messages(yaml, model, extra);
    // Megatron: whole experts only (Megatron's default splits them over TP), no context
    // parallelism.
    let tp2 = [
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    ];
    let split = problems(&megatron_fp32(), &tp2);
    assert!(
        split
            .iter()
            .any(|m| m.contains("experts split over tensor parallel 2")),
        "{split:?}"
    );
    let whole: Vec<&str> = tp2
        .iter()
        .copied()
        .chain(["actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1"])
        .collect();
    let whole = problems(&megatron_fp32(), &whole);
    assert!(whole.is_empty(), "{whole:?}");
    assert_full_attention_refusals(model, "gpt-oss");
}

/// `model`, a tiny family whose attention runs in full, trains on FSDP and is refused under
/// Megatron's context parallelism and with vLLM on CPU, each naming `family`.
fn assert_full_attention_refusals(model: &str, family: &str) {
    let problems = |yaml: &str, extra: &[&str]| model_messages(yaml, model, extra);
    assert!(problems(BASE, &[]).is_empty(), "{:?}", problems(BASE, &[]));
    let cp = problems(
        &megatron_fp32(),
        &[
            "actor_rollout_ref.actor.megatron.context_parallel_size=2",
            "trainer.n_gpus_per_node=2",
        ],
    );
    assert!(
        cp.iter().any(|m| m.contains(&format!("{family} model"))
            && m.contains("context parallel 2 is not implemented")),
        "{cp:?}"
    );
    let vllm = problems(BASE, &["actor_rollout_ref.rollout.name=vllm"]);
    assert!(
        vllm.iter()
            .any(|m| m.contains(&format!("not verified vLLM's serving of {family}"))),
        "{vllm:?}"
    );
}

/// Gemma 2's soft-capped attention is computed in full: refused under Megatron's context
/// parallelism and not sent to vLLM on CPU, trained otherwise.
#[test]
fn gemma2_is_refused_where_its_capped_attention_is_not_computed() {
    let model = "actor_rollout_ref.model.path='builtin://tiny?arch=gemma2&hidden=128&heads=4'";
    let tp2 = model_messages(
        &megatron_fp32(),
        model,
        &[
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "trainer.n_gpus_per_node=2",
        ],
    );
    assert!(tp2.is_empty(), "{tp2:?}");
    assert_full_attention_refusals(model, "Gemma 2");
}

/// A Mistral whose config sets a `sliding_window` attends within it in every layer: refused
/// under Megatron's context parallelism (and vLLM on CPU), as windowed families are; one with
/// a null window (Mistral-Nemo) is not. Likewise a Qwen2 under `use_sliding_window`.
#[test]
fn a_windowed_mistral_is_refused_where_windows_are_not_computed() {
    let dir = std::env::temp_dir().join(format!("verlc-plan-mistral-{}", std::process::id()));
    let write = |name: &str, model_type: &str, keys: &str| {
        let d = small_checkpoint(&dir, name, model_type, keys);
        format!("actor_rollout_ref.model.path={}", d.display())
    };
    let cp = [
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    ];
    let windowed = write("windowed", "mistral", r#""sliding_window": 4096"#);
    let refused = model_messages(&megatron_fp32(), &windowed, &cp);
    assert!(
        refused
            .iter()
            .any(|m| m.contains("Mistral model") && m.contains("context parallel 2")),
        "{refused:?}"
    );
    let vllm = model_messages(BASE, &windowed, &["actor_rollout_ref.rollout.name=vllm"]);
    assert!(
        vllm.iter().any(|m| m.contains("vLLM's serving of Mistral")),
        "{vllm:?}"
    );
    let nemo = write("nemo", "mistral", r#""sliding_window": null"#);
    let fine = model_messages(&megatron_fp32(), &nemo, &cp);
    assert!(fine.is_empty(), "{fine:?}");
    // `use_sliding_window`: Qwen2 windows its later layers (refused under CP like the
    // others), a Qwen3-MoE's config class does not, refused at the model's key.
    let on = r#""use_sliding_window": true, "sliding_window": 64, "max_window_layers": 1,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#;
    let qwen2 = write("qwen2", "qwen2", on);
    let refused = model_messages(&megatron_fp32(), &qwen2, &cp);
    assert!(
        refused.iter().any(|m| m.contains("context parallel 2")),
        "{refused:?}"
    );
    assert!(model_messages(BASE, &qwen2, &[]).is_empty());
    let moe = model_messages(BASE, &write("moe", "qwen3_moe", on), &[]);
    assert!(
        moe.iter().any(|m| m.contains("sets use_sliding_window")),
        "{moe:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

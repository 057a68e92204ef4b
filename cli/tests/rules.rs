//! One test per semantic rule, driven by the fixtures in `tests/fixtures/rules/`.
//!
//! For rule `Vxxx`:
//! - `Vxxx.yaml` (and any `Vxxx.<variant>.yaml`) must trigger the rule exactly as its
//!   `# expect:` lines say (key path, file and line of the primary label, severity);
//! - `Vxxx.ok.yaml` (and any `Vxxx.ok<variant>.yaml`) is a lookalike that must not trigger it.
//!
//! Each fixture is a small user config composed over verlc's built-in defaults and checked
//! with only that rule enabled. Header comments:
//! - `# overrides: a.b=1 c=d` command-line overrides;
//! - `# model: models/x.json` a model `config.json` for model-aware rules (relative to the
//!   fixture directory);
//! - `# tree: 0.9.1` composes on that verl release's own config tree (unpacked by
//!   scripts/setup into `.venv/verl-releases/`) instead of verlc's built-in one;
//! - `# expect: key=<dotted key> line=<n> [file=override:<i>|builtin:<path>] [severity=error|warning]`
//!   one expected diagnostic (`file` defaults to the fixture itself, `severity` to error).

use std::path::{Path, PathBuf};

use verlc_front::check::{CheckOptions, Checked, check};
use verlc_front::codes;
use verlc_front::diag::{Diagnostic, Severity};
use verlc_front::load::compose::LoadRequest;
use verlc_front::rules::RULES;

fn fixture_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("tests/fixtures/rules")
}

#[derive(Debug, Default)]
struct Header {
    overrides: Vec<String>,
    model: Option<PathBuf>,
    tree: Option<PathBuf>,
    expect: Vec<Expected>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Expected {
    key: String,
    file: String,
    line: usize,
    severity: String,
}

fn parse_header(path: &Path, text: &str) -> Header {
    let mut h = Header::default();
    let fixture_name = path.display().to_string();
    for line in text.lines() {
        let Some(comment) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let comment = comment.trim();
        if let Some(rest) = comment.strip_prefix("overrides:") {
            h.overrides
                .extend(rest.split_whitespace().map(String::from));
        } else if let Some(rest) = comment.strip_prefix("model:") {
            h.model = Some(fixture_dir().join(rest.trim()));
        } else if let Some(rest) = comment.strip_prefix("tree:") {
            let tree = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .join(".venv/verl-releases")
                .join(rest.trim())
                .join("verl/trainer/config");
            assert!(
                tree.is_dir(),
                "{}: no tree {} (scripts/setup)",
                path.display(),
                tree.display()
            );
            h.tree = Some(tree);
        } else if let Some(rest) = comment.strip_prefix("expect:") {
            let mut e = Expected {
                key: String::new(),
                file: fixture_name.clone(),
                line: 0,
                severity: "error".into(),
            };
            for field in rest.split_whitespace() {
                let (name, value) = field
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{fixture_name}: bad expect field `{field}`"));
                match name {
                    "key" => e.key = value.to_owned(),
                    "line" => {
                        e.line = value
                            .parse()
                            .unwrap_or_else(|_| panic!("{fixture_name}: bad line `{value}`"))
                    }
                    "severity" => e.severity = value.to_owned(),
                    "file" => {
                        e.file = if let Some(i) = value.strip_prefix("override:") {
                            format!("override #{i}")
                        } else if let Some(p) = value.strip_prefix("builtin:") {
                            format!("<verlc defaults>/{p}")
                        } else {
                            value.to_owned()
                        }
                    }
                    other => panic!("{fixture_name}: unknown expect field `{other}`"),
                }
            }
            assert!(
                !e.key.is_empty() && e.line > 0,
                "{fixture_name}: expect needs key= and line="
            );
            h.expect.push(e);
        }
    }
    h
}

fn run_fixture(path: &Path, code: &str) -> (Header, Checked) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let header = parse_header(path, &text);
    let req = LoadRequest {
        config_file: Some(path.to_path_buf()),
        config_text: None,
        config_dir: header.tree.clone(),
        config_name: None,
        base: None,
        overrides: header.overrides.clone(),
        cwd: fixture_dir(),
        builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
    };
    let opts = CheckOptions {
        model_config: header.model.clone(),
        only: vec![code.to_owned()],
    };
    let checked = check(&req, &opts);
    let blocking: Vec<&Diagnostic> = checked
        .diagnostics
        .iter()
        .filter(|d| d.is_error() && !d.code.0.starts_with('V'))
        .collect();
    assert!(
        blocking.is_empty() && checked.config.is_some(),
        "{} does not compose and validate cleanly, so no rule ran: {blocking:#?}",
        path.display()
    );
    (header, checked)
}

fn found(checked: &Checked, code: &str) -> Vec<Expected> {
    let mut v: Vec<Expected> = checked
        .diagnostics
        .iter()
        .filter(|d| d.code.0 == code)
        .map(|d| {
            let (file, line) = match &d.primary {
                Some(label) => {
                    let src = checked.composed.sources.get(label.origin.source);
                    (src.name.clone(), src.line_col(label.origin.span.start).0)
                }
                None => ("<no location>".to_owned(), 0),
            };
            let severity = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            Expected {
                key: d.key_path.clone().unwrap_or_default(),
                file,
                line,
                severity: severity.to_owned(),
            }
        })
        .collect();
    v.sort();
    v
}

/// The fixtures of one rule: (path, is an OK lookalike).
fn fixtures_of(code: &str) -> Vec<(PathBuf, bool)> {
    let mut v: Vec<(PathBuf, bool)> = std::fs::read_dir(fixture_dir())
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", fixture_dir().display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let stem = name.strip_suffix(".yaml")?;
            let rest = stem.strip_prefix(code)?;
            if rest.is_empty() {
                return Some((p, false));
            }
            let variant = rest.strip_prefix('.')?;
            Some((p, variant.starts_with("ok")))
        })
        .collect();
    v.sort();
    v
}

fn run_rule(code: &str) {
    let fixtures = fixtures_of(code);
    assert!(
        fixtures
            .iter()
            .any(|(p, ok)| !ok && p.ends_with(format!("{code}.yaml"))),
        "{code}: missing fixture {code}.yaml"
    );
    assert!(
        fixtures.iter().any(|(_, ok)| *ok),
        "{code}: missing lookalike fixture {code}.ok.yaml"
    );
    for (path, ok) in fixtures {
        let (header, checked) = run_fixture(&path, code);
        let got = found(&checked, code);
        if ok {
            assert!(
                got.is_empty(),
                "{}: the lookalike must not trigger {code}, got {got:#?}",
                path.display()
            );
            continue;
        }
        let mut want = header.expect.clone();
        want.sort();
        assert!(!want.is_empty(), "{}: no `# expect:` line", path.display());
        assert_eq!(
            got,
            want,
            "{}: {code} diagnostics differ from the fixture's expectations",
            path.display()
        );
    }
}

macro_rules! rule_tests {
    ($($name:ident => $code:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_rule($code);
            }
        )*
        const TESTED: &[&str] = &[$($code),*];
    };
}

rule_tests! {
    v001_train_batch_not_divisible_by_minimal_batch => "V001",
    v002_mini_batch_exceeds_train_batch => "V002",
    v003_mini_batch_not_divisible_by_global_micro_batch => "V003",
    v004_global_micro_batch_below_world_size => "V004",
    v005_normalized_mini_batch_is_zero => "V005",
    v006_normalized_mini_batch_not_divisible_by_micro_batch => "V006",
    v007_mini_batch_not_divisible_by_data_parallel => "V007",
    v008_micro_batch_set_twice => "V008",
    v009_micro_batch_unset => "V009",
    v010_dynamic_batching_mismatch => "V010",
    v011_engine_worker_needs_per_gpu_micro_batch => "V011",
    v012_token_budget_below_sequence_length => "V012",
    v013_megatron_shuffle_without_seed => "V013",
    v014_world_not_divisible_by_model_parallel => "V014",
    v015_world_not_divisible_by_sequence_parallel => "V015",
    v016_world_not_divisible_by_rollout_replica => "V016",
    v017_rollout_replica_not_node_aligned => "V017",
    v018_rollout_expert_parallel_mismatch => "V018",
    v019_rollout_pipeline_parallel_unsupported => "V019",
    v020_sequence_parallel_without_remove_padding => "V020",
    v021_mandatory_value_unset => "V021",
    v022_rollout_sync_mode_removed => "V022",
    v023_rollout_engine_not_registered => "V023",
    v024_validation_sampling_without_temperature => "V024",
    v025_lora_rank_above_vllm_limit => "V025",
    v026_tiled_mlp_without_fsdp2 => "V026",
    v027_adaptive_kl_horizon_not_positive => "V027",
    v028_pass_at_k_with_single_response => "V028",
    v029_rejection_sampling_option_unknown => "V029",
    v030_rejection_sampling_threshold_invalid => "V030",
    v031_optimizer_name_unknown => "V031",
    v032_reward_manager_not_registered => "V032",
    v033_reward_pool_size_not_positive => "V033",
    v034_hybrid_engine_disabled => "V034",
    v035_resume_path_without_global_step => "V035",
    v036_resume_from_hdfs_unsupported => "V036",
    v037_logger_backend_unsupported => "V037",
    v038_deprecated_key_set => "V038",
    v039_mbridge_required => "V039",
    v040_ref_load_weight_mismatch => "V040",
    v041_rollout_expert_parallel_needs_node_aligned_tensor_parallel => "V041",
    v042_prometheus_needs_log_stats => "V042",
    v043_data_file_format_unsupported => "V043",
    v044_gae_without_critic => "V044",
    v045_megatron_strategy_without_engine_section => "V045",
    v046_fsdp_size_does_not_divide_world => "V046",
    v047_megatron_with_ulysses => "V047",
    v048_curriculum_sampler_with_workers => "V048",
    v049_group_baseline_with_single_response => "V049",
    v050_megatron_float32_extension => "V050",
    v051_vectorized_grpo_ignores_std_flag => "V051",
    v052_straight_through_kl_raises_in_verl => "V052",
    v053_derived_size_overflows => "V053",
    v054_dro_without_beta => "V054",
    v055_optimal_baseline_without_sum_pi_squared => "V055",
    v056_gdpo_reward_keys_invalid => "V056",
    v057_filter_groups_metric_unavailable => "V057",
    v058_value_from_later_release => "V058",
    v059_key_moved_in_newer_release => "V059",
    v060_importance_threshold_invalid => "V060",
    v061_engine_needs_engine_workers => "V061",
    v062_name_not_in_release_registry => "V062",
    v063_builtin_model_invalid => "V063",
    v064_gen_batch_size_overridden => "V064",
    v065_separate_async_layout_invalid => "V065",
    v066_remax_without_baseline_in_v1 => "V066",
    v201_tensor_parallel_does_not_divide_heads => "V201",
    v202_tensor_parallel_incompatible_with_kv_heads => "V202",
    v203_rollout_max_model_len_exceeds_model => "V203",
    v204_sequence_exceeds_model_context => "V204",
    v205_pipeline_does_not_divide_layers => "V205",
    v206_expert_parallel_does_not_divide_experts => "V206",
}

#[test]
fn every_rule_has_a_test_case() {
    let registered: Vec<&str> = RULES.iter().map(|r| r.code.0).collect();
    assert_eq!(
        registered, TESTED,
        "the test list must name every registered rule, in id order"
    );
}

#[test]
fn every_fixture_belongs_to_a_rule() {
    for entry in std::fs::read_dir(fixture_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") {
            continue;
        }
        let code = name.split('.').next().unwrap_or_default();
        assert!(
            RULES.iter().any(|r| r.code.0 == code),
            "fixture {name} names no registered rule"
        );
    }
}

#[test]
fn rule_codes_are_unique_across_all_diagnostics() {
    let mut seen: Vec<&str> = codes::LOAD_CODES.iter().map(|(c, _)| c.0).collect();
    for r in RULES {
        assert!(!seen.contains(&r.code.0), "code {} is used twice", r.code);
        seen.push(r.code.0);
    }
}

#[test]
fn extreme_values_do_not_panic() {
    let big = i64::MAX;
    let sets: &[&[String]] = &[
        &[
            format!("data.train_batch_size={big}"),
            format!("data.max_prompt_length={big}"),
            format!("data.max_response_length={big}"),
            format!("actor_rollout_ref.rollout.n={big}"),
            format!("actor_rollout_ref.actor.ppo_mini_batch_size={big}"),
            format!("actor_rollout_ref.actor.ppo_micro_batch_size={big}"),
            format!("actor_rollout_ref.actor.ppo_max_token_len_per_gpu={big}"),
            "actor_rollout_ref.actor.use_dynamic_bsz=true".to_owned(),
            format!("actor_rollout_ref.actor.ulysses_sequence_parallel_size={big}"),
            format!("actor_rollout_ref.rollout.tensor_model_parallel_size={big}"),
            format!("actor_rollout_ref.rollout.data_parallel_size={big}"),
            format!("actor_rollout_ref.rollout.max_model_len={big}"),
            format!("trainer.n_gpus_per_node={big}"),
            format!("trainer.nnodes={big}"),
        ],
        &[
            "actor_rollout_ref.actor.strategy=megatron".to_owned(),
            format!("actor_rollout_ref.actor.megatron.tensor_model_parallel_size={big}"),
            format!("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={big}"),
            format!("actor_rollout_ref.actor.megatron.context_parallel_size={big}"),
            format!("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={big}"),
            format!("data.train_batch_size={}", big - 1),
            format!("trainer.n_gpus_per_node={big}"),
        ],
    ];
    for overrides in sets {
        let mut all = vec!["actor_rollout_ref.rollout.name=vllm".to_owned()];
        all.extend(overrides.iter().cloned());
        let req = LoadRequest {
            config_file: None,
            config_text: None,
            config_dir: None,
            config_name: None,
            base: all
                .iter()
                .any(|o| o.contains("strategy=megatron"))
                .then(|| "ppo_megatron_trainer".to_owned()),
            overrides: all,
            cwd: fixture_dir(),
            builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
        };
        let opts = CheckOptions {
            model_config: Some(fixture_dir().join("models/extreme.json")),
            only: Vec::new(),
        };
        let checked = check(&req, &opts);
        assert!(
            checked.config.is_some(),
            "extreme overrides should still validate: {:#?}",
            checked.diagnostics
        );
    }
}

//! Snapshots of `verlc check --format human` for a handful of rules: the rendered message,
//! labels, notes and help exactly as a user sees them. Runs the built binary on fixtures from
//! `tests/fixtures/rules/` with only the rule under test enabled. Review changes with
//! `cargo insta review`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// Renders one fixture; paths are relative to the workspace root, and any absolute path
/// that slips through is replaced by `[ROOT]`.
fn render(fixture: &str, code: &str) -> String {
    let root = workspace_root();
    let rel = format!("tests/fixtures/rules/{fixture}");
    let text = std::fs::read_to_string(root.join(&rel))
        .unwrap_or_else(|e| panic!("cannot read {rel}: {e}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verlc"));
    cmd.current_dir(&root)
        .env("NO_COLOR", "1")
        .arg("check")
        .arg(&rel)
        // The fixtures are written for verl 0.7.0's tree (`tests/rules.rs` runs them too).
        .args(["--verl-version", "0.7.0"]);
    for line in text.lines() {
        let Some(comment) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let comment = comment.trim();
        if let Some(rest) = comment.strip_prefix("overrides:") {
            cmd.args(rest.split_whitespace());
        } else if let Some(rest) = comment.strip_prefix("model:") {
            cmd.arg("--model-config")
                .arg(format!("tests/fixtures/rules/{}", rest.trim()));
        }
    }
    cmd.args(["--only", code, "--format", "human"]);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run verlc: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let root_text = root.canonicalize().unwrap_or(root).display().to_string();
    format!(
        "exit status: {}\n{}",
        out.status.code().unwrap_or(-1),
        stderr.replace(&root_text, "[ROOT]")
    )
}

macro_rules! snapshot_tests {
    ($($name:ident => ($fixture:literal, $code:literal)),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                insta::assert_snapshot!(stringify!($name), render($fixture, $code));
            }
        )*
    };
}

snapshot_tests! {
    v001_train_batch_not_divisible_by_minimal_batch => ("V001.yaml", "V001"),
    v001_megatron => ("V001.megatron.yaml", "V001"),
    v006_normalized_mini_batch_not_divisible_by_micro_batch => ("V006.yaml", "V006"),
    v007_legacy_warning => ("V007.legacy.yaml", "V007"),
    v008_critic_mirror => ("V008.critic_mirror.yaml", "V008"),
    v009_micro_batch_unset => ("V009.yaml", "V009"),
    v012_token_budget_below_sequence_length => ("V012.yaml", "V012"),
    v014_world_not_divisible_by_model_parallel => ("V014.yaml", "V014"),
    v020_sequence_parallel_without_remove_padding => ("V020.yaml", "V020"),
    v029_rejection_sampling_option_unknown => ("V029.yaml", "V029"),
    v037_logger_backend_unsupported => ("V037.yaml", "V037"),
    v038_deprecated_key_set_override => ("V038.critic_mirror.yaml", "V038"),
    v039_mbridge_required => ("V039.yaml", "V039"),
    v043_data_file_format_unsupported => ("V043.yaml", "V043"),
    v045_megatron_strategy_without_engine_section => ("V045.yaml", "V045"),
    v046_fsdp_size_does_not_divide_world => ("V046.yaml", "V046"),
    v049_group_baseline_with_single_response => ("V049.yaml", "V049"),
    v202_tensor_parallel_incompatible_with_kv_heads => ("V202.yaml", "V202"),
    v204_sequence_exceeds_model_context => ("V204.yaml", "V204"),
    v205_pipeline_does_not_divide_layers => ("V205.yaml", "V205"),
}

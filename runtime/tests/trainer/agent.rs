//! The trainer with `rollout.multi_turn` (verl's tool agent loop) on the quickstart: the tools
//! load in their host, every rollout row runs the loop, verl's `num_turns/*` metrics and the
//! tool-use ones are logged, and the run trains. (A fresh tiny model emits no tool calls; the loop's turns,
//! parsing, tool execution and masks are tested against verl in tests/rollout/agent.rs.)

use verlc_runtime::trainer::parallel::MegatronRoles;

use crate::support::{quickstart, quiet, repo, scratch, series, spec_of};

#[test]
fn the_tool_agent_loop_runs_in_training() {
    let dir = scratch("agent_loop");
    let tools = repo().join("tests/fixtures/tools/local_code.py");
    let overrides = vec![
        "data.train_batch_size=8".to_owned(),
        "actor_rollout_ref.rollout.n=2".to_owned(),
        "actor_rollout_ref.actor.ppo_mini_batch_size=8".to_owned(),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8".to_owned(),
        "actor_rollout_ref.actor.ppo_epochs=1".to_owned(),
        "actor_rollout_ref.rollout.multi_turn.enable=true".to_owned(),
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent".to_owned(),
        format!(
            "++actor_rollout_ref.rollout.multi_turn.function_tool_path={}",
            tools.display()
        ),
        "trainer.total_training_steps=2".to_owned(),
        "trainer.logger=[]".to_owned(),
        "trainer.val_before_train=false".to_owned(),
        "trainer.test_freq=-1".to_owned(),
        format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
    ];
    let refs: Vec<&str> = overrides.iter().map(String::as_str).collect();
    let spec = quickstart(&refs);
    let mt = spec
        .rollout
        .multi_turn
        .as_ref()
        .expect("the agent loop is on");
    assert_eq!(mt.default_agent_loop, "tool_agent");
    let summary =
        verlc_runtime::trainer::run(&spec, &quiet()).expect("training with the agent loop");
    let turns = series(&summary.history, "num_turns/mean");
    assert_eq!(turns.len(), 2, "num_turns is logged every step");
    assert!(turns.iter().all(|&t| t >= 2.0), "{turns:?}");
    // Tool-use metrics every step: calls per sample, the share of samples that called, and the
    // share of calls that failed.
    for name in [
        "tool_calls/mean",
        "tool_calls/sample_ratio",
        "tool_calls/failure_ratio",
    ] {
        let v = series(&summary.history, name);
        assert_eq!(v.len(), 2, "{name} is logged every step");
        assert!(
            v.iter().all(|x| x.is_finite() && *x >= 0.0),
            "{name}: {v:?}"
        );
    }
    assert_eq!(series(&summary.history, "actor/pg_loss").len(), 2);
}

/// Two steps of a run whose rows all run the tool agent loop with the test tools, its
/// checkpoints under a scratch dir `name`, with `extra` overrides.
fn tool_loop_overrides(name: &str, extra: &[&str]) -> Vec<String> {
    let dir = scratch(name);
    let tools = repo().join("tests/fixtures/tools/local_code.py");
    extra
        .iter()
        .chain(&[
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            "trainer.total_training_steps=2",
            "trainer.logger=[]",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
        ])
        .map(|s| s.to_string())
        .chain([
            format!(
                "++actor_rollout_ref.rollout.multi_turn.function_tool_path={}",
                tools.display()
            ),
            format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
        ])
        .collect()
}

/// The loop on the Megatron strategy with one rank per rollout replica (tensor and pipeline
/// parallel 1): the tools run and the run trains, as on FSDP. (A replica spanning ranks is
/// refused by `verlc build`: see the plan tests.)
#[test]
fn the_tool_agent_loop_runs_with_a_megatron_actor() {
    let overrides = tool_loop_overrides(
        "agent_loop_megatron",
        &[
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        ],
    );
    let spec = spec_of("quickstart_megatron.yaml", &overrides);
    assert!(spec.rollout.multi_turn.is_some());
    let summary = verlc_runtime::trainer::run_with(&spec, &quiet(), MegatronRoles { world: None })
        .expect("training with the agent loop on Megatron");
    assert_eq!(series(&summary.history, "num_turns/mean").len(), 2);
    assert_eq!(series(&summary.history, "tool_calls/mean").len(), 2);
}

/// The loop with a vision-language policy (the pictures example's tiny Qwen2.5-VL): each
/// row's images fill its prompt's placeholders, every turn is prefilled with them at their
/// multimodal positions, and the trajectories train with positions over the whole row. The
/// actor's log-probs of the responses equal the rollout's (a turn generated, or a batch
/// trained, without the pictures would differ by far more), and the run trains.
#[test]
fn the_tool_agent_loop_runs_with_images() {
    let overrides = tool_loop_overrides(
        "agent_loop_images",
        &[
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.ppo_epochs=1",
            // The rollout's log-probs beside the actor's (verl's `training/rollout_probs_diff_*`).
            "actor_rollout_ref.rollout.calculate_log_probs=true",
        ],
    );
    let spec = spec_of("color_digits_vl.yaml", &overrides);
    assert!(spec.rollout.multi_turn.is_some());
    let summary = verlc_runtime::trainer::run(&spec, &quiet()).expect("the agent loop with images");
    assert_turns_agree_with_the_actor(&summary.history);
    let norms = series(&summary.history, "actor/grad_norm");
    assert!(norms.iter().all(|n| n.is_finite() && *n > 0.0), "{norms:?}");
}

/// Two steps of the loop ran, and the actor's probabilities of the tokens each turn generated
/// are the rollout's up to the masked placeholders' share: the rollout never samples
/// `<|image_pad|>` or `<|video_pad|>` and normalises over the other tokens, as verl's vLLM
/// rollout does, so its probability of a token is the actor's divided by `1 - m`, `m` the
/// placeholders' mass there (about 2/43 on the tiny model's vocabulary of random logits;
/// measured up to 5.4e-3 of difference). Without the mask the two agreed to 6e-8; the exact
/// agreement with images is the rollout tests' (`rollout/vllm.rs`, `model/vision.rs`). Turns
/// prefilled without the pictures do not run.
fn assert_turns_agree_with_the_actor(history: &[(u64, verlc_runtime::engine::Metrics)]) {
    assert_eq!(series(history, "num_turns/mean").len(), 2);
    let diff = series(history, "training/rollout_probs_diff_max");
    assert_eq!(diff.len(), 2, "{:?}", history.last());
    assert!(diff.iter().all(|d| *d < 2e-2), "rollout vs actor: {diff:?}");
}

/// The same loop on the Megatron strategy (one process: the rollout decodes on the module's
/// own shards, whose first stage embeds the images): the actor's log-probs equal the
/// rollout's as on FSDP.
#[test]
fn the_tool_agent_loop_runs_with_images_on_megatron() {
    let overrides = tool_loop_overrides(
        "agent_loop_images_megatron",
        &[
            "actor_rollout_ref.model.path='builtin://tiny?arch=qwen2_5_vl&layers=2&hidden=64'",
            "data.train_files='builtin://color_digits?split=train&size=64&stripes=2'",
            "data.val_files='builtin://color_digits?split=test&size=8&stripes=2'",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.ppo_epochs=1",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
        ],
    );
    let spec = spec_of("quickstart_megatron.yaml", &overrides);
    assert!(spec.rollout.multi_turn.is_some());
    let summary = verlc_runtime::trainer::run_with(&spec, &quiet(), MegatronRoles { world: None })
        .expect("the agent loop with images on Megatron");
    assert_turns_agree_with_the_actor(&summary.history);
}

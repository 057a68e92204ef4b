use super::*;

const OLD: &str = "\
# GRPO with a reward model, verl 0.7.0 layout.
defaults:
  - ppo_megatron_trainer
  - _self_

actor_rollout_ref:
  rollout:
    name: vllm   # the engine
    update_weights_bucket_megabytes: 1024
    skip_rollout: false
    n: 4

custom_reward_function:
  path: my_reward.py   # scores answers
  name: compute_score

reward_model:
  enable: true
  reward_manager: dapo
  micro_batch_size_per_gpu: 8
  model:
    path: Skywork/Skywork-Reward-Llama-3.1-8B
    trust_remote_code: false

trainer:
  use_legacy_worker_impl: auto
  total_epochs: 3
";

const NEW: &str = "\
# GRPO with a reward model, verl 0.7.0 layout.
defaults:
  - ppo_trainer
  - override /model_engine: megatron
  - _self_

actor_rollout_ref:
  rollout:
    name: vllm   # the engine
    n: 4
    checkpoint_engine:
      update_weights_bucket_megabytes: 1024

trainer:
  total_epochs: 3

# Moved by `verlc migrate` into verl 0.9.1's layout.
reward:
  custom_reward_function:
    name: compute_score
    path: my_reward.py   # scores answers
  reward_manager:
    name: dapo
  reward_model:
    enable: true
    model_path: Skywork/Skywork-Reward-Llama-3.1-8B
skip:
  rollout:
    enable: false
";

#[test]
fn a_0_7_file_becomes_0_9_with_its_comments_and_the_rest_in_place() {
    let m = migrate_file(OLD).expect("migrates");
    assert_eq!(m.text, NEW, "got:\n{}", m.text);
    assert!(m.megatron_shim);
    let moved: Vec<(&str, Option<&str>, usize)> = m
        .changes
        .iter()
        .map(|c| (c.from.as_str(), c.to.as_deref(), c.line))
        .collect();
    assert_eq!(
        moved,
        vec![
            (
                "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
                Some("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"),
                9
            ),
            (
                "actor_rollout_ref.rollout.skip_rollout",
                Some("skip.rollout.enable"),
                10
            ),
            (
                "custom_reward_function.path",
                Some("reward.custom_reward_function.path"),
                14
            ),
            (
                "custom_reward_function.name",
                Some("reward.custom_reward_function.name"),
                15
            ),
            (
                "reward_model.enable",
                Some("reward.reward_model.enable"),
                18
            ),
            (
                "reward_model.reward_manager",
                Some("reward.reward_manager.name"),
                19
            ),
            ("reward_model.micro_batch_size_per_gpu", None, 20),
            (
                "reward_model.model.path",
                Some("reward.reward_model.model_path"),
                22
            ),
            ("reward_model.model.trust_remote_code", None, 23),
            ("trainer.use_legacy_worker_impl", None, 26),
        ]
    );
    // Migrating the result changes nothing more.
    let again = migrate_file(&m.text).expect("migrates");
    assert_eq!(again.text, m.text);
    assert!(again.changes.is_empty());
}

#[test]
fn a_moved_key_lands_in_an_existing_section_or_conflicts_with_its_new_key() {
    let text = "reward:\n  num_workers: 4\ncustom_reward_function:\n  path: r.py\n";
    let m = migrate_file(text).expect("migrates");
    assert_eq!(
        m.text,
        "reward:\n  num_workers: 4\n  custom_reward_function:\n    path: r.py\n"
    );
    let clash = "reward:\n  custom_reward_function:\n    path: new.py\ncustom_reward_function:\n  path: old.py\n";
    assert_eq!(
        migrate_file(clash),
        Err(MigrateError::Conflict {
            line: 5,
            from: "custom_reward_function.path".into(),
            to: "reward.custom_reward_function.path".into(),
            existing: 3,
        })
    );
}

#[test]
fn a_moved_key_in_a_flow_mapping_is_an_error_naming_its_line() {
    let text = "trainer:\n  total_epochs: 1\nreward_model: {enable: true}\n";
    assert_eq!(
        migrate_file(text),
        Err(MigrateError::Flow {
            line: 3,
            key: "reward_model.enable".into()
        })
    );
}

#[test]
fn overrides_move_key_by_key() {
    let (out, changes) = migrate_overrides(&[
        "reward_model.enable=true".into(),
        "+reward_model.model.path=/m".into(),
        "actor_rollout_ref.rollout.n=8".into(),
        "trainer.use_legacy_worker_impl=disable".into(),
        "~custom_reward_function.path".into(),
    ]);
    assert_eq!(
        out,
        vec![
            "reward.reward_model.enable=true",
            "+reward.reward_model.model_path=/m",
            "actor_rollout_ref.rollout.n=8",
            "~reward.custom_reward_function.path",
        ]
    );
    assert_eq!(changes.len(), 4);
    assert_eq!(changes[2].to, None);
    assert_eq!(changes[2].release, "0.8.0");
}

#[test]
fn diff_shows_changed_lines_with_context() {
    let d = diff("a\nb\nc\nd\n", "a\nb\nC\nd\ne\n");
    assert_eq!(d, "@@ -1 +1 @@\n a\n b\n-c\n+C\n d\n+e\n");
}

//! The trainer learns: GRPO on digit reversal (the quickstart, shortened) and PPO with a GAE
//! critic raise the mean score clearly.

use crate::support::{mean, quiet, scratch, series, small_grpo};

#[test]
fn grpo_quickstart_short_run_raises_the_score() {
    let dir = scratch("grpo_learns");
    let cfg = small_grpo(&dir, 30, &[]);
    let t = std::time::Instant::now();
    let summary = runtime::trainer::run(&cfg, &quiet()).expect("training runs");
    let scores = series(&summary.history, "critic/score/mean");
    eprintln!("grpo scores ({:.1}s): {scores:.3?}", t.elapsed().as_secs_f64());
    assert_eq!(scores.len(), 30);
    let (first, last) = (mean(&scores[..5]), mean(&scores[25..]));
    assert!(last > first + 0.15, "no clear rise: first 5 steps {first:.3}, last 5 {last:.3}");
}

#[test]
fn ppo_with_a_gae_critic_learns() {
    let dir = scratch("ppo_learns");
    let cfg = small_grpo(&dir, 30, &[
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.rollout.n=1",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "critic.ppo_mini_batch_size=8",
        "critic.ppo_micro_batch_size_per_gpu=8",
        "critic.optim.lr=1e-3",
        "critic.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2'",
    ]);
    let summary = runtime::trainer::run(&cfg, &quiet()).expect("training runs");
    let scores = series(&summary.history, "critic/score/mean");
    let vf = series(&summary.history, "critic/vf_loss");
    eprintln!("ppo scores: {scores:.3?}\nvf_loss: {vf:.4?}");
    assert_eq!(vf.len(), 30, "the critic is updated every step");
    let (first, last) = (mean(&scores[..5]), mean(&scores[25..]));
    assert!(last > first + 0.1, "no clear rise: first 5 steps {first:.3}, last 5 {last:.3}");
}

//! verl 0.9's `colocate_async` trainer: the replay-buffer loop with a rollout thread beside the
//! trainer. On policy (threshold 1, `wait`, no warm-up) it is the synchronous trainer's run step
//! for step; with a bound and warm-up, no trained group is older than the bound allows, and the
//! staleness metrics say how old they were.

use runtime::engine::Metrics;
use verlc::load::version::BuiltinRelease;

use crate::support::{quiet, scratch, series, small_grpo_on};

const ASYNC: &str = "trainer.v1.trainer_mode=colocate_async";

fn run(tag: &str, steps: u64, extra: &[&str]) -> Vec<(u64, Metrics)> {
    let dir = scratch(tag);
    let mut o = vec!["actor_rollout_ref.rollout.n=4"];
    o.extend_from_slice(extra);
    let cfg = small_grpo_on(&dir, steps, &o, BuiltinRelease::V0_9_1);
    runtime::trainer::run(&cfg, &quiet())
        .expect("training runs")
        .history
}

#[test]
fn colocate_async_on_policy_is_the_synchronous_run() {
    let on_policy = [
        ASYNC,
        "trainer.v1.colocate_async.num_warmup_batches=0",
        "trainer.v1.sampler.max_off_policy_threshold=1",
        "trainer.v1.sampler.max_off_policy_strategy=wait",
    ];
    let steps = 4;
    let sync = run("async_sync", steps, &[]);
    let colocated = run("async_on_policy", steps, &on_policy);
    for key in [
        "critic/score/mean",
        "actor/pg_loss",
        "actor/grad_norm",
        "response_length/mean",
    ] {
        let (a, b) = (series(&sync, key), series(&colocated, key));
        assert_eq!(a.len(), steps as usize, "{key}");
        assert_eq!(a, b, "{key}: sync vs colocate_async on policy");
    }
    let staleness = series(&colocated, "training/off_policy/trajectory_staleness/max");
    assert_eq!(staleness, vec![0.0; steps as usize]);
}

#[test]
fn colocate_async_trains_nothing_older_than_the_bound() {
    let k = 2;
    let threshold = format!("trainer.v1.sampler.max_off_policy_threshold={k}");
    let steps = 6;
    let h = run(
        "async_bound",
        steps,
        &[
            ASYNC,
            "trainer.v1.colocate_async.num_warmup_batches=2",
            &threshold,
            "trainer.v1.sampler.max_off_policy_strategy=drop",
        ],
    );
    let staleness = series(&h, "training/off_policy/trajectory_staleness/max");
    eprintln!("staleness {staleness:?}");
    for (step, m) in &h {
        eprintln!(
            "{step}: {:?}",
            m.iter()
                .filter(|(k, _)| k.contains("off_policy")
                    || k.contains("replay")
                    || k.contains("timing_s/gen")
                    || k.contains("async"))
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(staleness.len(), steps as usize);
    assert!(
        staleness.iter().all(|&s| s <= (k - 1) as f64),
        "{staleness:?}"
    );
    assert!(
        staleness.iter().any(|&s| s > 0.0),
        "warm-up makes some groups older: {staleness:?}"
    );
}

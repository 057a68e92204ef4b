//! The asynchronous trainers' replay buffer against verl 0.9.1's own `ReplayBufferAsync`:
//! tests/oracle/replay_oracle.py runs verl's class on seeded schedules (groups queued per step and
//! as warm-up, a simulated rollout finishing or failing them while the sampler waits, refills) for
//! every threshold (1, 2, 3, none) and strategy (drop, wait), and with DAPO's group filter, and
//! records every event; verlc's buffer replays the same events and must evict, refill, wait and
//! select exactly as verl did, with the same metrics.

use std::collections::VecDeque;
use std::path::Path;

use serde_json::Value;
use verlc_runtime::engine::Metrics;
use verlc_runtime::trainer::replay::{Feed, OffPolicyBound, OffPolicyStrategy, ReplayBuffer};

fn schedules() -> Vec<Value> {
    let out = crate::common::temp_dir("replay_oracle");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/replay_oracle.py");
    let status = crate::common::python::run_script(&crate::common::python(), &script, &[&out], &[]);
    assert!(status.success(), "replay buffer oracle failed: {status}");
    let text = std::fs::read_to_string(out.join("replay.json")).expect("replay.json");
    serde_json::from_str(&text).expect("json")
}

/// One recorded event: groups queued (at the step verl tagged them with), or the rollout's
/// progress (groups finished or failed).
fn apply(b: &mut ReplayBuffer<()>, e: &Value) {
    match e["op"].as_str() {
        Some("submit") => {
            let step = e["step"].as_u64().unwrap();
            for _ in 0..e["count"].as_u64().unwrap() {
                b.submit(step);
            }
        }
        Some("progress") => {
            for d in e["done"].as_array().unwrap() {
                let uid = d[1].as_u64().unwrap();
                let ok = match d[0].as_str() {
                    Some("finish") => b.finish(uid, ()),
                    _ => b.fail(uid),
                };
                assert!(ok, "group {uid} was not in flight: {e}");
                // DAPO's classification: every response's metric the same.
                if let Some(values) = d.get(2).and_then(Value::as_array) {
                    let first = values.first().and_then(Value::as_f64);
                    if values.len() > 1 && values.iter().all(|v| v.as_f64() == first) {
                        assert!(b.filter(uid));
                    }
                }
            }
        }
        other => panic!("unexpected event {other:?}"),
    }
}

/// Replays what verl's sampler did while it sampled: its refills and its waits, in order.
struct Replay {
    step: u64,
    inner: VecDeque<Value>,
}

impl Feed<()> for Replay {
    fn refill(&mut self, b: &mut ReplayBuffer<()>, count: usize) -> Result<(), String> {
        let e = self.inner.pop_front().ok_or("verl did not refill here")?;
        if e["op"] != "submit" || e["count"].as_u64() != Some(count as u64) {
            return Err(format!("refilled {count}; verl did {e}"));
        }
        if e["step"].as_u64() != Some(self.step) {
            return Err(format!("refilled at step {}; verl did {e}", self.step));
        }
        apply(b, &e);
        Ok(())
    }
    fn wait(&mut self, b: &mut ReplayBuffer<()>) -> Result<(), String> {
        let e = self.inner.pop_front().ok_or("verl did not wait here")?;
        if e["op"] != "progress" {
            return Err(format!("waited; verl did {e}"));
        }
        apply(b, &e);
        Ok(())
    }
}

#[test]
fn replay_buffer_evicts_waits_and_selects_as_verl_0_9_1() {
    let cases = schedules();
    assert_eq!(cases.len(), 28);
    let (mut stale, mut filtered, mut waits, mut refills) = (0.0, 0.0, 0, 0);
    for case in &cases {
        let bound = OffPolicyBound {
            threshold: case["threshold"].as_u64(),
            strategy: match case["strategy"].as_str() {
                Some("wait") => OffPolicyStrategy::Wait,
                _ => OffPolicyStrategy::Drop,
            },
        };
        let label = format!("seed {} {:?}", case["seed"], bound);
        let mut b = ReplayBuffer::new(bound);
        for e in case["events"].as_array().unwrap() {
            if e["op"] != "sample" {
                apply(&mut b, e);
                continue;
            }
            let step = e["step"].as_u64().unwrap();
            let inner: VecDeque<Value> = e["inner"].as_array().unwrap().iter().cloned().collect();
            waits += inner.iter().filter(|e| e["op"] == "progress").count();
            refills += inner.iter().filter(|e| e["op"] == "submit").count();
            let mut feed = Replay { step, inner };
            let mut m = Metrics::new();
            let batch = e["batch"].as_u64().unwrap() as usize;
            let got = b
                .sample(step, batch, &mut feed, &mut m)
                .unwrap_or_else(|err| panic!("{label} step {step}: {err}"));
            assert!(
                feed.inner.is_empty(),
                "{label} step {step}: verl went on: {:?}",
                feed.inner
            );
            let uids: Vec<u64> = got.iter().map(|s| s.uid).collect();
            let want: Vec<u64> = e["selected"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u.as_u64().unwrap())
                .collect();
            assert_eq!(uids, want, "{label} step {step}: selection");
            let theirs: Metrics = serde_json::from_value(e["metrics"].clone()).unwrap();
            assert_eq!(
                m.keys().collect::<Vec<_>>(),
                theirs.keys().collect::<Vec<_>>(),
                "{label} step {step}"
            );
            for (k, v) in &theirs {
                assert!(
                    (m[k] - v).abs() < 1e-12,
                    "{label} step {step}: {k} {} vs {v}",
                    m[k]
                );
            }
            stale += m
                .get("training/off_policy/evicted_samples")
                .copied()
                .unwrap_or(0.0);
            filtered += m
                .get("training/filter_groups/evicted_samples")
                .copied()
                .unwrap_or(0.0);
            // With drop, nothing trained is older than the threshold.
            if let (Some(k), OffPolicyStrategy::Drop) = (bound.threshold, bound.strategy) {
                assert!(
                    got.iter().all(|s| step + 1 - s.submitted <= k),
                    "{label} step {step}"
                );
            }
        }
    }
    // The schedules exercise what they are for.
    assert!(
        stale >= 10.0 && filtered >= 50.0 && waits >= 50 && refills >= 20,
        "{stale} {filtered} {waits} {refills}"
    );
}

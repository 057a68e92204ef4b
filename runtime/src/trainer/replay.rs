//! The replay buffer of verl 0.9's asynchronous trainers (`ReplayBufferAsync`): prompt groups
//! tagged with the step that submitted them, generated in the background, sampled oldest first.
//!
//! A group's *span* at step `g` is `g - submitted + 1`: the model versions between the policy
//! that was current when its prompt was queued and the one about to train on it.
//! `trainer.v1.sampler.max_off_policy_threshold` bounds it two ways:
//! - `drop`: finished groups whose span exceeds the threshold are evicted (and the caller
//!   queues as many fresh prompts, verl's refill), so no trained group is older;
//! - `wait`: sampling blocks while any in-flight group has reached the threshold, so it
//!   finishes and trains instead of being dropped.
//!
//! Groups whose generation failed are evicted and refilled in either mode. A null threshold
//! disables both (verl 0.9.1). The sampler works on its own state only: the trainer feeds it
//! through [`Feed`] (submitting refills, waiting for the rollout), which is also how the
//! parity test replays a schedule recorded from verl's own class.

use std::collections::BTreeMap;

use crate::engine::Metrics;

/// What happens to groups older than the threshold (`max_off_policy_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffPolicyStrategy {
    Drop,
    Wait,
}

/// `trainer.v1.sampler`: the bound on how many versions a trained group may span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffPolicyBound {
    /// `None`: no version control (verl 0.9.1's null).
    pub threshold: Option<u64>,
    pub strategy: OffPolicyStrategy,
}

/// Where a group is.
#[derive(Debug, Clone, PartialEq)]
enum State<T> {
    InFlight,
    Finished(T),
    Failed,
}

#[derive(Debug, Clone)]
struct Group<T> {
    submitted: u64,
    state: State<T>,
    /// DAPO's dynamic sampling: every response of the group scored the same.
    no_signal: bool,
}

/// A sampled group: its id, the step that queued it and what the rollout produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled<T> {
    pub uid: u64,
    pub submitted: u64,
    pub value: T,
}

/// How the buffer gets more data while it samples.
pub trait Feed<T> {
    /// Queue `count` fresh prompts at the current step (verl's `refill_fn`).
    fn refill(&mut self, buffer: &mut ReplayBuffer<T>, count: usize) -> Result<(), String>;
    /// Block until the rollout has finished (or failed) at least one more group.
    fn wait(&mut self, buffer: &mut ReplayBuffer<T>) -> Result<(), String>;
}

/// Groups keyed by a submission counter, so "oldest first" breaks ties by queue order.
#[derive(Debug)]
pub struct ReplayBuffer<T> {
    bound: OffPolicyBound,
    groups: BTreeMap<u64, Group<T>>,
    next_uid: u64,
}

impl<T> ReplayBuffer<T> {
    pub fn new(bound: OffPolicyBound) -> Self {
        ReplayBuffer {
            bound,
            groups: BTreeMap::new(),
            next_uid: 0,
        }
    }

    pub fn bound(&self) -> OffPolicyBound {
        self.bound
    }

    /// Queues a group at `step`; returns its id.
    pub fn submit(&mut self, step: u64) -> u64 {
        let uid = self.next_uid;
        self.next_uid += 1;
        self.groups.insert(
            uid,
            Group {
                submitted: step,
                state: State::InFlight,
                no_signal: false,
            },
        );
        uid
    }

    /// Records a group's result; false when the group is not in flight (evicted meanwhile).
    pub fn finish(&mut self, uid: u64, value: T) -> bool {
        match self.groups.get_mut(&uid) {
            Some(g) if matches!(g.state, State::InFlight) => {
                g.state = State::Finished(value);
                true
            }
            _ => false,
        }
    }

    /// Marks a finished group as carrying no signal (DAPO's `filter_groups`: its metric is the
    /// same for every response); the next [`ReplayBuffer::sample`] evicts and replaces it.
    pub fn filter(&mut self, uid: u64) -> bool {
        match self.groups.get_mut(&uid) {
            Some(g) if matches!(g.state, State::Finished(_)) => {
                g.no_signal = true;
                true
            }
            _ => false,
        }
    }

    /// Records that a group's generation failed.
    pub fn fail(&mut self, uid: u64) -> bool {
        match self.groups.get_mut(&uid) {
            Some(g) if matches!(g.state, State::InFlight) => {
                g.state = State::Failed;
                true
            }
            _ => false,
        }
    }

    /// True while the group is queued, generating or finished (not yet sampled or evicted).
    pub fn contains(&self, uid: u64) -> bool {
        self.groups.contains_key(&uid)
    }

    /// Groups queued or generating.
    pub fn in_flight(&self) -> usize {
        self.count(|s| matches!(s, State::InFlight))
    }

    /// Groups generated and not yet trained on.
    pub fn finished(&self) -> usize {
        self.count(|s| matches!(s, State::Finished(_)))
    }

    fn count(&self, f: impl Fn(&State<T>) -> bool) -> usize {
        self.groups.values().filter(|g| f(&g.state)).count()
    }

    /// Every group, as `(uid, step it was queued)`, in queue order (checkpoints).
    pub fn queued(&self) -> Vec<(u64, u64)> {
        self.groups.iter().map(|(&u, g)| (u, g.submitted)).collect()
    }

    fn span(step: u64, submitted: u64) -> u64 {
        (step + 1).saturating_sub(submitted)
    }

    /// Finished groups past the threshold under `drop`.
    fn stale(&self, step: u64) -> Vec<u64> {
        let Some(k) = self.bound.threshold else {
            return Vec::new();
        };
        if self.bound.strategy != OffPolicyStrategy::Drop {
            return Vec::new();
        }
        self.groups
            .iter()
            .filter(|(_, g)| {
                matches!(g.state, State::Finished(_)) && Self::span(step, g.submitted) > k
            })
            .map(|(&u, _)| u)
            .collect()
    }

    /// Under `wait`, true while an in-flight group has reached the threshold.
    fn must_wait(&self, step: u64) -> bool {
        match self.bound {
            OffPolicyBound {
                threshold: Some(k),
                strategy: OffPolicyStrategy::Wait,
            } => self
                .groups
                .values()
                .any(|g| matches!(g.state, State::InFlight) && Self::span(step, g.submitted) >= k),
            _ => false,
        }
    }

    /// Takes `batch_size` groups for training at `step`, oldest first: evicts stale (under
    /// `drop`), filtered (no signal) and failed groups and refills as many, waits for the rollout while too few are
    /// sampleable (or, under `wait`, while an in-flight group has reached the threshold).
    /// Adds verl's eviction metrics to `metrics`.
    pub fn sample(
        &mut self,
        step: u64,
        batch_size: usize,
        feed: &mut impl Feed<T>,
        metrics: &mut Metrics,
    ) -> Result<Vec<Sampled<T>>, String> {
        let mut evicted = Evicted::default();
        loop {
            let stale = self.stale(step);
            let failed: Vec<u64> = self
                .groups
                .iter()
                .filter(|(_, g)| matches!(g.state, State::Failed))
                .map(|(&u, _)| u)
                .collect();
            let filtered: Vec<u64> = self
                .groups
                .iter()
                .filter(|(_, g)| g.no_signal && matches!(g.state, State::Finished(_)))
                .map(|(&u, _)| u)
                .collect();
            if !stale.is_empty() || !failed.is_empty() || !filtered.is_empty() {
                for &u in &stale {
                    evicted
                        .stale_spans
                        .push(Self::span(step, self.groups[&u].submitted));
                }
                evicted.failed += failed.len();
                evicted.filtered += filtered.len();
                let mut gone = stale;
                gone.extend(failed);
                gone.extend(filtered);
                gone.sort_unstable();
                gone.dedup();
                for u in &gone {
                    self.groups.remove(u);
                }
                feed.refill(self, gone.len())?;
                continue;
            }
            if self.finished() >= batch_size && !self.must_wait(step) {
                break;
            }
            feed.wait(self)?;
        }
        evicted.report(metrics);

        let mut ready: Vec<(u64, u64)> = self
            .groups
            .iter()
            .filter(|(_, g)| matches!(g.state, State::Finished(_)))
            .map(|(&u, g)| (g.submitted, u))
            .collect();
        ready.sort_unstable();
        let mut out = Vec::with_capacity(batch_size);
        for (_, uid) in ready.into_iter().take(batch_size) {
            if let Some(Group {
                submitted,
                state: State::Finished(value),
                ..
            }) = self.groups.remove(&uid)
            {
                out.push(Sampled {
                    uid,
                    submitted,
                    value,
                });
            }
        }
        Ok(out)
    }
}

/// What one [`ReplayBuffer::sample`] evicted.
#[derive(Debug, Default)]
struct Evicted {
    stale_spans: Vec<u64>,
    failed: usize,
    filtered: usize,
}

impl Evicted {
    /// verl's names (`_evict_terminal_groups`, accumulated over the polls of one sample).
    fn report(&self, metrics: &mut Metrics) {
        if !self.stale_spans.is_empty() {
            let spans: Vec<f64> = self.stale_spans.iter().map(|&s| s as f64).collect();
            let p = "training/off_policy";
            metrics.insert(format!("{p}/evicted_samples"), spans.len() as f64);
            super::metrics::stats(&format!("{p}/evicted_samples_staleness"), &spans, metrics);
        }
        if self.filtered > 0 {
            metrics.insert(
                "training/filter_groups/evicted_samples".into(),
                self.filtered as f64,
            );
        }
        if self.failed > 0 {
            metrics.insert(
                "training/rollout_failure/evicted_samples".into(),
                self.failed as f64,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finishes in-flight groups in queue order, one per wait; refills at `step`.
    struct Fifo {
        step: u64,
        refills: Vec<usize>,
    }

    impl Feed<u64> for Fifo {
        fn refill(&mut self, b: &mut ReplayBuffer<u64>, count: usize) -> Result<(), String> {
            self.refills.push(count);
            for _ in 0..count {
                b.submit(self.step);
            }
            Ok(())
        }
        fn wait(&mut self, b: &mut ReplayBuffer<u64>) -> Result<(), String> {
            let next = b
                .groups
                .iter()
                .find(|(_, g)| matches!(g.state, State::InFlight))
                .map(|(&u, _)| u)
                .ok_or("nothing in flight")?;
            b.finish(next, next);
            Ok(())
        }
    }

    #[test]
    fn drop_never_trains_a_group_older_than_the_threshold() {
        let bound = OffPolicyBound {
            threshold: Some(2),
            strategy: OffPolicyStrategy::Drop,
        };
        let mut b = ReplayBuffer::new(bound);
        // Three batches of 2 queued at step 1; the rollout finishes all of them.
        for _ in 0..6 {
            let u = b.submit(1);
            b.finish(u, u);
        }
        let mut feed = Fifo {
            step: 1,
            refills: vec![],
        };
        let mut m = Metrics::new();
        let got = b.sample(1, 2, &mut feed, &mut m).unwrap();
        assert_eq!(got.iter().map(|s| s.uid).collect::<Vec<_>>(), vec![0, 1]);
        // At step 3 the rest spans 3 versions: evicted, refilled at step 3, then generated.
        feed.step = 3;
        let got = b.sample(3, 2, &mut feed, &mut m).unwrap();
        assert_eq!(feed.refills, vec![4]);
        assert!(got.iter().all(|s| s.submitted == 3));
        assert_eq!(m["training/off_policy/evicted_samples"], 4.0);
        assert_eq!(m["training/off_policy/evicted_samples_staleness/max"], 3.0);
    }

    #[test]
    fn wait_blocks_until_groups_at_the_threshold_finish() {
        let bound = OffPolicyBound {
            threshold: Some(1),
            strategy: OffPolicyStrategy::Wait,
        };
        let mut b = ReplayBuffer::new(bound);
        for _ in 0..4 {
            b.submit(1);
        }
        let mut feed = Fifo {
            step: 1,
            refills: vec![],
        };
        let mut m = Metrics::new();
        // Two groups are enough, but every in-flight group has span 1 = threshold: all finish.
        let got = b.sample(1, 2, &mut feed, &mut m).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(b.in_flight(), 0);
        assert_eq!(b.finished(), 2);
        assert!(m.is_empty());
    }

    #[test]
    fn failed_groups_are_replaced() {
        let bound = OffPolicyBound {
            threshold: None,
            strategy: OffPolicyStrategy::Drop,
        };
        let mut b = ReplayBuffer::new(bound);
        let a = b.submit(1);
        let c = b.submit(1);
        b.fail(a);
        b.finish(c, 7);
        let mut feed = Fifo {
            step: 1,
            refills: vec![],
        };
        let mut m = Metrics::new();
        let got = b.sample(1, 2, &mut feed, &mut m).unwrap();
        assert_eq!(feed.refills, vec![1]);
        assert_eq!(got.len(), 2);
        assert_eq!(m["training/rollout_failure/evicted_samples"], 1.0);
    }
}

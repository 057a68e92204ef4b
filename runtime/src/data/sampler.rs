//! Seeded batch sampling over a dataset with a resumable state: epoch `e` visits the indices in
//! the permutation drawn from `(seed, e)` (or in order without shuffling), `batch_size` at a
//! time; with `drop_last` the incomplete tail batch of an epoch is skipped (verl's train
//! dataloader). [`SamplerState`] is what a checkpoint stores to resume at the same batch.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

use super::DataError;

/// Everything needed to continue sampling exactly where it stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    pub len: usize,
    pub batch_size: usize,
    pub shuffle: bool,
    pub drop_last: bool,
    pub seed: u64,
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Position inside the epoch's order of the next batch.
    pub cursor: usize,
}

/// Batches of dataset indices.
#[derive(Debug, Clone)]
pub struct BatchSampler {
    state: SamplerState,
    order: Vec<usize>,
}

impl BatchSampler {
    pub fn new(
        len: usize,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<Self, DataError> {
        Self::from_state(SamplerState {
            len,
            batch_size,
            shuffle,
            drop_last,
            seed,
            epoch: 0,
            cursor: 0,
        })
    }

    /// Resumes from a saved state; `len` must still be the dataset's length.
    pub fn from_state(state: SamplerState) -> Result<Self, DataError> {
        if state.batch_size == 0 {
            return Err(DataError::State("batch_size must be positive".into()));
        }
        if state.len == 0 || (state.drop_last && state.len < state.batch_size) {
            return Err(DataError::State(format!(
                "dataset of {} samples yields no batch of {} (drop_last = {})",
                state.len, state.batch_size, state.drop_last
            )));
        }
        if state.cursor > state.len {
            return Err(DataError::State(format!(
                "cursor {} is past the dataset length {}",
                state.cursor, state.len
            )));
        }
        let order = Self::epoch_order(&state);
        Ok(BatchSampler { state, order })
    }

    /// Checks that a saved state belongs to a dataset of `len` samples.
    pub fn resume(state: SamplerState, len: usize) -> Result<Self, DataError> {
        if state.len != len {
            return Err(DataError::State(format!(
                "checkpoint was taken on a dataset of {} samples, the dataset now has {len}",
                state.len
            )));
        }
        Self::from_state(state)
    }

    fn epoch_order(s: &SamplerState) -> Vec<usize> {
        let mut order: Vec<usize> = (0..s.len).collect();
        if s.shuffle {
            Rng::derive(s.seed, s.epoch).shuffle(&mut order);
        }
        order
    }

    pub fn state(&self) -> &SamplerState {
        &self.state
    }

    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// Batches in one epoch.
    pub fn batches_per_epoch(&self) -> usize {
        let s = &self.state;
        if s.drop_last {
            s.len / s.batch_size
        } else {
            s.len.div_ceil(s.batch_size)
        }
    }

    /// The next `k` indices in the sampling order, crossing into the next epochs as needed
    /// (DAPO's refills draw prompts beyond the step's batch: verl's dataloader keeps going).
    pub fn next_prompts(&mut self, k: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(k);
        while out.len() < k {
            if self.state.cursor >= self.state.len {
                self.state.epoch += 1;
                self.state.cursor = 0;
                self.order = Self::epoch_order(&self.state);
            }
            let take = (k - out.len()).min(self.state.len - self.state.cursor);
            let start = self.state.cursor;
            out.extend_from_slice(&self.order[start..start + take]);
            self.state.cursor += take;
        }
        out
    }

    /// The next batch, moving to the next epoch (new permutation) when this one is exhausted.
    pub fn next_batch(&mut self) -> Vec<usize> {
        let s = &self.state;
        let remaining = s.len - s.cursor;
        if remaining == 0 || (s.drop_last && remaining < s.batch_size) {
            self.state.epoch += 1;
            self.state.cursor = 0;
            self.order = Self::epoch_order(&self.state);
        }
        let start = self.state.cursor;
        let end = (start + self.state.batch_size).min(self.state.len);
        self.state.cursor = end;
        self.order[start..end].to_vec()
    }
}

//! How a mini-batch is cut into micro-batches: a fixed number of rows, or verl's dynamic batch
//! size (`use_dynamic_bsz`), which forms micro-batches by token counts under a budget
//! (`*_max_token_len_per_gpu`) and balances their work, as verl 0.7.0's
//! `rearrange_micro_batches` does:
//!
//! 1. the micro-batch count is `min(rows, ceil(valid tokens / budget))`, raised to the largest
//!    count of any rank (every rank runs the same number of micro-batch steps);
//! 2. each row's work is estimated as `24576·L + L²` for `L` valid tokens (verl's
//!    `calculate_workload`) and the rows are split into that many parts of balanced work by the
//!    largest differencing method (Karmarkar–Karp, [`balanced_partitions`]), with verl's exact
//!    tie-breaking, so the parts are the ones verl forms;
//! 3. the parts are ordered by work, largest first, then the even-numbered ones reversed ahead
//!    of the odd ones (small micro-batches at both ends).
//!
//! The engines normalise every loss over the whole mini-batch, so the update does not depend on
//! how the rows are cut; only the work per micro-batch does.

use super::{Batch, EngineError};

/// How [`super::Engine`] passes cut a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MicroBatching {
    /// Consecutive chunks of this many rows.
    Rows(usize),
    /// These rows of the batch per micro-batch (every row exactly once).
    Parts(Vec<Vec<i64>>),
}

impl From<usize> for MicroBatching {
    fn from(n: usize) -> Self {
        MicroBatching::Rows(n)
    }
}

impl MicroBatching {
    /// The micro-batches of `batch`, without their shared left padding (for engines that
    /// drop it).
    pub fn cut(&self, batch: &Batch) -> Result<Vec<Batch>, EngineError> {
        self.cut_rows(batch)?
            .iter()
            .map(Batch::without_shared_left_padding)
            .collect()
    }

    /// The micro-batches of `batch` with every column.
    pub fn cut_rows(&self, batch: &Batch) -> Result<Vec<Batch>, EngineError> {
        match self {
            MicroBatching::Rows(n) => batch.split(*n),
            MicroBatching::Parts(parts) => parts.iter().map(|p| batch.select(p)).collect(),
        }
    }

    /// Puts rows computed in micro-batch order back into the batch's order (the identity for
    /// [`MicroBatching::Rows`]).
    pub fn restore(&self, rows: &tch::Tensor) -> Result<tch::Tensor, EngineError> {
        match self {
            MicroBatching::Rows(_) => Ok(rows.shallow_clone()),
            MicroBatching::Parts(parts) => {
                let order: Vec<i64> = parts.iter().flatten().copied().collect();
                let mut inverse = vec![0i64; order.len()];
                for (pos, &row) in order.iter().enumerate() {
                    let slot = usize::try_from(row)
                        .ok()
                        .and_then(|r| inverse.get_mut(r))
                        .ok_or_else(|| EngineError::Batch(format!("row {row} out of range")))?;
                    *slot = pos as i64;
                }
                let index = tch::Tensor::from_slice(&inverse).to_device(rows.device());
                Ok(rows.f_index_select(0, &index)?)
            }
        }
    }
}

/// verl's estimate of a sequence's compute (`calculate_workload`).
pub fn workload(valid_tokens: i64) -> i64 {
    24576 * valid_tokens + valid_tokens * valid_tokens
}

/// The micro-batches of dynamic batch size for rows of `valid_tokens` each under the token
/// budget `max_token_len`; `sync` raises the local micro-batch count to the largest over the
/// ranks that step together.
pub fn dynamic_parts(
    valid_tokens: &[i64],
    max_token_len: usize,
    sync: impl FnOnce(usize) -> Result<usize, EngineError>,
) -> Result<Vec<Vec<i64>>, EngineError> {
    let total: i64 = valid_tokens.iter().sum();
    let budget = max_token_len.max(1) as i64;
    let wanted = valid_tokens
        .len()
        .min(((total + budget - 1) / budget).max(0) as usize);
    let k = sync(wanted)?;
    if k == 0 || k > valid_tokens.len() {
        return Err(EngineError::Batch(format!(
            "dynamic batch size: {k} micro-batches for {} rows (every rank needs at least one row per micro-batch)",
            valid_tokens.len()
        )));
    }
    let work: Vec<i64> = valid_tokens.iter().map(|&l| workload(l)).collect();
    let mut parts = balanced_partitions(&work, k)?;
    let load = |p: &Vec<i64>| p.iter().map(|&i| work[i as usize]).sum::<i64>();
    // Largest work first (ties: the larger first row), stable as Python's sort.
    parts.sort_by(|a, b| {
        (load(b), b.first().copied().unwrap_or(0)).cmp(&(load(a), a.first().copied().unwrap_or(0)))
    });
    let mut even: Vec<Vec<i64>> = parts.iter().step_by(2).cloned().collect();
    even.reverse();
    even.extend(parts.iter().skip(1).step_by(2).cloned());
    Ok(even)
}

/// One set of a partial partition: its sum and its (index, value) items in insertion order.
#[derive(Debug, Clone, Default)]
struct Set {
    sum: i64,
    items: Vec<(i64, i64)>,
}

impl Set {
    /// Python's `Set.__lt__` of verl: by sum, then item count, then the item lists.
    fn lt(&self, o: &Set) -> bool {
        if self.sum != o.sum {
            return self.sum < o.sum;
        }
        if self.items.len() != o.items.len() {
            return self.items.len() < o.items.len();
        }
        self.items < o.items
    }
}

/// A partial k-way partition (its sets in decreasing order).
#[derive(Debug, Clone)]
struct State {
    sets: Vec<Set>,
}

fn sort_desc(sets: &mut [Set]) {
    // Python's stable `sorted(reverse=True)`.
    sets.sort_by(|a, b| {
        if b.lt(a) {
            std::cmp::Ordering::Less
        } else if a.lt(b) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
}

impl State {
    fn spread(&self) -> i64 {
        self.sets.first().map_or(0, |s| s.sum) - self.sets.last().map_or(0, |s| s.sum)
    }

    /// The heap order: the largest spread first, then the largest first set.
    fn lt(&self, o: &State) -> bool {
        if self.spread() != o.spread() {
            return self.spread() > o.spread();
        }
        o.sets[0].lt(&self.sets[0])
    }

    fn merge(&mut self, other: State) {
        let k = self.sets.len();
        for (i, s) in other.sets.into_iter().enumerate() {
            let mine = &mut self.sets[k - 1 - i];
            mine.sum += s.sum;
            mine.items.extend(s.items);
        }
        sort_desc(&mut self.sets);
    }
}

/// A binary min-heap that moves items exactly as Python's `heapq` does, so that states that
/// compare equal leave it in the same order as in verl. Python moves one item through a hole;
/// swapping that item along the same path ends in the same arrangement without copies.
struct PyHeap(Vec<State>);

impl PyHeap {
    /// `heapq._siftdown`: the item at `pos` rises while it is below its parent.
    fn sift_down(&mut self, start: usize, mut pos: usize) {
        while pos > start {
            let parent = (pos - 1) >> 1;
            if self.0[pos].lt(&self.0[parent]) {
                self.0.swap(pos, parent);
                pos = parent;
            } else {
                break;
            }
        }
    }

    /// `heapq._siftup`: the item at `pos` goes down to a leaf along the smaller children,
    /// then rises into place.
    fn sift_up(&mut self, mut pos: usize) {
        let (end, start) = (self.0.len(), pos);
        let mut child = 2 * pos + 1;
        while child < end {
            let right = child + 1;
            if right < end && !self.0[child].lt(&self.0[right]) {
                child = right;
            }
            self.0.swap(pos, child);
            pos = child;
            child = 2 * pos + 1;
        }
        self.sift_down(start, pos);
    }

    fn push(&mut self, s: State) {
        self.0.push(s);
        let last = self.0.len() - 1;
        self.sift_down(0, last);
    }

    fn pop(&mut self) -> Option<State> {
        let last = self.0.pop()?;
        if self.0.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.0[0], last);
        self.sift_up(0);
        Some(top)
    }
}

/// verl's `get_seqlen_balanced_partitions(values, k, equal_size=False)`: `k` parts of row
/// indices with balanced sums (largest differencing method), each sorted.
pub fn balanced_partitions(values: &[i64], k: usize) -> Result<Vec<Vec<i64>>, EngineError> {
    if k == 0 || values.len() < k {
        return Err(EngineError::Batch(format!(
            "cannot split {} rows into {k} parts",
            values.len()
        )));
    }
    let mut order: Vec<(i64, i64)> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| (v, i as i64))
        .collect();
    order.sort();
    let mut heap = PyHeap(Vec::with_capacity(order.len()));
    for (v, i) in order {
        let mut sets = vec![Set::default(); k];
        sets[0] = Set {
            sum: v,
            items: vec![(i, v)],
        };
        sort_desc(&mut sets);
        heap.push(State { sets });
    }
    while heap.0.len() > 1 {
        let (Some(mut a), Some(b)) = (heap.pop(), heap.pop()) else {
            break;
        };
        a.merge(b);
        heap.push(a);
    }
    let last = heap
        .pop()
        .ok_or_else(|| EngineError::Batch("no rows to split".into()))?;
    let mut parts: Vec<Vec<i64>> = last
        .sets
        .into_iter()
        .map(|s| {
            let mut p: Vec<i64> = s.items.into_iter().map(|(i, _)| i).collect();
            p.sort();
            p
        })
        .collect();
    if parts.iter().any(Vec::is_empty) {
        parts.retain(|p| !p.is_empty());
        return Err(EngineError::Batch(format!(
            "balanced split left a part empty ({} rows into {k})",
            values.len()
        )));
    }
    Ok(parts)
}

//! Group membership of the responses of one batch (verl's `uid`: the responses sampled for the
//! same prompt form a group).
use std::collections::HashMap;
use std::hash::Hash;

use tch::Tensor;

use super::dense::host_vec;
use crate::algo::{AlgoError, Result};

/// For each sample of a batch, the group it belongs to. Groups are numbered `0..num_groups()`
/// in order of first appearance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupIndex {
    group_of: Vec<usize>,
    members: Vec<Vec<usize>>,
}

impl GroupIndex {
    /// From any per-sample labels (uids, prompt indices …): equal labels, same group.
    pub fn from_labels<T: Hash + Eq>(labels: &[T]) -> GroupIndex {
        let mut ids: HashMap<&T, usize> = HashMap::new();
        let mut group_of = Vec::with_capacity(labels.len());
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (i, label) in labels.iter().enumerate() {
            let g = *ids.entry(label).or_insert_with(|| {
                members.push(Vec::new());
                members.len() - 1
            });
            members[g].push(i);
            group_of.push(g);
        }
        GroupIndex { group_of, members }
    }

    /// From integer ids (any values, not necessarily dense).
    pub fn from_ids(ids: &[i64]) -> GroupIndex {
        GroupIndex::from_labels(ids)
    }

    /// From a 1-D integer tensor of ids.
    pub fn from_tensor(ids: &Tensor) -> Result<GroupIndex> {
        if ids.dim() != 1 || ids.is_floating_point() {
            return Err(AlgoError::Shape {
                name: "index",
                expected: "[batch] integer ids".into(),
                got: ids.size(),
            });
        }
        let ids: Vec<i64> = host_vec(ids)?.into_iter().map(|v| v as i64).collect();
        Ok(GroupIndex::from_ids(&ids))
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.group_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.group_of.is_empty()
    }

    /// Number of groups.
    pub fn num_groups(&self) -> usize {
        self.members.len()
    }

    /// The group of sample `i`.
    pub fn group_of(&self, i: usize) -> usize {
        self.group_of[i]
    }

    /// The samples of group `g`, in batch order.
    pub fn members(&self, g: usize) -> &[usize] {
        &self.members[g]
    }

    /// Every group's samples.
    pub fn groups(&self) -> impl Iterator<Item = &[usize]> {
        self.members.iter().map(Vec::as_slice)
    }

    /// Size of the group of sample `i`.
    pub fn size_of(&self, i: usize) -> usize {
        self.members[self.group_of[i]].len()
    }

    /// Checks that there is one id per sample.
    pub(crate) fn check_len(&self, batch: i64) -> Result<()> {
        if self.len() as i64 != batch {
            return Err(AlgoError::Shape {
                name: "index",
                expected: format!("one group id per sample ({batch})"),
                got: vec![self.len() as i64],
            });
        }
        Ok(())
    }
}

//! Rank arithmetic of a TP x PP x DP job (pure, no communication), and the process groups
//! built from it.
use super::dist::{DistError, ProcessGroup, Result};

/// Ranks split into groups (each group's global ranks, increasing).
pub type Partition = Vec<Vec<usize>>;

/// A grid of `tp * pp * dp` ranks. `order` lists the dimensions from fastest- to
/// slowest-varying, like Megatron's `"tp-cp-ep-dp-pp"` (default here: `tp-dp-pp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankLayout {
    dims: Vec<(String, usize)>,
}

impl RankLayout {
    pub fn new(tp: usize, pp: usize, dp: usize) -> Result<Self> {
        Self::with_order(&[("tp", tp), ("dp", dp), ("pp", pp)])
    }

    /// Megatron's rank order `tp-cp-dp-pp` (its default `tp-cp-ep-dp-pp` without experts):
    /// TP ranks are adjacent, pipeline stages are farthest apart.
    pub fn megatron(tp: usize, cp: usize, pp: usize, dp: usize) -> Result<Self> {
        Self::with_order(&[("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)])
    }

    /// Dimensions in order, fastest first, e.g. `[("tp", 2), ("dp", 2), ("pp", 1)]`.
    pub fn with_order(dims: &[(&str, usize)]) -> Result<Self> {
        let mut seen = std::collections::HashSet::new();
        for (name, size) in dims {
            if *size == 0 {
                return Err(DistError::Invalid(format!("{name} size must be positive")));
            }
            if !seen.insert(*name) {
                return Err(DistError::Invalid(format!("dimension {name} listed twice")));
            }
        }
        Ok(RankLayout {
            dims: dims.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        })
    }

    pub fn world_size(&self) -> usize {
        self.dims.iter().map(|(_, s)| s).product()
    }

    /// Size of a dimension (1 if absent).
    pub fn size(&self, dim: &str) -> usize {
        self.dims
            .iter()
            .find(|(n, _)| n == dim)
            .map_or(1, |(_, s)| *s)
    }

    /// Coordinate of `rank` along `dim`.
    pub fn coord(&self, rank: usize, dim: &str) -> usize {
        let mut stride = 1;
        for (n, s) in &self.dims {
            if n == dim {
                return (rank / stride) % s;
            }
            stride *= s;
        }
        0
    }

    /// The rank whose coordinate along `dim` is shifted by `offset` (modulo the dimension's
    /// size, as Megatron's pipeline next/prev ranks wrap around); other coordinates are kept.
    pub fn shifted(&self, rank: usize, dim: &str, offset: isize) -> usize {
        let mut stride = 1;
        for (n, s) in &self.dims {
            if n == dim {
                let c = (rank / stride) % s;
                let shifted = (c as isize + offset).rem_euclid(*s as isize) as usize;
                return rank - c * stride + shifted * stride;
            }
            stride *= s;
        }
        rank
    }

    /// Megatron's expert layout of this grid: the expert-parallel groups (ranks that hold
    /// different experts) and the expert-data-parallel groups (ranks that hold the same ones).
    /// Megatron lays experts out over the ranks of a pipeline stage in the order
    /// `etp-ep-edp`, context parallelism folded in:
    ///
    /// - Experts split over tensor parallelism (`expert_tensor_parallel_size` = TP): the
    ///   context and data-parallel ranks of one tensor rank (`cp * dp`, context fastest) split
    ///   into `ep` expert-parallel ranks (fastest) times the rest.
    /// - Whole experts (`expert_tensor_parallel_size` 1): the tensor, context and data-parallel
    ///   ranks of a stage together (`tp * cp * dp`) split the same way, so an expert-parallel
    ///   group is `ep` consecutive ranks (the tensor group itself when `ep` = TP).
    pub fn expert_groups(&self, ep: usize, split_over_tp: bool) -> Result<(Partition, Partition)> {
        let (tp, cp, dp) = (self.size("tp"), self.size("cp"), self.size("dp"));
        let folded = if split_over_tp { cp * dp } else { tp * cp * dp };
        if ep == 0 || !folded.is_multiple_of(ep) {
            let what = if split_over_tp {
                "context x data-parallel size"
            } else {
                "tensor x context x data-parallel size"
            };
            return Err(DistError::Invalid(format!(
                "expert parallel size {ep} does not divide the {what} {folded}"
            )));
        }
        let folds = |n: &str| {
            if split_over_tp {
                matches!(n, "cp" | "dp")
            } else {
                matches!(n, "tp" | "cp" | "dp")
            }
        };
        // The folded dims are adjacent in Megatron's order: the first of them becomes
        // (ep, edp), the others go.
        let mut dims: Vec<(&str, usize)> = Vec::new();
        let mut placed = false;
        for (n, s) in &self.dims {
            if !folds(n) {
                dims.push((n.as_str(), *s));
            } else if !placed {
                dims.extend([("ep", ep), ("edp", folded / ep)]);
                placed = true;
            }
        }
        let split = RankLayout::with_order(&dims)?;
        Ok((split.groups(&["ep"])?, split.groups(&["edp"])?))
    }

    /// Megatron's embedding groups: the first and last pipeline stage of every pipeline
    /// group (they hold the input embedding and the tied output layer, whose gradients are
    /// summed over this group). One rank per group when there is a single stage.
    pub fn embedding_groups(&self) -> Result<Vec<Vec<usize>>> {
        let pp = self
            .groups(&["pp"])
            .or_else(|_| Ok::<_, DistError>((0..self.world_size()).map(|r| vec![r]).collect()))?;
        Ok(pp
            .into_iter()
            .map(|g| {
                let (first, last) = (g[0], g[g.len() - 1]);
                if first == last {
                    vec![first]
                } else {
                    vec![first, last]
                }
            })
            .collect())
    }

    /// The groups spanning the given dimensions (e.g. `&["tp"]`, or `&["tp", "pp"]` for the
    /// model-parallel group): ranks that agree on every other coordinate, each list in
    /// increasing rank order, lists ordered by their first rank.
    pub fn groups(&self, dims: &[&str]) -> Result<Vec<Vec<usize>>> {
        for d in dims {
            if !self.dims.iter().any(|(n, _)| n == d) {
                return Err(DistError::Invalid(format!("unknown dimension {d}")));
            }
        }
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut key_of = std::collections::BTreeMap::new();
        for rank in 0..self.world_size() {
            let key: Vec<usize> = self
                .dims
                .iter()
                .filter(|(n, _)| !dims.contains(&n.as_str()))
                .map(|(n, _)| self.coord(rank, n))
                .collect();
            let idx = *key_of.entry(key).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[idx].push(rank);
        }
        Ok(groups)
    }
}

/// The rollout's groups when its tensor parallel size differs from training's (see
/// [`crate::rollout::replicas`]): rank lists for `ProcessGroup::split`, each in group-rank
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutGroups {
    /// Rollout tensor-parallel groups, in rollout TP rank order.
    pub tp: Vec<Vec<usize>>,
    /// The ranks a rank exchanges prompts, outputs or weight shards with: for a smaller
    /// rollout TP, its training-TP neighbours of one rollout shard (in replica order); for a
    /// larger one, its replica's ranks of its training TP rank (in data-parallel order).
    pub peers: Vec<Vec<usize>>,
    /// True when the rollout TP is larger than training's (replicas span data-parallel ranks).
    pub join: bool,
}

impl RankLayout {
    /// The rollout groups for rollout TP `r` over this training layout (`r` ≠ training TP).
    ///
    /// - `r < t` (`k = t / r`): training TP rank `i` is rollout TP rank `i / k` of replica
    ///   `i % k`; its rollout shard is the training shards of its `k` consecutive neighbours
    ///   `i / k * k ..`, which are its peers.
    /// - `r > t` (`m = r / t`): data-parallel ranks `g * m ..` form one replica; training TP
    ///   rank `i` on its `c`-th data-parallel rank is rollout TP rank `i * m + c`, whose shard
    ///   lies inside the rank's own training shard. Its peers are the replica's ranks of TP
    ///   rank `i`.
    ///
    /// Pipeline stages keep training's: every stage is laid out the same way.
    pub fn rollout_groups(&self, r: usize) -> Result<RolloutGroups> {
        let (t, dp) = (self.size("tp"), self.size("dp"));
        if self.size("cp") != 1 {
            return Err(DistError::Invalid(
                "a rollout tensor parallel size other than training's needs context parallel 1"
                    .into(),
            ));
        }
        let join = r > t;
        if r == t || !verlc_spec::trainer::rollout_tensor_parallel_fits(r, t, dp) {
            return Err(DistError::Invalid(format!(
                "rollout tensor parallel {r} does not fit training tensor parallel {t} with data parallel {dp}: it must divide {t}, or be a multiple of it that divides {}",
                t * dp
            )));
        }
        type Groups = std::collections::BTreeMap<(usize, usize, usize), Vec<(usize, usize)>>;
        let (mut tp, mut peers) = (Groups::new(), Groups::new());
        for rank in 0..self.world_size() {
            let (i, d, s) = (
                self.coord(rank, "tp"),
                self.coord(rank, "dp"),
                self.coord(rank, "pp"),
            );
            // (group key, order in the group) for the rollout TP group and the peers.
            let ((tp_key, j), (peer_key, c)) = if join {
                let m = r / t;
                let (g, c) = (d / m, d % m);
                (((s, g, 0), i * m + c), ((s, g, i), c))
            } else {
                let k = t / r;
                let (j, c) = (i / k, i % k);
                (((s, d, c), j), ((s, d, j), c))
            };
            tp.entry(tp_key).or_default().push((j, rank));
            peers.entry(peer_key).or_default().push((c, rank));
        }
        let ordered = |groups: Groups| -> Vec<Vec<usize>> {
            let mut lists: Vec<Vec<usize>> = groups
                .into_values()
                .map(|mut g| {
                    g.sort_unstable();
                    g.into_iter().map(|(_, rank)| rank).collect()
                })
                .collect();
            lists.sort_unstable_by_key(|g| g.iter().copied().min());
            lists
        };
        Ok(RolloutGroups {
            tp: ordered(tp),
            peers: ordered(peers),
            join,
        })
    }
}

/// The groups a trainer passes to its engine and optimizer.
#[derive(Debug, Clone)]
pub struct ProcessGroups {
    pub world: ProcessGroup,
    pub tp: ProcessGroup,
    pub pp: ProcessGroup,
    pub dp: ProcessGroup,
    /// Context-parallel group (ranks splitting the same sequences; their data is the same,
    /// their gradients are summed); `None` for context parallel 1.
    pub cp: Option<ProcessGroup>,
    /// Data x context parallel (Megatron's `dp_cp` group: what the distributed optimizer
    /// shards over under context parallelism); `None` for context parallel 1.
    pub dp_cp: Option<ProcessGroup>,
    /// Model-parallel group (TP x PP): where found-inf and grad norms are reduced.
    pub mp: ProcessGroup,
    /// First and last pipeline stage (tied embedding and output layer); `None` on middle
    /// stages and when there is a single stage.
    pub embedding: Option<ProcessGroup>,
    /// Expert parallelism ([`RankLayout::expert_groups`]): the ranks that split the experts,
    /// and the ranks that hold the same experts; `None` without it.
    pub experts: Option<ExpertGroups>,
    /// Whether a mixture-of-experts model's experts are split over the tensor-parallel group
    /// (Megatron's `expert_tensor_parallel_size` = TP, the default) or whole on each rank
    /// (expert tensor parallel 1: each tensor rank routes its share of the tokens).
    pub experts_split_over_tp: bool,
    pub layout: RankLayout,
}

/// The process groups of Megatron's expert parallelism.
#[derive(Debug, Clone)]
pub struct ExpertGroups {
    /// The ranks that split the experts (each holds `experts / ep`).
    pub ep: ProcessGroup,
    /// The ranks that hold the same experts (their gradients are averaged there).
    pub expert_dp: ProcessGroup,
}

impl ProcessGroups {
    /// Creates the TP, PP, DP and TP x PP groups of `layout` over `world` (collective).
    pub fn new(world: &ProcessGroup, layout: &RankLayout) -> Result<Self> {
        Self::with_experts(world, layout, 1, true)
    }

    /// [`ProcessGroups::new`] plus the expert-parallel groups of degree `ep` (none for 1),
    /// with each expert split over the tensor-parallel group (`split_over_tp`: Megatron's
    /// `expert_tensor_parallel_size` = TP) or whole (expert tensor parallel 1); see
    /// [`RankLayout::expert_groups`].
    pub fn with_experts(
        world: &ProcessGroup,
        layout: &RankLayout,
        ep: usize,
        split_over_tp: bool,
    ) -> Result<Self> {
        if layout.world_size() != world.size() {
            return Err(DistError::Invalid(format!(
                "layout has {} ranks but the world group has {}",
                layout.world_size(),
                world.size()
            )));
        }
        let make = |dims: &[&str]| -> Result<ProcessGroup> {
            world.split(&layout.groups(dims)?)?.ok_or_else(|| {
                DistError::Invalid(format!("rank {} is in no {dims:?} group", world.rank()))
            })
        };
        let embedding = if layout.size("pp") > 1 {
            world.split(&layout.embedding_groups()?)?
        } else {
            None
        };
        let experts = if ep > 1 {
            let (ep_groups, edp_groups) = layout.expert_groups(ep, split_over_tp)?;
            let split = |groups: &[Vec<usize>], what: &str| -> Result<ProcessGroup> {
                world.split(groups)?.ok_or_else(|| {
                    DistError::Invalid(format!("rank {} is in no {what} group", world.rank()))
                })
            };
            Some(ExpertGroups {
                ep: split(&ep_groups, "expert-parallel")?,
                expert_dp: split(&edp_groups, "expert-data-parallel")?,
            })
        } else {
            None
        };
        let (cp, dp_cp) = if layout.size("cp") > 1 {
            (Some(make(&["cp"])?), Some(make(&["cp", "dp"])?))
        } else {
            (None, None)
        };
        Ok(ProcessGroups {
            cp,
            dp_cp,
            tp: make(&["tp"])?,
            pp: make(&["pp"])?,
            dp: make(&["dp"])?,
            mp: make(&["tp", "pp"])?,
            embedding,
            experts,
            experts_split_over_tp: split_over_tp,
            layout: layout.clone(),
            world: world.clone(),
        })
    }

    /// Pipeline stage of this rank (its rank in the PP group, which lists stages in order).
    pub fn pp_rank(&self) -> usize {
        self.pp.rank()
    }

    pub fn is_first_stage(&self) -> bool {
        self.pp.rank() == 0
    }

    pub fn is_last_stage(&self) -> bool {
        self.pp.rank() + 1 == self.pp.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_rollout_tp_splits_each_training_tp_group() {
        // TP 4 × DP 2 (ranks 0-3 and 4-7 are the TP groups), rollout TP 2: replicas {0, 2} and
        // {1, 3}; rank 2 holds rollout shard 1 = training shards 2 and 3.
        let g = RankLayout::megatron(4, 1, 1, 2)
            .unwrap()
            .rollout_groups(2)
            .unwrap();
        assert!(!g.join);
        assert_eq!(g.tp, vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
        assert_eq!(
            g.peers,
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
    }

    #[test]
    fn larger_rollout_tp_joins_data_parallel_ranks_stage_by_stage() {
        // TP 2 × DP 2 × PP 2 (stage 1 is ranks 4-7), rollout TP 4: one replica per stage;
        // rollout rank i * 2 + c lies inside training shard i.
        let g = RankLayout::megatron(2, 1, 2, 2)
            .unwrap()
            .rollout_groups(4)
            .unwrap();
        assert!(g.join);
        assert_eq!(g.tp, vec![vec![0, 2, 1, 3], vec![4, 6, 5, 7]]);
        assert_eq!(
            g.peers,
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
    }

    #[test]
    fn expert_groups_split_data_parallel_ranks_as_megatron_does() {
        // TP 2 x DP 4, EP 2: data-parallel ranks of TP rank 0 are 0, 2, 4, 6; consecutive
        // pairs split the experts, ranks two apart in data-parallel order hold the same ones.
        let (ep, edp) = RankLayout::megatron(2, 1, 1, 4)
            .unwrap()
            .expert_groups(2, true)
            .unwrap();
        assert_eq!(ep, vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
        assert_eq!(edp, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        assert!(
            RankLayout::megatron(1, 1, 1, 4)
                .unwrap()
                .expert_groups(3, true)
                .is_err()
        );
    }

    #[test]
    fn whole_experts_split_over_tensor_and_data_parallel_ranks_together() {
        // TP 2 x DP 2 x PP 2 with expert TP 1: each stage's 4 ranks fold into EP 2 x EDP 2,
        // an expert-parallel group being a tensor group.
        let l = RankLayout::megatron(2, 1, 2, 2).unwrap();
        let (ep, edp) = l.expert_groups(2, false).unwrap();
        assert_eq!(ep, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
        assert_eq!(edp, vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
        // EP 4 spans both data-parallel replicas of a stage.
        let (ep, edp) = l.expert_groups(4, false).unwrap();
        assert_eq!(ep, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(edp.len(), 8);
        // EP 8 does not divide a stage's 4 ranks.
        assert!(l.expert_groups(8, false).is_err());
        // Context parallelism folds in: TP 2 x CP 2, whole experts over EP 2 are the tensor
        // groups; split experts over EP 2 are the context groups of each tensor rank.
        let l = RankLayout::megatron(2, 2, 1, 1).unwrap();
        let (ep, _) = l.expert_groups(2, false).unwrap();
        assert_eq!(ep, vec![vec![0, 1], vec![2, 3]]);
        let (ep, edp) = l.expert_groups(2, true).unwrap();
        assert_eq!(ep, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(edp, vec![vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn rollout_tp_must_divide_or_be_a_multiple_that_fits() {
        let l = RankLayout::megatron(2, 1, 1, 2).unwrap();
        for r in [0, 2, 3, 8] {
            assert!(l.rollout_groups(r).is_err(), "rollout TP {r}");
        }
        assert!(l.rollout_groups(1).is_ok());
        assert!(l.rollout_groups(4).is_ok());
    }
}

//! Rank arithmetic of a TP x PP x DP job (pure, no communication), and the process groups
//! built from it.
use super::{DistError, ProcessGroup, Result};

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
    /// TP ranks are adjacent, pipeline stages are farthest apart. Context parallelism is rank
    /// arithmetic only for now (no `cp` group is created by [`ProcessGroups`]).
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

/// The groups a trainer passes to its engine and optimizer.
#[derive(Debug, Clone)]
pub struct ProcessGroups {
    pub world: ProcessGroup,
    pub tp: ProcessGroup,
    pub pp: ProcessGroup,
    pub dp: ProcessGroup,
    /// Model-parallel group (TP x PP): where found-inf and grad norms are reduced.
    pub mp: ProcessGroup,
    /// First and last pipeline stage (tied embedding and output layer); `None` on middle
    /// stages and when there is a single stage.
    pub embedding: Option<ProcessGroup>,
    pub layout: RankLayout,
}

impl ProcessGroups {
    /// Creates the TP, PP, DP and TP x PP groups of `layout` over `world` (collective).
    pub fn new(world: &ProcessGroup, layout: &RankLayout) -> Result<Self> {
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
        Ok(ProcessGroups {
            tp: make(&["tp"])?,
            pp: make(&["pp"])?,
            dp: make(&["dp"])?,
            mp: make(&["tp", "pp"])?,
            embedding,
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

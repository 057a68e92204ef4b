//! Megatron's contiguous-buffer layout for the distributed optimizer (pure arithmetic;
//! docs/optimizer.md; Megatron's `_compute_per_buffer_param_layout` and
//! `_build_model_gbuf_param_range_map`).
//!
//! Params are placed in reverse order (the order backward produces their gradients), each
//! start aligned to 64 elements; a bucket closes when it reaches `bucket_size` elements or
//! at a shared embedding (which gets a bucket of its own), and its end is padded to a
//! multiple of `lcm(dp, 128)` (also `2^16` with `pad_for_high_nccl_busbw`), so every bucket
//! splits into `dp` equal shards. Rank `r` owns shard `r` of every bucket, regardless of
//! where params begin and end.
use std::ops::Range;

/// Start alignment of every param in the buffer (elements).
pub const PARAM_ALIGN: usize = 64;

/// What the layout needs to know about a param.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    pub numel: usize,
    /// Megatron's `shared_embedding` (the tied embedding / output weight under pipeline
    /// parallelism): isolated in its own bucket.
    pub shared_embedding: bool,
}

/// Options of [`ParamLayout::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayoutOptions {
    /// Close a bucket once it holds at least this many elements (`None`: one bucket, as
    /// without `overlap_grad_reduce`).
    pub bucket_size: Option<usize>,
    /// Pad buckets to `lcm(dp, 128, 2^16)` (Megatron's `pad_buckets_for_high_nccl_busbw`).
    pub pad_for_high_nccl_busbw: bool,
}

/// Where one param lives in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamIndex {
    pub start: usize,
    pub end: usize,
    pub bucket: usize,
}

/// The buffer layout of a list of params for `dp` optimizer shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    /// Indexed like the params given to [`ParamLayout::new`].
    pub index: Vec<ParamIndex>,
    /// Padded bucket ranges, in buffer order.
    pub buckets: Vec<Range<usize>>,
    /// Elements of each bucket before the end padding (alignment gaps included).
    pub numel_unpadded: Vec<usize>,
    pub dp: usize,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

impl ParamLayout {
    /// Megatron's layout of `params` (in model order) for `dp` shards (`dp >= 1`).
    pub fn new(params: &[ParamSpec], dp: usize, opts: LayoutOptions) -> Self {
        let dp = dp.max(1);
        let mut l = lcm(dp, 128);
        if opts.pad_for_high_nccl_busbw {
            l = lcm(l, 1 << 16);
        }
        let mut index = vec![
            ParamIndex {
                start: 0,
                end: 0,
                bucket: 0
            };
            params.len()
        ];
        let mut buckets = Vec::new();
        let mut numel_unpadded = Vec::new();
        let (mut start, mut bucket_start, mut open) = (0usize, 0usize, false);
        let mut finalize =
            |end: usize, bucket_start: &mut usize, buckets: &mut Vec<Range<usize>>| {
                numel_unpadded.push(end - *bucket_start);
                let bucket_end = round_up(end, l);
                buckets.push(*bucket_start..bucket_end);
                *bucket_start = bucket_end;
            };
        for (i, p) in params.iter().enumerate().rev() {
            start = round_up(start, PARAM_ALIGN);
            if p.shared_embedding && open {
                finalize(start, &mut bucket_start, &mut buckets);
                start = bucket_start;
            }
            let end = start + p.numel;
            index[i] = ParamIndex {
                start,
                end,
                bucket: buckets.len(),
            };
            open = true;
            let full = opts.bucket_size.is_some_and(|b| end - bucket_start >= b);
            if full || p.shared_embedding {
                finalize(end, &mut bucket_start, &mut buckets);
                start = bucket_start;
                open = false;
            } else {
                start = end;
            }
        }
        if open {
            finalize(start, &mut bucket_start, &mut buckets);
        }
        ParamLayout {
            index,
            buckets,
            numel_unpadded,
            dp,
        }
    }

    /// Total padded elements of the buffer.
    pub fn numel(&self) -> usize {
        self.buckets.last().map_or(0, |b| b.end)
    }

    /// Shard size of bucket `b` (its padded size over `dp`).
    pub fn shard_size(&self, b: usize) -> usize {
        self.buckets.get(b).map_or(0, |r| r.len() / self.dp)
    }

    /// The part of bucket `b` that `rank` owns, in buffer coordinates.
    pub fn shard_range(&self, b: usize, rank: usize) -> Range<usize> {
        let s = self.shard_size(b);
        let off = self.buckets.get(b).map_or(0, |r| r.start);
        off + rank * s..off + (rank + 1) * s
    }

    /// The pieces of params that `rank` owns, bucket by bucket, in buffer order.
    pub fn owned(&self, rank: usize) -> Vec<OwnedRange> {
        let mut order: Vec<usize> = (0..self.index.len()).collect();
        order.sort_by_key(|&i| (self.index[i].bucket, self.index[i].start));
        let mut out = Vec::new();
        for i in order {
            let p = self.index[i];
            let w = self.shard_range(p.bucket, rank);
            let s = w.len();
            let local_start = p.start.saturating_sub(w.start);
            let local_end = s.min(p.end.saturating_sub(w.start));
            if p.end <= w.start || local_end <= local_start {
                continue;
            }
            let world = local_start + w.start..local_end + w.start;
            let bucket_off = self.buckets[p.bucket].start;
            let param_start = w.start.saturating_sub(p.start);
            out.push(OwnedRange {
                param: i,
                bucket: p.bucket,
                param_range: param_start..param_start + (local_end - local_start),
                gbuf_local: local_start..local_end,
                gbuf_world: world.clone(),
                gbuf_world_in_bucket: world.start - bucket_off..world.end - bucket_off,
            });
        }
        out
    }
}

/// A piece of a param owned by one rank (Megatron's `Range` maps of a param).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRange {
    /// Index of the param in the list given to [`ParamLayout::new`].
    pub param: usize,
    pub bucket: usize,
    /// Slice of the flattened param.
    pub param_range: Range<usize>,
    /// Within this rank's shard of the bucket.
    pub gbuf_local: Range<usize>,
    /// Within the whole buffer.
    pub gbuf_world: Range<usize>,
    /// Within the bucket.
    pub gbuf_world_in_bucket: Range<usize>,
}

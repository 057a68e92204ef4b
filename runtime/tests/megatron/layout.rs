//! The distributed-optimizer buffer layout (docs/optimizer.md) against golden cases computed
//! by Megatron's own layout code.
use verlc_runtime::optim::distrib::{
    LayoutOptions, OwnedRange, ParamIndex, ParamLayout, ParamSpec,
};

fn spec(numel: usize) -> ParamSpec {
    ParamSpec {
        numel,
        shared_embedding: false,
    }
}

fn ix(start: usize, end: usize, bucket: usize) -> ParamIndex {
    ParamIndex { start, end, bucket }
}

type Span = (usize, usize);

/// (param, param_range, gbuf_local, gbuf_world_in_bucket) of each owned piece.
fn owned(l: &ParamLayout, rank: usize) -> Vec<(usize, Span, Span, Span)> {
    l.owned(rank)
        .into_iter()
        .map(|o: OwnedRange| {
            (
                o.param,
                (o.param_range.start, o.param_range.end),
                (o.gbuf_local.start, o.gbuf_local.end),
                (o.gbuf_world_in_bucket.start, o.gbuf_world_in_bucket.end),
            )
        })
        .collect()
}

#[test]
fn golden_one_bucket_dp2() {
    // params [w0:100, b0:10, w1:300], bucket_size=None, D=2
    let l = ParamLayout::new(
        &[spec(100), spec(10), spec(300)],
        2,
        LayoutOptions::default(),
    );
    assert_eq!(
        l.index,
        vec![ix(384, 484, 0), ix(320, 330, 0), ix(0, 300, 0)]
    );
    assert_eq!(l.buckets, vec![0..512]);
    assert_eq!(l.numel_unpadded, vec![484]);
    // r0 owns w1[0:256]
    assert_eq!(owned(&l, 0), vec![(2, (0, 256), (0, 256), (0, 256))]);
    // r1 owns w1[256:300] (local 0-44), b0[0:10] (local 64-74), w0[0:100] (local 128-228)
    assert_eq!(
        owned(&l, 1),
        vec![
            (2, (256, 300), (0, 44), (256, 300)),
            (1, (0, 10), (64, 74), (320, 330)),
            (0, (0, 100), (128, 228), (384, 484))
        ]
    );
}

#[test]
fn golden_two_buckets_dp2() {
    // [a, b, c] each 5000, bucket_size=8000, D=2
    let opts = LayoutOptions {
        bucket_size: Some(8000),
        ..Default::default()
    };
    let l = ParamLayout::new(&[spec(5000), spec(5000), spec(5000)], 2, opts);
    assert_eq!(
        l.index,
        vec![ix(10112, 15112, 1), ix(5056, 10056, 0), ix(0, 5000, 0)]
    );
    assert_eq!(l.buckets, vec![0..10112, 10112..15232]);
    assert_eq!(l.numel_unpadded, vec![10056, 5000]);
    // bucket 1: r0 owns a[0:2560], r1 owns a[2560:5000] (world_in_bucket 2560-5000)
    let in_bucket1 = |r| {
        owned(&l, r)
            .into_iter()
            .filter(|o| o.0 == 0)
            .collect::<Vec<_>>()
    };
    assert_eq!(in_bucket1(0), vec![(0, (0, 2560), (0, 2560), (0, 2560))]);
    assert_eq!(
        in_bucket1(1),
        vec![(0, (2560, 5000), (0, 2440), (2560, 5000))]
    );
}

#[test]
fn golden_shared_embedding_dp4() {
    // [emb:1000 (shared_embedding), w:1000, out:1000], D=4
    let emb = ParamSpec {
        numel: 1000,
        shared_embedding: true,
    };
    let l = ParamLayout::new(&[emb, spec(1000), spec(1000)], 4, LayoutOptions::default());
    assert_eq!(
        l.index,
        vec![ix(2048, 3048, 1), ix(1024, 2024, 0), ix(0, 1000, 0)]
    );
    assert_eq!(l.buckets, vec![0..2048, 2048..3072]);
    assert_eq!(l.numel_unpadded, vec![2048, 1000]);
    // emb split into 4 ranges of 256 (the last one 232)
    let emb_ranges: Vec<(usize, usize)> = (0..4)
        .flat_map(|r| owned(&l, r).into_iter().filter(|o| o.0 == 0).map(|o| o.1))
        .collect();
    assert_eq!(
        emb_ranges,
        vec![(0, 256), (256, 512), (512, 768), (768, 1000)]
    );
}

#[test]
fn padding_rules() {
    // Every bucket divisible by lcm(D, 128); with high-busbw padding by lcm(D, 128, 2^16).
    for dp in [1, 3, 4, 6] {
        let l = ParamLayout::new(&[spec(1), spec(65), spec(7)], dp, LayoutOptions::default());
        assert!(
            l.buckets
                .iter()
                .all(|b| b.len() % dp == 0 && b.len() % 128 == 0),
            "dp={dp}: {:?}",
            l.buckets
        );
        assert!(l.index.iter().all(|i| i.start % 64 == 0));
    }
    let l = ParamLayout::new(
        &[spec(1)],
        4,
        LayoutOptions {
            pad_for_high_nccl_busbw: true,
            ..Default::default()
        },
    );
    assert_eq!(l.buckets, vec![0..65536]);
    // Every element of a param is owned by exactly one rank.
    let l = ParamLayout::new(
        &[spec(333), spec(10), spec(777), spec(64)],
        3,
        LayoutOptions {
            bucket_size: Some(500),
            ..Default::default()
        },
    );
    let mut count = [0usize; 4];
    for r in 0..3 {
        for o in l.owned(r) {
            count[o.param] += o.param_range.len();
            assert_eq!(o.gbuf_local.len(), o.param_range.len());
        }
    }
    assert_eq!(count, [333, 10, 777, 64]);
}

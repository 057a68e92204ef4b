//! Incremental decoding with the KV cache gives the logits of a full recomputation.

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::{Dtype, KvCache, from_pretrained, position_ids_from_mask};

use crate::oracle;

#[test]
fn kv_cache_logits_equal_full_recompute() {
    let dir = oracle::models();
    // Not llama_dynamic: dynamic NTK frequencies change with the sequence length, so cached
    // keys legitimately differ from a recomputation (in transformers too).
    for arch in oracle::GEN_ARCHS {
        let m = from_pretrained(
            dir.join(arch).to_str().unwrap(),
            Device::Cpu,
            Dtype::Fp32,
            0,
        )
        .unwrap()
        .model;
        tch::manual_seed(3);
        let (b, p, steps) = (3i64, 7i64, 6i64);
        let ids = Tensor::randint_low(3, 128, [b, p + steps], (Kind::Int64, Device::Cpu));
        // Left padding of 0, 2 and 4 prompt tokens.
        let mask = Tensor::ones([b, p + steps], (Kind::Int64, Device::Cpu));
        let _ = mask.get(1).narrow(0, 0, 2).fill_(0);
        let _ = mask.get(2).narrow(0, 0, 4).fill_(0);
        let pos = position_ids_from_mask(&mask);
        let full = tch::no_grad(|| m.forward(&ids, &pos, Some(&mask), None));

        let mut cache = KvCache::new(&m.config, b, p + steps, Kind::Float, Device::Cpu);
        let mut pieces = vec![tch::no_grad(|| {
            m.forward(
                &ids.narrow(1, 0, p),
                &pos.narrow(1, 0, p),
                Some(&mask.narrow(1, 0, p)),
                Some(&mut cache),
            )
        })];
        for t in p..p + steps {
            let step = tch::no_grad(|| {
                m.forward(
                    &ids.narrow(1, t, 1),
                    &pos.narrow(1, t, 1),
                    Some(&mask.narrow(1, 0, t + 1)),
                    Some(&mut cache),
                )
            });
            pieces.push(step);
        }
        assert_eq!(cache.len(), p + steps);
        let inc = Tensor::cat(&pieces, 1);
        let d = oracle::max_abs_diff_masked(&inc, &full, &mask);
        assert!(d <= 1e-5, "{arch}: cached vs full logits differ by {d}");
    }
}

#[test]
fn cache_rows_can_be_replicated_for_n_samples() {
    let m = from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        7,
    )
    .unwrap()
    .model;
    let ids = Tensor::from_slice(&[5i64, 6, 7, 8, 9, 10]).view([2, 3]);
    let pos = Tensor::arange(3, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([2, 1]);
    let mut cache = KvCache::new(&m.config, 2, 3, Kind::Float, Device::Cpu);
    let _ = tch::no_grad(|| m.forward(&ids, &pos, None, Some(&mut cache)));
    let rows = Tensor::from_slice(&[0i64, 0, 1, 1]);
    let mut big = cache.select_rows(&rows, 4);
    assert_eq!((big.batch(), big.len(), big.capacity()), (4, 3, 4));
    let next = Tensor::from_slice(&[11i64, 11, 12, 12]).view([4, 1]);
    let step = tch::no_grad(|| {
        m.forward(
            &next,
            &Tensor::full([4, 1], 3, (Kind::Int64, Device::Cpu)),
            None,
            Some(&mut big),
        )
    });
    let full_ids = Tensor::cat(&[ids.index_select(0, &rows), next], 1);
    let full_pos = Tensor::arange(4, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([4, 1]);
    let full = tch::no_grad(|| m.forward(&full_ids, &full_pos, None, None)).narrow(1, 3, 1);
    assert!(oracle::max_abs_diff(&step, &full) <= 1e-5);
}

//! Every collective on 2 Gloo ranks over loopback.
use tch::{Kind, Tensor};
use verlc_runtime::parallel::dist::ReduceOp;

use crate::rank_test;

fn vals(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

rank_test!(all_reduce_ops, 2, |pg| {
    let r = pg.rank() as f64;
    let make = || Tensor::from_slice(&[1.0 + r, 10.0 * (r + 1.0), -r]);
    for (op, want) in [
        (ReduceOp::Sum, vec![3.0, 30.0, -1.0]),
        (ReduceOp::Avg, vec![1.5, 15.0, -0.5]),
        (ReduceOp::Max, vec![2.0, 20.0, 0.0]),
        (ReduceOp::Min, vec![1.0, 10.0, -1.0]),
        (ReduceOp::Product, vec![2.0, 200.0, 0.0]),
    ] {
        let t = make();
        pg.all_reduce(&t, op).unwrap();
        assert_eq!(vals(&t), want, "{op:?}");
    }
    // Several tensors (and dtypes per call) in one collective.
    let a = Tensor::from_slice(&[r as i64 + 1]);
    let b = Tensor::from_slice(&[2 * (r as i64) + 1, 7]);
    pg.all_reduce_many(&[a.shallow_clone(), b.shallow_clone()], ReduceOp::Sum)
        .unwrap();
    assert_eq!(vals(&a), vec![3.0]);
    assert_eq!(vals(&b), vec![4.0, 14.0]);
    // Leaf tensors that require grad (model params) of different shapes, one collective.
    let p = Tensor::ones([2, 2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let q = Tensor::ones([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    pg.all_reduce_many(&[p.shallow_clone(), q.shallow_clone()], ReduceOp::Sum)
        .unwrap();
    assert_eq!(vals(&p), vec![2.0; 4]);
    assert_eq!(vals(&q), vec![2.0; 3]);
    assert!(p.requires_grad());
    // bf16 too.
    let h = Tensor::from_slice(&[1.5f32 + r as f32]).to_kind(Kind::BFloat16);
    pg.all_reduce(&h, ReduceOp::Sum).unwrap();
    assert_eq!(vals(&h), vec![4.0]);
    // Avg of an integer tensor is refused, as an error, not a crash.
    assert!(
        pg.all_reduce(&Tensor::from_slice(&[1i64]), ReduceOp::Avg)
            .is_err()
    );
});

rank_test!(all_gather_and_reduce_scatter, 2, |pg| {
    let r = pg.rank() as f32;
    let input = Tensor::from_slice(&[r, r + 0.5]);
    let out = Tensor::zeros([4], (Kind::Float, tch::Device::Cpu));
    pg.all_gather_into(&out, &input).unwrap();
    assert_eq!(vals(&out), vec![0.0, 0.5, 1.0, 1.5]);
    // 2-D output: rank-major along dim 0.
    let out2 = Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu));
    pg.all_gather_into(&out2, &input).unwrap();
    assert_eq!(vals(&out2), vec![0.0, 0.5, 1.0, 1.5]);
    assert!(
        pg.all_gather_into(&Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)), &input)
            .is_err()
    );

    // reduce_scatter: rank r contributes [0,1,2,3] * (r+1); rank k keeps slice k of the sum.
    let inp = Tensor::from_slice(&[0f32, 1.0, 2.0, 3.0]) * (r as f64 + 1.0);
    let got = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
    pg.reduce_scatter(&got, &inp, ReduceOp::Sum).unwrap();
    let want = if pg.rank() == 0 {
        vec![0.0, 3.0]
    } else {
        vec![6.0, 9.0]
    };
    assert_eq!(vals(&got), want);
    pg.reduce_scatter(&got, &inp, ReduceOp::Avg).unwrap();
    let want = if pg.rank() == 0 {
        vec![0.0, 1.5]
    } else {
        vec![3.0, 4.5]
    };
    assert_eq!(vals(&got), want);
    pg.reduce_scatter(&got, &inp, ReduceOp::Max).unwrap();
    let want = if pg.rank() == 0 {
        vec![0.0, 2.0]
    } else {
        vec![4.0, 6.0]
    };
    assert_eq!(vals(&got), want);
});

rank_test!(broadcast_send_recv_barrier, 2, |pg| {
    let r = pg.rank();
    let t = Tensor::from_slice(&[r as f32 * 7.0 + 1.0, 2.0]);
    pg.broadcast(&t, 1).unwrap();
    assert_eq!(vals(&t), vec![8.0, 2.0]);
    let t = Tensor::from_slice(&[r as f64; 3]);
    pg.broadcast(&t, 0).unwrap();
    assert_eq!(vals(&t), vec![0.0; 3]);
    assert!(pg.broadcast(&t, 2).is_err());

    // Ping-pong: 0 -> 1, then 1 -> 0 with a different tag.
    if r == 0 {
        pg.send(&Tensor::from_slice(&[3.0f32, 4.0]), 1, 7).unwrap();
        let back = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        pg.recv(&back, 1, 8).unwrap();
        assert_eq!(vals(&back), vec![6.0, 8.0]);
    } else {
        let got = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        pg.recv(&got, 0, 7).unwrap();
        pg.send(&(got * 2.0), 0, 8).unwrap();
    }
    pg.barrier().unwrap();
    assert_eq!(pg.size(), 2);
    assert_eq!(pg.global_ranks(), &[0, 1]);
});

// Gloo's event-loop threads go through the pacing in csrc/gloo_pacing.cpp: the executable's
// epoll_wait is the one libtorch's Gloo calls (if linking ever stopped exporting it, the loop
// would spin again where ranks outnumber cores, and nothing else would say so).
rank_test!(gloo_event_loops_wait_through_the_pacing, 2, |pg| {
    let before = verlc_runtime::parallel::dist::GlooPacing::now();
    let t = Tensor::ones([1 << 16], (Kind::Float, tch::Device::Cpu));
    for _ in 0..20 {
        pg.all_reduce(&t, ReduceOp::Sum).unwrap();
    }
    assert_eq!(vals(&t.narrow(0, 0, 1)), vec![f64::powi(2.0, 20)]);
    let after = verlc_runtime::parallel::dist::GlooPacing::now();
    assert!(
        after.waits > before.waits,
        "no epoll wait of a Gloo loop thread went through the pacing: {after:?}"
    );
    assert!(after.yields <= after.waits);
});

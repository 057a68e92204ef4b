//! The f/g mappings and the segment-wise backward of `dist::mappings` on 2 ranks: a
//! column-parallel then row-parallel MLP gives the full MLP's output and gradients.
use tch::{Device, Kind, Tensor};
use verlc_runtime::parallel::mappings::{
    Tape, copy_to_tp_region, gather_from_sequence_parallel_region, gather_from_tp_region,
    reduce_from_tp_region, reduce_scatter_to_sequence_parallel_region, scatter_to_tp_region,
};

use crate::rank_test;
use crate::support::max_diff;

fn randn(shape: &[i64]) -> Tensor {
    Tensor::randn(shape, (Kind::Float, Device::Cpu))
}

rank_test!(column_row_mlp_matches_full, 2, |pg| {
    tch::manual_seed(11);
    let (r, w) = (pg.rank() as i64, pg.size() as i64);
    let x0 = randn(&[4, 6]);
    let a = randn(&[8, 6]); // column-parallel weight (out, in)
    let b = randn(&[6, 8]); // row-parallel weight
    let c = randn(&[6]); // replicated scale before the column layer (like a norm weight)
    let dy = randn(&[4, 6]);

    // Full computation: y = gelu((x * c) A^T) B^T + x (residual).
    let (x, cf, af, bf) = [&x0, &c, &a, &b]
        .map(|t| t.detach().set_requires_grad(true))
        .into();
    let y =
        ((&x * &cf).linear::<&Tensor>(&af, None).gelu("none")).linear::<&Tensor>(&bf, None) + &x;
    (&y * &dy).sum(Kind::Float).backward();

    // Tensor-parallel: A split on dim 0, B on dim 1.
    let al = a
        .narrow(0, r * 8 / w, 8 / w)
        .detach()
        .set_requires_grad(true);
    let bl = b
        .narrow(1, r * 8 / w, 8 / w)
        .detach()
        .set_requires_grad(true);
    let (xp, cp) = (
        x0.detach().set_requires_grad(true),
        c.detach().set_requires_grad(true),
    );
    let mut tape = Tape::new();
    let h0 = tape.cut(&xp);
    let xin = copy_to_tp_region(&mut tape, &(&h0 * &cp), Some(&pg));
    let part = xin
        .linear::<&Tensor>(&al, None)
        .gelu("none")
        .linear::<&Tensor>(&bl, None);
    let yp = reduce_from_tp_region(&part, Some(&pg)).unwrap() + &h0;
    assert!(max_diff(&yp, &y) < 1e-5);
    assert_eq!(tape.len(), 2);
    tape.backward(&(&yp * &dy).sum(Kind::Float), None).unwrap();
    assert!(tape.is_empty());
    assert!(
        max_diff(&xp.grad(), &x.grad()) < 1e-5,
        "input grad {}",
        max_diff(&xp.grad(), &x.grad())
    );
    assert!(
        max_diff(&cp.grad(), &cf.grad()) < 1e-5,
        "replicated grad {}",
        max_diff(&cp.grad(), &cf.grad())
    );
    assert!(max_diff(&al.grad(), &af.grad().narrow(0, r * 4, 4)) < 1e-5);
    assert!(max_diff(&bl.grad(), &bf.grad().narrow(1, r * 4, 4)) < 1e-5);
});

rank_test!(scatter_gather_pairs_are_conjugate, 2, |pg| {
    tch::manual_seed(5);
    let r = pg.rank() as i64;
    let x = randn(&[2, 4, 6]).set_requires_grad(true);
    let dy = randn(&[2, 4, 6]);
    // scatter (split last dim) then gather: identity both ways.
    let mut tape = Tape::new();
    let part = scatter_to_tp_region(&mut tape, &x, Some(&pg)).unwrap();
    assert_eq!(part.size(), vec![2, 4, 3]);
    let full = gather_from_tp_region(&part, Some(&pg)).unwrap();
    assert!(max_diff(&full, &x) < 1e-7);
    tape.backward(&(&full * &dy).sum(Kind::Float), None)
        .unwrap();
    assert!(
        max_diff(&x.grad(), &dy) < 1e-6,
        "scatter/gather grad {}",
        max_diff(&x.grad(), &dy)
    );

    // Sequence parallel: all-gather the sequence (dim 1) forward, reduce-scatter backward;
    // reduce-scatter forward, all-gather backward. Same input on both ranks here.
    let s = randn(&[2, 2, 6]).set_requires_grad(true); // local sequence chunk
    let mut tape = Tape::new();
    let gathered = gather_from_sequence_parallel_region(&mut tape, &s, Some(&pg), 1).unwrap();
    assert_eq!(gathered.size(), vec![2, 4, 6]);
    let scattered =
        reduce_scatter_to_sequence_parallel_region(&mut tape, &(&gathered * 1.0), Some(&pg), 1)
            .unwrap();
    // Every rank gathered the same values, so the reduce-scatter gives world * (own chunk of the gather).
    let expected = gathered.detach().narrow(1, r * 2, 2) * 2.0;
    assert!(max_diff(&scattered, &expected) < 1e-5);
    let g = randn(&[2, 2, 6]);
    tape.backward(&(&scattered * &g).sum(Kind::Float), None)
        .unwrap();
    // Backward: the all-gather of g (dS), then the reduce-scatter over the 2 identical
    // gathers: 2 * g on every rank.
    assert!(
        max_diff(&s.grad(), &(&g * 2.0)) < 1e-6,
        "sequence-parallel grad {}",
        max_diff(&s.grad(), &(&g * 2.0))
    );
});

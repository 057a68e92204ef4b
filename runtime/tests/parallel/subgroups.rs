//! Sub-groups: new_group / split on 2 ranks, and a TP x DP layout on 4 ranks.
use tch::{Kind, Tensor};
use verlc_runtime::parallel::dist::ReduceOp;
use verlc_runtime::parallel::layout::{ProcessGroups, RankLayout};

use crate::rank_test;

fn val(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double).double_value(&[0])
}

rank_test!(new_group_and_split, 2, |pg| {
    let r = pg.rank();
    // A group holding only rank 1: rank 0 gets None.
    let solo = pg.new_group(&[1]).unwrap();
    assert_eq!(solo.is_some(), r == 1);
    if let Some(g) = &solo {
        assert_eq!(
            (g.rank(), g.size(), g.global_ranks()),
            (0, 1, &[1usize][..])
        );
        let t = Tensor::from_slice(&[5.0f32]);
        g.all_reduce(&t, ReduceOp::Sum).unwrap();
        assert_eq!(val(&t), 5.0);
    }
    // Reversed order: group rank 0 is world rank 1.
    let rev = pg.new_group(&[1, 0]).unwrap().unwrap();
    assert_eq!(rev.rank(), 1 - r);
    assert_eq!(rev.global_ranks(), &[1, 0]);
    let t = Tensor::from_slice(&[r as f32 + 1.0]);
    rev.broadcast(&t, 0).unwrap(); // group root 0 = world rank 1
    assert_eq!(val(&t), 2.0);
    // split into singletons: each rank gets its own.
    let mine = pg.split(&[vec![0], vec![1]]).unwrap().unwrap();
    assert_eq!(mine.global_ranks(), &[r]);
    mine.barrier().unwrap();
    // Bad partitions are argument errors on every rank (no collective is started).
    assert!(pg.split(&[vec![0], vec![0]]).is_err());
    assert!(pg.new_group(&[2]).is_err());
    // The world group still works after all that.
    let t = Tensor::from_slice(&[1.0f32]);
    pg.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(val(&t), 2.0);
});

rank_test!(tp_dp_layout_groups, 4, |world| {
    let layout = RankLayout::new(2, 1, 2).unwrap();
    let groups = ProcessGroups::new(&world, &layout).unwrap();
    let r = world.rank();
    assert_eq!(groups.tp.size(), 2);
    assert_eq!(groups.dp.size(), 2);
    assert_eq!(groups.pp.size(), 1);
    assert_eq!(groups.mp.size(), 2);
    // TP groups {0,1},{2,3}; DP groups {0,2},{1,3}.
    let t = Tensor::from_slice(&[r as f32]);
    groups.tp.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(val(&t), if r < 2 { 1.0 } else { 5.0 });
    let t = Tensor::from_slice(&[r as f32]);
    groups.dp.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(val(&t), if r % 2 == 0 { 2.0 } else { 4.0 });
    let out = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
    groups
        .dp
        .all_gather_into(&out, &Tensor::from_slice(&[r as f32]))
        .unwrap();
    assert_eq!(
        Vec::<f32>::try_from(&out).unwrap(),
        if r % 2 == 0 {
            vec![0.0, 2.0]
        } else {
            vec![1.0, 3.0]
        }
    );
    groups.world.barrier().unwrap();
});

//! Megatron's rank order and the groups derived from it (pure arithmetic, no processes).
use verlc_runtime::parallel::layout::RankLayout;

#[test]
fn megatron_order_tp_cp_dp_pp() {
    // 16 ranks: tp=2, cp=2, dp=2, pp=2 (Megatron's `tp-cp-ep-dp-pp` without ep).
    let l = RankLayout::megatron(2, 2, 2, 2).unwrap();
    assert_eq!(l.world_size(), 16);
    assert_eq!(l.groups(&["tp"]).unwrap()[..2], [vec![0, 1], vec![2, 3]]);
    assert_eq!(l.groups(&["cp"]).unwrap()[0], vec![0, 2]);
    assert_eq!(l.groups(&["dp"]).unwrap()[0], vec![0, 4]);
    assert_eq!(l.groups(&["pp"]).unwrap()[0], vec![0, 8]);
    assert_eq!(l.groups(&["dp", "cp"]).unwrap()[0], vec![0, 2, 4, 6]);
    assert_eq!(l.groups(&["tp", "pp"]).unwrap()[0], vec![0, 1, 8, 9]);
    // Pipeline neighbours wrap around, other coordinates kept.
    assert_eq!(
        (
            l.shifted(3, "pp", 1),
            l.shifted(11, "pp", 1),
            l.shifted(11, "pp", -1)
        ),
        (11, 3, 3)
    );
    assert_eq!(l.shifted(5, "tp", 1), 4);
}

#[test]
fn embedding_groups_pair_first_and_last_stage() {
    let l = RankLayout::megatron(2, 1, 4, 1).unwrap();
    assert_eq!(l.embedding_groups().unwrap(), vec![vec![0, 6], vec![1, 7]]);
    let single = RankLayout::megatron(2, 1, 1, 2).unwrap();
    assert_eq!(
        single.embedding_groups().unwrap(),
        vec![vec![0], vec![1], vec![2], vec![3]]
    );
}

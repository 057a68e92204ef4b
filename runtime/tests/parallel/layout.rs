use verlc_runtime::parallel::layout::RankLayout;

#[test]
fn tp_dp_pp_groups() {
    // 8 ranks: tp=2 fastest, then dp=2, then pp=2 (Megatron's default order, without cp/ep).
    let l = RankLayout::new(2, 2, 2).unwrap();
    assert_eq!(l.world_size(), 8);
    assert_eq!(
        l.groups(&["tp"]).unwrap(),
        vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
    );
    assert_eq!(
        l.groups(&["dp"]).unwrap(),
        vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
    );
    assert_eq!(
        l.groups(&["pp"]).unwrap(),
        vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
    );
    assert_eq!(
        l.groups(&["tp", "pp"]).unwrap(),
        vec![vec![0, 1, 4, 5], vec![2, 3, 6, 7]]
    );
    assert_eq!(
        (l.coord(5, "tp"), l.coord(5, "dp"), l.coord(5, "pp")),
        (1, 0, 1)
    );
}

#[test]
fn custom_order_and_errors() {
    let l = RankLayout::with_order(&[("dp", 2), ("tp", 2)]).unwrap();
    assert_eq!(l.groups(&["tp"]).unwrap(), vec![vec![0, 2], vec![1, 3]]);
    assert_eq!(l.size("pp"), 1);
    assert!(l.groups(&["cp"]).is_err());
    assert!(RankLayout::with_order(&[("tp", 0)]).is_err());
    assert!(RankLayout::with_order(&[("tp", 2), ("tp", 2)]).is_err());
}

verlc_macros::bind_trainer! {
    strategy = Single,
    precision = Fp32,
    offload = [params],
    config = "",
}

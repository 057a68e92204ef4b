verlc_macros::bind_trainer! {
    strategy = Fsdp,
    precision = Fp32,
    offload = [params, grads],
    config = "",
}

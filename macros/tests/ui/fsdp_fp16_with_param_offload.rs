verlc_macros::bind_trainer! {
    strategy = Fsdp,
    precision = Fp16Mixed,
    offload = [params, grads],
    config = "",
}

verlc_macros::bind_trainer! {
    strategy = Megatron,
    precision = Bf16Mixed,
    offload = [params, grads, optimizer],
    config = "",
}

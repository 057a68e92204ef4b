verlc_macros::bind_trainer! {
    strategy = Megatron,
    precision = Bf16Mixed,
    offload = [params, cpu],
    config = "",
}

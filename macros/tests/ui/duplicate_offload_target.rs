verlc_macros::bind_trainer! {
    strategy = Megatron,
    precision = Fp16Mixed,
    offload = [optimizer, optimizer],
    config = "",
}

verlc_macros::bind_trainer! {
    strategy = Fsdp,
    precision = Bf16Mixed,
    offload = [grads, optimizer],
    config = "",
}

verlc_macros::bind_trainer! {
    strategy = Fsdp,
    precision = Bf16,
    config = "",
}

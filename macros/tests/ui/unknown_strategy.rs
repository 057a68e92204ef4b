verlc_macros::bind_trainer! {
    strategy = Fsdp2,
    precision = Bf16Mixed,
    config = "",
}

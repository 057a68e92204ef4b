verlc_macros::bind_trainer! {
    strategy = Fsdp,
    precison = Bf16Mixed,
    config = "",
}

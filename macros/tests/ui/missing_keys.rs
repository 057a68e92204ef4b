verlc_macros::bind_trainer! {
    strategy = Fsdp,
}

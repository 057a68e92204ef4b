//! Links the `verlc` executable at a fixed address on Linux (`-no-pie`): its large static
//! tables (the validation schema, the built-in default trees, the release tables) hold tens of
//! thousands of pointers, which a position-independent executable relocates, page by page,
//! at every start; `verlc check` runs in a few milliseconds, so that was a large share.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}

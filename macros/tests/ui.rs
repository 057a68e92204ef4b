//! Compile-time behaviour of `bind_trainer!`: unknown names and unsupported combinations fail
//! at the offending token (`ui/*.rs` with their expected `.stderr`), and a valid binding
//! expands to `fn main` calling the runtime's generic entry with the marker types
//! (`pass/*.rs`, against a stand-in runtime so no libtorch is needed).
//!
//! Regenerate the `.stderr` files after an intended message change with
//! `TRYBUILD=overwrite cargo test -p verlc-macros --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/pass/*.rs");
}

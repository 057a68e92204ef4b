//! Procedural macros of verlc-generated trainers. This file only declares the entry points;
//! each macro lives in its own module and returns `syn::Result`, turned into
//! `compile_error!` at the offending token by [`syn::Error::into_compile_error`].

mod bind_trainer;

/// The strategy/precision vocabulary and support table, shared with `verlc_front::plan`
/// and the runtime through `verlc-spec` (one table, three users).
use verlc_spec::binding;

use proc_macro::TokenStream;

/// Binds a trainer binary: expands to `fn main()` calling
/// `verlc_runtime::binding::main::<Strategy, Precision>(config, build_info)`. Offload is not part
/// of a binding: each role's placement is its engine setting in the config, read at run time.
///
/// ```ignore
/// verlc_macros::bind_trainer! {
///     strategy = Fsdp,                 // Fsdp | Megatron
///     precision = Bf16Mixed,           // Fp32 | Bf16Mixed | Fp16Mixed
///     config = include_str!("../trainer.yaml"),
///     verlc_version = "0.1.0",         // optional build info
///     config_hash = "sha256:…",
///     source = "examples/quickstart.yaml",
///     // runtime = ::runtime,          // optional: path of the runtime crate
/// }
/// ```
///
/// Unknown names and combinations the runtime does not support fail to compile, pointing at
/// the offending token with the valid choices.
#[proc_macro]
pub fn bind_trainer(input: TokenStream) -> TokenStream {
    bind_trainer::expand(input.into())
        .unwrap_or_else(bind_trainer::error_with_stub_main)
        .into()
}

//! libtorch runtime of verlc trainers: c10d collectives through a C++ shim ([`parallel::dist`]), fused
//! optimizer kernels ([`ops`]) and a Megatron-core optimizer stack ([`optim`]).
pub mod algo;
pub mod binding;
pub use verlc_spec::builtin_uri;
pub mod data;
pub mod engine;
pub(crate) mod ffi;
pub mod host_alloc;
pub mod logging;
pub mod logits;
pub mod model;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod process_exit;
pub mod pyproc;
pub mod rng;
pub mod rollout;
pub mod sft;
pub mod tokenizer;
pub mod trainer;
pub mod workers;

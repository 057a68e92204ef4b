//! libtorch runtime of verlc trainers: c10d collectives through a C++ shim ([`dist`]), fused
//! optimizer kernels ([`ops`]) and a Megatron-core optimizer stack ([`optim`]).
pub mod algo;
pub mod dist;
pub(crate) mod ffi;
pub mod ops;
pub mod optim;

//! The contract between verlc and the trainers it generates.
//!
//! - [`binding`]: the vocabulary of what a binary binds at compile time (strategy ×
//!   precision × offload) and the one support table, shared by the compiler, the
//!   `bind_trainer!` macro and the runtime.
//! - [`trainer::TrainerSpec`]: the typed settings of a run, produced by the compiler's
//!   lowering and embedded in the binary; the runtime takes them as they are.
//! - [`Dtype`]: the one dtype type (parameters, training precision, reductions).
//! - [`families`]: the model families verlc trains, one row each.
//! - [`sft::SftSpec`]: the settings of a supervised fine-tuning run (verl's SFT trainer).
//! - [`algo`], [`optim`], [`sampling`], [`data`]: the settings types the spec is made of,
//!   with verl's spellings where verl names them.
//!
//! This crate has no libtorch and no config parser, so the macro and `verlc check` stay light.

pub mod algo;
pub mod binding;
pub mod builtin;
pub mod builtin_uri;
pub mod data;
pub mod dtype;
pub mod families;
pub mod names;
pub mod optim;
pub mod sampling;
pub mod sft;
pub mod trainer;

pub use binding::Binding;
pub use dtype::Dtype;
pub use names::UnknownName;
pub use trainer::TrainerSpec;

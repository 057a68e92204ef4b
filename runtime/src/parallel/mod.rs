//! The parallel layer: how ranks split a model and talk to each other, above the model
//! (whose layers name no process group: they take [`crate::model::rank_group::RankGroup`]
//! values, which [`dist::ProcessGroup`] implements) and below the optimizer and the engines.
//!
//! - [`dist`]: c10d process groups and collectives over Gloo and NCCL, the rendezvous
//!   store, the launcher of local ranks.
//! - [`layout`]: a job's ranks laid out as Megatron does (tensor, pipeline, context, expert
//!   and data parallel) and the process groups of one rank ([`layout::ProcessGroups`]).
//! - [`mappings`]: the tensor-parallel f/g operators and the segment-wise backward
//!   ([`mappings::Tape`]) that stands in for custom autograd functions.
//! - [`tp`]: tensor-parallel layers, the regions the decoder crosses on a rank's shards,
//!   vocabulary-parallel losses, context parallelism and sharded checkpoint I/O.
pub mod dist;
pub mod layout;
pub mod mappings;
pub mod tp;

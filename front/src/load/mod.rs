//! Loading a config the way Hydra and OmegaConf do: YAML with spans ([`yaml`]), the
//! config search path ([`repo`]), `defaults:` composition ([`compose`]), command-line
//! overrides ([`overrides`]) and `${...}` interpolation ([`interp`]); which verl release a
//! tree is ([`version`]); reading files as untrusted input, within limits ([`read`]).

pub mod carried_tree;
pub mod compose;
pub mod interp;
pub mod moves;
pub mod node;
pub mod node_de;
pub mod override_value;
pub mod overrides;
pub mod read;
pub mod release_table;
pub mod repo;
mod snapshot;
pub mod version;
pub mod yaml;
mod yaml_block;

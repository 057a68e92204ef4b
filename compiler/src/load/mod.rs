//! Loading a config the way Hydra and OmegaConf do: YAML with spans ([`yaml`]), the
//! `defaults:` composition ([`compose`]), command-line overrides ([`overrides`]) and
//! `${...}` interpolation ([`interp`]).

pub mod node;
pub mod yaml;

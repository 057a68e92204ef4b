//! The typed verl config model (serde + schemars), one module per section.
//! Placeholder: being written; see the module list below once it lands.

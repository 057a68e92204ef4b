//! Sampling parameters of one generation call: the contract type of `verlc_spec`.

pub use verlc_spec::sampling::{LogProbPath, MaskedTokens, SamplingParams};

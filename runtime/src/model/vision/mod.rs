//! Vision towers of vision-language models: pixel patches in, embeddings for the language
//! model's vision placeholders out. One file per family.

pub mod mrope;
pub mod qwen2_5_vl;

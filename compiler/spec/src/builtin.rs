//! Facts of the built-in tiny models (`builtin://tiny?…`) that the compiler needs without the
//! runtime's tokenizer: the vocabulary size (the runtime's tokenizer tests that it agrees).

/// Tokens of the built-in tokenizer: specials, digits, punctuation and words.
pub const TINY_VOCAB: i64 = 38;

/// The vocabulary of a `builtin://tiny?…` model: the built-in tokenizer's, plus one token per
/// tool of its `tools=a,b` parameter.
pub fn tiny_vocab(uri: &str) -> i64 {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    let tools = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("tools="))
        .map_or(0, |t| t.split(',').filter(|t| !t.is_empty()).count());
    TINY_VOCAB + tools as i64
}

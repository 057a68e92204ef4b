//! Facts of the built-in tiny models (`builtin://tiny?…`) that the compiler needs without the
//! runtime: the vocabulary size (the runtime's tokenizer tests that it agrees), the parameters
//! and families the runtime builds (its `model::builtin` reads these lists), and a check of an
//! address against them, so `verlc check` refuses what the trainer could not build.

use crate::builtin_uri::BuiltinUri;

/// The `builtin://` models there are.
pub const BUILTIN_MODELS: &[&str] = &["tiny", "scaled"];

/// The parameters `builtin://scaled` (a scaled-down stand-in of a model directory's config)
/// takes.
pub const SCALED_PARAMS: &[&str] = &[
    "from",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "intermediate",
    "experts",
];

/// The parameters `builtin://tiny` takes.
pub const TINY_PARAMS: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "intermediate",
    "max_positions",
    "arch",
    "experts",
    "experts_per_tok",
    "moe_intermediate",
    "tools",
    "window",
    "full_attention_interval",
    "partial_rotary_factor",
    "deepstack",
];

/// Parameters only a family with Gated DeltaNet layers reads (its config class's keys).
const TINY_LINEAR_ATTENTION_PARAMS: &[&str] = &["full_attention_interval", "partial_rotary_factor"];

/// The integer parameters of `builtin://tiny`, each at least 1.
const TINY_COUNTS: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "intermediate",
    "max_positions",
    "experts",
    "experts_per_tok",
    "moe_intermediate",
    "full_attention_interval",
];

/// Why the model address `path` cannot be built: `None` when it is no `builtin://` address or
/// a good one. The same name, parameters, families and value kinds the runtime accepts.
pub fn model_problem(path: &str) -> Option<String> {
    let uri = match BuiltinUri::parse(path)? {
        Ok(u) => u,
        Err(e) => return Some(e),
    };
    if !BUILTIN_MODELS.contains(&uri.name.as_str()) {
        return Some(format!(
            "`{path}`: no built-in model `{}` (there is {})",
            uri.name,
            BUILTIN_MODELS.join(", ")
        ));
    }
    if uri.name == "scaled" {
        if let Err(e) = uri.check_keys(SCALED_PARAMS) {
            return Some(e);
        }
        let from = uri.params.get("from").map_or("", String::as_str);
        if !std::path::Path::new(from).join("config.json").is_file() {
            return Some(format!(
                "`{path}`: `from` must name a model directory with a config.json (got `{from}`)"
            ));
        }
    } else if let Some(e) = tiny_problem(&uri, path) {
        return Some(e);
    }
    None
}

/// Why `builtin://tiny` cannot be built with `uri`'s parameters (`path` names it in the
/// message): unknown keys, an unknown family, a setting of another family, a bad number. The
/// front end's check and the runtime's builder both ask it.
pub fn tiny_problem(uri: &BuiltinUri, path: &str) -> Option<String> {
    if let Err(e) = uri.check_keys(TINY_PARAMS) {
        return Some(e);
    }
    if let Some(arch) = uri.params.get("arch")
        && !crate::families::tiny_archs().contains(&arch.as_str())
    {
        return Some(format!(
            "`{path}`: the tiny model has no family `{arch}` (it builds {})",
            crate::families::tiny_archs().join(", ")
        ));
    }
    let arch = uri
        .params
        .get("arch")
        .map_or(TINY_DEFAULT_ARCH, String::as_str);
    let linear = crate::families::of_tiny_arch(arch).is_some_and(|r| r.linear_attention);
    if let Some(key) = TINY_LINEAR_ATTENTION_PARAMS
        .iter()
        .find(|k| !linear && uri.params.contains_key(**k))
    {
        return Some(format!(
            "`{path}`: `{key}` is a setting of the families with Gated DeltaNet layers, not of `{arch}`"
        ));
    }
    // How many decoder layers take DeepStack features: Qwen3-VL's towers have them, and the
    // tiny tower two blocks to take them from.
    if let Some(v) = uri.params.get("deepstack") {
        let deepstack = crate::families::of_tiny_arch(arch)
            .and_then(|r| r.vision)
            .is_some_and(|t| t.deepstack());
        if !deepstack {
            return Some(format!(
                "`{path}`: `deepstack` is a setting of the families with DeepStack features (Qwen3-VL's), not of `{arch}`"
            ));
        }
        if !matches!(v.as_str(), "1" | "2") {
            return Some(format!(
                "`{path}`: `deepstack` is 1 or 2 (the tiny tower's blocks), not `{v}`"
            ));
        }
    }
    if let Some(v) = uri.params.get("partial_rotary_factor")
        && !v.parse::<f64>().is_ok_and(|f| f > 0.0 && f <= 1.0)
    {
        return Some(format!(
            "`{path}`: `partial_rotary_factor` must be a number in (0, 1], not `{v}`"
        ));
    }
    for key in TINY_COUNTS {
        if let Some(v) = uri.params.get(*key)
            && !v.parse::<i64>().is_ok_and(|n| n >= 1)
        {
            return Some(format!(
                "`{path}`: `{key}` must be a whole number of at least 1, not `{v}`"
            ));
        }
    }
    None
}

/// Tokens of the built-in tokenizer: specials, digits, punctuation and words.
pub const TINY_VOCAB: i64 = 38;

/// The family `builtin://tiny` builds when its address names no `arch`.
pub const TINY_DEFAULT_ARCH: &str = "qwen2";

/// The vision tokens (Qwen-VL's) the built-in tokenizer of a vision-language tiny model adds
/// after its vocabulary, in id order: a vision span's start and end, an image's and a video's
/// placeholder.
pub const TINY_VISION_TOKENS: [&str; 4] = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
];

/// True when the tiny family `arch` (an `arch=` name) has a vision tower.
pub fn tiny_arch_has_vision(arch: &str) -> bool {
    crate::families::FAMILIES
        .iter()
        .any(|r| r.tiny_arch == arch && r.vision.is_some())
}

/// The vocabulary of a `builtin://tiny?…` model: the built-in tokenizer's, the vision tokens
/// of a vision-language family, and one token per tool of its `tools=a,b` parameter.
pub fn tiny_vocab(uri: &str) -> i64 {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    let param = |key: &str| query.split('&').find_map(|kv| kv.strip_prefix(key));
    let tools = param("tools=").map_or(0, |t| t.split(',').filter(|t| !t.is_empty()).count());
    let vision = if param("arch=").is_some_and(tiny_arch_has_vision) {
        TINY_VISION_TOKENS.len()
    } else {
        0
    };
    TINY_VOCAB + (vision + tools) as i64
}

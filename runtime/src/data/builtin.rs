//! Synthetic tasks with rule rewards that need no files, addressed as
//! `builtin://<task>?split=train|test[&size=N][&seed=S]…`, producing rows in verl's layout.
//!
//! - `digit_reversal`: "reverse 40213" -> "31204". Parameters `min_digits` (2), `max_digits` (5).
//! - `arithmetic`: "compute 12+34" -> "46" (`+`, `-` with a non-negative result, `*`).
//!   Parameters `max_operand` (99), `ops` (`+-*`, any subset).
//! - `code_lookup`, the tool task: "what is the answer of 472" -> the number's 3-digit code,
//!   which only the `lookup` tool knows ([`lookup_code`]; `examples/tools/code_lookup.py` is
//!   that tool, `examples/tool_lookup.yaml` the run). Rows carry verl's per-sample tool
//!   arguments, `extra_info.tools_kwargs = {lookup: {create_kwargs: {number}}}`.
//!
//! - `color_digits`, the vision task: an image of `stripes` (3, up to 6) vertical stripes,
//!   each one of ten colours ([`STRIPE_COLORS`], colour `d` for digit `d`), and the prompt
//!   "<image>what is the answer?" -> the stripes' digits left to right ("307"); each picture's
//!   colours are shaded (up to 12 levels a channel), so examples are distinct pictures. Rows carry the
//!   image as verl's multimodal datasets do (`images = [{bytes: <PNG>, path: null}]`, 28
//!   pixels a stripe and 56 high: two merged 28-pixel patches a stripe), for a vision-language model
//!   (`builtin://tiny?arch=qwen2_5_vl`, `examples/color_digits_vl.yaml`).
//!
//! `interaction=<name>` (any task) gives each row verl's interaction arguments,
//! `extra_info.interaction_kwargs = {name, query, ground_truth}` (what verl's GSM8K
//! multi-turn preprocessing writes), for `rollout.multi_turn.interaction_config_path`.
//!
//! `size` defaults to 8192 (train) / 256 (test); the test split is generated first and
//! excluded from the train split, so the two never share a prompt. Rows are
//! `data_source = "builtin/<task>"`, `prompt = [{role: user, content}]`, `ability`,
//! `reward_model = {style: rule, ground_truth}`, `extra_info = {split, index, question,
//! answer}`, and for supervised fine-tuning the solved conversation, `messages = [{role: user,
//! content}, {role: assistant, content: ground_truth}]` (verl's SFT `messages_key`; the
//! single-turn SFT dataset of verl 0.7.0 reads `extra_info.question`/`answer`, as for GSM8K).

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::builtin_uri::BuiltinUri;
use crate::rng::Rng;

/// Task names.
pub const TASKS: &[&str] = &[
    "digit_reversal",
    "arithmetic",
    "code_lookup",
    "color_digits",
];

/// The RGB colour of each digit's stripe in `color_digits` images.
pub const STRIPE_COLORS: [[u8; 3]; 10] = [
    [0, 0, 0],
    [255, 255, 255],
    [230, 25, 25],
    [25, 200, 40],
    [30, 60, 230],
    [250, 220, 20],
    [240, 130, 20],
    [150, 40, 200],
    [20, 210, 220],
    [140, 90, 40],
];

/// A `color_digits` image of `digits` (one stripe each, left to right), 28 pixels a stripe
/// and 56 high, as PNG bytes; `shade` moves each stripe's colour by up to 12 levels per
/// channel (a deterministic function of `shade` and the stripe), so the same digits come in
/// many pictures.
pub fn stripe_png(digits: &str, shade: u64) -> Result<Vec<u8>, String> {
    let (stripe, height) = (28usize, 56usize);
    let mut rng = Rng::derive(shade, 0x5717_09e5);
    let colors: Vec<[u8; 3]> = digits
        .bytes()
        .map(|b| {
            let base = STRIPE_COLORS[usize::from(b.wrapping_sub(b'0')) % 10];
            base.map(|c| (i64::from(c) + rng.range(-12, 12)).clamp(0, 255) as u8)
        })
        .collect();
    let width = stripe * colors.len().max(1);
    let mut data = Vec::with_capacity(width * height * 3);
    for _ in 0..height {
        for x in 0..width {
            data.extend_from_slice(&colors.get(x / stripe).copied().unwrap_or([0; 3]));
        }
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width as u32, height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(&data).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// The secret code of `number` in the `code_lookup` task: 3 digits no rule over the digits
/// gives away (the tool in `examples/tools/code_lookup.py` computes the same).
pub fn lookup_code(number: u64) -> String {
    format!("{:03}", (number * 7919 + 104_729) % 1000)
}

/// The `data_source` of a task's rows.
pub fn data_source(task: &str) -> String {
    format!("builtin/{task}")
}

type Gen = Box<dyn FnMut(&mut Rng) -> (String, String)>;

fn generator(uri: &BuiltinUri) -> Result<Gen, String> {
    match uri.name.as_str() {
        "digit_reversal" => {
            let (lo, hi): (i64, i64) = (uri.get("min_digits", 2)?, uri.get("max_digits", 5)?);
            if lo < 1 || hi < lo || hi > 30 {
                return Err(format!(
                    "builtin://digit_reversal: need 1 <= min_digits <= max_digits <= 30, got {lo}..{hi}"
                ));
            }
            Ok(Box::new(move |rng| {
                let n = rng.range(lo, hi);
                let digits: String = (0..n)
                    .map(|_| char::from(b'0' + rng.below(10) as u8))
                    .collect();
                (format!("reverse {digits}"), digits.chars().rev().collect())
            }))
        }
        "arithmetic" => {
            let max: i64 = uri.get("max_operand", 99)?;
            let ops: String = uri.get("ops", "+-*".to_owned())?;
            if max < 1 || ops.is_empty() || !ops.chars().all(|c| "+-*".contains(c)) {
                return Err(
                    "builtin://arithmetic: need max_operand >= 1 and ops from `+-*`".to_owned(),
                );
            }
            let ops: Vec<char> = ops.chars().collect();
            Ok(Box::new(move |rng| {
                let op = ops[rng.below(ops.len() as u64) as usize];
                let (mut a, mut b) = (rng.range(0, max), rng.range(0, max));
                if op == '-' && a < b {
                    std::mem::swap(&mut a, &mut b);
                }
                let r = match op {
                    '+' => a + b,
                    '-' => a - b,
                    _ => a * b,
                };
                (format!("compute {a}{op}{b}"), r.to_string())
            }))
        }
        // The prompt text is the same for every row: the digits and the picture's shade make
        // the examples distinct (and become the image when the rows are built).
        "color_digits" => {
            let stripes: i64 = uri.get("stripes", 3)?;
            if !(1..=6).contains(&stripes) {
                return Err(format!(
                    "builtin://color_digits: need 1 <= stripes <= 6, got {stripes}"
                ));
            }
            Ok(Box::new(move |rng| {
                let digits: String = (0..stripes)
                    .map(|_| char::from(b'0' + rng.below(10) as u8))
                    .collect();
                let shade = rng.below(1 << 20);
                (format!("{digits}:{shade}"), digits)
            }))
        }
        "code_lookup" => Ok(Box::new(move |rng| {
            let n = rng.range(100, 999) as u64;
            (format!("what is the answer of {n}"), lookup_code(n))
        })),
        other => Err(format!(
            "unknown builtin dataset `{other}` (known: {})",
            TASKS.join(", ")
        )),
    }
}

/// Distinct examples from `seed`'s stream for `split`, skipping prompts in `exclude`; when
/// `strict` is false, returns fewer than `size` if the task has too few distinct prompts.
fn examples(
    uri: &BuiltinUri,
    split: &str,
    size: usize,
    seed: u64,
    exclude: &HashSet<String>,
    strict: bool,
) -> Result<Vec<(String, String)>, String> {
    let mut gen_fn = generator(uri)?;
    let mut rng = Rng::derive(seed, if split == "test" { 1 } else { 2 });
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(size);
    let mut attempts = 0usize;
    while out.len() < size {
        attempts += 1;
        if attempts > size.saturating_mul(50) + 1000 {
            if !strict {
                break;
            }
            return Err(format!(
                "builtin://{}: cannot draw {size} distinct {split} examples; lower `size` or widen the task",
                uri.name
            ));
        }
        let (prompt, answer) = gen_fn(&mut rng);
        if !exclude.contains(&prompt) && seen.insert(prompt.clone()) {
            out.push((prompt, answer));
        }
    }
    Ok(out)
}

/// The rows of a `builtin://` dataset address.
pub fn rows(uri: &BuiltinUri) -> Result<Vec<Map<String, Value>>, String> {
    let known = [
        "split",
        "size",
        "seed",
        "min_digits",
        "max_digits",
        "max_operand",
        "ops",
        "interaction",
        "stripes",
    ];
    uri.check_keys(&known)?;
    let split: String = uri.get("split", "train".to_owned())?;
    if split != "train" && split != "test" {
        return Err(format!(
            "builtin://{}: split must be train or test, got `{split}`",
            uri.name
        ));
    }
    let seed: u64 = uri.get("seed", 0)?;
    let test_size: usize = if split == "test" {
        uri.get("size", 256)?
    } else {
        256
    };
    // The train split excludes the default-sized test split (as far as the task allows).
    let test = examples(
        uri,
        "test",
        test_size,
        seed,
        &HashSet::new(),
        split == "test",
    )?;
    let chosen = if split == "test" {
        test
    } else {
        let exclude: HashSet<String> = test.into_iter().map(|(p, _)| p).collect();
        examples(uri, "train", uri.get("size", 8192)?, seed, &exclude, true)?
    };
    let interaction: String = uri.get("interaction", String::new())?;
    let ability = if uri.name == "arithmetic" {
        "math"
    } else {
        "digits"
    };
    chosen
        .into_iter()
        .enumerate()
        .map(|(i, (prompt, answer))| {
            let (prompt, images) = if uri.name == "color_digits" {
                use base64::Engine as _;
                let (digits, shade) = prompt.split_once(':').unwrap_or((&prompt, "0"));
                let png = stripe_png(digits, shade.parse().unwrap_or(0))?;
                let png = base64::engine::general_purpose::STANDARD.encode(png);
                (
                    "<image>what is the answer?".to_owned(),
                    json!([{"bytes": png, "path": null}]),
                )
            } else {
                (prompt, Value::Null)
            };
            // `question`/`answer` as verl's GSM8K preprocessing writes them: the single-turn
            // SFT dataset reads them through `prompt_dict_keys`/`response_dict_keys`.
            let mut extra =
                json!({"split": split, "index": i, "question": prompt, "answer": answer});
            if uri.name == "code_lookup" {
                let number = prompt.rsplit(' ').next().unwrap_or_default();
                extra["tools_kwargs"] = json!({"lookup": {"create_kwargs": {"number": number}}});
            }
            if !interaction.is_empty() {
                extra["interaction_kwargs"] =
                    json!({"name": interaction, "query": prompt, "ground_truth": answer});
            }
            let mut row = json!({
                "data_source": data_source(&uri.name),
                "prompt": [{"role": "user", "content": prompt}],
                "messages": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": answer},
                ],
                "ability": ability,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": extra,
            });
            if !images.is_null() {
                row["images"] = images;
            }
            Ok(match row {
                Value::Object(m) => m,
                _ => Map::new(),
            })
        })
        .collect()
}

/// Rule reward of a built-in task; `None` when `data_source` is not a built-in one.
///
/// The response (special tokens removed, surrounding whitespace trimmed) scores 1.0 when it
/// equals the ground truth. Otherwise it earns shaped partial credit below 0.5, so that a
/// randomly initialised tiny model gets a signal from its first samples (digits only, then the
/// right length, then the right digits in the right places):
/// `0.1 * digit_fraction + 0.1 * length_match + 0.3 * position_match`, where
/// `digit_fraction` is the share of ASCII digits in the response, `length_match` is
/// `1 - |len(r) - len(g)| / max(len(r), len(g))`, and `position_match` the share of positions
/// of the longer string where both agree.
///
/// `code_lookup` scores the answer after the last tool round (the text after the last
/// `assistant` header), and a response that called the tool earns 0.2 more (below 1), the
/// usual format credit of tool-use recipes, so that calling pays before copying is learnt.
pub fn compute_score(data_source: &str, response: &str, ground_truth: &str) -> Option<f64> {
    let task = data_source.strip_prefix("builtin/")?;
    if !TASKS.contains(&task) {
        return None;
    }
    if task == "color_digits" {
        return compute_score("builtin/digit_reversal", response, ground_truth);
    }
    if task == "code_lookup" {
        let called = response.contains("<tool_call>");
        let answer = response.rsplit("assistant\n").next().unwrap_or(response);
        let base = compute_score("builtin/digit_reversal", answer, ground_truth)?;
        return Some(if base >= 1.0 {
            1.0
        } else {
            base + if called { 0.2 } else { 0.0 }
        });
    }
    let r: Vec<char> = response.trim().chars().collect();
    let g: Vec<char> = ground_truth.chars().collect();
    if r == g {
        return Some(1.0);
    }
    let longest = r.len().max(g.len()).max(1) as f64;
    let digits = if r.is_empty() {
        0.0
    } else {
        r.iter().filter(|c| c.is_ascii_digit()).count() as f64 / r.len() as f64
    };
    let length = 1.0 - (r.len() as f64 - g.len() as f64).abs() / longest;
    let positions = r.iter().zip(&g).filter(|(a, b)| a == b).count() as f64 / longest;
    Some(0.1 * digits + 0.1 * length + 0.3 * positions)
}

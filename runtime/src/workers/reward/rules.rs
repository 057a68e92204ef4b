//! Built-in rule scorers, chosen by `data_source` as verl's `default_compute_score` does:
//!
//! | data_source | scorer |
//! |---|---|
//! | `openai/gsm8k` | [`gsm8k`]: the last `#### <number>` of the response's last 300 characters, commas and `$` removed, equal to the ground truth → 1, else 0 |
//! | `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500` | [`math_boxed`]: the last `\boxed{…}` equivalent to the ground truth after the Hendrycks-MATH normalisation → 1, else 0 |
//! | `builtin/<task>` | the synthetic tasks' rule rewards ([`crate::data::builtin::compute_score`]) |
//! | the others verl's `default_compute_score` covers ([`scored_by_verl`]) | verl's own function, in Python |

use serde_json::Value;

use super::RewardError;
use crate::data::builtin;

/// The data sources with a scorer, for error messages.
pub const KNOWN_SOURCES: &str = "openai/gsm8k, lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, \
HuggingFaceH4/MATH-500 and builtin/<task> (verlc's rules), and through verl's own \
default_compute_score math_dapo, math, aime*, numina_*, hiyouga/geometry3k, searchR1_*, codecontests, \
apps, codeforces and taco";

const MATH_SOURCES: [&str; 3] = [
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
];

/// True when `data_source` has a built-in scorer.
/// The data sources verl's `default_compute_score` scores that verlc's rules do not: verl's
/// DAPO/AIME math, Numina (PRIME), geometry3k, Search-R1 and code-contest scorers. verlc
/// calls verl's own function for them (`RewardFn::Builtin`), so they score as in verl.
pub fn scored_by_verl(data_source: &str) -> bool {
    const SOURCES: [&str; 20] = [
        "math_dapo",
        "math",
        "math_dapo_reasoning",
        "numina_aops_forum",
        "numina_synthetic_math",
        "numina_amc_aime",
        "numina_synthetic_amc",
        "numina_cn_k12",
        "numina_olympiads",
        "codecontests",
        "apps",
        "codeforces",
        "taco",
        "hiyouga/geometry3k",
        "searchR1_nq",
        "searchR1_triviaqa",
        "searchR1_popqa",
        "searchR1_hotpotqa",
        "searchR1_2wikimultihopqa",
        "searchR1_musique",
    ];
    SOURCES.contains(&data_source)
        || data_source == "searchR1_bamboogle"
        || data_source.starts_with("aime")
}

pub fn is_supported(data_source: &str) -> bool {
    data_source == "openai/gsm8k"
        || MATH_SOURCES.contains(&data_source)
        || builtin::compute_score(data_source, "", "").is_some()
}

fn truth_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// verl's `default_compute_score(data_source, solution_str, ground_truth)`.
pub fn default_compute_score(
    data_source: &str,
    solution: &str,
    ground_truth: &Value,
) -> Result<f64, RewardError> {
    let truth = truth_str(ground_truth);
    if data_source == "openai/gsm8k" {
        return Ok(gsm8k(solution, &truth));
    }
    if MATH_SOURCES.contains(&data_source) {
        return Ok(math_boxed(solution, &truth));
    }
    builtin::compute_score(data_source, solution, &truth)
        .ok_or_else(|| RewardError::NotImplemented(data_source.to_owned()))
}

/// The answer after the last `#### ` (verl's strict GSM8K extraction): a run of
/// `-?[0-9.,]+` with commas and `$` removed, searched in the last 300 characters.
pub fn gsm8k_extract(solution: &str) -> Option<String> {
    let chars: Vec<char> = solution.chars().collect();
    let tail: String = chars[chars.len().saturating_sub(300)..].iter().collect();
    let mut found = None;
    let mut rest = tail.as_str();
    while let Some(pos) = rest.find("#### ") {
        let after = &rest[pos + 5..];
        let mut end = 0;
        for (i, c) in after.char_indices() {
            let ok = c.is_ascii_digit() || c == '.' || c == ',' || (i == 0 && c == '-');
            if !ok {
                break;
            }
            end = i + c.len_utf8();
        }
        let m = &after[..end];
        // The regex needs at least one of [0-9.,] after an optional '-'.
        if !m.trim_start_matches('-').is_empty() {
            found = Some(m.replace([',', '$'], ""));
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    found
}

/// GSM8K: 1.0 when the strict `#### answer` equals the ground truth, else 0.0.
pub fn gsm8k(solution: &str, ground_truth: &str) -> f64 {
    match gsm8k_extract(solution) {
        Some(a) if a == ground_truth => 1.0,
        _ => 0.0,
    }
}

/// The last `\boxed{…}` / `\boxed …` / `\fbox{…}` of `s`, with its command (verl's
/// `last_boxed_only_string`).
pub fn last_boxed_only_string(s: &str) -> Option<String> {
    let mut idx = s.rfind("\\boxed");
    if let Some(pos) = s.rfind("\\boxed ") {
        let after = &s[pos + "\\boxed ".len()..];
        return Some(format!("\\boxed {}", after.split('$').next().unwrap_or("")));
    }
    if idx.is_none() {
        idx = s.rfind("\\fbox");
    }
    let idx = idx?;
    let mut depth = 0i64;
    for (i, c) in s[idx..].char_indices() {
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            depth -= 1;
            if depth == 0 {
                return Some(s[idx..idx + i + 1].to_owned());
            }
        }
    }
    None
}

/// The content of a boxed expression (verl's `remove_boxed`; like verl, an `\fbox{…}` found
/// by [`last_boxed_only_string`] is not unboxed, so it scores 0).
pub fn remove_boxed(s: &str) -> Option<String> {
    if let Some(rest) = s.strip_prefix("\\boxed ") {
        return Some(rest.to_owned());
    }
    s.strip_prefix("\\boxed{")?
        .strip_suffix('}')
        .map(str::to_owned)
}

/// MATH: 1.0 when the last boxed answer is equivalent to the ground truth, else 0.0.
pub fn math_boxed(solution: &str, ground_truth: &str) -> f64 {
    let Some(answer) = last_boxed_only_string(solution).and_then(|b| remove_boxed(&b)) else {
        return 0.0;
    };
    if is_equiv(&answer, ground_truth) {
        1.0
    } else {
        0.0
    }
}

/// Hendrycks-MATH equivalence: equal after [`strip_string`]; when normalisation fails (the
/// reference raises), the raw strings are compared.
pub fn is_equiv(a: &str, b: &str) -> bool {
    match (strip_string(a), strip_string(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Hendrycks-MATH answer normalisation (`strip_string`); `None` where the reference raises.
pub fn strip_string(s: &str) -> Option<String> {
    let mut s = s.replace('\n', "").replace("\\!", "").replace("\\\\", "\\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac");
    s = s.replace("\\left", "").replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "");
    s = s.replace("\\$", "");
    s = remove_right_units(&s)?;
    s = s.replace("\\%", "").replace("\\%", "");
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s = format!("0{s}");
    }
    let parts: Vec<&str> = s.split('=').collect();
    if parts.len() == 2 && parts[0].chars().count() <= 2 {
        s = parts[1].to_owned();
    }
    s = fix_sqrt(&s)?;
    s = s.replace(' ', "");
    s = fix_fracs(&s);
    if s == "0.5" {
        s = "\\frac{1}{2}".to_owned();
    }
    fix_a_slash_b(&s)
}

fn remove_right_units(s: &str) -> Option<String> {
    if s.contains("\\text{ ") {
        let parts: Vec<&str> = s.split("\\text{ ").collect();
        if parts.len() != 2 {
            return None;
        }
        return Some(parts[0].to_owned());
    }
    Some(s.to_owned())
}

fn fix_sqrt(s: &str) -> Option<String> {
    if !s.contains("\\sqrt") {
        return Some(s.to_owned());
    }
    let mut parts = s.split("\\sqrt");
    let mut out = parts.next().unwrap_or("").to_owned();
    for p in parts {
        let first = p.chars().next()?;
        if first != '{' {
            out.push_str(&format!("\\sqrt{{{first}}}{}", &p[first.len_utf8()..]));
        } else {
            out.push_str("\\sqrt");
            out.push_str(p);
        }
    }
    Some(out)
}

fn fix_fracs(s: &str) -> String {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or("").to_owned();
    for p in parts {
        out.push_str("\\frac");
        let chars: Vec<char> = p.chars().collect();
        if chars.first() == Some(&'{') {
            out.push_str(p);
            continue;
        }
        if chars.len() < 2 {
            return s.to_owned();
        }
        let (a, b) = (chars[0], chars[1]);
        let post: String = chars[2..].iter().collect();
        if b != '{' {
            out.push_str(&format!("{{{a}}}{{{b}}}{post}"));
        } else {
            out.push_str(&format!("{{{a}}}{b}{post}"));
        }
    }
    out
}

fn fix_a_slash_b(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split('/').collect();
    if parts.len() != 2 {
        return Some(s.to_owned());
    }
    // int() of a non-integer raises outside the reference's `except AssertionError`.
    let a: i64 = parse_py_int(parts[0])?;
    let b: i64 = parse_py_int(parts[1])?;
    if s == format!("{a}/{b}") {
        Some(format!("\\frac{{{a}}}{{{b}}}"))
    } else {
        Some(s.to_owned())
    }
}

/// Python's `int(str)` for plain decimal integers (surrounding whitespace, sign, `_` digit
/// separators are accepted as Python does).
fn parse_py_int(s: &str) -> Option<i64> {
    let t = s.trim();
    let (sign, digits) = match t.strip_prefix('-') {
        Some(d) => (-1, d),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    if !clean.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    clean.parse::<i64>().ok().map(|v| sign * v)
}

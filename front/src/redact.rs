//! Keeping environment-derived values out of verlc's output. A config may read a token with
//! `${oc.env:HF_TOKEN}`; `verlc check` runs in CI on configs from pull requests, where a
//! message quoting that value ("`hf_abc...` is not an integer") would publish it. Every text
//! verlc prints from a composed config (diagnostics in both formats, `--print-config`,
//! `explain`) passes through [`Secrets`], which writes `${oc.env:NAME}` in place of the value.

use crate::diag::Diagnostic;

/// Values shorter than this are replaced only as whole words (`ab` inside `tab` is no leak),
/// and not at all when they are numbers: hiding every `2` would garble batch sizes and line
/// numbers, and no credential is that short. Longer values are replaced wherever they appear.
const WORD_ONLY_BELOW: usize = 4;

/// The environment variables a config reads, with their values at check time.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    /// `(value, replacement)`, longest value first.
    values: Vec<(String, String)>,
}

impl Secrets {
    /// The current values of `names` (unset or empty ones need no hiding).
    pub fn from_env(names: &[String]) -> Secrets {
        let mut values: Vec<(String, String)> = names
            .iter()
            .filter_map(|n| {
                let v = std::env::var(n).ok()?;
                let v = v.trim().to_owned();
                let short_number = v.len() < WORD_ONLY_BELOW && v.parse::<f64>().is_ok();
                (!v.is_empty() && !short_number).then(|| (v, format!("${{oc.env:{n}}}")))
            })
            .collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.0.len()));
        Secrets { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret value replaced by its `${oc.env:NAME}`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (value, replacement) in &self.values {
            if value.len() >= WORD_ONLY_BELOW {
                if out.contains(value.as_str()) {
                    out = out.replace(value.as_str(), replacement);
                }
            } else {
                out = replace_words(&out, value, replacement);
            }
        }
        out
    }

    /// Redact the text of every diagnostic (message, labels, help, notes). Source snippets
    /// are rendered from the files, which hold the `${oc.env:...}` as written.
    pub fn redact_diagnostics(&self, diags: &mut [Diagnostic]) {
        if self.is_empty() {
            return;
        }
        for d in diags {
            d.message = self.redact(&d.message);
            for l in d.primary.iter_mut().chain(d.secondary.iter_mut()) {
                l.message = self.redact(&l.message);
            }
            if let Some(h) = &mut d.help {
                *h = self.redact(h);
            }
            for n in &mut d.notes {
                *n = self.redact(n);
            }
        }
    }

    /// Redact every string (keys and values) of a JSON document.
    pub fn redact_json(&self, v: &mut serde_json::Value) {
        use serde_json::Value as J;
        if self.is_empty() {
            return;
        }
        match v {
            J::String(s) => *s = self.redact(s),
            J::Array(items) => items.iter_mut().for_each(|i| self.redact_json(i)),
            J::Object(m) => {
                let entries = std::mem::take(m);
                for (k, mut val) in entries {
                    self.redact_json(&mut val);
                    m.insert(self.redact(&k), val);
                }
            }
            // `${oc.env:...}` always gives a string: a number is some other value.
            J::Number(_) | J::Null | J::Bool(_) => {}
        }
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Replace `value` where it is not part of a longer word or number.
fn replace_words(text: &str, value: &str, replacement: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(value) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + value.len()..].chars().next();
        let bounded = |c: Option<char>| c.is_none_or(|c| !is_word(c) && c != '.');
        out.push_str(&rest[..i]);
        if bounded(before) && bounded(after) {
            out.push_str(replacement);
        } else {
            out.push_str(value);
        }
        rest = &rest[i + value.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_numbers_are_not_hidden() {
        // SAFETY: the variables are unique to this test; nothing else reads them.
        unsafe {
            std::env::set_var("VERLC_REDACT_TEST_N", "2");
            std::env::set_var("VERLC_REDACT_TEST_T", " tok-en ");
        }
        let s = Secrets::from_env(&[
            "VERLC_REDACT_TEST_N".into(),
            "VERLC_REDACT_TEST_T".into(),
            "VERLC_REDACT_TEST_UNSET".into(),
        ]);
        assert_eq!(s.redact("2 tok-en"), "2 ${oc.env:VERLC_REDACT_TEST_T}");
    }

    fn secrets(pairs: &[(&str, &str)]) -> Secrets {
        let mut values: Vec<(String, String)> = pairs
            .iter()
            .map(|(n, v)| (v.to_string(), format!("${{oc.env:{n}}}")))
            .collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.0.len()));
        Secrets { values }
    }

    #[test]
    fn long_values_are_replaced_anywhere_short_ones_as_words() {
        let s = secrets(&[("TOKEN", "hf_secret123"), ("N", "ab")]);
        assert_eq!(
            s.redact("`xhf_secret123y` is not an integer"),
            "`x${oc.env:TOKEN}y` is not an integer"
        );
        assert_eq!(
            s.redact("value ab, tab, ab.c, `ab`"),
            "value ${oc.env:N}, tab, ab.c, `${oc.env:N}`"
        );
    }

    #[test]
    fn json_keys_values_and_numbers() {
        let s = secrets(&[("TOKEN", "hf_secret123")]);
        let mut v = serde_json::json!({"a": "hf_secret123", "hf_secret123": [64, "x"]});
        s.redact_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": "${oc.env:TOKEN}", "${oc.env:TOKEN}": [64, "x"]})
        );
    }
}

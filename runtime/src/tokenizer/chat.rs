//! Hugging Face chat templates rendered with minijinja, configured like transformers'
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with loop controls,
//! Python string/dict methods (`.strip()`, `.split()`, `.items()` …), `raise_exception`,
//! `strftime_now` and transformers' `tojson` (Python `json.dumps`, non-ASCII kept).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// One chat message; fields beyond role and content (tool_calls, name …) are kept in `extra`
/// and visible to the template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Json,
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_owned(),
            content: Json::String(content.to_owned()),
            extra: Map::new(),
        }
    }
    pub fn system(content: &str) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: &str) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: &str) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; syntax errors (including unsupported extensions such as
    /// `{% generation %}`) are reported here.
    pub fn new(source: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned())?;
        Ok(ChatTemplate { env })
    }

    /// Renders `messages` with the given context: `add_generation_prompt`, the special-token
    /// strings (`bos_token`, `eos_token` …) and extra keyword arguments (e.g. `enable_thinking`).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        special: &Map<String, Json>,
        kwargs: &Map<String, Json>,
    ) -> Result<String, Error> {
        let mut ctx: Map<String, Json> = special.clone();
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        let msgs = serde_json::to_value(messages)
            .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
        ctx.insert("messages".into(), msgs);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        ctx.entry("tools").or_insert(Json::Null);
        ctx.entry("documents").or_insert(Json::Null);
        self.env
            .get_template(NAME)?
            .render(Value::from(minijinja::value::Serde(&ctx)))
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let mut out = String::new();
    let opts = PyJson {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ascii: ensure_ascii.unwrap_or(false),
    };
    opts.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it (`", "` and `": "`
/// separators, keys in order).
pub fn python_json(value: &Json) -> String {
    let mut out = String::new();
    PyJson {
        indent: None,
        sort_keys: false,
        ascii: false,
    }
    .write(value, 0, &mut out);
    out
}

/// Python `json.dumps` formatting.
struct PyJson {
    indent: Option<usize>,
    sort_keys: bool,
    ascii: bool,
}

impl PyJson {
    fn write(&self, v: &Json, depth: usize, out: &mut String) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&n.to_string()),
            Json::String(s) => self.string(s, out),
            Json::Array(a) => self.seq(
                a.iter().map(|x| (None, x)).collect(),
                ('[', ']'),
                depth,
                out,
            ),
            Json::Object(m) => {
                let mut items: Vec<(&String, &Json)> = m.iter().collect();
                if self.sort_keys {
                    items.sort_by(|a, b| a.0.cmp(b.0));
                }
                self.seq(
                    items.into_iter().map(|(k, v)| (Some(k), v)).collect(),
                    ('{', '}'),
                    depth,
                    out,
                )
            }
        }
    }

    fn seq(
        &self,
        items: Vec<(Option<&String>, &Json)>,
        (open, close): (char, char),
        depth: usize,
        out: &mut String,
    ) {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return;
        }
        let newline = |d: usize, out: &mut String| {
            if let Some(n) = self.indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * d));
            }
        };
        for (i, (key, val)) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(if self.indent.is_some() { "," } else { ", " });
            }
            newline(depth + 1, out);
            if let Some(k) = key {
                self.string(k, out);
                out.push_str(": ");
            }
            self.write(val, depth + 1, out);
        }
        newline(depth, out);
        out.push(close);
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && (c as u32) > 0x7f) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// `strftime_now(format)` in UTC for the codes chat templates use (%Y %y %m %d %B %b %H %M %S %A %a).
fn strftime_now(fmt: &str) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
        .as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let mname = MONTHS[(month - 1) as usize];
    let dname = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(mname),
            Some('b') => out.push_str(&mname[..3]),
            Some('A') => out.push_str(dname),
            Some('a') => out.push_str(&dname[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported code %{other}"),
                ));
            }
            None => out.push('%'),
        }
    }
    Ok(out)
}

//! The value half of Hydra's override grammar (hydra-core 1.3, `OverrideLexer.g4` value
//! mode and `OverrideParser.g4`), reproduced token for token so that verlc accepts and
//! types exactly what Hydra does: `k=1e-6` is a float, `k=010` the string "010",
//! `k=~/x` and `k=a'b` are syntax errors, `k=a\,b` is "a,b".
//!
//! The lexer picks the longest match among the token rules at each position (ties go to
//! the rule defined first), as ANTLR does. The parser follows the grammar's rules; the
//! built-in functions are the casts `int/float/str/bool` and `sort`; sweeps are rejected
//! because they need `--multirun`.

use super::interp::py_float;
use super::node::{Entry, Map, Node, Scalar, Value};
use crate::source::{Origin, SourceId};

/// A syntax or evaluation error: byte span in the override text and a message.
pub type PError = (std::ops::Range<usize>, String);
type PResult<T> = Result<T, PError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    POpen,
    Comma,
    PClose,
    BracketOpen,
    BracketClose,
    BraceOpen,
    BraceClose,
    Colon,
    Equal,
    Float,
    Int,
    Bool,
    Null,
    UnquotedChar,
    Id,
    Esc,
    Ws,
    Quoted,
    Interpolation,
}

/// Token rules in the lexer's definition order (the tie-break order).
const RULES: [Tok; 19] = [
    Tok::POpen,
    Tok::Comma,
    Tok::PClose,
    Tok::BracketOpen,
    Tok::BracketClose,
    Tok::BraceOpen,
    Tok::BraceClose,
    Tok::Colon,
    Tok::Equal,
    Tok::Float,
    Tok::Int,
    Tok::Bool,
    Tok::Null,
    Tok::UnquotedChar,
    Tok::Id,
    Tok::Esc,
    Tok::Ws,
    Tok::Quoted,
    Tok::Interpolation,
];

#[derive(Clone, Copy, Debug)]
struct Token {
    kind: Tok,
    start: usize,
    end: usize,
}

// ------------------------------------------------------------------ lexer

fn byte(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

fn ws_len(s: &[u8], i: usize) -> usize {
    s[i.min(s.len())..]
        .iter()
        .take_while(|c| **c == b' ' || **c == b'\t')
        .count()
}

/// `WS? c WS?` style punctuation: `lead`/`trail` say which sides take whitespace.
fn punct(s: &[u8], i: usize, c: u8, lead: bool, trail: bool) -> Option<usize> {
    let w = if lead { ws_len(s, i) } else { 0 };
    if byte(s, i + w) != c {
        return None;
    }
    let t = if trail { ws_len(s, i + w + 1) } else { 0 };
    Some(w + 1 + t)
}

/// `DIGIT (('_')? DIGIT)*`
fn digits(s: &[u8], i: usize) -> Option<usize> {
    if !byte(s, i).is_ascii_digit() {
        return None;
    }
    let mut j = i + 1;
    loop {
        if byte(s, j).is_ascii_digit() {
            j += 1;
        } else if byte(s, j) == b'_' && byte(s, j + 1).is_ascii_digit() {
            j += 2;
        } else {
            return Some(j - i);
        }
    }
}

/// `'0' | [1-9] (('_')? DIGIT)*`
fn int_unsigned(s: &[u8], i: usize) -> Option<usize> {
    match byte(s, i) {
        b'0' => Some(1),
        b'1'..=b'9' => digits(s, i),
        _ => None,
    }
}

/// `INT_UNSIGNED '.' | INT_UNSIGNED? '.' DIGIT (('_')? DIGIT)*`
fn point_float(s: &[u8], i: usize) -> Option<usize> {
    let int = int_unsigned(s, i);
    let mut best = None;
    if let Some(n) = int
        && byte(s, i + n) == b'.'
    {
        best = Some(n + 1 + digits(s, i + n + 1).unwrap_or(0));
    }
    if byte(s, i) == b'.'
        && let Some(d) = digits(s, i + 1)
    {
        best = best.max(Some(1 + d));
    }
    best
}

/// `(INT_UNSIGNED | POINT_FLOAT) [eE] [+-]? DIGIT (('_')? DIGIT)*`
fn exponent_float(s: &[u8], i: usize) -> Option<usize> {
    [int_unsigned(s, i), point_float(s, i)]
        .into_iter()
        .flatten()
        .filter_map(|base| {
            let mut j = i + base;
            if !matches!(byte(s, j), b'e' | b'E') {
                return None;
            }
            j += 1;
            if matches!(byte(s, j), b'+' | b'-') {
                j += 1;
            }
            digits(s, j).map(|d| j + d - i)
        })
        .max()
}

fn keyword(s: &[u8], i: usize, word: &str) -> Option<usize> {
    let end = i + word.len();
    (end <= s.len() && s[i..end].eq_ignore_ascii_case(word.as_bytes())).then_some(word.len())
}

fn sign(s: &[u8], i: usize) -> usize {
    usize::from(matches!(byte(s, i), b'+' | b'-'))
}

fn float_len(s: &[u8], i: usize) -> Option<usize> {
    let j = i + sign(s, i);
    let body = [
        point_float(s, j),
        exponent_float(s, j),
        keyword(s, j, "inf"),
        keyword(s, j, "nan"),
    ]
    .into_iter()
    .flatten()
    .max()?;
    Some(j - i + body)
}

fn int_len(s: &[u8], i: usize) -> Option<usize> {
    let j = i + sign(s, i);
    int_unsigned(s, j).map(|n| j - i + n)
}

fn id_len(s: &[u8], i: usize) -> Option<usize> {
    let c = byte(s, i);
    if !(c.is_ascii_alphabetic() || c == b'_') {
        return None;
    }
    Some(
        1 + s[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_' || **c == b'-')
            .count(),
    )
}

/// One or more of `\\ \( \) \[ \] \{ \} \: \= \, \<space> \<tab>`.
fn esc_len(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    while byte(s, j) == b'\\' && b"\\()[]{}:=, \t".contains(&byte(s, j + 1)) && j + 1 < s.len() {
        j += 2;
    }
    (j > i).then_some(j - i)
}

/// A quoted string ends at the first quote preceded by an even number of backslashes.
fn quoted_len(s: &[u8], i: usize) -> Option<usize> {
    let q = byte(s, i);
    if q != b'\'' && q != b'"' {
        return None;
    }
    let mut backslashes = 0;
    for (k, c) in s.iter().enumerate().skip(i + 1) {
        if *c == q && backslashes % 2 == 0 {
            return Some(k + 1 - i);
        }
        backslashes = if *c == b'\\' { backslashes + 1 } else { 0 };
    }
    None
}

/// `'${' ~('}')+ '}'`: ends at the first `}`, so nested interpolations do not lex.
fn interpolation_len(s: &[u8], i: usize) -> Option<usize> {
    if byte(s, i) != b'$' || byte(s, i + 1) != b'{' {
        return None;
    }
    let close = s[i + 2..].iter().position(|c| *c == b'}')?;
    (close > 0).then_some(close + 3)
}

fn rule_len(kind: Tok, s: &[u8], i: usize) -> Option<usize> {
    match kind {
        Tok::POpen => punct(s, i, b'(', true, true),
        Tok::Comma => punct(s, i, b',', true, true),
        Tok::PClose => punct(s, i, b')', true, false),
        Tok::BracketOpen => punct(s, i, b'[', false, true),
        Tok::BracketClose => punct(s, i, b']', true, false),
        Tok::BraceOpen => punct(s, i, b'{', false, true),
        Tok::BraceClose => punct(s, i, b'}', true, false),
        Tok::Colon => punct(s, i, b':', true, true),
        Tok::Equal => punct(s, i, b'=', true, true),
        Tok::Float => float_len(s, i),
        Tok::Int => int_len(s, i),
        Tok::Bool => keyword(s, i, "true").or_else(|| keyword(s, i, "false")),
        Tok::Null => keyword(s, i, "null"),
        Tok::UnquotedChar => b"/-\\+.$%*@?|"
            .contains(&byte(s, i))
            .then_some(1)
            .filter(|_| i < s.len()),
        Tok::Id => id_len(s, i),
        Tok::Esc => esc_len(s, i),
        Tok::Ws => Some(ws_len(s, i)).filter(|n| *n > 0),
        Tok::Quoted => quoted_len(s, i),
        Tok::Interpolation => interpolation_len(s, i),
    }
}

/// Tokenize `text[from..]`: at each position the longest rule wins, the earlier on ties.
fn lex(text: &str, from: usize) -> PResult<Vec<Token>> {
    let s = text.as_bytes();
    let mut out = Vec::new();
    let mut i = from;
    while i < s.len() {
        let mut best: Option<(Tok, usize)> = None;
        for kind in RULES {
            if let Some(n) = rule_len(kind, s, i)
                && best.is_none_or(|(_, b)| n > b)
            {
                best = Some((kind, n));
            }
        }
        let Some((kind, n)) = best else {
            let c = text[i..].chars().next().unwrap_or('?');
            return Err((
                i..i + c.len_utf8(),
                format!("`{c}` is not allowed here; quote the value ('...')"),
            ));
        };
        out.push(Token {
            kind,
            start: i,
            end: i + n,
        });
        i += n;
    }
    Ok(out)
}

// ------------------------------------------------------------------ parser

/// A parsed element before it becomes a [`Node`]; quoted strings are remembered because
/// casts treat them as strings whatever they look like.
#[derive(Clone, Debug)]
enum Elem {
    Scalar(Scalar, std::ops::Range<usize>),
    List(Vec<Elem>, std::ops::Range<usize>),
    Dict(
        Vec<(String, std::ops::Range<usize>, Elem)>,
        std::ops::Range<usize>,
    ),
}

impl Elem {
    fn span(&self) -> std::ops::Range<usize> {
        match self {
            Elem::Scalar(_, s) | Elem::List(_, s) | Elem::Dict(_, s) => s.clone(),
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
}

/// Parse the value of an override (the text after `=` and its whitespace).
pub fn parse_value(text: &str, from: usize, source: SourceId) -> PResult<Node> {
    let toks = lex(text, from)?;
    if toks.is_empty() {
        // `key=` is the empty string.
        return Ok(Node::scalar(
            Scalar::Str(String::new()),
            Some(Origin::new(source, from..from)),
        ));
    }
    let mut p = Parser {
        text,
        toks,
        pos: 0,
        depth: 0,
    };
    let first = p.element()?;
    if p.peek() == Some(Tok::Comma) {
        return Err((
            from..text.len(),
            "a comma-separated value is a sweep, which needs --multirun; quote it ('a,b') for a string or use [a,b] for a list".into(),
        ));
    }
    p.expect_end()?;
    Ok(to_node(first, source))
}

impl Parser<'_> {
    fn peek(&self) -> Option<Tok> {
        self.toks.get(self.pos).map(|t| t.kind)
    }

    fn peek_at(&self, k: usize) -> Option<Tok> {
        self.toks.get(self.pos + k).map(|t| t.kind)
    }

    fn here(&self) -> std::ops::Range<usize> {
        match self.toks.get(self.pos) {
            Some(t) => t.start..t.end,
            None => self.text.len()..self.text.len(),
        }
    }

    fn tok_text(&self, t: Token) -> &str {
        &self.text[t.start..t.end]
    }

    fn expect_end(&self) -> PResult<()> {
        match self.toks.get(self.pos) {
            None => Ok(()),
            Some(t) => Err((
                t.start..self.text.len(),
                format!("unexpected `{}`", &self.text[t.start..]),
            )),
        }
    }

    fn expect(&mut self, kind: Tok, what: &str) -> PResult<Token> {
        match self.toks.get(self.pos) {
            Some(t) if t.kind == kind => {
                self.pos += 1;
                Ok(*t)
            }
            Some(t) => Err((
                t.start..t.end,
                format!("expected {what}, found `{}`", self.tok_text(*t)),
            )),
            None => Err((
                self.text.len()..self.text.len(),
                format!("expected {what} at the end"),
            )),
        }
    }

    fn element(&mut self) -> PResult<Elem> {
        self.depth += 1;
        if self.depth > super::yaml::MAX_DEPTH {
            return Err((
                self.here().start..self.text.len(),
                "value nests too deeply".into(),
            ));
        }
        let out = match self.peek() {
            Some(Tok::BracketOpen) => self.list(),
            Some(Tok::BraceOpen) => self.dict(),
            Some(Tok::Id) if self.peek_at(1) == Some(Tok::POpen) => self.function(),
            Some(Tok::Quoted) => {
                let t = self.toks[self.pos];
                self.pos += 1;
                Ok(Elem::Scalar(
                    Scalar::Str(unescape_quoted(self.tok_text(t))),
                    t.start..t.end,
                ))
            }
            Some(k) if is_primitive_tok(k, true) => self.primitive(true),
            Some(_) => Err((
                self.here(),
                format!("expected a value, found `{}`", &self.text[self.here()]),
            )),
            None => Err((self.here(), "missing value".into())),
        };
        self.depth -= 1;
        out
    }

    /// A run of primitive tokens (`dict_key` excludes `:` and interpolations).
    fn primitive(&mut self, full: bool) -> PResult<Elem> {
        let start = self.pos;
        while self.peek().is_some_and(|k| is_primitive_tok(k, full)) {
            self.pos += 1;
        }
        let toks = &self.toks[start..self.pos];
        let span = toks.first().map_or(0, |t| t.start)..toks.last().map_or(0, |t| t.end);
        make_primitive(self.text, toks)
            .map(|s| Elem::Scalar(s, span.clone()))
            .map_err(|m| (span, m))
    }

    fn list(&mut self) -> PResult<Elem> {
        let open = self.expect(Tok::BracketOpen, "`[`")?;
        let mut items = Vec::new();
        if self.peek() != Some(Tok::BracketClose) {
            items.push(self.element()?);
            while self.peek() == Some(Tok::Comma) {
                self.pos += 1;
                items.push(self.element()?);
            }
        }
        let close = self.expect(Tok::BracketClose, "`,` or `]`")?;
        Ok(Elem::List(items, open.start..close.end))
    }

    fn dict(&mut self) -> PResult<Elem> {
        let open = self.expect(Tok::BraceOpen, "`{`")?;
        let mut pairs = Vec::new();
        if self.peek() != Some(Tok::BraceClose) {
            pairs.push(self.pair()?);
            while self.peek() == Some(Tok::Comma) {
                self.pos += 1;
                pairs.push(self.pair()?);
            }
        }
        let close = self.expect(Tok::BraceClose, "`,` or `}`")?;
        Ok(Elem::Dict(pairs, open.start..close.end))
    }

    fn pair(&mut self) -> PResult<(String, std::ops::Range<usize>, Elem)> {
        if !self.peek().is_some_and(|k| is_primitive_tok(k, false)) {
            return Err((
                self.here(),
                "expected a dict key (dict keys cannot be quoted)".into(),
            ));
        }
        let Elem::Scalar(key, span) = self.primitive(false)? else {
            unreachable!("primitive gives a scalar")
        };
        let key = match key {
            Scalar::Str(s) => s,
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => py_float(f),
            Scalar::Bool(_) | Scalar::Null => {
                return Err((span, "a dict key must be a string or a number".into()));
            }
        };
        self.expect(Tok::Colon, "`:` after the dict key")?;
        let v = self.element()?;
        Ok((key, span, v))
    }

    fn function(&mut self) -> PResult<Elem> {
        let name_tok = self.expect(Tok::Id, "a function name")?;
        let name = self.tok_text(name_tok).to_string();
        self.expect(Tok::POpen, "`(`")?;
        let mut args = Vec::new();
        let mut kwargs = Vec::new();
        if self.peek() != Some(Tok::PClose) {
            loop {
                if self.peek() == Some(Tok::Id) && self.peek_at(1) == Some(Tok::Equal) {
                    let k = self.tok_text(self.toks[self.pos]).to_string();
                    self.pos += 2;
                    kwargs.push((k, self.element()?));
                } else {
                    if !kwargs.is_empty() {
                        return Err((
                            self.here(),
                            "positional argument follows keyword argument".into(),
                        ));
                    }
                    args.push(self.element()?);
                }
                if self.peek() != Some(Tok::Comma) {
                    break;
                }
                self.pos += 1;
            }
        }
        let close = self.expect(Tok::PClose, "`,` or `)`")?;
        let span = name_tok.start..close.end;
        call(&name, args, kwargs, span)
    }
}

fn is_primitive_tok(k: Tok, full: bool) -> bool {
    match k {
        Tok::Id
        | Tok::Null
        | Tok::Int
        | Tok::Float
        | Tok::Bool
        | Tok::UnquotedChar
        | Tok::Esc
        | Tok::Ws => true,
        Tok::Colon | Tok::Interpolation => full,
        _ => false,
    }
}

/// Hydra's `_createPrimitive`: outer whitespace dropped; one token is typed, several are
/// concatenated into a string with escapes undone.
fn make_primitive(text: &str, toks: &[Token]) -> Result<Scalar, String> {
    let mut inner = toks;
    if inner.first().is_some_and(|t| t.kind == Tok::Ws) {
        if inner.len() == 1 {
            return Err("a value cannot be only whitespace".into());
        }
        inner = &inner[1..];
    }
    if inner.last().is_some_and(|t| t.kind == Tok::Ws) {
        inner = &inner[..inner.len() - 1];
    }
    let tt = |t: &Token| &text[t.start..t.end];
    if let [t] = inner {
        let s = tt(t);
        return Ok(match t.kind {
            Tok::Int => parse_py_int(s).map_or_else(|| Scalar::Str(s.to_string()), Scalar::Int),
            Tok::Float => Scalar::Float(parse_py_float(s).unwrap_or(f64::NAN)),
            Tok::Null => Scalar::Null,
            Tok::Bool => Scalar::Bool(s.eq_ignore_ascii_case("true")),
            Tok::Esc => Scalar::Str(unescape(s)),
            _ => Scalar::Str(s.to_string()),
        });
    }
    let mut out = String::new();
    for t in inner {
        if t.kind == Tok::Esc {
            out.push_str(&unescape(tt(t)))
        } else {
            out.push_str(tt(t))
        }
    }
    Ok(Scalar::Str(out))
}

/// `\,` -> `,`: every other character of an ESC token.
fn unescape(s: &str) -> String {
    s.chars().skip(1).step_by(2).collect()
}

/// Hydra's `_unescape_quoted_string`: only backslashes before a quote are escapes.
fn unescape_quoted(tok: &str) -> String {
    let q = tok.chars().next().unwrap_or('"');
    let body = &tok[1..];
    let mut out = String::new();
    let mut run = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            run.push(c);
            continue;
        }
        if c == q {
            // `\\\"` -> `\"`: halve the backslashes; the closing quote is dropped.
            out.extend(std::iter::repeat_n('\\', run.len() / 2));
            if chars.peek().is_some() {
                out.push(q);
            }
        } else {
            out.push_str(&run);
            out.push(c);
        }
        run.clear();
    }
    out.push_str(&run);
    out
}

/// Python's `int(str)`: optional sign, digits with single underscores between them.
pub fn parse_py_int(s: &str) -> Option<i64> {
    let t = s.trim();
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    if !underscores_ok(body) || !body.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// Python's `float(str)`: also `inf`, `infinity`, `nan`, `.5`, `5.`, `1_0.5`.
pub fn parse_py_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let neg = t.starts_with('-');
    let special = match body.to_ascii_lowercase().as_str() {
        "inf" | "infinity" => Some(f64::INFINITY),
        "nan" => Some(f64::NAN),
        _ => None,
    };
    if let Some(v) = special {
        return Some(if neg { -v } else { v });
    }
    if !underscores_ok(body)
        || !body
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '_' | '.' | 'e' | 'E' | '+' | '-'))
    {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// Underscores only between two digits.
fn underscores_ok(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter().enumerate().all(|(i, c)| {
        *c != b'_' || (i > 0 && b[i - 1].is_ascii_digit() && byte(b, i + 1).is_ascii_digit())
    })
}

// ------------------------------------------------------------------ functions

fn call(
    name: &str,
    args: Vec<Elem>,
    kwargs: Vec<(String, Elem)>,
    span: std::ops::Range<usize>,
) -> PResult<Elem> {
    match name {
        "int" | "float" | "str" | "bool" => {
            let value = cast_argument(name, args, kwargs, &span)?;
            cast(name, value).map_err(|m| (span, format!("`{name}(...)`: {m}")))
        }
        "sort" => sort(args, kwargs, span),
        "choice" | "range" | "interval" | "glob" | "shuffle" | "tag" => Err((
            span,
            format!("`{name}(...)` is a sweep, which needs --multirun"),
        )),
        _ => Err((
            span,
            format!(
                "unknown function `{name}`; the functions are int, float, str, bool, sort and the sweeps"
            ),
        )),
    }
}

/// The one value a cast takes: a positional argument or `value=`.
fn cast_argument(
    name: &str,
    mut args: Vec<Elem>,
    kwargs: Vec<(String, Elem)>,
    span: &std::ops::Range<usize>,
) -> PResult<Elem> {
    let mut value = None;
    for (k, v) in kwargs {
        if k != "value" {
            return Err((
                span.clone(),
                format!("`{name}()` got an unexpected keyword argument `{k}`"),
            ));
        }
        value = Some(v);
    }
    match (args.len(), value) {
        (0, Some(v)) => Ok(v),
        (0, None) => Err((span.clone(), format!("`{name}()` needs a value"))),
        (1, None) => Ok(args.remove(0)),
        (_, Some(_)) => Err((
            span.clone(),
            format!("`{name}()` cannot take both positional and named arguments"),
        )),
        _ => Err((
            span.clone(),
            format!("`{name}(a, b, ...)` is a sweep, which needs --multirun"),
        )),
    }
}

/// Hydra's `cast_int/float/str/bool`, applied through lists and dict values.
fn cast(name: &str, v: Elem) -> Result<Elem, String> {
    match v {
        Elem::List(items, span) => Ok(Elem::List(
            items
                .into_iter()
                .map(|i| cast(name, i))
                .collect::<Result<_, _>>()?,
            span,
        )),
        Elem::Dict(pairs, span) => Ok(Elem::Dict(
            pairs
                .into_iter()
                .map(|(k, ks, v)| cast(name, v).map(|v| (k, ks, v)))
                .collect::<Result<_, _>>()?,
            span,
        )),
        Elem::Scalar(s, span) => cast_scalar(name, &s).map(|c| Elem::Scalar(c, span)),
    }
}

fn cast_scalar(name: &str, s: &Scalar) -> Result<Scalar, String> {
    let bad = || format!("cannot convert {} to {name}", scalar_repr(s));
    match (name, s) {
        ("bool", Scalar::Null) => Ok(Scalar::Bool(false)),
        (_, Scalar::Null) => Err(bad()),
        ("int", Scalar::Int(i)) => Ok(Scalar::Int(*i)),
        ("int", Scalar::Float(f)) if f.is_finite() && f.abs() < 9.2e18 => {
            Ok(Scalar::Int(f.trunc() as i64))
        }
        ("int", Scalar::Bool(b)) => Ok(Scalar::Int(i64::from(*b))),
        ("int", Scalar::Str(t)) => parse_py_int(t).map(Scalar::Int).ok_or_else(bad),
        ("float", Scalar::Int(i)) => Ok(Scalar::Float(*i as f64)),
        ("float", Scalar::Float(f)) => Ok(Scalar::Float(*f)),
        ("float", Scalar::Bool(b)) => Ok(Scalar::Float(if *b { 1.0 } else { 0.0 })),
        ("float", Scalar::Str(t)) => parse_py_float(t).map(Scalar::Float).ok_or_else(bad),
        ("str", Scalar::Bool(b)) => Ok(Scalar::Str(b.to_string())),
        ("str", Scalar::Int(i)) => Ok(Scalar::Str(i.to_string())),
        ("str", Scalar::Float(f)) => Ok(Scalar::Str(py_float(*f))),
        ("str", Scalar::Str(t)) => Ok(Scalar::Str(t.clone())),
        ("bool", Scalar::Bool(b)) => Ok(Scalar::Bool(*b)),
        ("bool", Scalar::Int(i)) => Ok(Scalar::Bool(*i != 0)),
        ("bool", Scalar::Float(f)) => Ok(Scalar::Bool(*f != 0.0)),
        ("bool", Scalar::Str(t)) => match t.to_ascii_lowercase().as_str() {
            "true" => Ok(Scalar::Bool(true)),
            "false" => Ok(Scalar::Bool(false)),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

fn scalar_repr(s: &Scalar) -> String {
    match s {
        Scalar::Str(t) => format!("'{t}'"),
        Scalar::Null => "null".into(),
        other => other.to_string(),
    }
}

/// `sort([..])` / `sort([..], reverse=true)`: a sorted list of like primitives.
fn sort(
    args: Vec<Elem>,
    kwargs: Vec<(String, Elem)>,
    span: std::ops::Range<usize>,
) -> PResult<Elem> {
    let mut reverse = false;
    for (k, v) in kwargs {
        match (k.as_str(), v) {
            ("reverse", Elem::Scalar(Scalar::Bool(b), _)) => reverse = b,
            _ => return Err((span, format!("`sort()` got an unexpected argument `{k}`"))),
        }
    }
    let [Elem::List(items, lspan)] = <[Elem; 1]>::try_from(args).map_err(|_| {
        (
            span.clone(),
            "`sort()` of several values is a sweep, which needs --multirun".to_string(),
        )
    })?
    else {
        return Err((span, "`sort()` takes a list".into()));
    };
    let mut keyed = Vec::new();
    for i in items {
        match &i {
            Elem::Scalar(Scalar::Int(n), _) => keyed.push((SortKey::Num(*n as f64), i)),
            Elem::Scalar(Scalar::Float(f), _) => keyed.push((SortKey::Num(*f), i)),
            Elem::Scalar(Scalar::Str(s), _) => keyed.push((SortKey::Str(s.clone()), i)),
            _ => return Err((span, "`sort()` takes a list of numbers or strings".into())),
        }
    }
    if keyed
        .windows(2)
        .any(|w| std::mem::discriminant(&w[0].0) != std::mem::discriminant(&w[1].0))
    {
        return Err((span, "`sort()` cannot compare numbers with strings".into()));
    }
    keyed.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    if reverse {
        keyed.reverse();
    }
    Ok(Elem::List(
        keyed.into_iter().map(|(_, e)| e).collect(),
        lspan,
    ))
}

#[derive(PartialEq, PartialOrd)]
enum SortKey {
    Num(f64),
    Str(String),
}

// ------------------------------------------------------------------ to Node

fn to_node(e: Elem, source: SourceId) -> Node {
    let origin = Some(Origin::new(source, e.span()));
    match e {
        Elem::Scalar(s, _) => Node::scalar(s, origin),
        Elem::List(items, _) => Node::new(
            Value::Seq(items.into_iter().map(|i| to_node(i, source)).collect()),
            origin,
        ),
        Elem::Dict(pairs, _) => {
            let mut m = Map::default();
            for (k, ks, v) in pairs {
                // A repeated key: the last one wins, as in a Python dict.
                m.insert(
                    k,
                    Entry {
                        key_origin: Some(Origin::new(source, ks)),
                        node: to_node(v, source),
                    },
                );
            }
            Node::new(Value::Map(Box::new(m)), origin)
        }
    }
}

/// `a.b_c.0.d-e`: segments that are identifiers (a letter or `_`, then letters, digits, `_`,
/// `-`) or unsigned integers, the first an identifier.
fn is_dotted_key(word: &str) -> bool {
    let mut segments = word.split('.');
    let ident = |s: &str| {
        let mut b = s.bytes();
        b.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    };
    segments.next().is_some_and(ident)
        && segments.all(|s| ident(s) || (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())))
}

/// Type a bare word the way the override grammar types a primitive (`1` int, `1e-6`
/// float, `true` bool, `null`, else a string); words that do not lex stay strings.
pub fn type_primitive(word: &str) -> Scalar {
    // The words verl's interpolations pass most (`null`, `true`, a small count) without
    // running the lexer; the lexer agrees on each.
    if word.eq_ignore_ascii_case("null") {
        return Scalar::Null;
    }
    if word.eq_ignore_ascii_case("true") || word.eq_ignore_ascii_case("false") {
        return Scalar::Bool(word.eq_ignore_ascii_case("true"));
    }
    // A key (`actor_rollout_ref.rollout.n`, as `oc.select` names one): identifiers (and
    // indices) joined by dots, a string to the lexer unless it spells a float (`inf`, `nan`).
    if is_dotted_key(word) && !word.eq_ignore_ascii_case("inf") && !word.eq_ignore_ascii_case("nan")
    {
        return Scalar::Str(word.to_string());
    }
    if !word.is_empty()
        && word.len() < 18
        && word.bytes().all(|b| b.is_ascii_digit())
        && (word == "0" || !word.starts_with('0'))
        && let Ok(i) = word.parse::<i64>()
    {
        return Scalar::Int(i);
    }
    match lex(word, 0) {
        Ok(toks) if !toks.is_empty() && toks.iter().all(|t| is_primitive_tok(t.kind, true)) => {
            make_primitive(word, &toks).unwrap_or_else(|_| Scalar::Str(word.to_string()))
        }
        _ => Scalar::Str(word.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v(t: &str) -> serde_json::Value {
        parse_value(t, 0, SourceId(0))
            .unwrap_or_else(|e| panic!("{t}: {e:?}"))
            .to_json()
    }

    fn err(t: &str) -> String {
        parse_value(t, 0, SourceId(0)).expect_err(t).1
    }

    #[test]
    fn the_fast_words_type_as_the_lexer_does() {
        for w in [
            "null",
            "NULL",
            "Null",
            "true",
            "True",
            "FALSE",
            "false",
            "0",
            "7",
            "42",
            "123456789",
            "007",
            "1_000",
            "-3",
            "inf",
            "NaN",
            "Inf",
            "a.b",
            "global_profiler.tool",
            "a.0.b",
            "x-y.z",
            "_a",
            "a1.b2",
            "a..b",
            "a.",
            ".a",
            "a.-b",
            "1a",
            "a.1e5",
            "abc",
            "actor_rollout_ref.rollout.n",
            "None",
        ] {
            let fast = type_primitive(w);
            let lexed = match lex(w, 0) {
                Ok(toks)
                    if !toks.is_empty() && toks.iter().all(|t| is_primitive_tok(t.kind, true)) =>
                {
                    make_primitive(w, &toks).unwrap_or_else(|_| Scalar::Str(w.to_string()))
                }
                _ => Scalar::Str(w.to_string()),
            };
            assert_eq!(format!("{fast:?}"), format!("{lexed:?}"), "{w}");
        }
    }

    #[test]
    fn numbers_follow_the_lexer() {
        assert_eq!(v("1e5"), json!(100000.0));
        assert_eq!(v("1.e5"), json!(100000.0));
        assert_eq!(v(".5"), json!(0.5));
        assert_eq!(v("5."), json!(5.0));
        assert_eq!(v("+5"), json!(5));
        assert_eq!(v("-0"), json!(0));
        assert_eq!(v("1_000"), json!(1000));
        assert_eq!(v("010"), json!("010"));
        assert_eq!(v("01.5"), json!("01.5"));
        assert_eq!(v("1__0"), json!("1__0"));
        assert_eq!(v("Infinity"), json!("Infinity"));
        assert_eq!(
            v("inf"),
            json!("inf"),
            "non-finite floats print as Python spells them"
        );
        assert_eq!(v("10.0.0.1"), json!("10.0.0.1"));
        assert_eq!(v("trueish"), json!("trueish"));
        assert_eq!(v("NULL"), json!(null));
    }

    #[test]
    fn strings_whitespace_and_escapes() {
        assert_eq!(v("  5"), json!(5));
        assert_eq!(v("a : b"), json!("a : b"));
        assert_eq!(v("hello world"), json!("hello world"));
        assert_eq!(v("a\\ b\\,c\\x"), json!("a b,c\\x"));
        assert_eq!(v("'a\\'b'"), json!("a'b"));
        assert_eq!(v("\"x y, z\""), json!("x y, z"));
        assert_eq!(v("'abc\\\\'"), json!("abc\\"));
        assert_eq!(v("''"), json!(""));
        assert_eq!(v("${a}${b}"), json!("${a}${b}"));
        assert_eq!(v("$HOME/x"), json!("$HOME/x"));
        assert_eq!(v("-"), json!("-"));
    }

    #[test]
    fn containers_and_functions() {
        assert_eq!(v("[a , b ]"), json!(["a", "b"]));
        assert_eq!(v("{a: 1, a: 2}"), json!({"a": 2}));
        assert_eq!(v("{1: a}"), json!({"1": "a"}));
        assert_eq!(v("int(3.7)"), json!(3));
        assert_eq!(v("int(-3.7)"), json!(-3));
        assert_eq!(v("int(value=3)"), json!(3));
        assert_eq!(v("float(' 1_0 ')"), json!(10.0));
        assert_eq!(v("str(1e-6)"), json!("1e-06"));
        assert_eq!(v("str([1, true, 2.0])"), json!(["1", "true", "2.0"]));
        assert_eq!(v("bool(null)"), json!(false));
        assert_eq!(v("sort([3,1,2])"), json!([1, 2, 3]));
    }

    #[test]
    fn hydra_rejects_these() {
        for t in [
            "~/x",
            "a'b",
            "a#b",
            "a!b",
            "<x>",
            "héllo",
            "${}",
            "a=b",
            "${oc.select:a,${b}}",
            "run}",
            "'x' ",
            "int(null)",
            "int(1,2)",
            "{'a': 1}",
            "{null: 1}",
            "1,2",
            "choice(1,2)",
            "nope(1)",
        ] {
            let _ = err(t);
        }
        assert!(err("1,2").contains("sweep"));
    }
}

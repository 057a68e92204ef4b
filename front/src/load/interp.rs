//! OmegaConf interpolation over the composed tree: `${a.b}`, `${.sibling}`, `${..up}`,
//! `${oc.select:path,default}`, `${oc.env:VAR,default}`, string interpolation
//! (`ckpt/${trainer.project_name}`) and `\${` escapes. A whole-string interpolation keeps
//! the referenced value's type (and subtree); a cycle is an error naming every step.

use std::collections::HashSet;

use super::node::{Node, Scalar, Value};
use crate::codes;
use crate::diag::Diagnostic;
use crate::source::Origin;

/// Longest chain of interpolations resolved through one another (verl's are ≤ 3).
pub const MAX_CHAIN: usize = 100;
/// Deepest nesting of `${...}` inside resolver arguments.
const MAX_NESTING: usize = 32;
/// Largest string an interpolation may build.
const MAX_STRING: usize = 1 << 20;
/// Most nodes that interpolations may copy into the tree in one resolution. verl's trees copy
/// a few hundred; lists that reference each other (`b: [${a}, ${a}]`, `c: [${b}, ${b}]`, ...)
/// double with every line and would otherwise take minutes and gigabytes.
pub const MAX_COPIED_NODES: usize = 100_000;
/// Most bytes of text that interpolations may produce in one resolution, copies of
/// referenced strings included: 2000 references to one 1 MiB string would be 2 GB.
pub const MAX_COPIED_BYTES: usize = 16 << 20;

/// What resolving a tree found: its problems, and the environment variables that
/// `${oc.env:...}` read (their values are secrets to every output; see `crate::redact`).
#[derive(Debug, Default)]
pub struct Resolution {
    pub diagnostics: Vec<Diagnostic>,
    pub env_vars: Vec<String>,
}

/// Resolve every interpolation in `root` in place. Problems are collected, not fatal:
/// an unresolvable string is left as written.
pub fn resolve_all(root: &mut Node) -> Vec<Diagnostic> {
    resolve(root).diagnostics
}

/// [`resolve_all`], also saying which environment variables were read.
pub fn resolve(root: &mut Node) -> Resolution {
    resolve_parsing(root, &mut ParsedInterpolations::default())
}

/// Interpolation strings already parsed, for resolving trees that share most of them (a
/// config and the same config before its overrides).
#[derive(Default)]
pub struct ParsedInterpolations(std::collections::HashMap<String, std::rc::Rc<[Piece]>>);

/// [`resolve`], parsing each interpolation string once across calls that share `parsed`.
pub fn resolve_parsing(root: &mut Node, parsed: &mut ParsedInterpolations) -> Resolution {
    let paths = collect(root);
    let mut r = Resolver {
        parsed: std::mem::take(&mut parsed.0),
        ..Resolver::default()
    };
    for p in paths {
        r.resolve_path(root, &p);
    }
    parsed.0 = std::mem::take(&mut r.parsed);
    Resolution {
        diagnostics: r.diags,
        env_vars: r.env_vars,
    }
}

/// Bytes of text in a subtree (string values and map keys).
fn text_bytes(n: &Node) -> usize {
    match &n.value {
        Value::Scalar(Scalar::Str(s)) => s.len(),
        Value::Scalar(_) => 8,
        Value::Seq(items) => items.iter().map(text_bytes).sum(),
        Value::Map(m) => m.iter().map(|(k, e)| k.len() + text_bytes(&e.node)).sum(),
    }
}

/// OmegaConf's `select` as Hydra uses it for `+key` and `~key`: the value at `path` with
/// interpolations on the way (and inside it) resolved, `None` when the path is absent or
/// passes through a non-container. Works on a copy; the tree is not changed.
pub fn select(root: &Node, path: &[&str]) -> Result<Option<Node>, Diagnostic> {
    let raw = select_raw(root, path);
    if !raw.needs_resolution {
        return Ok(raw.node.cloned());
    }
    let mut copy = root.clone();
    let mut r = Resolver::default();
    let key = path.join(".");
    match r.lookup(&mut copy, &[], &key, None) {
        Ok(n) => match r.diags.into_iter().find(Diagnostic::is_error) {
            Some(d) => Err(d),
            None => Ok(n),
        },
        Err(d) => Err(*d),
    }
}

struct RawSelect<'a> {
    node: Option<&'a Node>,
    /// An interpolation lies on the path or inside the selected value.
    needs_resolution: bool,
}

fn select_raw<'a>(root: &'a Node, path: &[&str]) -> RawSelect<'a> {
    let mut cur = root;
    for seg in path {
        if cur.as_str().is_some_and(has_interpolation) {
            return RawSelect {
                node: None,
                needs_resolution: true,
            };
        }
        match cur.child(seg) {
            Some(n) => cur = n,
            None => {
                return RawSelect {
                    node: None,
                    needs_resolution: false,
                };
            }
        }
    }
    RawSelect {
        node: Some(cur),
        needs_resolution: !collect(cur).is_empty(),
    }
}

/// The paths of the interpolated strings under `node`.
fn collect(node: &Node) -> Vec<Vec<String>> {
    node.paths_where(&|n| n.as_str().is_some_and(has_interpolation))
}

/// Whether `s` holds `${` (most strings hold no `$` at all: one byte scan).
pub(crate) fn has_interpolation(s: &str) -> bool {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = b[from..].iter().position(|&c| c == b'$') {
        if b.get(from + p + 1) == Some(&b'{') {
            return true;
        }
        from += p + 1;
    }
    false
}

fn get<'a>(root: &'a Node, path: &[String]) -> Option<&'a Node> {
    let mut cur = root;
    for s in path {
        cur = cur.child(s)?;
    }
    Some(cur)
}

fn get_mut<'a>(root: &'a mut Node, path: &[String]) -> Option<&'a mut Node> {
    let mut cur = root;
    for s in path {
        cur = cur.child_mut(s)?;
    }
    Some(cur)
}

fn dotted(path: &[String]) -> String {
    path.join(".")
}

/// One piece of an interpolated string.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Interp(Expr),
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Key(String),
    Resolver { name: String, args: Vec<Vec<Piece>> },
}

fn parse_pieces(s: &str) -> Result<Vec<Piece>, String> {
    parse_pieces_at(s, 0)
}

fn parse_pieces_at(s: &str, depth: usize) -> Result<Vec<Piece>, String> {
    if depth > MAX_NESTING {
        return Err(format!(
            "interpolations nest deeper than {MAX_NESTING} levels"
        ));
    }
    let mut out = Vec::new();
    let mut text = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // Plain text up to the next `$` or `\\` goes over in one piece.
        let next = b[i..]
            .iter()
            .position(|&c| c == b'$' || c == b'\\')
            .map_or(b.len(), |p| i + p);
        if next > i {
            text.push_str(&s[i..next]);
            i = next;
            continue;
        }
        if b[i] == b'\\' && s[i + 1..].starts_with("${") {
            text.push_str("${");
            i += 3;
            continue;
        }
        if s[i..].starts_with("${") {
            let end = matching_brace(s, i + 2).ok_or_else(|| format!("unclosed `${{` in `{s}`"))?;
            if !text.is_empty() {
                out.push(Piece::Text(std::mem::take(&mut text)));
            }
            out.push(Piece::Interp(parse_expr(&s[i + 2..end], depth)?));
            i = end + 1;
            continue;
        }
        // A `$` or `\\` that starts nothing.
        text.push(char::from(b[i]));
        i += 1;
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// Index of the `}` closing a `${` whose body starts at `from`.
fn matching_brace(s: &str, from: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 1usize;
    let mut i = from;
    let mut quote: Option<u8> = None;
    while i < b.len() {
        match (quote, b[i]) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), b'\\') => i += 1,
            (Some(_), _) => {}
            (None, b'\'') | (None, b'"') => quote = Some(b[i]),
            (None, b'{') => depth += 1,
            (None, b'}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn parse_expr(body: &str, depth: usize) -> Result<Expr, String> {
    let body = body.trim();
    if body.is_empty() {
        return Err("empty interpolation `${}`".into());
    }
    // A resolver call is `name:args`; a key never holds `:` outside brackets.
    if let Some(colon) = body.find(':')
        && !body[..colon].contains("${")
        && body[..colon]
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    {
        let name = body[..colon].to_string();
        let args = split_args(&body[colon + 1..])?
            .into_iter()
            .map(|a| parse_pieces_at(&a, depth + 1))
            .collect::<Result<_, _>>()?;
        return Ok(Expr::Resolver { name, args });
    }
    Ok(Expr::Key(body.to_string()))
}

/// Split resolver arguments on top-level commas, keeping quotes, brackets and `${}` intact.
fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                cur.push(c);
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                cur.push(c);
            }
            (None, '{' | '[') => {
                depth += 1;
                cur.push(c);
            }
            (None, '}' | ']') => {
                depth -= 1;
                cur.push(c);
            }
            (None, ',') if depth == 0 => out.push(std::mem::take(&mut cur)),
            (None, c) => cur.push(c),
        }
    }
    if quote.is_some() {
        return Err(format!("unclosed quote in `{s}`"));
    }
    if !cur.is_empty() || !out.is_empty() {
        out.push(cur);
    }
    Ok(out.into_iter().map(|a| a.trim().to_string()).collect())
}

/// Python's `repr(float)`, which OmegaConf's string interpolation uses.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let exp = f.abs().log10().floor() as i32;
    if !(-4..16).contains(&exp) {
        // shortest round-trip digits in exponent form: 1e-06, 1.5e+20
        let s = format!("{f:e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let sign = if e < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", e.abs())
    } else {
        let s = format!("{f}");
        if s.contains('.') { s } else { format!("{s}.0") }
    }
}

/// Python's `repr` of a container, which is what `str()` of an OmegaConf container gives
/// when it is interpolated into a string: `{'a': 1, 'b': [True, None]}`.
fn py_repr(n: &Node) -> String {
    match &n.value {
        Value::Scalar(Scalar::Str(s)) => py_str_repr(s),
        Value::Scalar(s) => scalar_to_py_str(s),
        Value::Seq(items) => format!(
            "[{}]",
            items.iter().map(py_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Map(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, e)| format!("{}: {}", py_str_repr(k), py_repr(&e.node)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
fn py_str_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

fn scalar_to_py_str(s: &Scalar) -> String {
    match s {
        Scalar::Null => "None".into(),
        Scalar::Bool(true) => "True".into(),
        Scalar::Bool(false) => "False".into(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => py_float(*f),
        Scalar::Str(s) => s.clone(),
    }
}

#[derive(Default)]
struct Resolver {
    diags: Vec<Diagnostic>,
    /// Paths being resolved, outermost first: a repeat is a cycle.
    stack: Vec<Vec<String>>,
    failed: HashSet<Vec<String>>,
    /// Nodes copied in by resolved interpolations so far (bounded by [`MAX_COPIED_NODES`]).
    copied: usize,
    /// Bytes of text produced so far (bounded by [`MAX_COPIED_BYTES`]).
    copied_bytes: usize,
    /// A growth limit was reported; every later interpolation stays as written.
    over_limit: bool,
    env_vars: Vec<String>,
    /// Interpolation strings parsed so far ([`ParsedInterpolations`]).
    parsed: std::collections::HashMap<String, std::rc::Rc<[Piece]>>,
}

impl Resolver {
    /// Resolve the interpolation at `path` (if any) and everything it depends on.
    fn resolve_path(&mut self, root: &mut Node, path: &[String]) -> bool {
        let Some(node) = get(root, path) else {
            return false;
        };
        let Some(s) = node
            .as_str()
            .filter(|s| has_interpolation(s))
            .map(str::to_string)
        else {
            return true;
        };
        if self.failed.contains(path) || self.over_limit {
            return false;
        }
        let origin = node.origin.clone();
        if let Some(i) = self.stack.iter().position(|p| p == path) {
            let chain: Vec<String> = self.stack[i..]
                .iter()
                .map(|p| dotted(p))
                .chain([dotted(path)])
                .collect();
            self.diags.push(
                Diagnostic::error(
                    codes::INTERP_CYCLE,
                    format!("interpolation cycle: {}", chain.join(" -> ")),
                )
                .with_key(dotted(path))
                .with_primary(origin, "this interpolation refers back to itself")
                .with_help("break the cycle by giving one of these keys a plain value"),
            );
            for p in &self.stack[i..] {
                self.failed.insert(p.clone());
            }
            return false;
        }
        if self.stack.len() >= MAX_CHAIN {
            self.fail(
                path,
                Diagnostic::error(
                    codes::INTERP_CYCLE,
                    format!("interpolation chain longer than {MAX_CHAIN} links"),
                )
                .with_primary(
                    origin,
                    "resolving this needs a longer chain of interpolations",
                )
                .with_help("give one of the keys in the chain a plain value"),
            );
            return false;
        }
        let parsed = match self.parsed.get(&s) {
            Some(p) => Ok(p.clone()),
            None => parse_pieces(&s).map(|p| {
                let p: std::rc::Rc<[Piece]> = p.into();
                self.parsed.insert(s.clone(), p.clone());
                p
            }),
        };
        let pieces = match parsed {
            Ok(p) => p,
            Err(msg) => {
                self.fail(
                    path,
                    Diagnostic::error(codes::INTERP_SYNTAX, msg).with_primary(origin, "here"),
                );
                return false;
            }
        };
        self.stack.push(path.to_vec());
        let result = self.eval_pieces(root, path, &pieces, origin.as_ref());
        self.stack.pop();
        match result {
            Ok(mut value) => {
                self.copied = self.copied.saturating_add(value.count());
                self.copied_bytes = self.copied_bytes.saturating_add(text_bytes(&value));
                if self.copied > MAX_COPIED_NODES || self.copied_bytes > MAX_COPIED_BYTES {
                    self.failed.insert(path.to_vec());
                    self.report_growth(path, origin);
                    return false;
                }
                value.via = origin.clone().map(Box::new);
                if value.origin.is_none() {
                    value.origin = origin;
                }
                if let Some(slot) = get_mut(root, path) {
                    *slot = value;
                }
                true
            }
            Err(d) => {
                self.fail(path, *d);
                false
            }
        }
    }

    /// Reported once: the interpolations copy too much (exponential growth).
    fn report_growth(&mut self, path: &[String], origin: Option<Origin>) {
        if std::mem::replace(&mut self.over_limit, true) {
            return;
        }
        self.diags.push(
            Diagnostic::error(
                codes::YAML_LIMIT,
                format!("interpolations copy more than {MAX_COPIED_NODES} values or {MAX_COPIED_BYTES} bytes of text into the config"),
            )
            .with_key(dotted(path))
            .with_primary(origin, "the limit is reached resolving this interpolation")
            .with_help("a config whose values reference each other grows exponentially; give these keys plain values"),
        );
    }

    fn fail(&mut self, path: &[String], d: Diagnostic) {
        self.failed.insert(path.to_vec());
        if d.code == codes::YAML_LIMIT && self.over_limit {
            return; // already reported once by `report_growth`
        }
        self.diags.push(d.with_key(dotted(path)));
    }

    fn eval_pieces(
        &mut self,
        root: &mut Node,
        at: &[String],
        pieces: &[Piece],
        origin: Option<&Origin>,
    ) -> Result<Node, Box<Diagnostic>> {
        if let [Piece::Interp(e)] = pieces {
            return self.eval_expr(root, at, e, origin);
        }
        let mut out = String::new();
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Interp(e) => {
                    let v = self.eval_expr(root, at, e, origin)?;
                    match &v.value {
                        Value::Scalar(s) => out.push_str(&scalar_to_py_str(s)),
                        _ => out.push_str(&py_repr(&v)),
                    }
                    if out.len() > MAX_STRING {
                        return Err(Box::new(
                            Diagnostic::error(codes::INTERP_SYNTAX, format!("string interpolation builds a value longer than {MAX_STRING} bytes"))
                                .with_primary(origin.cloned(), "interpolated here"),
                        ));
                    }
                    if self.copied_bytes.saturating_add(out.len()) > MAX_COPIED_BYTES {
                        self.report_growth(at, origin.cloned());
                        return Err(Box::new(
                            Diagnostic::error(
                                codes::YAML_LIMIT,
                                "interpolation left unresolved: the growth limit was reached",
                            )
                            .with_primary(origin.cloned(), "interpolated here"),
                        ));
                    }
                }
            }
        }
        Ok(Node::scalar(Scalar::Str(out), origin.cloned()))
    }

    fn eval_expr(
        &mut self,
        root: &mut Node,
        at: &[String],
        e: &Expr,
        origin: Option<&Origin>,
    ) -> Result<Node, Box<Diagnostic>> {
        match e {
            Expr::Key(k) => match self.lookup(root, at, k, origin)? {
                Some(n) if n.is_missing() => Err(Box::new(
                    Diagnostic::error(codes::MANDATORY_MISSING, format!("interpolation `${{{k}}}` refers to a mandatory value (`???`) that was never set"))
                        .with_primary(origin.cloned(), "interpolated here")
                        .with_secondary(n.origin.clone(), "declared mandatory here")
                        .with_help(format!("set `{}` in your config or on the command line", self.abs_key(at, k))),
                )),
                Some(n) => Ok(n),
                None => Err(Box::new(
                    Diagnostic::error(codes::INTERP_KEY_MISSING, format!("interpolation key `{k}` not found"))
                        .with_primary(origin.cloned(), "interpolated here")
                        .with_help("use `${oc.select:key,default}` to fall back to a default when the key may be absent"),
                )),
            },
            Expr::Resolver { name, args } => {
                let mut vals = Vec::new();
                for a in args {
                    vals.push(self.eval_arg(root, at, a, origin)?);
                }
                match name.as_str() {
                    "oc.select" => {
                        let Some(Node { value: Value::Scalar(Scalar::Str(key)), .. }) = vals.first() else {
                            return Err(Box::new(Diagnostic::error(codes::INTERP_SYNTAX, "`oc.select` needs a key").with_primary(origin.cloned(), "here")));
                        };
                        let key = key.clone();
                        let default = vals.get(1).cloned();
                        match self.lookup(root, at, &key, origin)? {
                            Some(n) if !n.is_missing() => Ok(n),
                            _ => Ok(default.unwrap_or_else(|| Node::null(origin.cloned()))),
                        }
                    }
                    "oc.env" => {
                        let Some(Node { value: Value::Scalar(Scalar::Str(var)), .. }) = vals.first() else {
                            return Err(Box::new(Diagnostic::error(codes::INTERP_SYNTAX, "`oc.env` needs a variable name").with_primary(origin.cloned(), "here")));
                        };
                        if !self.env_vars.contains(var) {
                            self.env_vars.push(var.clone());
                        }
                        match std::env::var(var) {
                            Ok(v) => Ok(Node::scalar(Scalar::Str(v), origin.cloned())),
                            Err(_) => match vals.get(1) {
                                Some(d) => Ok(match &d.value {
                                    Value::Scalar(Scalar::Null) => d.clone(),
                                    Value::Scalar(s) => Node::scalar(Scalar::Str(scalar_to_py_str(s)), d.origin.clone()),
                                    _ => d.clone(),
                                }),
                                None => Err(Box::new(
                                    Diagnostic::error(codes::INTERP_KEY_MISSING, format!("environment variable `{var}` is not set"))
                                        .with_primary(origin.cloned(), "read here")
                                        .with_help(format!("export {var}=... or give a default: `${{oc.env:{var},default}}`")),
                                )),
                            },
                        }
                    }
                    other => Err(Box::new(
                        Diagnostic::error(codes::INTERP_RESOLVER, format!("unsupported resolver `{other}`"))
                            .with_primary(origin.cloned(), "used here")
                            .with_help("verlc supports `oc.select` and `oc.env`, the resolvers verl's configs use"),
                    )),
                }
            }
        }
    }

    /// A resolver argument: a (possibly interpolated) OmegaConf element.
    fn eval_arg(
        &mut self,
        root: &mut Node,
        at: &[String],
        a: &[Piece],
        origin: Option<&Origin>,
    ) -> Result<Node, Box<Diagnostic>> {
        match a {
            [Piece::Text(t)] => Ok(parse_arg_literal(t, origin)),
            [] => Ok(Node::scalar(Scalar::Str(String::new()), origin.cloned())),
            _ => self.eval_pieces(root, at, a, origin),
        }
    }

    fn abs_key(&self, at: &[String], key: &str) -> String {
        dotted(&absolute(at, key))
    }

    /// Find the node a key refers to, resolving interpolations along the way and inside
    /// the found subtree (so copies carry resolved values).
    fn lookup(
        &mut self,
        root: &mut Node,
        at: &[String],
        key: &str,
        _origin: Option<&Origin>,
    ) -> Result<Option<Node>, Box<Diagnostic>> {
        let target = absolute(at, key);
        // Resolve each prefix that is itself an interpolation.
        for i in 1..=target.len() {
            let prefix = &target[..i];
            match get(root, prefix) {
                None => return Ok(None),
                Some(n) if n.as_str().is_some_and(has_interpolation) => {
                    if !self.resolve_path(root, prefix) {
                        return Err(Box::new(
                            Diagnostic::error(
                                codes::INTERP_KEY_MISSING,
                                format!("`{key}` depends on an interpolation that failed"),
                            )
                            .with_primary(_origin.cloned(), "here"),
                        ));
                    }
                }
                Some(_) => {}
            }
        }
        // Resolve inside a referenced subtree before copying it.
        let mut inner = Vec::new();
        if let Some(n) = get(root, &target)
            && !matches!(n.value, Value::Scalar(_))
        {
            inner = collect(n)
                .into_iter()
                .map(|p| target.iter().cloned().chain(p).collect::<Vec<String>>())
                .collect();
        }
        for p in inner {
            // A copy must not carry interpolations that could not be resolved: copied
            // elsewhere they would be resolved again in a new place, without end.
            if !self.resolve_path(root, &p) {
                return Err(Box::new(
                    Diagnostic::error(
                        codes::INTERP_KEY_MISSING,
                        format!("`{key}` holds `{}`, whose interpolation failed", dotted(&p)),
                    )
                    .with_primary(_origin.cloned(), "here"),
                ));
            }
        }
        Ok(get(root, &target).cloned())
    }
}

/// `.x` is relative to the node holding the interpolation, `..x` to its parent, else absolute.
fn absolute(at: &[String], key: &str) -> Vec<String> {
    let dots = key.chars().take_while(|c| *c == '.').count();
    let rest = &key[dots..];
    let mut base: Vec<String> = if dots == 0 {
        Vec::new()
    } else {
        let parent = &at[..at.len().saturating_sub(1)];
        parent[..parent.len().saturating_sub(dots - 1)].to_vec()
    };
    for seg in rest.split('.').filter(|s| !s.is_empty()) {
        // `a[0]` is the same as `a.0`
        let mut s = seg;
        while let Some(open) = s.find('[') {
            if open > 0 {
                base.push(s[..open].to_string());
            }
            let close = s[open..].find(']').map_or(s.len(), |c| open + c);
            base.push(s[open + 1..close].to_string());
            s = if close < s.len() { &s[close + 1..] } else { "" };
        }
        if !s.is_empty() {
            base.push(s.to_string());
        }
    }
    base
}

/// OmegaConf's typing of a literal resolver argument (`null`, `1`, `{}`, `[]`, quoted).
fn parse_arg_literal(t: &str, origin: Option<&Origin>) -> Node {
    let t = t.trim();
    let o = origin.cloned();
    if t.len() >= 2
        && ((t.starts_with('\'') && t.ends_with('\'')) || (t.starts_with('"') && t.ends_with('"')))
    {
        return Node::scalar(Scalar::Str(t[1..t.len() - 1].to_string()), o);
    }
    if t == "{}" {
        return Node::empty_map(o);
    }
    if t == "[]" {
        return Node::new(Value::Seq(Vec::new()), o);
    }
    let src = crate::source::SourceId(0);
    if (t.starts_with('[') || t.starts_with('{'))
        && let Ok(ov) = super::overrides::parse_override(&format!("x={t}"), src)
        && let Some(mut v) = ov.value
    {
        strip_origins(&mut v, o.clone());
        return v;
    }
    Node::scalar(super::overrides::type_primitive(t), o)
}

fn strip_origins(n: &mut Node, o: Option<Origin>) {
    n.origin = o.clone();
    match &mut n.value {
        Value::Map(m) => m.values_mut().for_each(|e| {
            e.key_origin = o.clone();
            strip_origins(&mut e.node, o.clone())
        }),
        Value::Seq(items) => items.iter_mut().for_each(|i| strip_origins(i, o.clone())),
        Value::Scalar(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::yaml;
    use crate::source::{Source, SourceId, SourceKind};
    use serde_json::json;

    fn resolve(text: &str) -> (serde_json::Value, Vec<Diagnostic>) {
        let src = Source::new("t.yaml", text, SourceKind::File);
        let mut n = yaml::parse(&src, SourceId(0)).unwrap();
        let d = resolve_all(&mut n);
        (n.to_json(), d)
    }

    #[test]
    fn absolute_relative_and_string_interpolation() {
        let (v, d) = resolve(
            "trainer:\n  project: p\n  exp: e\n  dir: ckpt/${trainer.project}/${.exp}\ndata:\n  len: 512\nrollout:\n  prompt: ${data.len}\n  resp: ${oc.select:data.resp,null}\n  n: ${oc.select:data.n, 1}\n  lr: ${oc.select:x.lr,1e-6}\n  mode: ${oc.select:x.mode,token-mean}\n  d: ${oc.select:x.d,{}}\n  q: ${oc.select:x.q,\"~/m\"}\n  up: ${..data.len}\n",
        );
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(v["trainer"]["dir"], json!("ckpt/p/e"));
        assert_eq!(v["rollout"]["prompt"], json!(512));
        assert_eq!(v["rollout"]["resp"], json!(null));
        assert_eq!(v["rollout"]["n"], json!(1));
        assert_eq!(v["rollout"]["lr"], json!(1e-6));
        assert_eq!(v["rollout"]["mode"], json!("token-mean"));
        assert_eq!(v["rollout"]["d"], json!({}));
        assert_eq!(v["rollout"]["q"], json!("~/m"));
        assert_eq!(v["rollout"]["up"], json!(512));
    }

    #[test]
    fn chains_subtrees_and_escapes() {
        let (v, d) = resolve(
            "a: ${b}\nb: ${c}\nc: 3\nsub: ${tree}\ntree:\n  x: ${c}\n  y: ${.x}\nesc: \\${c}\nf: v${fl}\nfl: 1e-6\nt: ${tb}x\ntb: true\n",
        );
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(v["a"], json!(3));
        assert_eq!(v["sub"], json!({"x": 3, "y": 3}));
        assert_eq!(v["esc"], json!("${c}"));
        assert_eq!(v["f"], json!("v1e-06"));
        assert_eq!(v["t"], json!("Truex"));
    }

    #[test]
    fn cycles_missing_keys_and_mandatory_values_are_reported() {
        let (_, d) = resolve("a: ${b}\nb: ${a}\n");
        assert_eq!(d[0].code, codes::INTERP_CYCLE);
        let (_, d) = resolve("a: ${nope.x}\n");
        assert_eq!(d[0].code, codes::INTERP_KEY_MISSING);
        let (_, d) = resolve("a: ???\nb: ${a}\n");
        assert_eq!(d[0].code, codes::MANDATORY_MISSING);
        let (v, d) = resolve("a: ???\nb: ${oc.select:a,5}\n");
        assert!(d.is_empty());
        assert_eq!(v["b"], json!(5));
        let (_, d) = resolve("a: ${oc.decode:x}\n");
        assert_eq!(d[0].code, codes::INTERP_RESOLVER);
    }

    /// A container interpolated into a string reads as Python prints it, not as JSON.
    #[test]
    fn containers_in_strings_use_python_repr() {
        let (v, d) = resolve("d:\n  a: 1\n  b: [x, true, null, 1.5]\n  c: \"it's\"\ns: dir/${d}\n");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            v["s"],
            json!("dir/{'a': 1, 'b': ['x', True, None, 1.5], 'c': \"it's\"}")
        );
    }

    #[test]
    fn python_float_repr() {
        assert_eq!(py_float(1e-6), "1e-06");
        assert_eq!(py_float(0.001), "0.001");
        assert_eq!(py_float(1.5e20), "1.5e+20");
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(0.0001), "0.0001");
    }
}

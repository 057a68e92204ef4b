//! The untyped config tree every stage works on: YAML maps, lists and scalars, each node
//! carrying the [`Origin`] of the text it was written in. Composition, overrides and
//! interpolation rewrite this tree; the schema and the typed model see it as JSON.

use indexmap::IndexMap;

use crate::source::Origin;

#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Scalar(Scalar),
    Seq(Vec<Node>),
    /// Boxed: a map is 64 bytes inline, and most nodes are scalars (a node is 72 bytes
    /// instead of 128, which matters for a config of a few MB).
    Map(Box<Map>),
}

/// A map entry remembers where its key was written, so "unknown key" points at the key.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub key_origin: Option<Origin>,
    pub node: Node,
}

/// Config keys are short and trusted-size (the YAML parser bounds node counts): a fast
/// non-cryptographic hasher, not SipHash, which showed up in every `verlc check` profile.
pub type Map = IndexMap<String, Entry, foldhash::fast::FixedState>;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub value: Value,
    pub origin: Option<Origin>,
    /// Set on values produced by `${...}`: where the interpolation was written.
    pub via: Option<Box<Origin>>,
}

impl Node {
    pub fn new(value: Value, origin: Option<Origin>) -> Self {
        Node {
            value,
            origin,
            via: None,
        }
    }

    pub fn scalar(s: Scalar, origin: Option<Origin>) -> Self {
        Node::new(Value::Scalar(s), origin)
    }

    pub fn null(origin: Option<Origin>) -> Self {
        Node::scalar(Scalar::Null, origin)
    }

    pub fn empty_map(origin: Option<Origin>) -> Self {
        Node::new(Value::Map(Box::default()), origin)
    }

    /// Nodes in this subtree, itself included.
    pub fn count(&self) -> usize {
        1 + match &self.value {
            Value::Map(m) => m.values().map(|e| e.node.count()).sum(),
            Value::Seq(items) => items.iter().map(Node::count).sum(),
            Value::Scalar(_) => 0,
        }
    }

    pub fn as_map(&self) -> Option<&Map> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_map_mut(&mut self) -> Option<&mut Map> {
        match &mut self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(Scalar::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self.value {
            Value::Scalar(Scalar::Bool(b)) => Some(b),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self.value {
            Value::Scalar(Scalar::Int(i)) => Some(i),
            _ => None,
        }
    }

    /// A number as a float (an integer too, as YAML writes `lr: 1`).
    pub fn as_f64(&self) -> Option<f64> {
        match self.value {
            Value::Scalar(Scalar::Int(i)) => Some(i as f64),
            Value::Scalar(Scalar::Float(f)) => Some(f),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Scalar(Scalar::Null))
    }

    /// OmegaConf's `???`: a value that must be supplied before use.
    pub fn is_missing(&self) -> bool {
        self.as_str() == Some("???")
    }

    /// Child by dotted path segments.
    pub fn get_path(&self, path: &[&str]) -> Option<&Node> {
        let mut cur = self;
        for seg in path {
            cur = cur.child(seg)?;
        }
        Some(cur)
    }

    pub fn child(&self, seg: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(m) => m.get(seg).map(|e| &e.node),
            Value::Seq(items) => seg.parse::<usize>().ok().and_then(|i| items.get(i)),
            Value::Scalar(_) => None,
        }
    }

    pub fn child_mut(&mut self, seg: &str) -> Option<&mut Node> {
        match &mut self.value {
            Value::Map(m) => m.get_mut(seg).map(|e| &mut e.node),
            Value::Seq(items) => seg.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            Value::Scalar(_) => None,
        }
    }

    pub fn get_path_mut(&mut self, path: &[&str]) -> Option<&mut Node> {
        let mut cur = self;
        for seg in path {
            cur = cur.child_mut(seg)?;
        }
        Some(cur)
    }

    /// Plain JSON, as the schema validator and the typed model see it.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Scalar(Scalar::Null) => J::Null,
            Value::Scalar(Scalar::Bool(b)) => J::Bool(*b),
            Value::Scalar(Scalar::Int(i)) => J::from(*i),
            Value::Scalar(Scalar::Float(f)) => serde_json::Number::from_f64(*f)
                .map_or_else(|| J::String(format_float(*f)), J::Number),
            Value::Scalar(Scalar::Str(s)) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(m) => J::Object(
                m.iter()
                    .map(|(k, e)| (k.clone(), e.node.to_json()))
                    .collect(),
            ),
        }
    }

    /// Forget where every node and key was written (and which interpolation made it).
    pub fn clear_origins(&mut self) {
        self.origin = None;
        self.via = None;
        match &mut self.value {
            Value::Map(m) => {
                for e in m.values_mut() {
                    e.key_origin = None;
                    e.node.clear_origins();
                }
            }
            Value::Seq(items) => items.iter_mut().for_each(Node::clear_origins),
            Value::Scalar(_) => {}
        }
    }

    /// The paths (keys, list items by index) of the nodes under this one that `hit` accepts,
    /// without descending into those. Keys are borrowed during the walk: only the hits' paths
    /// are copied (a config has a thousand keys and few hits).
    pub fn paths_where(&self, hit: &dyn Fn(&Node) -> bool) -> Vec<Vec<String>> {
        fn go<'a>(
            n: &'a Node,
            hit: &dyn Fn(&Node) -> bool,
            path: &mut Vec<std::borrow::Cow<'a, str>>,
            out: &mut Vec<Vec<String>>,
        ) {
            if hit(n) {
                out.push(path.iter().map(|p| p.to_string()).collect());
                return;
            }
            match &n.value {
                Value::Map(m) => {
                    for (k, e) in m.iter() {
                        path.push(k.as_str().into());
                        go(&e.node, hit, path, out);
                        path.pop();
                    }
                }
                Value::Seq(items) => {
                    for (i, c) in items.iter().enumerate() {
                        path.push(i.to_string().into());
                        go(c, hit, path, out);
                        path.pop();
                    }
                }
                Value::Scalar(_) => {}
            }
        }
        let mut out = Vec::new();
        go(self, hit, &mut Vec::new(), &mut out);
        out
    }

    /// Visit every node with its JSON pointer (`/actor_rollout_ref/actor/optim/lr`).
    pub fn walk(&self, f: &mut dyn FnMut(&str, &Node, Option<&Origin>)) {
        fn go(
            node: &Node,
            key_origin: Option<&Origin>,
            ptr: &mut String,
            f: &mut dyn FnMut(&str, &Node, Option<&Origin>),
        ) {
            f(ptr, node, key_origin);
            let len = ptr.len();
            match &node.value {
                Value::Map(m) => {
                    for (k, e) in m.iter() {
                        ptr.push('/');
                        ptr.push_str(&k.replace('~', "~0").replace('/', "~1"));
                        go(&e.node, e.key_origin.as_ref(), ptr, f);
                        ptr.truncate(len);
                    }
                }
                Value::Seq(items) => {
                    for (i, n) in items.iter().enumerate() {
                        ptr.push('/');
                        ptr.push_str(&i.to_string());
                        go(n, None, ptr, f);
                        ptr.truncate(len);
                    }
                }
                Value::Scalar(_) => {}
            }
        }
        go(self, None, &mut String::new(), f);
    }
}

/// Python's spelling of non-finite floats, which JSON cannot hold.
pub fn format_float(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        let s = format!("{f}");
        if s.contains('.') || s.contains('e') {
            s
        } else {
            format!("{s}.0")
        }
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Null => f.write_str("null"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => f.write_str(&format_float(*x)),
            Scalar::Str(s) => f.write_str(s),
        }
    }
}

/// Split a dotted key (`a.b.c`); `a.0.b` addresses list items.
pub fn split_key(key: &str) -> Vec<&str> {
    key.split('.').filter(|s| !s.is_empty()).collect()
}

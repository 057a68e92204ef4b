//! verlc's built-in default trees, composed ahead of time.
//!
//! Every `verlc check` compares the user's values with the built-in defaults of the config's
//! flavour, and composing them from the YAML files took a sizeable part of a check. The
//! composed trees are committed (`front/defaults/composed.json`, kept equal to what the
//! files compose to by `tests/schema_fresh.rs`) and the build script turns them into the
//! statics below; building a [`Node`] from them is a plain copy. Debug builds (the tests)
//! compose the files instead, so a stale snapshot cannot hide a change from them.

use super::node::{Entry, Map, Node, Scalar, Value};

include!(concat!(env!("OUT_DIR"), "/builtin_trees.rs"));

/// A node of a committed default tree.
#[derive(Debug)]
#[allow(
    dead_code,
    reason = "the build script writes whichever variants the trees need"
)]
pub enum StaticNode {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'static str),
    Seq(&'static [StaticNode]),
    Map(&'static [(&'static str, StaticNode)]),
}

/// The tree as a [`Node`] without origins.
pub fn to_node(n: &StaticNode) -> Node {
    let value = match n {
        StaticNode::Null => Value::Scalar(Scalar::Null),
        StaticNode::Bool(b) => Value::Scalar(Scalar::Bool(*b)),
        StaticNode::Int(i) => Value::Scalar(Scalar::Int(*i)),
        StaticNode::Float(f) => Value::Scalar(Scalar::Float(*f)),
        StaticNode::Str(s) => Value::Scalar(Scalar::Str((*s).to_owned())),
        StaticNode::Seq(items) => Value::Seq(items.iter().map(to_node).collect()),
        StaticNode::Map(entries) => {
            let mut m = Map::with_capacity_and_hasher(entries.len(), Default::default());
            for (k, v) in entries.iter() {
                m.insert(
                    (*k).to_owned(),
                    Entry {
                        key_origin: None,
                        node: to_node(v),
                    },
                );
            }
            Value::Map(Box::new(m))
        }
    };
    Node::new(value, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Flavour;
    use crate::load::compose::composed_builtin_tree;

    /// The statics copy the committed trees exactly (integers stay integers, strings keep
    /// their escapes); `tests/schema_fresh.rs` checks the file itself is current.
    #[test]
    fn snapshot_builds_the_composed_trees() {
        assert_eq!(to_node(&BUILTIN_FSDP), composed_builtin_tree(Flavour::Fsdp));
        assert_eq!(
            to_node(&BUILTIN_MEGATRON),
            composed_builtin_tree(Flavour::Megatron)
        );
    }
}

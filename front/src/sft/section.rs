//! Reading the values of an engine's or optimizer's section whose keys verlc has no typed
//! model of (the VeOmni and AutoModel groups): a key's node, its text, an optimizer's betas.

use crate::load::node::Node;

/// The node of `key` (dotted) under the top-level `section`.
pub(super) fn get<'a>(root: &'a Node, section: &str, key: &str) -> Option<&'a Node> {
    let mut path = vec![section];
    path.extend(key.split('.'));
    root.get_path(&path)
}

/// A scalar as text (`true`, `2`, `fsdp2`); other values as empty.
pub(super) fn text(n: &Node) -> String {
    match (n.as_str(), n.as_bool(), n.as_i64()) {
        (Some(s), ..) => s.to_owned(),
        (_, Some(b), _) => b.to_string(),
        (_, _, Some(i)) => i.to_string(),
        _ => String::new(),
    }
}

/// `optim.betas` as (beta1, beta2), torch's defaults when unset.
pub(super) fn betas(root: &Node) -> (f64, f64) {
    let b: Vec<f64> = get(root, "optim", "betas")
        .map(Node::to_json)
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    (
        b.first().copied().unwrap_or(0.9),
        b.get(1).copied().unwrap_or(0.999),
    )
}

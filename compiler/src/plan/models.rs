//! The models and tokenizer a trainer spec reads that are named by Hugging Face Hub id, with
//! the config key that names each: `verlc build` makes sure they are in the Hub cache, where
//! the trainer (which never downloads) reads them.

use verlc_hub::{RepoId, hub_id};
use verlc_spec::TrainerSpec;

/// A Hub model the trainer reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    /// The key whose value names it (the first of the roles that read it).
    pub key: &'static str,
    pub id: RepoId,
}

/// Each Hub id of `spec` once, in the order actor, tokenizer, reference, critic.
pub fn hub_models(spec: &TrainerSpec) -> Vec<HubModel> {
    let mut paths = vec![
        (
            "actor_rollout_ref.model.path",
            spec.actor.model_path.as_str(),
        ),
        (
            "actor_rollout_ref.model.tokenizer_path",
            spec.tokenizer_path.as_str(),
        ),
    ];
    if let Some(r) = &spec.reference {
        paths.push(("actor_rollout_ref.ref.model.path", r.model_path.as_str()));
    }
    if let Some(c) = &spec.critic {
        paths.push(("critic.model.path", c.model_path.as_str()));
    }
    let mut out: Vec<HubModel> = Vec::new();
    for (key, path) in paths {
        if let Some(id) = hub_id(path).filter(|id| out.iter().all(|m| &m.id != id)) {
            out.push(HubModel { key, id });
        }
    }
    out
}

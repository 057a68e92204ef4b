//! How a family's checkpoint stores tensors the model holds otherwise: Qwen3-Next's fused
//! DeltaNet projections ([`FusedProjections`]) and Qwen3-VL-MoE's fused experts
//! ([`FusedExperts`]). Loading splits them ([`StoredLayout::split`]), saving fuses them
//! again ([`StoredLayout::fuse`]), so a trained model is a checkpoint of its family.
use tch::Tensor;

use super::ModelConfig;
use super::fused_experts::FusedExperts;
use super::qwen3_next::FusedProjections;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredLayout {
    DeltaNet(FusedProjections),
    Experts(FusedExperts),
}

impl StoredLayout {
    /// The `model_type`s whose checkpoints store fused tensors (the config is parsed only
    /// for these).
    pub fn fuses(model_type: &str) -> bool {
        model_type == "qwen3_next"
            || verlc_spec::families::of_checkpoint(model_type)
                .is_some_and(|r| r.expert_style != verlc_spec::families::ExpertStyle::PerExpert)
    }

    /// The layout of `cfg`'s checkpoint: `None` where it is stored as the model holds it.
    pub fn of(cfg: &ModelConfig) -> Option<Self> {
        FusedProjections::of(cfg)
            .map(StoredLayout::DeltaNet)
            .or_else(|| FusedExperts::of(cfg).map(StoredLayout::Experts))
    }

    /// Whether checkpoint tensor `name` is stored fused.
    pub fn is_fused(&self, name: &str) -> bool {
        match self {
            StoredLayout::DeltaNet(_) => FusedProjections::is_fused(name),
            StoredLayout::Experts(_) => FusedExperts::is_fused(name),
        }
    }

    /// The held tensors of checkpoint tensor `name` (itself when it is not fused).
    pub fn split(&self, name: &str, t: &Tensor) -> Result<Vec<(String, Tensor)>, String> {
        match self {
            StoredLayout::DeltaNet(f) => f.split(name, t),
            StoredLayout::Experts(f) => f.split(name, t),
        }
    }

    /// `named` (held tensors) as the checkpoint stores them.
    pub fn fuse(&self, named: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>, String> {
        match self {
            StoredLayout::DeltaNet(f) => f.fuse(named),
            StoredLayout::Experts(f) => f.fuse(named),
        }
    }
}

//! The one floating-point dtype type of verlc: a model's parameters, a role's training
//! precision (the binding), a gradient reduction, the optimizer's wrapper and the rollout's
//! weights are all a [`Dtype`].
//!
//! The config keeps verl's several YAML spellings (`bf16`, `bfloat16`, `32`, …) in its own
//! enums, each turned into a [`Dtype`] by one `dtype()` method; the runtime maps it to a torch
//! kind in one place (`verlc_runtime::model::TorchKind`).

use serde::{Deserialize, Serialize};

/// A floating-point dtype. As a training precision: `Fp32` trains in fp32; `Bf16` computes
/// in bf16 with fp32 main weights, gradient reductions and optimizer state; `Fp16` does the
/// same in fp16 with dynamic loss scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
}

impl Dtype {
    pub const ALL: [Dtype; 3] = [Dtype::Fp32, Dtype::Bf16, Dtype::Fp16];

    /// verl's spellings (its `PrecisionType` helper and torch's names): fp32/float32/float/32,
    /// bf16/bfloat16, fp16/float16/half/16.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fp32" | "float32" | "float" | "32" => Some(Dtype::Fp32),
            "bf16" | "bfloat16" => Some(Dtype::Bf16),
            "fp16" | "float16" | "half" | "16" => Some(Dtype::Fp16),
            _ => None,
        }
    }

    /// verl's short spelling (`fp32`, `bf16`, `fp16`), for messages and help.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
        }
    }

    /// fp16 needs a gradient (loss) scaler; bf16 and fp32 do not.
    pub const fn loss_scaling(self) -> bool {
        matches!(self, Dtype::Fp16)
    }

    /// As a binding's precision: the runtime's marker type (`verlc_runtime::binding::Bf16Mixed`),
    /// the spelling of `bind_trainer!` and of build reports.
    pub const fn marker(self) -> &'static str {
        match self {
            Dtype::Fp32 => "Fp32",
            Dtype::Bf16 => "Bf16Mixed",
            Dtype::Fp16 => "Fp16Mixed",
        }
    }

    pub fn from_marker(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.marker() == name)
    }
}

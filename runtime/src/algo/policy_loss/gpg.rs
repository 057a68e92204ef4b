//! `gpg`: group policy gradient (Chu et al. 2025): `ℓ = −A·log π_θ`, no ratio, aggregated with
//! `loss_agg_mode`. verl logs no metrics for it.
use super::{PolicyLoss, PolicyLossInputs, PolicyLossMetrics};
use crate::algo::Result;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    inputs.validate()?;
    let mask = inputs.mask()?;
    let pg_losses = inputs.weighted(inputs.log_prob.f_mul(inputs.advantages)?.f_neg()?)?;
    let loss = agg_loss(&pg_losses, &mask, agg_mode, agg)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics::default(),
    })
}

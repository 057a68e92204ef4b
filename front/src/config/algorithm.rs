//! The RL algorithm, `algorithm`: advantage estimator, discounting, in-reward KL penalty and
//! its controller (`kl_ctrl`), PF-PPO resampling (`pf_ppo`), DAPO group filtering
//! (`filter_groups`) and rollout-vs-training mismatch correction (`rollout_correction`,
//! group `algorithm/rollout_correction.yaml`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::KlEstimator;

/// How advantages are computed from rewards (and values): the spec's vocabulary.
pub use verlc_spec::algo::AdvEstimator;

/// Kind of controller for the in-reward KL coefficient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum KlCtrlType {
    /// The coefficient stays at `kl_coef`.
    #[serde(rename = "fixed")]
    Fixed,
    /// The coefficient is adjusted to keep the measured KL near `target_kl`.
    #[serde(rename = "adaptive")]
    Adaptive,
}

/// Controller of the in-reward KL penalty coefficient.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KlCtrlConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Controller kind.
    #[serde(rename = "type")]
    pub kind: KlCtrlType,
    /// Initial (or fixed) KL coefficient.
    #[schemars(range(min = 0.0))]
    pub kl_coef: f64,
    /// Adaptive controller: number of samples over which the coefficient adapts; must be
    /// positive for `adaptive`.
    pub horizon: i64,
    /// Adaptive controller: KL value the coefficient steers towards.
    pub target_kl: f64,
}

/// PF-PPO sample weighting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PfPpoReweightMethod {
    /// Weight by the score's absolute value raised to `weight_pow`.
    #[serde(rename = "pow")]
    Pow,
    /// Keep only the best and worst scored samples.
    #[serde(rename = "max_min")]
    MaxMin,
    /// Favour the best scored samples, keep others with a small weight.
    #[serde(rename = "max_random")]
    MaxRandom,
}

/// Policy-filtered PPO: resample the batch by reward-based weights (GAE only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PfPpoConfig {
    /// Weighting scheme.
    pub reweight_method: PfPpoReweightMethod,
    /// Exponent of the `pow` scheme.
    pub weight_pow: f64,
}

/// DAPO dynamic sampling: drop groups whose responses all score alike and generate more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterGroupsConfig {
    /// Turn group filtering on.
    pub enable: bool,
    /// Per-sample metric whose variance decides whether a group is kept (e.g. `acc`,
    /// `score`, `seq_reward`).
    pub metric: Option<String>,
    /// Generation batches tried per step before giving up; 0 (the default) means no limit.
    #[schemars(range(min = 0))]
    #[serde(default)]
    pub max_num_gen_batches: i64,
    /// Sync DAPO prompt batches pending or generating at once (verl 0.9's v1 trainer; absent
    /// from older trees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight_gen_batches: Option<i64>,
}

/// Granularity of rollout importance-sampling weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutIsLevel {
    /// One truncated weight per token.
    #[serde(rename = "token")]
    Token,
    /// One weight per sequence (product of token ratios).
    #[serde(rename = "sequence")]
    Sequence,
}

/// Loss used in bypass mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BypassLossType {
    /// PPO clipped surrogate against the rollout policy.
    #[serde(rename = "ppo_clip")]
    PpoClip,
    /// REINFORCE weighted by importance weights.
    #[serde(rename = "reinforce")]
    Reinforce,
}

/// A bound on the importance ratio: a number, or a string spec such as `lower_upper` bounds
/// (verl 0.8+; rejection sampling's per-option lists too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RatioThreshold {
    /// Upper bound on the importance ratio.
    Number(f64),
    /// Textual threshold specification.
    Text(String),
}

impl RatioThreshold {
    /// verl 0.8's reading of `rollout_is_threshold` (`_parse_rollout_is_threshold`):
    /// `(upper, lower)`, IcePop when a lower bound is given, or what verl raises.
    // The negated comparisons also refuse NaN, which verl's checks let through; it has no use.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn importance_bounds(&self) -> Result<(f64, Option<f64>), String> {
        let number = |s: &str| s.trim().parse::<f64>().ok();
        let (upper, lower) = match self {
            RatioThreshold::Number(x) => (*x, None),
            RatioThreshold::Text(t) => {
                let spec = t.trim();
                if spec.is_empty() {
                    return Err("rollout_is_threshold must not be an empty string".into());
                }
                let parsed = match spec.split_once('_') {
                    Some((lo, hi)) => number(hi).zip(number(lo)).map(|(hi, lo)| (hi, Some(lo))),
                    None => number(spec).map(|hi| (hi, None)),
                };
                parsed.ok_or_else(|| format!("Invalid rollout_is_threshold '{t}'"))?
            }
        };
        if !(upper > 0.0) {
            return Err(format!(
                "rollout_is_threshold upper bound must be positive, got {upper}"
            ));
        }
        match lower {
            Some(lo) if !(lo > 0.0) => Err(format!(
                "rollout_is_threshold lower bound must be positive, got {lo}"
            )),
            Some(lo) if lo > upper => Err(format!(
                "rollout_is_threshold lower bound must be <= upper bound, got {lo} > {upper}"
            )),
            _ => Ok((upper, lower)),
        }
    }
}

/// Correction for the mismatch between the rollout engine's and the trainer's
/// probabilities: importance weights and rejection sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutCorrectionConfig {
    /// Importance-weight granularity; null disables importance weighting.
    pub rollout_is: Option<RolloutIsLevel>,
    /// Upper truncation of the importance weights; since verl 0.8 also `"lower_upper"`
    /// (IcePop: weights outside the bounds are zeroed).
    pub rollout_is_threshold: RatioThreshold,
    /// Rejection-sampling level (`token`, `sequence`, `geometric`, or a comma list of
    /// estimator options); null disables rejection sampling.
    pub rollout_rs: Option<String>,
    /// Upper rejection bound; null reuses `rollout_is_threshold`.
    pub rollout_rs_threshold: Option<RatioThreshold>,
    /// Lower rejection bound; null uses the reciprocal of the upper bound.
    pub rollout_rs_threshold_lower: Option<f64>,
    /// Reject a whole sequence when any token's ratio falls below this; null disables.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub rollout_token_veto_threshold: Option<f64>,
    /// Use the rollout log-probs as the old policy and skip recomputing them.
    pub bypass_mode: bool,
    /// Loss used in bypass mode.
    pub loss_type: BypassLossType,
    /// Normalise the importance weights to mean 1 over the batch.
    pub rollout_is_batch_normalize: bool,
}

/// The RL algorithm: advantage estimation, discounting and the in-reward KL penalty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Discount factor of future rewards.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub gamma: f64,
    /// GAE lambda: trade-off between bias (0) and variance (1).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub lam: f64,
    /// Advantage estimator; only `gae` needs the critic.
    pub adv_estimator: AdvEstimator,
    /// GRPO: divide by the group's standard deviation (false gives Dr. GRPO).
    pub norm_adv_by_std_in_grpo: bool,
    /// Subtract a KL penalty towards the reference policy from the token rewards; needs the
    /// reference policy.
    pub use_kl_in_reward: bool,
    /// KL estimator of the in-reward penalty.
    pub kl_penalty: KlEstimator,
    /// Controller of the in-reward KL coefficient.
    pub kl_ctrl: KlCtrlConfig,
    /// Resample batches with PF-PPO weights.
    pub use_pf_ppo: bool,
    /// PF-PPO settings.
    pub pf_ppo: PfPpoConfig,
    /// Rollout-vs-training mismatch correction.
    pub rollout_correction: RolloutCorrectionConfig,
    /// GDPO: the keys of the reward function's result dict normalised one by one (verl 0.9
    /// dataclass field, absent from the YAML trees: set it with `+algorithm.gdpo_reward_keys`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdpo_reward_keys: Option<Vec<String>>,
    /// GDPO: one weight per reward key; null weighs them equally (verl 0.9 dataclass field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdpo_reward_weights: Option<Vec<f64>>,
    /// DAPO group filtering; absent disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_groups: Option<FilterGroupsConfig>,
}

//! The algorithm vocabulary (docs/algorithms.md): advantage estimators, policy losses, loss
//! aggregation and KL estimators, with verl's spellings, and the parameters they read.

use std::str::FromStr;

use crate::names::{UnknownName, verl_names};

verl_names! {
    /// How the per-token loss matrix is reduced to a scalar (`actor.loss_agg_mode`).
    pub enum LossAggMode ("loss_agg_mode") {
        /// Mean over every valid token of the batch.
        TokenMean => "token-mean",
        /// Sum over each sequence's tokens, mean over sequences.
        SeqMeanTokenSum => "seq-mean-token-sum",
        /// Mean over each sequence's tokens, mean over sequences.
        SeqMeanTokenMean => "seq-mean-token-mean",
        /// Sum over all tokens divided by a constant (Dr. GRPO).
        SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        /// Sum over every valid token of the batch (verl 0.9).
        TokenSum => "token-sum",
    }
}

verl_names! {
    /// The advantage estimator (`algorithm.adv_estimator`).
    pub enum AdvEstimator ("advantage estimator") {
        /// Generalized advantage estimation with the critic's values (PPO).
        Gae => "gae",
        /// Group-normalised outcome score (GRPO; Dr. GRPO without the std).
        Grpo => "grpo",
        /// GRPO with the vectorised group statistics (variance floored at epsilon).
        GrpoVectorized => "grpo_vectorized",
        /// Only the best response of each group gets an advantage (pass@k).
        GrpoPassk => "grpo_passk",
        /// Discounted token returns, whitened over the batch (REINFORCE++).
        ReinforcePlusPlus => "reinforce_plus_plus",
        /// Score minus the group mean, whitened over the batch.
        ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
        /// Score minus the mean of the other responses of the group (RLOO).
        Rloo => "rloo",
        /// Vectorised RLOO (a singleton group gets advantage 0).
        RlooVectorized => "rloo_vectorized",
        /// Score minus the length-weighted group mean (OPO).
        Opo => "opo",
        /// Return minus the score of a greedy rollout of the same prompt (ReMax).
        Remax => "remax",
        /// Group-centred score rescaled by the share of non-zero scores (GPG).
        Gpg => "gpg",
        /// Reward-to-go minus a per-timestep group baseline weighted by accumulated path
        /// variance (verl 0.9; needs `actor.calculate_sum_pi_squared`).
        OptimalTokenBaseline => "optimal_token_baseline",
        /// `optimal_token_baseline` over each trajectory's own tokens (multi-turn responses
        /// with tool turns masked out; verl 0.9).
        TirOptimalTokenBaseline => "tir_optimal_token_baseline",
        /// Each reward component normalised within its group (GRPO per component), summed
        /// with weights and whitened over the batch (GDPO; verl 0.9).
        Gdpo => "gdpo",
    }
}

impl AdvEstimator {
    /// True for the estimators that need the critic's `values` (only `gae`).
    pub fn needs_values(self) -> bool {
        self == AdvEstimator::Gae
    }

    /// True for the estimators that need a [`GroupIndex`].
    pub fn needs_index(self) -> bool {
        !matches!(
            self,
            AdvEstimator::Gae | AdvEstimator::ReinforcePlusPlus | AdvEstimator::Remax
        )
    }

    /// True for the estimators that read the old policy's `Σ_v π_v²` per token.
    pub fn needs_sum_pi_squared(self) -> bool {
        matches!(
            self,
            AdvEstimator::OptimalTokenBaseline | AdvEstimator::TirOptimalTokenBaseline
        )
    }

    /// True for the estimators that need `reward_baselines` (only `remax`).
    pub fn needs_reward_baselines(self) -> bool {
        self == AdvEstimator::Remax
    }
}

/// The verl release whose algorithm functions a run follows. A few of verl's functions
/// changed their results between releases (docs/algorithms.md, "Per release"); a run computes
/// what the release its config was judged against computes. `(major, minor, patch)`; the
/// newest carried release (0.9.1) where none is given.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct AlgoRelease(pub u32, pub u32, pub u32);

impl Default for AlgoRelease {
    fn default() -> Self {
        AlgoRelease::NEWEST
    }
}

impl AlgoRelease {
    pub const NEWEST: AlgoRelease = AlgoRelease(0, 9, 1);
    pub const V0_7_0: AlgoRelease = AlgoRelease(0, 7, 0);

    /// `seq-mean-token-sum-norm` sums each non-empty sequence's losses over the global batch's
    /// non-empty sequences and scales by the data-parallel size before the constant (0.7.1 on);
    /// before, the whole sum over the constant. From the same release `agg_loss` refuses a
    /// data-parallel size above 1 without the global batch's counts.
    pub fn seq_sum_norm_over_batch(self) -> bool {
        self >= AlgoRelease(0, 7, 1)
    }

    /// `grpo_vectorized`'s group std: the two-pass unbiased variance, no floor (0.8.0 on); before,
    /// the one-pass variance floored at ε.
    pub fn grpo_vectorized_two_pass(self) -> bool {
        self >= AlgoRelease(0, 8, 0)
    }

    /// REINFORCE++'s returns: the running return carries across masked positions and the returns
    /// are masked (0.9.0 on); before, the running return restarts after a masked token.
    pub fn reinforce_pp_carries_over_masks(self) -> bool {
        self >= AlgoRelease(0, 9, 0)
    }

    /// GSPO aggregates with the configured `loss_agg_mode` (0.9.1 on); before, always
    /// `seq-mean-token-mean`.
    pub fn gspo_uses_configured_agg(self) -> bool {
        self >= AlgoRelease(0, 9, 1)
    }

    /// The SFT dataset (no_padding) refuses a conversation longer than `max_length` under
    /// `truncation: error` (0.7.1 on); before, it kept the first `max_length` tokens whatever
    /// `truncation` said.
    pub fn sft_overlong_is_error(self) -> bool {
        self >= AlgoRelease(0, 7, 1)
    }

    /// The SFT dataset renders a message the chat template refuses alone (one that needs a
    /// user turn first) after an empty user turn, and cuts that turn's tokens off (0.7.1 on).
    pub fn sft_lone_message_fallback(self) -> bool {
        self >= AlgoRelease(0, 7, 1)
    }

    /// The SFT dataset measures the system and generation prompts with
    /// `apply_chat_template_kwargs` (0.8.0 on); before, with none.
    pub fn sft_prompts_with_kwargs(self) -> bool {
        self >= AlgoRelease(0, 8, 0)
    }
}

impl std::fmt::Display for AlgoRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The `algorithm` parameters the estimators read.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdvantageConfig {
    /// Discount factor γ (`algorithm.gamma`; gae, reinforce_plus_plus).
    pub gamma: f64,
    /// GAE λ (`algorithm.lam`).
    pub lam: f64,
    /// Divide by the group std (`algorithm.norm_adv_by_std_in_grpo`; grpo, grpo_vectorized,
    /// grpo_passk).
    pub norm_adv_by_std_in_grpo: bool,
    /// ε added to the group std (verl's 1e-6; before 0.8, also grpo_vectorized's variance floor).
    pub epsilon: f64,
    /// Whose estimators these are (see [`AlgoRelease`]).
    #[serde(default)]
    pub release: AlgoRelease,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig {
            gamma: 1.0,
            lam: 1.0,
            norm_adv_by_std_in_grpo: true,
            epsilon: 1e-6,
            release: AlgoRelease::NEWEST,
        }
    }
}

verl_names! {
    /// The policy loss (`actor.policy_loss.loss_mode`). verl's `bypass_mode` (selected by rollout
    /// correction) is not one of them here.
    pub enum PolicyLossMode ("policy loss mode") {
        /// PPO clipped surrogate with dual clipping for negative advantages.
        Vanilla => "vanilla",
        /// Sequence-level importance ratio (GSPO).
        Gspo => "gspo",
        /// Soft, sigmoid-gated ratio (SAPO).
        Sapo => "sapo",
        /// Plain policy gradient `−A·log π` (GPG).
        Gpg => "gpg",
        /// PPO clip plus random detaching of high-covariance tokens (Clip-Cov).
        ClipCov => "clip_cov",
        /// Unclipped ratio with a KL penalty on the highest-covariance tokens (KL-Cov).
        KlCov => "kl_cov",
        /// Geometric mean of clipped token ratios per sequence (GMPO).
        GeoMean => "geo_mean",
        /// Clipped, detached ratio weighting a REINFORCE term (CISPO).
        Cispo => "cispo",
        /// Truncated ratio weighting a REINFORCE term inside a total-variation trust region
        /// (DPPO-Binary-TV).
        DppoTv => "dppo_tv",
        /// As `dppo_tv` with a binary-KL trust region (DPPO-Binary-KL).
        DppoKl => "dppo_kl",
        /// Policy gradient with a quadratic log-ratio penalty (DRO).
        Dro => "dro",
    }
}

/// The actor parameters the losses read; `Default` is verl's defaults.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyLossConfig {
    /// `actor.clip_ratio`, the fallback of the two below.
    pub clip_ratio: f64,
    /// `actor.clip_ratio_low` (ε_l).
    pub clip_ratio_low: Option<f64>,
    /// `actor.clip_ratio_high` (ε_h).
    pub clip_ratio_high: Option<f64>,
    /// `actor.clip_ratio_c`: dual-clip bound, > 1.
    pub clip_ratio_c: f64,
    /// `actor.tau_pos` (SAPO, A > 0).
    pub tau_pos: f64,
    /// `actor.tau_neg` (SAPO, A ≤ 0).
    pub tau_neg: f64,
    /// `actor.policy_loss.clip_cov_ratio`.
    pub clip_cov_ratio: f64,
    /// `actor.policy_loss.clip_cov_lb`.
    pub clip_cov_lb: f64,
    /// `actor.policy_loss.clip_cov_ub`.
    pub clip_cov_ub: f64,
    /// `actor.policy_loss.kl_cov_ratio`.
    pub kl_cov_ratio: f64,
    /// `actor.policy_loss.ppo_kl_coef`.
    pub ppo_kl_coef: f64,
    /// `actor.policy_loss.dro_beta` (DRO's penalty weight; required by `dro`).
    #[serde(default)]
    pub dro_beta: Option<f64>,
    /// Whose losses and aggregation these are (see [`AlgoRelease`]).
    #[serde(default)]
    pub release: AlgoRelease,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        PolicyLossConfig {
            clip_ratio: 0.2,
            clip_ratio_low: Some(0.2),
            clip_ratio_high: Some(0.2),
            clip_ratio_c: 3.0,
            tau_pos: 1.0,
            tau_neg: 1.05,
            clip_cov_ratio: 0.0002,
            clip_cov_lb: 1.0,
            clip_cov_ub: 5.0,
            kl_cov_ratio: 0.0002,
            ppo_kl_coef: 0.1,
            dro_beta: None,
            release: AlgoRelease::NEWEST,
        }
    }
}

impl PolicyLossConfig {
    /// ε_l.
    pub fn clip_low(&self) -> f64 {
        self.clip_ratio_low.unwrap_or(self.clip_ratio)
    }

    /// ε_h.
    pub fn clip_high(&self) -> f64 {
        self.clip_ratio_high.unwrap_or(self.clip_ratio)
    }
}

/// One KL estimator (the math, without verl's aliases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlKind {
    /// `Δ`.
    K1,
    /// `|Δ|`.
    Abs,
    /// `½Δ²`.
    K2,
    /// `e^{−Δ} + Δ − 1`, clamped.
    K3,
    /// Exact KL over the vocabulary (needs `[.., vocab]` log-probs).
    Full,
}

impl KlKind {
    /// The canonical verl name (`k1`, `abs`, `k2`, `k3`, `full`).
    pub fn as_str(self) -> &'static str {
        match self {
            KlKind::K1 => "k1",
            KlKind::Abs => "abs",
            KlKind::K2 => "k2",
            KlKind::K3 => "k3",
            KlKind::Full => "full",
        }
    }

    pub fn from_verl_name(name: &str) -> Option<KlKind> {
        Some(match name {
            "kl" | "k1" => KlKind::K1,
            "abs" => KlKind::Abs,
            "mse" | "k2" => KlKind::K2,
            "low_var_kl" | "k3" => KlKind::K3,
            "full" => KlKind::Full,
            _ => return None,
        })
    }
}

/// A KL estimator as configured: the forward value of `value` with the gradient of `grad`
/// (equal for the plain names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KlEstimator {
    pub value: KlKind,
    pub grad: KlKind,
}

/// Every name verl accepts (`+` names included).
pub const KL_NAMES: &[&str] = &[
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "full",
    "kl+",
    "k1+",
    "abs+",
    "mse+",
    "k2+",
    "low_var_kl+",
    "k3+",
];

impl KlEstimator {
    /// The plain estimator `kind` (value and gradient of `kind`).
    pub const fn plain(kind: KlKind) -> Self {
        KlEstimator {
            value: kind,
            grad: kind,
        }
    }

    /// Straight-through: the value of `value`, the gradient of `grad`.
    pub const fn straight_through(value: KlKind, grad: KlKind) -> Self {
        KlEstimator { value, grad }
    }

    /// True when value and gradient come from different estimators.
    pub fn is_straight_through(&self) -> bool {
        self.value != self.grad
    }
}

impl FromStr for KlEstimator {
    type Err = UnknownName;

    /// verl's names: `kl`/`k1`, `abs`, `mse`/`k2`, `low_var_kl`/`k3`, `full`, and any of the
    /// first four with a `+` suffix (value of the named estimator, gradient of `k2`).
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        let unknown = || UnknownName {
            what: "KL estimator",
            name: s.to_owned(),
            expected: KL_NAMES.join(", "),
        };
        let (base, plus) = match s.strip_suffix('+') {
            Some(base) => (base, true),
            None => (s, false),
        };
        let kind = KlKind::from_verl_name(base).ok_or_else(unknown)?;
        match (kind, plus) {
            (KlKind::Full, true) => Err(unknown()),
            (kind, true) => Ok(KlEstimator::straight_through(kind, KlKind::K2)),
            (kind, false) => Ok(KlEstimator::plain(kind)),
        }
    }
}

impl std::fmt::Display for KlEstimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.value, self.grad) {
            (v, g) if v == g => f.write_str(v.as_str()),
            (v, KlKind::K2) => write!(f, "{}+", v.as_str()),
            (v, g) => write!(f, "{} (gradient of {})", v.as_str(), g.as_str()),
        }
    }
}

/// The value of one estimator.
/// Serialized as verl's name (`low_var_kl`, `k1+`).
impl serde::Serialize for KlEstimator {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KlEstimator {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        KlEstimator::from_str(&name).map_err(serde::de::Error::custom)
    }
}

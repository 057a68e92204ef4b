//! Rewards: a score per response, written at its last valid token (verl's
//! `NaiveRewardManager`).
//!
//! The scorer is chosen as verl's `load_reward_manager` does (docs/rewards.md):
//! `custom_reward_function.path` set → the user's Python function, served by a long-lived
//! subprocess ([`python`]); otherwise the built-in rule scorers chosen by `data_source`
//! ([`rules`]: GSM8K, boxed MATH answers, verlc's synthetic tasks).
//!
//! A scorer returns a float or a dict with `"score"`; the other keys of a dict are kept as
//! `reward_extra_info` (numbers only are logged).
//!
//! A reward model ([`model`], `reward_model.enable`) replaces the scorer in training, as verl
//! extracts the reward model's `rm_scores` before it would call the reward manager.

pub mod manager;
pub mod model;
pub mod python;
pub mod python_manager;
pub mod rules;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value};
use tch::{Kind, Tensor};

pub use model::{RewardInput, RewardModel};
pub use python::{PythonRewardFn, PythonSettings};

/// Why scoring failed.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    #[error(
        "Reward function is not implemented for data_source={0:?}: verlc's built-in scorers cover {known}; \
         set custom_reward_function.path to a Python file with compute_score(data_source, solution_str, ground_truth, extra_info)",
        known = rules::KNOWN_SOURCES
    )]
    NotImplemented(String),
    #[error("custom reward function `{name}` in {path}: {msg}")]
    Python {
        path: String,
        name: String,
        msg: String,
    },
    #[error(
        "custom reward function `{name}` in {path} did not answer within {seconds:.0} s ({what}); it was stopped"
    )]
    Timeout {
        path: String,
        name: String,
        seconds: f64,
        what: String,
    },
    #[error("cannot start the reward-function interpreter `{python}`: {source}")]
    Spawn {
        python: String,
        source: std::io::Error,
    },
    /// `source` concerns one response: the `index`-th of the items scored.
    #[error("{source}")]
    Sample {
        index: usize,
        source: Box<RewardError>,
    },
    /// A Python reward manager failed (its traceback), or its helper did.
    #[error("{what}: {msg}")]
    Manager { what: String, msg: String },
    #[error("reward: {0}")]
    Other(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// What a scorer sees of one response (verl's `compute_score` arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreItem {
    pub data_source: String,
    /// The decoded response, special tokens removed.
    pub solution_str: String,
    pub ground_truth: Value,
    pub extra_info: Map<String, Value>,
}

/// A score and the scorer's other outputs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Score {
    pub score: f64,
    /// Other keys of a dict result (verl's `reward_extra_info`).
    pub extra: BTreeMap<String, Value>,
    /// The scorer returned a dict (verl's DAPO manager then logs its `score`, else `acc`).
    pub from_dict: bool,
    /// A Python reward manager's reward per response token (`score` is their sum); `None`:
    /// the score goes to the response's last token.
    pub tokens: Option<Vec<f64>>,
}

impl Score {
    /// A score alone, without a scorer's other outputs.
    pub fn of(score: f64) -> Self {
        Score {
            score,
            ..Score::default()
        }
    }
}

/// The configured scorer.
#[derive(Debug)]
pub enum RewardFn {
    /// verlc's rule scorers, by `data_source` (verl's `default_compute_score`); the sources
    /// only verl's own `default_compute_score` covers ([`rules::scored_by_verl`]: DAPO and
    /// AIME, Numina, geometry3k, Search-R1, code contests) go to it, in the installed verl
    /// (`verl`: started when the data has such sources, see [`RewardFn::for_sources`]).
    Builtin { verl: Option<Box<PythonRewardFn>> },
    /// The user's Python `compute_score`.
    Python(Box<PythonRewardFn>),
}

impl RewardFn {
    /// The built-in scorers for data with these `sources`: verl's `default_compute_score`
    /// started (with `settings`' interpreter and timeouts) when one of them needs it. A source
    /// neither covers fails now, instead of minutes into the run.
    pub fn for_sources<'a>(
        sources: impl IntoIterator<Item = &'a str>,
        settings: impl FnOnce() -> PythonSettings,
    ) -> Result<Self, RewardError> {
        let mut needs_verl = None;
        for s in sources {
            if rules::is_supported(s) {
                continue;
            }
            if !rules::scored_by_verl(s) {
                return Err(RewardError::NotImplemented(s.to_owned()));
            }
            needs_verl.get_or_insert_with(|| s.to_owned());
        }
        let Some(source) = needs_verl else {
            return Ok(RewardFn::Builtin { verl: None });
        };
        let mut settings = settings();
        settings.path = PathBuf::from(VERL_SCORERS);
        settings.name = "default_compute_score".into();
        settings.reward_kwargs = Map::new();
        match PythonRewardFn::start(settings) {
            Ok(verl) => Ok(RewardFn::Builtin {
                verl: Some(Box::new(verl)),
            }),
            Err(e) => Err(RewardError::Other(format!(
                "data_source={source:?} is scored by verl's default_compute_score, which cannot be loaded here \
                 (install verl in the Python verlc uses, or set custom_reward_function.path): {e}"
            ))),
        }
    }

    /// Scores every item (one round trip for the Python scorer).
    pub fn score(&mut self, items: &[ScoreItem]) -> Result<Vec<Score>, RewardError> {
        match self {
            RewardFn::Builtin { verl } => {
                let mut out = vec![Score::default(); items.len()];
                let mut to_verl = Vec::new();
                for (index, it) in items.iter().enumerate() {
                    if verl.is_some() && !rules::is_supported(&it.data_source) {
                        to_verl.push(index);
                        continue;
                    }
                    out[index] = rules::default_compute_score(
                        &it.data_source,
                        &it.solution_str,
                        &it.ground_truth,
                    )
                    .map(Score::of)
                    .map_err(|e| RewardError::Sample {
                        index,
                        source: Box::new(e),
                    })?;
                }
                if let (Some(verl), false) = (verl, to_verl.is_empty()) {
                    let batch: Vec<ScoreItem> = to_verl.iter().map(|&i| items[i].clone()).collect();
                    // One score per item (the server's answer is checked for that).
                    let scores = verl.score(&batch).map_err(|e| match e {
                        // The index within the batch is the index within `items` here.
                        RewardError::Sample { index, source } => RewardError::Sample {
                            index: to_verl.get(index).copied().unwrap_or(index),
                            source,
                        },
                        other => other,
                    })?;
                    for (&i, s) in to_verl.iter().zip(scores) {
                        out[i] = s;
                    }
                }
                Ok(out)
            }
            RewardFn::Python(p) => p.score(items),
        }
    }
}

/// The module [`RewardFn::Builtin`] loads for the sources verlc's rules do not cover.
const VERL_SCORERS: &str = "pkg://verl.utils.reward_score";

/// The first `n` characters of `text` (for messages about what a scorer returned).
pub(crate) fn clip(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

/// [`token_level_scores`], where a row with token rewards (a Python reward manager's) keeps
/// them as they are.
pub fn token_level_rewards_of(
    scores: &[f64],
    details: &[Score],
    response_mask: &Tensor,
) -> Result<Tensor, RewardError> {
    if details.iter().all(|d| d.tokens.is_none()) {
        return token_level_scores(scores, response_mask);
    }
    let size = response_mask.size();
    let (rows, width) = (size[0] as usize, size[1] as usize);
    if details.len() != rows {
        return Err(RewardError::Other(format!(
            "{} token rewards for a response mask of shape {size:?}",
            details.len()
        )));
    }
    let mut dense = vec![0f32; rows * width];
    for (i, d) in details.iter().enumerate() {
        match &d.tokens {
            Some(t) => {
                if t.len() != width {
                    return Err(RewardError::Other(format!(
                        "the reward manager gave row {i} {} token rewards for responses of {width} tokens",
                        t.len()
                    )));
                }
                for (j, &x) in t.iter().enumerate() {
                    dense[i * width + j] = x as f32;
                }
            }
            None => {
                return Err(RewardError::Other(format!(
                    "row {i} has a score but no token rewards"
                )));
            }
        }
    }
    Ok(Tensor::from_slice(&dense)
        .f_view([size[0], size[1]])?
        .f_to_device(response_mask.device())?)
}

/// Token-level scores `(N, R)`: each row's score at its last valid response token.
pub fn token_level_scores(scores: &[f64], response_mask: &Tensor) -> Result<Tensor, RewardError> {
    let size = response_mask.size();
    if size.len() != 2 || size[0] != scores.len() as i64 {
        return Err(RewardError::Other(format!(
            "{} scores for a response mask of shape {size:?}",
            scores.len()
        )));
    }
    let lengths =
        Vec::<i64>::try_from(response_mask.f_sum_dim_intlist(1i64, false, Kind::Int64)?)?;
    let mut dense = vec![0f32; (size[0] * size[1]) as usize];
    for (i, (&len, &s)) in lengths.iter().zip(scores).enumerate() {
        if len > 0 {
            dense[i * size[1] as usize + len as usize - 1] = s as f32;
        }
    }
    Ok(Tensor::from_slice(&dense)
        .f_view([size[0], size[1]])?
        .f_to_device(response_mask.device())?)
}

//! Sampling parameters of one generation call (verl's `rollout.*` and `rollout.val_kwargs`).

/// Where `rollout_log_probs` come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogProbPath {
    /// The decoding pass itself (KV cache, the rollout's dtype), as vLLM reports them.
    #[default]
    Decode,
    /// A full forward over the finished sequences through the training forward
    /// (`rollout::compute_log_probs`) of the same model.
    Recompute,
}

/// Tokens the sampler never picks, whatever their logits: verl's vLLM rollout sets their
/// logits to minus infinity before sampling, so the log-probabilities it reports are
/// normalised over the other tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MaskedTokens {
    /// Every id from this one on: the rows a checkpoint pads its vocabulary with past its
    /// tokenizer's (no tokenizer decodes them).
    pub from: Option<i64>,
    /// Single ids inside the vocabulary: a vision-language model's image and video
    /// placeholders (a sampled one has no image behind it, and the training forward's
    /// positions and embeddings would pair it with none).
    pub ids: Vec<i64>,
}

impl MaskedTokens {
    /// True when nothing is masked for a vocabulary of `vocab` ids.
    pub fn is_empty_for(&self, vocab: i64) -> bool {
        self.from.is_none_or(|f| f >= vocab) && self.ids.iter().all(|&i| i < 0 || i >= vocab)
    }

    /// The masked ids below `vocab` that [`MaskedTokens::from`] does not already cover, in
    /// ascending order without repeats.
    pub fn single_ids(&self, vocab: i64) -> Vec<i64> {
        let end = self.from.map_or(vocab, |f| f.clamp(0, vocab));
        let mut ids: Vec<i64> = self
            .ids
            .iter()
            .copied()
            .filter(|&i| (0..end).contains(&i))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// How to generate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// Sample when true; greedy (argmax) when false or when `temperature` is 0.
    pub do_sample: bool,
    pub temperature: f64,
    /// Keep the `top_k` most likely tokens; 0 or -1 disables.
    pub top_k: i64,
    /// Nucleus sampling threshold; 1.0 disables.
    pub top_p: f64,
    /// Samples per prompt (rows `i*n .. i*n+n` belong to prompt `i`).
    pub n: usize,
    /// Response length: generation stops after this many tokens.
    pub max_new_tokens: usize,
    /// Seed of the per-sequence sampling streams (sequence `k` uses stream `k`).
    pub seed: u64,
    /// Keep generating after EOS (benchmarks).
    pub ignore_eos: bool,
    pub log_prob_path: LogProbPath,
    /// Largest number of prompts per generation pass (`None`: all at once).
    pub max_prompts_per_pass: Option<usize>,
    /// Micro-batch size (sequences) of the recompute path.
    pub log_prob_micro_batch: usize,
    /// Tokens never sampled (set by the trainer from the tokenizer and the model; none by
    /// default). Log-probs taken while decoding are normalised over the rest.
    #[serde(default)]
    pub masked: MaskedTokens,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            do_sample: true,
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
            n: 1,
            max_new_tokens: 512,
            seed: 0,
            ignore_eos: false,
            log_prob_path: LogProbPath::Decode,
            max_prompts_per_pass: None,
            log_prob_micro_batch: 16,
            masked: MaskedTokens::default(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_new_tokens`.
    pub fn greedy(max_new_tokens: usize) -> Self {
        SamplingParams {
            do_sample: false,
            max_new_tokens,
            ..Self::default()
        }
    }

    /// True when tokens are chosen by argmax.
    pub fn is_greedy(&self) -> bool {
        !self.do_sample || self.temperature == 0.0
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.n == 0 {
            return Err("n must be at least 1".into());
        }
        if self.max_new_tokens == 0 {
            return Err("max_new_tokens (response_length) must be at least 1".into());
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.top_k < -1 {
            return Err(format!(
                "top_k must be -1, 0 or positive, got {}",
                self.top_k
            ));
        }
        if self.max_prompts_per_pass == Some(0) || self.log_prob_micro_batch == 0 {
            return Err("max_prompts_per_pass and log_prob_micro_batch must be positive".into());
        }
        Ok(())
    }
}

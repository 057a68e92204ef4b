//! The vocabulary projection and next-token choice while decoding on CPU.
//!
//! Decoding multiplies a few rows of hidden states by a (vocab, hidden) weight that is far larger
//! than any cache. libtorch's CPU GEMM repacks the whole weight on every call when it is the
//! right-hand operand (`hidden @ W^T`): on a 151936-wide vocabulary that copy costs about as much
//! as the multiplication. Multiplying the weight's row blocks from the left instead
//! (`W[block] @ hidden^T`, each block a contiguous view of the weight, no copy) streams the weight
//! once and leaves the logits vocabulary-major: (vocab, rows). While a block's logits are still in
//! cache, its per-row log-sum-exp is taken; sampling then needs the whole-vocabulary
//! distribution only through those block sums: the uniform number picks a block by the block
//! masses and a token by the cumulative probabilities inside that one block. Measured on a
//! Qwen2.5-0.5B vocabulary with 64 rows on 2 AVX2 cores: 133 ms per step against 232 ms for the
//! row-major GEMM followed by a full-width softmax, cumsum and search.
//!
//! The result is the inverse-CDF draw of [`super::sampling::sample`] (the same uniform from each
//! row's own stream, the same token up to float rounding at a cumulative boundary) and the same
//! log-probability, `logits / temperature` minus its log-sum-exp. Top-k and top-p filtering need
//! every row's full sorted distribution; those settings (and other devices or dtypes) get
//! row-major logits from `hidden @ W^T` and the general path of [`super::sampling`].
//!
//! Masked tokens ([`super::MaskedTokens`]) never get a value: the blocks end where the masked
//! tail begins (the rows past it stay minus infinity), and a single masked id is set to minus
//! infinity in its block before that block's log-sum-exp.

use tch::{Device, Kind, Tensor};

use crate::model::CausalLm;

use super::SamplingParams;
use super::sampling::next_tokens;

/// Vocabulary rows per block (fewer when the vocabulary is smaller): a block of logits for 64
/// decoding rows is 512 KiB, about one core's L2, so the log-sum-exp reads what the GEMM just
/// wrote.
const BLOCK: i64 = 2048;

/// Next-token logits, in whichever layout the head produced.
pub enum HeadLogits {
    /// (rows, vocab), any dtype.
    RowMajor(Tensor),
    VocabMajor(VocabMajorLogits),
}

/// Logits already divided by the sampling temperature, stored (blocks x block, rows) in f32 with
/// `-inf` past the vocabulary, and each block's log-sum-exp per row.
pub struct VocabMajorLogits {
    logits: Tensor,
    block_lse: Tensor,
    vocab: i64,
    block: i64,
}

impl HeadLogits {
    /// The rows `index` (1-D int64) of these logits, in order (a prompt's logits given to each
    /// of its samples).
    pub fn select_rows(&self, index: &Tensor) -> HeadLogits {
        match self {
            HeadLogits::RowMajor(l) => HeadLogits::RowMajor(l.index_select(0, index)),
            HeadLogits::VocabMajor(v) => HeadLogits::VocabMajor(VocabMajorLogits {
                logits: v.logits.index_select(1, index),
                block_lse: v.block_lse.index_select(1, index),
                vocab: v.vocab,
                block: v.block,
            }),
        }
    }

    /// The chosen tokens (rows,) and their log-probabilities (rows,); `u` (rows,) holds each
    /// row's uniform number for this token ([`super::sampling::uniforms`]).
    pub fn next_tokens(&self, params: &SamplingParams, u: &Tensor) -> (Tensor, Tensor) {
        match self {
            HeadLogits::RowMajor(l) => next_tokens(l, params, u),
            HeadLogits::VocabMajor(v) if params.is_greedy() => v.greedy(),
            HeadLogits::VocabMajor(v) => v.sample(u),
        }
    }
}

/// The decoding head of one `generate` call.
pub struct DecodeHead {
    /// The (vocab, hidden) projection.
    weight: Tensor,
    /// Contiguous (block, hidden) views of the head weight (the last one shorter), or `None`
    /// where logits are computed row-major by the model.
    blocks: Option<Vec<Tensor>>,
    /// Each block's masked rows (offsets within it), where it has any.
    masked_rows: Vec<Option<Tensor>>,
    /// The ids that can be chosen are below this one (the weight's rows, less a masked tail).
    vocab: i64,
    block: i64,
    /// Divides the logits before the log-sum-exp (1 when greedy: log-probs are then taken at
    /// temperature 1, as the general path does).
    temperature: f64,
    /// The family's soft cap of the logits, applied before the temperature.
    cap: Option<f64>,
    /// The logits buffer, reused from step to step while the row count stays: a fresh one
    /// would be mapped and zeroed by the kernel every step (10 ms of 180 at Qwen's vocabulary).
    buffer: Option<Tensor>,
    /// One block's `exp(logits - max)`.
    scratch: Option<Tensor>,
}

impl DecodeHead {
    pub fn new(model: &CausalLm, params: &SamplingParams) -> Self {
        let mut head = Self::for_weight(model.head_weight(), params);
        head.cap = model.config.final_logit_softcap();
        head
    }

    /// The head of a (vocab, hidden) projection weight, for `params`: vocabulary-major on CPU
    /// in f32 without top-k/top-p filtering, row-major otherwise.
    pub fn for_weight(weight: &Tensor, params: &SamplingParams) -> Self {
        let rows = weight.size()[0];
        // A masked tail is never computed; at least one id stays.
        let vocab = params.masked.from.map_or(rows, |f| f.clamp(1, rows));
        let filtering = (params.top_k > 0 && params.top_k < vocab) || params.top_p < 1.0;
        let usable = weight.device() == Device::Cpu
            && weight.kind() == Kind::Float
            && weight.is_contiguous()
            && (params.is_greedy() || !filtering);
        let block = BLOCK.min(vocab).max(1);
        let blocks: Option<Vec<Tensor>> = usable.then(|| {
            (0..vocab)
                .step_by(block as usize)
                .map(|start| weight.narrow(0, start, block.min(vocab - start)))
                .collect()
        });
        let single = params.masked.single_ids(vocab);
        let masked_rows = (0..blocks.as_ref().map_or(0, Vec::len) as i64)
            .map(|b| {
                let inside: Vec<i64> = single
                    .iter()
                    .filter(|&&id| id / block == b)
                    .map(|&id| id % block)
                    .collect();
                (!inside.is_empty()).then(|| Tensor::from_slice(&inside))
            })
            .collect();
        let temperature = if params.is_greedy() {
            1.0
        } else {
            params.temperature
        };
        DecodeHead {
            weight: weight.shallow_clone(),
            blocks,
            masked_rows,
            vocab,
            block,
            temperature,
            cap: None,
            buffer: None,
            scratch: None,
        }
    }

    /// True when logits come out vocabulary-major.
    pub fn is_vocab_major(&self) -> bool {
        self.blocks.is_some()
    }

    /// Logits of `hidden` (rows, hidden). Vocabulary-major logits share this head's buffer:
    /// the next call overwrites them.
    pub fn logits(&mut self, hidden: &Tensor) -> HeadLogits {
        let Some(blocks) = &self.blocks else {
            let logits = hidden.linear::<&Tensor>(&self.weight, None);
            return HeadLogits::RowMajor(crate::model::heads::soft_cap(logits, self.cap));
        };
        let rows = hidden.size()[0];
        let block = self.block;
        let count = blocks.len() as i64;
        let fits = |t: &Tensor| t.size()[1] == rows;
        // Rows past the vocabulary are never written: -inf once, at allocation.
        let logits = match self.buffer.take() {
            Some(t) if fits(&t) => t,
            _ => Tensor::full(
                [count * block, rows],
                f64::NEG_INFINITY,
                (Kind::Float, Device::Cpu),
            ),
        };
        let scratch = match self.scratch.take() {
            Some(t) if fits(&t) => t,
            _ => Tensor::empty([block, rows], (Kind::Float, Device::Cpu)),
        };
        let block_lse = Tensor::empty([count, rows], (Kind::Float, Device::Cpu));
        let hidden_t = hidden.to_kind(Kind::Float).tr();
        for (i, w) in blocks.iter().enumerate() {
            let i = i as i64;
            let len = w.size()[0];
            let mut out = logits.narrow(0, i * block, len);
            let _ = w.mm_out(&out, &hidden_t);
            if let Some(cap) = self.cap {
                let _ = out.g_div_scalar_(cap).tanh_().g_mul_scalar_(cap);
            }
            if self.temperature != 1.0 {
                let _ = out.g_div_scalar_(self.temperature);
            }
            if let Some(rows) = &self.masked_rows[i as usize] {
                let _ = out.index_fill_(0, rows, f64::NEG_INFINITY);
            }
            // log-sum-exp over the block while it is in cache, without allocating.
            let max = out.amax([0].as_slice(), true);
            let mut e = scratch.narrow(0, 0, len);
            let _ = out.sub_out(&e, &max);
            let _ = e.exp_();
            let mut lse = block_lse.get(i);
            let _ = e.sum_intlist_out(&lse, [0].as_slice(), false, Kind::Float);
            let _ = lse.log_().g_add_(&max.squeeze_dim(0));
        }
        self.buffer = Some(logits.shallow_clone());
        self.scratch = Some(scratch);
        HeadLogits::VocabMajor(VocabMajorLogits {
            logits,
            block_lse,
            vocab: self.vocab,
            block,
        })
    }
}

impl VocabMajorLogits {
    fn rows(&self) -> i64 {
        self.logits.size()[1]
    }

    fn row_index(&self) -> Tensor {
        Tensor::arange(self.rows(), (Kind::Int64, Device::Cpu))
    }

    /// Each row's log-sum-exp over the whole vocabulary.
    fn lse(&self) -> Tensor {
        self.block_lse.logsumexp([0].as_slice(), false)
    }

    /// Log-probabilities of `tokens` (rows,).
    fn log_probs_of(&self, tokens: &Tensor, lse: &Tensor) -> Tensor {
        self.logits.index(&[Some(tokens), Some(&self.row_index())]) - lse
    }

    fn greedy(&self) -> (Tensor, Tensor) {
        // argmax returns the first maximal index, as on row-major logits; padding is -inf.
        let tokens = self.logits.argmax(0, false);
        let logp = self.log_probs_of(&tokens, &self.lse());
        (tokens, logp)
    }

    fn sample(&self, u: &Tensor) -> (Tensor, Tensor) {
        let rows = self.rows();
        let blocks = self.block_lse.size()[0];
        let at = self.row_index();
        let lse = self.lse();
        // Cumulative probability mass of the blocks, per row: (blocks, rows).
        let mass = (&self.block_lse - lse.unsqueeze(0))
            .exp()
            .cumsum(0, Kind::Float);
        let total = mass.get(blocks - 1);
        let target = u * total * (1.0 - 1.0 / (1u64 << 20) as f64);
        // The first block whose cumulative mass exceeds the target (blocks of zero mass are
        // never chosen: their cumulative value equals the one before).
        let block = mass
            .le_tensor(&target.unsqueeze(0))
            .sum_dim_intlist(0, false, Kind::Int64)
            .clamp_max(blocks - 1);
        let before = mass.index(&[Some(&(&block - 1).clamp_min(0)), Some(&at)]) * block.gt(0);
        // That block's cumulative probabilities for each row: (rows, block).
        let size = self.block;
        let chosen = self
            .logits
            .view([blocks, size, rows])
            .permute([2, 0, 1])
            .index(&[Some(&at), Some(&block)]);
        let cdf = (chosen - lse.unsqueeze(1)).exp().cumsum(1, Kind::Float) + before.unsqueeze(1);
        let found = target
            .unsqueeze(1)
            .searchsorted(&cdf, false, true, "right", None::<Tensor>)
            .squeeze_dim(1);
        // Rounding can leave the block's own sum just below the target: take its last token
        // with mass, never the zero-probability tail or the padding.
        let last_with_mass =
            cdf.lt_tensor(&cdf.narrow(1, size - 1, 1))
                .sum_dim_intlist(1, false, Kind::Int64);
        let tokens = (block * size + found.minimum(&last_with_mass)).clamp_max(self.vocab - 1);
        debug_assert_eq!(tokens.size(), [rows]);
        let logp = self.log_probs_of(&tokens, &lse);
        (tokens, logp)
    }
}

//! What a forward computes from the top-k of the next-token distribution, for on-policy
//! distillation's `forward_kl_topk`: the teacher's own `k` most likely tokens (ids and
//! log-probs, as verl's teacher server returns them as prompt log-probs), and on the student's
//! side the top-k forward KL against them ([`crate::algo::topk_kl`]). The teacher's top-k
//! reach the student's forward as two batch columns on the response grid
//! ([`TEACHER_TOPK_IDS`], [`TEACHER_TOPK_LOG_PROBS`]); engines carry the results as per-token
//! columns like the log-prob's ([`TopK::columns`]).
use tch::{Kind, Tensor};

pub use crate::algo::topk_kl::at_least_f32;
use crate::algo::topk_kl::{MassAt, TopKKl, forward_kl_topk};
use crate::algo::{AlgoError, Result};

/// The batch column of the teacher's top-k token ids `(N, R, K)`, int64.
pub const TEACHER_TOPK_IDS: &str = "teacher_topk_ids";
/// The batch column of the teacher's log-probs of those ids `(N, R, K)`, f32.
pub const TEACHER_TOPK_LOG_PROBS: &str = "teacher_topk_log_probs";

/// Which top-k output a forward computes besides the log-prob.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum TopK {
    #[default]
    Off,
    /// The model's own `k` most likely next tokens: their ids and log-probs (a teacher).
    Own(i64),
    /// The top-k forward KL against the teacher's top-k of the batch (the student).
    KlToTeacher {
        k: i64,
        log_prob_min_clamp: Option<f64>,
    },
}

impl TopK {
    /// Per-token columns the output takes: ids then log-probs (`2k`), or the KL's five.
    pub fn columns(self) -> i64 {
        match self {
            TopK::Off => 0,
            TopK::Own(k) => 2 * k,
            TopK::KlToTeacher { .. } => TopKKl::COLUMNS,
        }
    }

    /// `k`, when on.
    pub fn k(self) -> Option<i64> {
        match self {
            TopK::Off => None,
            TopK::Own(k) | TopK::KlToTeacher { k, .. } => Some(k),
        }
    }
}

/// The teacher's top-k at each token: ids `(…, K)` int64 and log-probs `(…, K)` f32.
#[derive(Debug)]
pub struct TopKTargets {
    pub ids: Tensor,
    pub log_probs: Tensor,
}

impl TopKTargets {
    /// Both lists picked at the same tokens along `dim` (packing, sequence shards).
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Self> {
        Ok(TopKTargets {
            ids: self.ids.f_index_select(dim, index)?,
            log_probs: self.log_probs.f_index_select(dim, index)?,
        })
    }

    /// Both lists narrowed along `dim`.
    pub fn narrow(&self, dim: i64, start: i64, len: i64) -> Result<Self> {
        Ok(TopKTargets {
            ids: self.ids.f_narrow(dim, start, len)?,
            log_probs: self.log_probs.f_narrow(dim, start, len)?,
        })
    }

    /// `(B, L, K)` lists flattened to `(B·L, K)` and picked at `tokens` `(M,)`: `(1, M, K)`
    /// (the packed form of a response grid).
    pub fn pack(&self, tokens: &Tensor) -> Result<Self> {
        let flat = |t: &Tensor| -> Result<Tensor> {
            let k = t.size().last().copied().unwrap_or(0);
            Ok(t.f_reshape([-1, k])?
                .f_index_select(0, tokens)?
                .f_unsqueeze(0)?)
        };
        Ok(TopKTargets {
            ids: flat(&self.ids)?,
            log_probs: flat(&self.log_probs)?,
        })
    }
}

/// The output of a forward's top-k on the response grid `(N, R)`.
#[derive(Debug)]
pub enum TopKOutput {
    /// The model's own top-k: ids `(N, R, K)` int64 and log-probs `(N, R, K)`.
    Own(TopKTargets),
    /// The top-k forward KL against the teacher's.
    Kl(TopKKl),
}

impl TopKOutput {
    /// The per-token columns `(…, C)` it was read from ([`topk_output`]'s inverse).
    pub fn columns(&self) -> Result<Tensor> {
        match self {
            TopKOutput::Own(t) => Ok(Tensor::f_cat(
                &[
                    t.ids.f_to_kind(Kind::Float)?,
                    t.log_probs.f_to_kind(Kind::Float)?,
                ],
                -1,
            )?),
            TopKOutput::Kl(kl) => kl.columns(),
        }
    }
}

/// The top-k columns `(…, C)` of logits `(…, V)` (already divided by the temperature),
/// `targets` the teacher's top-k at the same tokens for [`TopK::KlToTeacher`]. verl's FSDP
/// form: a log-softmax over the whole vocabulary, gathered.
pub fn topk_columns(
    logits: &Tensor,
    topk: TopK,
    targets: Option<&TopKTargets>,
) -> Result<Option<Tensor>> {
    let Some(k) = topk.k() else {
        return Ok(None);
    };
    let vocab = logits.size().last().copied().unwrap_or(0);
    check_k(k, vocab)?;
    let kind = at_least_f32(logits.kind());
    let log_probs = logits.f_to_kind(kind)?.f_log_softmax(-1, kind)?;
    let (own, own_ids) = log_probs.f_detach()?.f_topk(k, -1, true, true)?;
    match topk {
        TopK::Off => Ok(None),
        TopK::Own(_) => Ok(Some(Tensor::f_cat(&[own_ids.f_to_kind(kind)?, own], -1)?)),
        TopK::KlToTeacher {
            log_prob_min_clamp, ..
        } => {
            let t = targets.ok_or_else(|| {
                AlgoError::Unsupported(
                    "the top-k distillation loss needs the teacher's top-k".into(),
                )
            })?;
            check_targets(t, &log_probs.size()[..log_probs.dim() - 1], k, vocab)?;
            let student = log_probs.f_gather(-1, &t.ids, false)?;
            let kl = forward_kl_topk(
                &student,
                &t.log_probs,
                &t.ids,
                &own_ids,
                log_prob_min_clamp,
                MassAt::BeforeClamp,
            )?;
            Ok(Some(kl.columns()?))
        }
    }
}

/// The top-k output from its columns `(N, R, C)`.
pub fn topk_output(columns: &Tensor, topk: TopK) -> Result<Option<TopKOutput>> {
    Ok(match topk {
        TopK::Off => None,
        TopK::Own(k) => Some(TopKOutput::Own(TopKTargets {
            ids: columns
                .f_narrow(-1, 0, k)?
                .f_round()?
                .f_to_kind(Kind::Int64)?,
            log_probs: columns.f_narrow(-1, k, k)?,
        })),
        TopK::KlToTeacher { .. } => Some(TopKOutput::Kl(TopKKl::from_columns(columns)?)),
    })
}

/// `k` fits the vocabulary, and ids survive the f32 columns exactly.
pub fn check_k(k: i64, vocab: i64) -> Result<()> {
    if k < 1 || k > vocab {
        return Err(AlgoError::Unsupported(format!(
            "top-k distillation: k = {k} must be between 1 and the vocabulary size {vocab}"
        )));
    }
    // Ids travel as f32 columns beside the log-probs.
    if vocab > 1 << 24 {
        return Err(AlgoError::Unsupported(format!(
            "top-k distillation: a vocabulary of {vocab} tokens is beyond exact f32 ids"
        )));
    }
    Ok(())
}

/// The teacher's lists fit the student's `tokens` and `k`, and name tokens of its vocabulary
/// (a teacher with a larger vocabulary than the student's cannot be compared id by id).
pub fn check_targets(t: &TopKTargets, tokens: &[i64], k: i64, vocab: i64) -> Result<()> {
    let mut want = tokens.to_vec();
    want.push(k);
    if t.ids.size() != want || t.log_probs.size() != want {
        return Err(AlgoError::Unsupported(format!(
            "the teacher's top-k ids {:?} and log-probs {:?} do not fit the student's tokens {tokens:?} with k = {k}",
            t.ids.size(),
            t.log_probs.size()
        )));
    }
    if t.ids.numel() > 0 {
        let (lo, hi) = (
            t.ids.f_min()?.f_int64_value(&[])?,
            t.ids.f_max()?.f_int64_value(&[])?,
        );
        if lo < 0 || hi >= vocab {
            return Err(AlgoError::Unsupported(format!(
                "the teacher's top-k names token {} outside the student's vocabulary of {vocab} (teacher and student must share the tokenizer)",
                if lo < 0 { lo } else { hi }
            )));
        }
    }
    Ok(())
}

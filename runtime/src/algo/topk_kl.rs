//! verl 0.9's top-k forward KL (`distillation_loss.loss_mode: forward_kl_topk`), per token:
//! over the teacher's `K` most likely next tokens `i` (ids and log-probs `log q_i` the teacher
//! scored), `Σ_i q_i (log q_i − log p_i)` with `log p_i` the student's log-prob of the same
//! token; both log-probs clamped below at `log_prob_min_clamp` first. Beside it the masses
//! `Σ_i p_i` and `Σ_i q_i`, and the overlap diagnostics verl logs: how many of the teacher's
//! top-k are also the student's, and the mean of `−q_i (log q_i − log p_i)` over those.
//!
//! The engines compute the student's log-probs at the teacher's ids from their logits (whole,
//! or split over the vocabulary on Megatron) and call [`forward_kl_topk`]; autograd through
//! it gives verl's gradient (on Megatron a hand-written backward of the same value:
//! `m_A p_j − q_j [j ∈ A]`, `A` the unclamped entries).
use tch::Tensor;

use super::Result;

/// Per-token outputs, each `(…)` like the token grid: the loss carries the student's
/// gradient, the rest are detached.
#[derive(Debug)]
pub struct TopKKl {
    pub loss: Tensor,
    pub student_mass: Tensor,
    pub teacher_mass: Tensor,
    /// How many of the teacher's top-k ids are among the student's top-k (as f32).
    pub overlap_count: Tensor,
    /// The mean of `−q_i (log q_i − log p_i)` over the overlapping ids, 0 when there are none.
    pub overlap_advantage: Tensor,
}

/// Where verl measures the masses: its FSDP path sums the probabilities before the clamp,
/// its Megatron path after it (so clamped entries count `e^clamp` each there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MassAt {
    BeforeClamp,
    AfterClamp,
}

/// The top-k forward KL of one grid of tokens: `student` `(…, K)` the student's log-probs at
/// the teacher's ids (with the gradient), `teacher` `(…, K)` the teacher's, `teacher_ids`
/// and `student_ids` `(…, K)` the two top-k id lists (for the overlap only).
pub fn forward_kl_topk(
    student: &Tensor,
    teacher: &Tensor,
    teacher_ids: &Tensor,
    student_ids: &Tensor,
    log_prob_min_clamp: Option<f64>,
    mass_at: MassAt,
) -> Result<TopKKl> {
    let kind = at_least_f32(student.kind());
    let student = student.f_to_kind(kind)?;
    let teacher = teacher.f_to_kind(kind)?;
    let mass = |lp: &Tensor| -> Result<Tensor> {
        Ok(lp
            .f_detach()?
            .f_exp()?
            .f_sum_dim_intlist(-1i64, false, kind)?)
    };
    let (mut student_mass, mut teacher_mass) = (mass(&student)?, mass(&teacher)?);
    let (s, t) = match log_prob_min_clamp {
        Some(c) => (student.f_clamp_min(c)?, teacher.f_clamp_min(c)?),
        None => (student, teacher),
    };
    if mass_at == MassAt::AfterClamp {
        student_mass = mass(&s)?;
        teacher_mass = mass(&t)?;
    }
    let token_kl = t.f_exp()?.f_mul(&t.f_sub(&s)?)?;
    let loss = token_kl.f_sum_dim_intlist(-1i64, false, kind)?;
    let overlap = teacher_ids
        .f_unsqueeze(-1)?
        .f_eq_tensor(&student_ids.f_unsqueeze(-2)?)?
        .f_any_dim(-1, false)?;
    let overlap_count = overlap.f_sum_dim_intlist(-1i64, false, kind)?;
    let kept = token_kl
        .f_detach()?
        .f_neg()?
        .f_mul(&overlap.f_to_kind(kind)?)?
        .f_sum_dim_intlist(-1i64, false, kind)?;
    let overlap_advantage = kept.f_div(&overlap_count.f_clamp_min(1.0)?)?;
    Ok(TopKKl {
        loss,
        student_mass,
        teacher_mass,
        overlap_count,
        overlap_advantage,
    })
}

impl TopKKl {
    /// The five outputs stacked on a last axis `(…, 5)` (how the engines carry per-token
    /// columns), the loss first.
    pub fn columns(&self) -> Result<Tensor> {
        Ok(Tensor::f_stack(
            &[
                &self.loss,
                &self.student_mass,
                &self.teacher_mass,
                &self.overlap_count,
                &self.overlap_advantage,
            ],
            -1,
        )?)
    }

    /// [`TopKKl::columns`] read back.
    pub fn from_columns(columns: &Tensor) -> Result<Self> {
        let col = |i: i64| columns.f_select(-1, i);
        Ok(TopKKl {
            loss: col(0)?,
            student_mass: col(1)?,
            teacher_mass: col(2)?,
            overlap_count: col(3)?,
            overlap_advantage: col(4)?,
        })
    }

    /// Columns [`TopKKl::columns`] carries.
    pub const COLUMNS: i64 = 5;
}

/// f32, or f64 when given (the parity tests' precision).
pub fn at_least_f32(kind: tch::Kind) -> tch::Kind {
    if kind == tch::Kind::Double {
        tch::Kind::Double
    } else {
        tch::Kind::Float
    }
}

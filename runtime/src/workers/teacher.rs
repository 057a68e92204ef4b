//! On-policy distillation's teachers (verl 0.9's `distillation.teacher_models`): frozen
//! models that score each response token the actor sampled, as the reference does but at
//! temperature 1 (verl's teacher server scores at 1 whatever the rollout's temperature).
//! With several teachers each scores the rows of its `data_source`; every teacher runs over
//! the whole batch (its forward is collective on a sharded engine, so every rank runs it
//! alike) and each row keeps its own teacher's log-probs. For the top-k loss a teacher gives
//! its own top-k at every response position instead (verl's teacher server: prompt log-probs
//! with `k` alternatives).

use tch::{Kind, Tensor};

use crate::engine::{Batch, Engine};
use crate::logits::topk::{TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS, TopKTargets};
use crate::model::CausalLm;

use super::reference::Reference;
use super::{Result, WorkerError};

/// The batch column that names each row's teacher (an index into [`Teachers`]).
pub const TEACHER_COLUMN: &str = "teacher";

/// The teachers, each with the `data_source` it scores (`None`: every row).
#[derive(Debug)]
pub struct Teachers<E: Engine<Head = CausalLm>> {
    teachers: Vec<(Option<String>, Reference<E>)>,
}

impl<E: Engine<Head = CausalLm>> Teachers<E> {
    pub fn new(teachers: Vec<(Option<String>, Reference<E>)>) -> Result<Self> {
        if teachers.is_empty() {
            return Err(WorkerError::Config("distillation needs a teacher".into()));
        }
        Ok(Teachers { teachers })
    }

    /// Whether rows are routed (several teachers).
    pub fn routed(&self) -> bool {
        self.teachers.len() > 1
    }

    /// The teacher of a row from `data_source`; an error names a source no teacher scores
    /// (verl's teacher manager fails on it too).
    pub fn route(&self, data_source: &str) -> Result<i64> {
        if !self.routed() {
            return Ok(0);
        }
        self.teachers
            .iter()
            .position(|(key, _)| key.as_deref() == Some(data_source))
            .map(|i| i as i64)
            .ok_or_else(|| {
                let keys: Vec<&str> = self
                    .teachers
                    .iter()
                    .filter_map(|(k, _)| k.as_deref())
                    .collect();
                WorkerError::Config(format!(
                    "no distillation teacher scores data_source `{data_source}` (teachers: {})",
                    keys.join(", ")
                ))
            })
    }

    /// What the actor's loss reads from the teachers, into `batch`: `teacher_log_prob`
    /// `(N, R)` (each row's teacher's log-probs of its response tokens), or with `topk` the
    /// teacher's top-k ids and log-probs `(N, R, k)` ([`TEACHER_TOPK_IDS`],
    /// [`TEACHER_TOPK_LOG_PROBS`]).
    pub fn score(&mut self, batch: &mut Batch, topk: Option<i64>) -> Result<()> {
        let which = if self.routed() {
            Some(batch.get(TEACHER_COLUMN)?.f_to_kind(Kind::Int64)?)
        } else {
            None
        };
        let mut lps: Option<Tensor> = None;
        let mut ids: Option<Tensor> = None;
        for (i, (_, teacher)) in self.teachers.iter_mut().enumerate() {
            let (lp, id) = match topk {
                Some(k) => {
                    let TopKTargets { ids, log_probs } = teacher.compute_topk(batch, k)?;
                    (log_probs, Some(ids))
                }
                None => (teacher.compute_ref_log_prob(batch)?, None),
            };
            // Rows keep their own teacher's values.
            let pick = |acc: Option<Tensor>, new: Tensor| -> Result<Tensor> {
                let (Some(acc), Some(which)) = (acc, which.as_ref()) else {
                    return Ok(new);
                };
                let mut mine = which.f_eq(i as i64)?;
                while mine.dim() < new.dim() {
                    mine = mine.f_unsqueeze(-1)?;
                }
                Ok(new.f_where_self(&mine, &acc)?)
            };
            lps = Some(pick(lps.take(), lp)?);
            if let Some(id) = id {
                ids = Some(pick(ids.take(), id)?);
            }
        }
        let lps = lps.ok_or_else(|| WorkerError::Config("distillation needs a teacher".into()))?;
        match ids {
            Some(ids) => {
                batch.insert(TEACHER_TOPK_IDS, ids)?;
                batch.insert(TEACHER_TOPK_LOG_PROBS, lps)?;
            }
            None => batch.insert("teacher_log_prob", lps)?,
        }
        Ok(())
    }
}

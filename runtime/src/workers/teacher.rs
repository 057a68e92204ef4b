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
        for (i, (key, teacher)) in self.teachers.iter_mut().enumerate() {
            let text = teacher
                .engine
                .model_config()
                .arch()
                .is_ok_and(|a| !a.has_vision());
            let view = if text {
                text_view(batch, which.as_ref(), i, key.as_deref())?
            } else {
                None
            };
            let batch = view.as_ref().unwrap_or(batch);
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

/// What a text-model teacher reads of a vision-language batch (a student's rows with images
/// and multimodal positions `(N, T, 3)`): the rows' text positions (the first axis: on a
/// text-only row all three are the same) and no images; `None` when the batch is text already.
/// The rows teacher `i` scores (`which`, or every row) must carry no images: a text model
/// cannot see them, and verl gives such rows to a vision-language teacher.
fn text_view(
    batch: &Batch,
    which: Option<&Tensor>,
    i: usize,
    key: Option<&str>,
) -> Result<Option<Batch>> {
    let pos = batch.get("position_ids")?;
    if batch.images().is_empty() && pos.dim() != 3 {
        return Ok(None);
    }
    let mine: Vec<bool> = match which {
        Some(w) => Vec::<i64>::try_from(w)?
            .iter()
            .map(|&t| t == i as i64)
            .collect(),
        None => vec![true; batch.rows() as usize],
    };
    if let Some(row) = batch
        .images()
        .iter()
        .zip(&mine)
        .position(|(images, &own)| own && !images.is_empty())
    {
        return Err(WorkerError::Config(format!(
            "distillation teacher {} is a text model, but row {row} it scores has images",
            key.unwrap_or("(the only one)")
        )));
    }
    let mut view = batch.shallow_clone();
    if pos.dim() == 3 {
        view.insert("position_ids", pos.f_select(-1, 0)?)?;
    }
    if !batch.images().is_empty() {
        view.set_images(vec![
            std::sync::Arc::from(Vec::new());
            batch.rows() as usize
        ])?;
        // The other teachers' rows (their values are dropped) read as token 0: their vision
        // tokens may lie outside a text model's vocabulary. Every row still runs, so every
        // rank's forward has the same shape.
        let own = Tensor::from_slice(&mine).f_to_device(pos.device())?;
        for key in ["input_ids", "responses"] {
            let ids = batch.get(key)?;
            let keep = own.f_view([-1, 1])?.f_expand_as(ids)?;
            view.insert(key, ids.f_where_self(&keep, &ids.f_zeros_like()?)?)?;
        }
    }
    Ok(Some(view))
}

//! Where a run's prompts come from and in which order: the data files read by verlc and its
//! seeded [`BatchSampler`], or the user's Python classes (`data.custom_cls`,
//! `data.sampler.class_path`, see [`crate::data::python`]). The helper runs on the main rank
//! only; the other ranks receive its rows and every batch of indices through a broadcast, so
//! all ranks train on the same prompts whatever the classes do with randomness.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tch::Tensor;
use verlc_spec::data::DataSpec;

use crate::data::python::{PythonData, PythonDataSettings, Split};
use crate::data::vision_prompt::lift_inline_images;
use crate::data::{BatchSampler, DatasetOptions, RlDataset, SamplerState, files::SourcedRow};
use crate::engine::Batch;
use crate::tokenizer::Tokenizer;

use super::TrainerError;
use super::parallel::DataParallel;

/// The column of a Python dataset's item that holds the chat messages (what verl's agent
/// loop reads, whatever the dataset's `prompt_key`).
const RAW_PROMPT: &str = "raw_prompt";

/// The training and validation datasets, and the helper when a sampler class draws from them.
pub(crate) struct Loaded {
    pub train: RlDataset,
    pub val: Option<RlDataset>,
    pub helper: Option<PythonData>,
    /// What the helper said at start (on the main rank), for the run's first lines.
    pub note: Option<String>,
}

/// Whether the run reads its prompts through Python classes.
fn uses_python(d: &DataSpec) -> bool {
    d.custom_dataset.is_some() || d.sampler.is_some()
}

/// Reads both datasets: a Python dataset class's items (built on the main rank, broadcast),
/// else the data files.
pub(crate) fn load(
    d: &DataSpec,
    tokenizer_path: &str,
    tokenizer: &Tokenizer,
    opts: DatasetOptions,
    python: &str,
    dp: &DataParallel,
) -> Result<Loaded, TrainerError> {
    if !uses_python(d) {
        let mut o = opts;
        let train = RlDataset::load(&d.train_files, tokenizer, &o)?;
        let val = if d.val_files.is_empty() {
            None
        } else {
            o.max_samples = d.val_max_samples;
            o.shuffle = d.validation_shuffle;
            Some(RlDataset::load(&d.val_files, tokenizer, &o)?)
        };
        return Ok(Loaded {
            train,
            val,
            helper: None,
            note: None,
        });
    }
    let mut helper = None;
    let mut note = None;
    let (train_rows, val_rows) = on_main(dp, || {
        let (tokenizer_dir, saved) = tokenizer_dir(tokenizer_path, tokenizer)?;
        if let (Some(v), Some(_)) = (&opts.vision, &saved) {
            // The built-in model's processor beside its tokenizer, as a checkpoint carries it
            // (verl's dataset needs the processor for items with pictures).
            v.processor
                .save(&tokenizer_dir, v.model_dir.as_deref())
                .map_err(|e| {
                    TrainerError::Data(crate::data::DataError::Builtin(format!(
                        "writing the built-in model's processor for the dataset class: {e}"
                    )))
                })?;
        }
        let written = TempDir::new("verlc-rows")?;
        let train_files = readable_files(&d.train_files, &written.path.join("train"))?;
        let val_files = readable_files(&d.val_files, &written.path.join("val"))?;
        let count = |n: Option<usize>| n.map_or(-1, |n| n as i64);
        let mut h = PythonData::start(&PythonDataSettings {
            python: python.to_owned(),
            dataset: d.custom_dataset.clone(),
            sampler: d.sampler.clone(),
            train_files,
            val_files,
            tokenizer_dir,
            config: d.config.clone(),
            train_max_samples: count(d.train_max_samples),
            val_max_samples: count(d.val_max_samples),
            vision: opts.vision.is_some(),
            written_dir: Some(written.path.clone()),
        })?;
        note = Some(format!(
            "data: {} ({} training items{}){}; verl's base classes: {}",
            h.dataset_class,
            h.train_len,
            h.val_len
                .map_or(String::new(), |n| format!(", {n} validation items")),
            h.sampler_class.as_ref().map_or(String::new(), |s| format!(
                ", sampler {s}{}",
                if h.curriculum { " (curriculum)" } else { "" }
            )),
            h.verl
        ));
        let train = h.rows(Split::Train)?;
        let val = if h.val_len.is_some() {
            Some(h.rows(Split::Val)?)
        } else {
            None
        };
        if d.sampler.is_some() {
            helper = Some(h);
        }
        Ok((train, val))
    })?;
    // The dataset class did its own sampling and filtering (verl does not filter again):
    // every item is kept, so the sampler's indices are the items' places.
    let mut o = opts;
    o.prompt_key = RAW_PROMPT.into();
    o.filter_overlong_prompts = false;
    o.max_samples = None;
    let image_key = o.vision.as_ref().map(|v| v.image_key.clone());
    let prepare = |rows| check_raw_prompts(rows, image_key.as_deref());
    let train = RlDataset::from_rows(prepare(train_rows)?, tokenizer, &o)?;
    let val = match val_rows {
        Some(rows) => Some(RlDataset::from_rows(prepare(rows)?, tokenizer, &o)?),
        None => None,
    };
    Ok(Loaded {
        train,
        val,
        helper,
        note,
    })
}

/// `work`'s outcome on every rank, `work` running on the main rank only: a failure there fails
/// every rank (with the main rank's own error there, its message elsewhere), so no rank waits
/// for a broadcast that never comes.
fn on_main<T: Serialize + serde::de::DeserializeOwned>(
    dp: &DataParallel,
    work: impl FnOnce() -> Result<T, TrainerError>,
) -> Result<T, TrainerError> {
    let mut failure = None;
    let mine: Option<Result<T, String>> = if dp.is_main() {
        Some(work().map_err(|e| {
            let text = e.to_string();
            failure = Some(e);
            text
        }))
    } else {
        None
    };
    match (dp.from_main(mine)?, failure) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(e)) => Err(e),
        (Err(text), None) => Err(TrainerError::Config(format!("on the main rank: {text}"))),
    }
}

/// A Python dataset's items, each checked for its `raw_prompt` (an item without one is named
/// as such, not as a missing `prompt_key` column) and, for a vision-language model
/// (`image_key`: its image column), with its inline pictures moved to that column
/// ([`lift_inline_images`]).
fn check_raw_prompts(
    mut rows: Vec<SourcedRow>,
    image_key: Option<&str>,
) -> Result<Vec<SourcedRow>, TrainerError> {
    let mut problems = crate::data::RowProblems::default();
    for (source, row, map) in &mut rows {
        if let Some(key) = image_key
            && let Err(msg) = lift_inline_images(map, (RAW_PROMPT, key))
        {
            problems.push(crate::data::DataError::Row {
                file: source.clone(),
                row: *row,
                msg,
            });
        }
        if !map.contains_key(RAW_PROMPT) {
            problems.push(crate::data::DataError::Row {
                file: source.clone(),
                row: *row,
                msg: "the item has no `raw_prompt`: verl's agent loop reads the chat messages from it (verl's RLHFDataset.__getitem__ sets it from `data.prompt_key`)".into(),
            });
        }
    }
    problems.into_result()?;
    Ok(rows)
}

/// `files` as Python can read them: a `builtin://` task's rows are written to a JSON-lines
/// file under `dir` (verl's dataset reads `.json` as JSON lines); other files as they are.
fn readable_files(files: &[String], dir: &std::path::Path) -> Result<Vec<String>, TrainerError> {
    let mut out = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        if !f.starts_with("builtin://") {
            out.push(f.clone());
            continue;
        }
        let rows = crate::data::files::read_rows(f)?;
        let text: String = rows
            .into_iter()
            .map(|r| format!("{}\n", Value::Object(r)))
            .collect();
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(format!("{i}.json"));
        std::fs::write(&path, text).map_err(|e| io(&path, e))?;
        out.push(path.display().to_string());
    }
    Ok(out)
}

fn io(path: &std::path::Path, e: std::io::Error) -> TrainerError {
    TrainerError::Data(crate::data::DataError::Io {
        file: path.to_path_buf(),
        source: e,
    })
}

/// A directory of this process's, removed when dropped.
pub(super) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(name: &str) -> Result<Self, TrainerError> {
        // Unique in the process too: trainers of one process (tests) load data at once.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|e| io(&path, e))?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A directory `AutoTokenizer` can load: the model's own (or a Hub id it finds in the cache),
/// or the built-in tokenizer saved to a temporary directory, returned to be kept alive.
pub(super) fn tokenizer_dir(
    path: &str,
    tokenizer: &Tokenizer,
) -> Result<(PathBuf, Option<TempDir>), TrainerError> {
    if !path.contains("://") {
        return Ok((PathBuf::from(path), None));
    }
    let dir = TempDir::new("verlc-tokenizer")?;
    tokenizer.save(&dir.path)?;
    Ok((dir.path.clone(), Some(dir)))
}

/// The order prompts are drawn in.
pub(crate) enum PromptSampler {
    Seeded(BatchSampler),
    /// The user's sampler class: drawn on the main rank (`helper`), broadcast to the others.
    Python {
        helper: Option<Box<PythonData>>,
        len: usize,
        batch_size: usize,
        /// Batches an epoch: `len(sampler)` (else the dataset's length) over the batch size.
        batches_per_epoch: usize,
        epoch: u64,
        curriculum: bool,
    },
}

/// What every rank learns of a draw.
#[derive(Serialize, Deserialize)]
struct Draw {
    indices: Vec<usize>,
    epoch: u64,
}

impl PromptSampler {
    /// The sampler of `loaded`'s training set: the Python one where a class was given (its
    /// length and kind broadcast from the main rank), else the seeded one.
    pub(crate) fn new(
        d: &DataSpec,
        loaded: &mut Loaded,
        dp: &DataParallel,
    ) -> Result<Self, TrainerError> {
        let len = loaded.train.len();
        if d.sampler.is_none() {
            return Ok(PromptSampler::Seeded(BatchSampler::new(
                len,
                d.batch_size,
                d.shuffle,
                d.seed,
                true,
            )?));
        }
        let helper = loaded.helper.take().map(Box::new);
        let (sampler_len, curriculum): (Option<usize>, bool) = on_main(dp, || {
            helper
                .as_ref()
                .map(|h| (h.sampler_len, h.curriculum))
                .ok_or_else(|| TrainerError::Config("the data helper is not running".into()))
        })?;
        let batches_per_epoch = sampler_len.unwrap_or(len) / d.batch_size;
        if batches_per_epoch == 0 {
            return Err(TrainerError::Config(format!(
                "data.sampler: the sampler draws {} indices an epoch, fewer than one batch of {} prompts",
                sampler_len.unwrap_or(len),
                d.batch_size
            )));
        }
        Ok(PromptSampler::Python {
            helper,
            len,
            batch_size: d.batch_size,
            batches_per_epoch,
            epoch: 0,
            curriculum,
        })
    }

    pub(crate) fn epoch(&self) -> u64 {
        match self {
            PromptSampler::Seeded(s) => s.epoch(),
            PromptSampler::Python { epoch, .. } => *epoch,
        }
    }

    pub(crate) fn batches_per_epoch(&self) -> usize {
        match self {
            PromptSampler::Seeded(s) => s.batches_per_epoch(),
            PromptSampler::Python {
                batches_per_epoch, ..
            } => *batches_per_epoch,
        }
    }

    /// The next batch (an epoch's short tail skipped).
    pub(crate) fn next_batch(&mut self, dp: &DataParallel) -> Result<Vec<usize>, TrainerError> {
        match self {
            PromptSampler::Seeded(s) => Ok(s.next_batch()),
            PromptSampler::Python { batch_size, .. } => {
                let k = *batch_size;
                self.draw(k, true, dp)
            }
        }
    }

    /// The next `k` prompts, running on into the next epochs (DAPO's refills).
    pub(crate) fn next_prompts(
        &mut self,
        k: usize,
        dp: &DataParallel,
    ) -> Result<Vec<usize>, TrainerError> {
        match self {
            PromptSampler::Seeded(s) => Ok(s.next_prompts(k)),
            PromptSampler::Python { .. } => self.draw(k, false, dp),
        }
    }

    fn draw(
        &mut self,
        k: usize,
        drop_last: bool,
        dp: &DataParallel,
    ) -> Result<Vec<usize>, TrainerError> {
        let PromptSampler::Python { helper, epoch, .. } = self else {
            return Ok(Vec::new());
        };
        let draw: Draw = on_main(dp, || {
            let h = helper
                .as_mut()
                .ok_or_else(|| TrainerError::Config("the data helper is not running".into()))?;
            let (indices, epoch) = h.take(k, drop_last)?;
            Ok(Draw { indices, epoch })
        })?;
        *epoch = draw.epoch;
        Ok(draw.indices)
    }

    /// A curriculum sampler's `update(batch)` with the step's whole batch, on the main rank
    /// (every rank calls it, and learns if it failed).
    pub(crate) fn update(
        &mut self,
        batch: &Batch,
        train: &RlDataset,
        step: u64,
        dp: &DataParallel,
    ) -> Result<(), TrainerError> {
        let PromptSampler::Python {
            helper,
            curriculum: true,
            ..
        } = self
        else {
            return Ok(());
        };
        on_main(dp, || match helper.as_mut() {
            Some(h) => Ok(h.update(update_batch(batch, train, step)?)?),
            None => Err(TrainerError::Config(
                "the data helper is not running".into(),
            )),
        })
    }

    /// What a checkpoint stores: the seeded sampler's state, or the Python sampler's place
    /// (and its `state_dict()`) as the main rank reads it.
    pub(crate) fn state(
        &mut self,
        dp: &DataParallel,
    ) -> Result<(SamplerState, Option<Value>), TrainerError> {
        match self {
            PromptSampler::Seeded(s) => Ok((s.state().clone(), None)),
            PromptSampler::Python {
                helper,
                len,
                batch_size,
                epoch,
                ..
            } => {
                let python = Some(on_main(dp, || match helper.as_mut() {
                    Some(h) => Ok(h.state()?),
                    None => Err(TrainerError::Config(
                        "the data helper is not running".into(),
                    )),
                })?);
                let seeded = SamplerState {
                    len: *len,
                    batch_size: *batch_size,
                    shuffle: false,
                    drop_last: true,
                    seed: 0,
                    epoch: *epoch,
                    cursor: 0,
                };
                Ok((seeded, python))
            }
        }
    }

    /// Continues from a checkpoint's state.
    pub(crate) fn resume(
        &mut self,
        state: SamplerState,
        python: Option<&Value>,
        dp: &DataParallel,
    ) -> Result<(), TrainerError> {
        match self {
            PromptSampler::Seeded(s) => {
                let len = s.state().len;
                *s = BatchSampler::resume(state, len)?;
                Ok(())
            }
            PromptSampler::Python { helper, epoch, .. } => {
                *epoch = state.epoch;
                on_main(dp, || {
                    match (helper.as_mut(), python) {
                    (Some(h), Some(p)) => Ok(h.restore(p)?),
                    (Some(_), None) => Err(TrainerError::Config(
                        "the checkpoint has no state of the data.sampler class (it was written by a run without it)".into(),
                    )),
                    (None, _) => Err(TrainerError::Config("the data helper is not running".into())),
                }
                })
            }
        }
    }
}

/// The trained batch as verl hands it to `update`: its tensors by name, each row's sample
/// fields as non-tensor columns, `global_step` in `meta_info`.
fn update_batch(batch: &Batch, train: &RlDataset, step: u64) -> Result<Value, TrainerError> {
    let mut tensors = Map::new();
    for name in [
        "responses",
        "response_mask",
        "token_level_scores",
        "token_level_rewards",
        "advantages",
        "returns",
    ] {
        if let Some(t) = batch.opt(name) {
            tensors.insert(name.into(), tensor_json(t)?);
        }
    }
    let items = Vec::<i64>::try_from(batch.get(super::fit::PROMPT_ITEM)?)?;
    let uids = Vec::<i64>::try_from(batch.get("uid")?)?;
    let mut columns: [(&str, Vec<Value>); 6] = [
        ("data_source", Vec::new()),
        ("reward_model", Vec::new()),
        ("extra_info", Vec::new()),
        ("index", Vec::new()),
        ("uid", Vec::new()),
        (RAW_PROMPT, Vec::new()),
    ];
    for (&i, uid) in items.iter().zip(&uids) {
        let item = usize::try_from(i)
            .ok()
            .and_then(|i| train.items.get(i))
            .ok_or_else(|| TrainerError::Config(format!("batch row names prompt item {i}")))?;
        let s = &item.sample;
        let row = |k: &str| s.row.get(k).cloned().unwrap_or(Value::Null);
        for (name, col) in &mut columns {
            col.push(match *name {
                "data_source" => json!(s.data_source),
                "index" => json!(s.index),
                "uid" => json!(uid.to_string()),
                other => row(other),
            });
        }
    }
    let non_tensors: Map<String, Value> = columns
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::Array(v)))
        .collect();
    Ok(json!({
        "tensors": tensors,
        "non_tensors": non_tensors,
        "meta_info": {"global_step": step},
    }))
}

pub(super) fn tensor_json(t: &Tensor) -> Result<Value, TrainerError> {
    let size = t.size();
    let rows = usize::try_from(size.first().copied().unwrap_or(0)).unwrap_or(0);
    let flat = t.f_flatten(0, -1)?;
    let is_float = matches!(
        t.kind(),
        tch::Kind::Float | tch::Kind::Double | tch::Kind::Half | tch::Kind::BFloat16
    );
    let cols = (flat.size()[0] as usize).checked_div(rows).unwrap_or(0);
    let values: Vec<Value> = if is_float {
        Vec::<f64>::try_from(flat.f_to_kind(tch::Kind::Double)?)?
            .into_iter()
            .map(|v| json!(v))
            .collect()
    } else {
        Vec::<i64>::try_from(flat.f_to_kind(tch::Kind::Int64)?)?
            .into_iter()
            .map(|v| json!(v))
            .collect()
    };
    if size.len() <= 1 {
        return Ok(Value::Array(values));
    }
    Ok(Value::Array(
        values
            .chunks(cols.max(1))
            .map(|c| Value::Array(c.to_vec()))
            .collect(),
    ))
}

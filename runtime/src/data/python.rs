//! The user's dataset class (`data.custom_cls`) and sampler class (`data.sampler.class_path`),
//! run in a Python helper (`python_host.py`) as verl's trainer runs them: the dataset is built
//! with verl's constructor arguments (data files, the model's tokenizer, the `data` section as
//! a DictConfig, `max_samples`), its items are read once and prepared by verlc like file rows
//! (the prompt is the item's `raw_prompt`, what verl's agent loop reads); the sampler is built
//! on the training dataset and drawn from an iterator per epoch, and a curriculum sampler's
//! `update(batch)` gets each trained batch. Only the main rank runs the helper; the other ranks
//! receive rows and indices from it (see `trainer::prompts`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};
use verlc_spec::data::PyClass;

use crate::pyproc::{JsonLinesProcess, ProcError};

use super::DataError;
use super::files::SourcedRow;

/// verl's modules for the user's classes (`pyproc/verl_prelude.py`), then the helper.
const SCRIPT: &str = concat!(
    include_str!("../pyproc/verl_prelude.py"),
    include_str!("python_host.py")
);

/// Start-up imports torch, transformers and the user's module, and builds both datasets.
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// One request: a chunk of rows, a batch of indices, one update.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Rows read per request.
const CHUNK: usize = 256;

/// What the helper needs to build the classes.
#[derive(Debug, Clone)]
pub struct PythonDataSettings {
    pub python: String,
    /// `None`: verl's `RLHFDataset` (a sampler still needs a dataset object).
    pub dataset: Option<PyClass>,
    pub sampler: Option<PyClass>,
    pub train_files: Vec<String>,
    pub val_files: Vec<String>,
    /// A directory with the model's tokenizer files (what `AutoTokenizer` loads).
    pub tokenizer_dir: PathBuf,
    /// The composed `data` section.
    pub config: Value,
    /// verl's `max_samples` arguments (-1: all rows).
    pub train_max_samples: i64,
    pub val_max_samples: i64,
    /// The model has a vision tower: verl's dataset gets the model's processor (loaded from
    /// `tokenizer_dir` where it has one), as verl's trainer passes it.
    pub vision: bool,
    /// Where verlc wrote rows of `builtin://` tasks as JSON lines: the helper turns those files
    /// into parquet with their image cells' bytes decoded, as verl's data files hold them.
    pub written_dir: Option<PathBuf>,
}

/// Which dataset to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
}

impl Split {
    fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

/// The running helper and what it reported at start.
#[derive(Debug)]
pub struct PythonData {
    proc: JsonLinesProcess,
    next_id: u64,
    /// The classes, for messages (`data.custom_cls` `Name` from `path`).
    what: String,
    pub train_len: usize,
    pub val_len: Option<usize>,
    /// `len(sampler)` where the sampler has one.
    pub sampler_len: Option<usize>,
    pub curriculum: bool,
    /// Where verl's base classes came from: `installed`, `without its package root`, `stand-in`.
    pub verl: String,
    pub dataset_class: String,
    pub sampler_class: Option<String>,
}

/// Where the helper's sampler is: the epoch and how many indices it drew in it, and the
/// sampler's own `state_dict()` where it has one.
pub type PythonSamplerState = Value;

impl PythonData {
    /// Starts the helper and builds the classes; a class that fails to load or construct is
    /// reported with its traceback.
    pub fn start(s: &PythonDataSettings) -> Result<Self, DataError> {
        let what = describe(s);
        // A missing file is said before an interpreter spends seconds importing torch.
        for c in s.dataset.iter().chain(&s.sampler) {
            if !c.path.starts_with("pkg://") && !std::path::Path::new(&c.path).is_file() {
                let cwd = std::env::current_dir().unwrap_or_default();
                return Err(DataError::Python {
                    what,
                    message: format!(
                        "no such file: {} (a relative path is taken from the directory the run starts in, {})",
                        c.path,
                        cwd.display()
                    ),
                });
            }
        }
        let class = |c: &Option<PyClass>| {
            c.as_ref()
                .map_or(Value::Null, |c| json!({"path": c.path, "name": c.name}))
        };
        let arg = json!({
            "dataset": class(&s.dataset),
            "sampler": class(&s.sampler),
            "train_files": s.train_files,
            "val_files": s.val_files,
            "tokenizer": s.tokenizer_dir,
            "config": s.config,
            "train_max_samples": s.train_max_samples,
            "val_max_samples": s.val_max_samples,
            "vision": s.vision,
            "written_dir": s.written_dir,
        });
        let fail = |e: ProcError| DataError::Python {
            what: what.clone(),
            message: e.to_string(),
        };
        let mut proc =
            JsonLinesProcess::spawn(&s.python, SCRIPT, &[arg.to_string()], "data").map_err(fail)?;
        let ready = proc
            .read(START_TIMEOUT, "building the dataset and sampler")
            .map_err(fail)?;
        if ready.get("ready") != Some(&Value::Bool(true)) {
            return Err(DataError::Python {
                what,
                message: text(&ready, "error"),
            });
        }
        let count = |k: &str| {
            ready
                .get(k)
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
        };
        Ok(PythonData {
            proc,
            next_id: 0,
            train_len: count("train").unwrap_or(0),
            val_len: count("val"),
            sampler_len: count("sampler_len"),
            curriculum: ready.get("curriculum") == Some(&Value::Bool(true)),
            verl: text(&ready, "verl"),
            dataset_class: text(&ready, "dataset_class"),
            sampler_class: ready
                .get("sampler_class")
                .and_then(Value::as_str)
                .map(str::to_owned),
            what,
        })
    }

    /// Every item of a dataset, as rows named `<Class>[i]` (row = the item's index).
    pub fn rows(&mut self, split: Split) -> Result<Vec<SourcedRow>, DataError> {
        let len = match split {
            Split::Train => self.train_len,
            Split::Val => self.val_len.unwrap_or(0),
        };
        let source = format!("{} ({} dataset)", self.dataset_class, split.name());
        let mut out = Vec::with_capacity(len);
        for start in (0..len).step_by(CHUNK) {
            let end = (start + CHUNK).min(len);
            let reply = self.request(
                json!({"rows": split.name(), "start": start, "end": end}),
                "reading dataset items",
            )?;
            let rows = match reply.get("rows") {
                Some(Value::Array(rows)) => rows,
                _ => return Err(self.protocol("rows")),
            };
            for (k, row) in rows.iter().enumerate() {
                let Value::Object(map) = row else {
                    return Err(self.protocol("rows"));
                };
                out.push((source.clone(), start + k, map.clone()));
            }
        }
        Ok(out)
    }

    /// The sampler's next `k` indices (see the helper's `take`), with the epoch they are in.
    pub fn take(&mut self, k: usize, drop_last: bool) -> Result<(Vec<usize>, u64), DataError> {
        let reply = self.request(
            json!({"take": k, "drop_last": drop_last}),
            "drawing indices from the sampler",
        )?;
        let indices = reply
            .get("indices")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| self.protocol("indices"))?
            .ok_or_else(|| DataError::Python {
                what: self.what.clone(),
                message: "the sampler yielded an index that is not a non-negative integer".into(),
            })?;
        if let Some(bad) = indices.iter().find(|&&i| i >= self.train_len) {
            return Err(DataError::Python {
                what: self.what.clone(),
                message: format!(
                    "the sampler yielded index {bad}, past the training dataset's {} items",
                    self.train_len
                ),
            });
        }
        let epoch = reply.get("epoch").and_then(Value::as_u64).unwrap_or(0);
        Ok((indices, epoch))
    }

    /// A curriculum sampler's `update(batch)`: `batch` holds `tensors`, `non_tensors` and
    /// `meta_info` as the helper's protocol says.
    pub fn update(&mut self, batch: Value) -> Result<(), DataError> {
        self.request(json!({"update": batch}), "updating the curriculum sampler")
            .map(drop)
    }

    pub fn state(&mut self) -> Result<PythonSamplerState, DataError> {
        let reply = self.request(json!({"state": true}), "reading the sampler's state")?;
        reply
            .get("state")
            .cloned()
            .ok_or_else(|| self.protocol("state"))
    }

    pub fn restore(&mut self, state: &PythonSamplerState) -> Result<(), DataError> {
        self.request(json!({"restore": state}), "restoring the sampler's state")
            .map(drop)
    }

    fn request(&mut self, mut req: Value, what: &str) -> Result<Map<String, Value>, DataError> {
        self.next_id += 1;
        if let Value::Object(m) = &mut req {
            m.insert("id".into(), json!(self.next_id));
        }
        let reply = self
            .proc
            .request(&req, REQUEST_TIMEOUT, what)
            .map_err(|e| DataError::Python {
                what: self.what.clone(),
                message: e.to_string(),
            })?;
        if reply.contains_key("error") {
            return Err(DataError::Python {
                what: self.what.clone(),
                message: text(&reply, "error"),
            });
        }
        Ok(reply)
    }

    fn protocol(&self, field: &str) -> DataError {
        DataError::Python {
            what: self.what.clone(),
            message: format!("the data helper's reply has no valid `{field}`"),
        }
    }
}

fn text(m: &Map<String, Value>, k: &str) -> String {
    m.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn describe(s: &PythonDataSettings) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &s.dataset {
        parts.push(format!("data.custom_cls `{}` from {}", d.name, d.path));
    }
    if let Some(c) = &s.sampler {
        parts.push(format!("data.sampler `{}` from {}", c.name, c.path));
    }
    parts.join(" and ")
}

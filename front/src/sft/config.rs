//! The values of an SFT config that verl's SFT trainer reads for its arithmetic and checks,
//! taken from the composed tree once its types passed (see [`super::keys`]). Values verl
//! derives elsewhere (a `null` total step count) stay `None`.

use crate::codes;
use crate::diag::Diagnostic;
use crate::load::node::{Node, Scalar, Value};

/// `save_freq`/`test_freq`: a step interval, or once per epoch.
#[derive(Clone, Debug, PartialEq)]
pub enum Frequency {
    Steps(i64),
    AfterEachEpoch,
    /// A string verl does not take (`sft_trainer.py` only knows `after_each_epoch`).
    Other(String),
}

impl Frequency {
    /// Whether the trainer runs the action periodically (verl: a positive interval, or each
    /// epoch).
    pub fn enabled(&self) -> bool {
        match self {
            Frequency::Steps(n) => *n > 0,
            Frequency::AfterEachEpoch => true,
            Frequency::Other(_) => false,
        }
    }
}

/// The SFT engine's parallel layout and placement.
#[derive(Clone, Debug, PartialEq)]
pub struct SftEngine {
    /// `engine.strategy`: `fsdp`, `fsdp2`, `megatron`, `veomni`, `torchtitan`, `automodel`, ...
    pub strategy: String,
    pub ulysses: i64,
    pub tensor_parallel: i64,
    pub pipeline_parallel: i64,
    pub context_parallel: i64,
    pub param_offload: bool,
    pub optimizer_offload: bool,
    /// FSDP's `model_dtype` (the dtype of the shards the optimizer steps).
    pub model_dtype: String,
    /// Megatron's `use_distributed_optimizer`.
    pub distributed_optimizer: bool,
}

impl SftEngine {
    pub fn is_megatron(&self) -> bool {
        self.strategy == "megatron"
    }

    /// Ranks one sequence is split over for the token budget: Ulysses under FSDP (Megatron's
    /// budget is per rank).
    pub fn sequence_parallel(&self) -> i64 {
        if self.is_megatron() {
            1
        } else {
            self.ulysses.max(1)
        }
    }

    /// Ranks that hold one copy of the data: Ulysses groups under FSDP, the model-parallel
    /// grid (TP × PP × CP) under Megatron and AutoModel; `None` for TorchTitan, whose layout
    /// verlc does not derive.
    pub fn model_parallel(&self) -> Option<i64> {
        match self.strategy.as_str() {
            "megatron" | "automodel" => Some(
                self.tensor_parallel
                    .saturating_mul(self.pipeline_parallel)
                    .saturating_mul(self.context_parallel),
            ),
            // VeOmni is FSDP2 with Ulysses groups.
            "fsdp" | "fsdp2" | "veomni" => Some(self.ulysses),
            _ => None,
        }
    }
}

/// Which of verl's SFT trainers reads the config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SftTrainer {
    /// `verl.trainer.sft_trainer`, config `sft_trainer_engine`.
    #[default]
    Engine,
    /// verl 0.7.0's `verl.trainer.fsdp_sft_trainer`, config `sft_trainer`.
    Legacy,
}

/// Where the legacy config keeps what the engine config calls by another name.
const LEGACY_KEYS: &[(&str, &str)] = &[
    (
        "engine.ulysses_sequence_parallel_size",
        "ulysses_sequence_parallel_size",
    ),
    ("model.use_remove_padding", "use_remove_padding"),
    ("model.path", "model.partial_pretrain"),
    ("optim.lr_scheduler_type", "optim.lr_scheduler"),
    ("engine.strategy", "model.strategy"),
    ("engine.param_offload", "model.fsdp_config.offload_params"),
];

#[derive(Clone, Debug, PartialEq)]
pub struct SftConfig {
    pub trainer: SftTrainer,
    pub train_batch_size: i64,
    pub micro_batch_size_per_gpu: i64,
    pub max_token_len_per_gpu: i64,
    pub use_dynamic_bsz: bool,
    pub max_length: i64,
    pub pad_mode: String,
    pub truncation: String,
    pub train_files: Vec<String>,
    pub val_files: Vec<String>,
    pub model_path: String,
    pub use_remove_padding: bool,
    pub lora_rank: i64,
    /// `model.enable_gradient_checkpointing`.
    pub gradient_checkpointing: bool,
    pub engine: SftEngine,
    pub lr: f64,
    /// `optim.lr_scheduler_type` (FSDP's optimizer); `None` where the optimizer has none.
    pub lr_scheduler_type: Option<String>,
    pub nnodes: i64,
    pub n_gpus_per_node: i64,
    pub total_epochs: i64,
    pub total_training_steps: Option<i64>,
    pub save_freq: Frequency,
    pub test_freq: Frequency,
    pub resume_mode: String,
    pub resume_from_path: Option<String>,
    pub logger: Vec<String>,
    pub profile_interval: Vec<i64>,
    /// Whether the config states the world (`trainer.nnodes`/`n_gpus_per_node` written by the
    /// user): `python -m verl.trainer.sft_trainer` runs under torchrun, whose
    /// `--nproc_per_node` decides it, and reads neither key (`sft_trainer_ray` does).
    pub world_stated: bool,
}

impl SftConfig {
    /// The values of `root` (an SFT tree); an error names the first key whose value has no
    /// usable form.
    pub fn from_tree(root: &Node) -> Result<SftConfig, Box<Diagnostic>> {
        let r = Reader { root };
        // Megatron's engine config has no `strategy` key.
        let default_strategy = if r.at("engine.tensor_model_parallel_size").is_some() {
            "megatron"
        } else {
            "fsdp"
        };
        let engine = SftEngine {
            strategy: r.string_or("engine.strategy", default_strategy),
            // VeOmni names it `ulysses_parallel_size`.
            ulysses: match r.opt_int("engine.ulysses_parallel_size")? {
                Some(u) => u,
                None => r.int_or("engine.ulysses_sequence_parallel_size", 1)?,
            },
            // AutoModel names them `tp_size`, `pp_size`, `cp_size`.
            tensor_parallel: match r.opt_int("engine.tp_size")? {
                Some(n) => n,
                None => r.int_or("engine.tensor_model_parallel_size", 1)?,
            },
            pipeline_parallel: match r.opt_int("engine.pp_size")? {
                Some(n) => n,
                None => r.int_or("engine.pipeline_model_parallel_size", 1)?,
            },
            context_parallel: match r.opt_int("engine.cp_size")? {
                Some(n) => n,
                None => r.int_or("engine.context_parallel_size", 1)?,
            },
            param_offload: r.bool_or("engine.param_offload", false),
            optimizer_offload: r.bool_or("engine.optimizer_offload", false),
            model_dtype: r.string_or("engine.model_dtype", "fp32"),
            distributed_optimizer: r.bool_or("engine.use_distributed_optimizer", true),
        };
        Ok(SftConfig {
            trainer: SftTrainer::Engine,
            train_batch_size: r.int_or("data.train_batch_size", 256)?,
            micro_batch_size_per_gpu: r.int_or("data.micro_batch_size_per_gpu", 4)?,
            max_token_len_per_gpu: r.int_or("data.max_token_len_per_gpu", 8192)?,
            use_dynamic_bsz: r.bool_or("data.use_dynamic_bsz", true),
            max_length: r.int_or("data.max_length", 1024)?,
            pad_mode: r.string_or("data.pad_mode", "no_padding"),
            truncation: r.string_or("data.truncation", "error"),
            train_files: r.strings("data.train_files"),
            val_files: r.strings("data.val_files"),
            model_path: r.string_or("model.path", ""),
            use_remove_padding: r.bool_or("model.use_remove_padding", true),
            lora_rank: r.int_or("model.lora_rank", 0)?,
            gradient_checkpointing: r.bool_or("model.enable_gradient_checkpointing", true),
            engine,
            lr: r.float_or("optim.lr", 1e-3),
            lr_scheduler_type: r.string("optim.lr_scheduler_type"),
            nnodes: r.int_or("trainer.nnodes", 1)?,
            n_gpus_per_node: r.int_or("trainer.n_gpus_per_node", 1)?,
            total_epochs: r.int_or("trainer.total_epochs", 1)?,
            total_training_steps: r.opt_int("trainer.total_training_steps")?,
            save_freq: r.frequency("trainer.save_freq")?,
            test_freq: r.frequency("trainer.test_freq")?,
            resume_mode: r.string_or("trainer.resume_mode", "auto"),
            resume_from_path: r.string("trainer.resume_from_path"),
            logger: r.strings("trainer.logger"),
            profile_interval: r.ints("trainer.profile_interval"),
            world_stated: false,
        })
    }

    /// The values of verl 0.7.0's legacy SFT tree (`sft_trainer`): the same settings under
    /// the legacy keys ([`Self::key`]); no dynamic batching, rows padded on the right unless
    /// `data.pad_mode` says otherwise. (`from_tree` on a legacy tree finds none of the engine
    /// config's own keys, and reads the shared ones where both configs keep them.)
    pub fn from_legacy_tree(root: &Node) -> Result<SftConfig, Box<Diagnostic>> {
        let r = Reader { root };
        let engine = SftEngine {
            strategy: r.string_or("model.strategy", "fsdp2"),
            ulysses: r.int_or("ulysses_sequence_parallel_size", 1)?,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            context_parallel: 1,
            param_offload: r.bool_or("model.fsdp_config.cpu_offload", false)
                && r.bool_or("model.fsdp_config.offload_params", false),
            optimizer_offload: false,
            model_dtype: r.string_or("model.fsdp_config.model_dtype", "fp32"),
            distributed_optimizer: false,
        };
        // The keys the two configs share (data files and lengths, batch sizes, `trainer.*`)
        // read as the engine config reads them; the rest under the legacy keys.
        Ok(SftConfig {
            trainer: SftTrainer::Legacy,
            max_token_len_per_gpu: 0,
            use_dynamic_bsz: false,
            pad_mode: r.string_or("data.pad_mode", "right"),
            model_path: r.string_or("model.partial_pretrain", ""),
            use_remove_padding: r.bool_or("use_remove_padding", false),
            engine,
            lr: r.float_or("optim.lr", 1e-5),
            lr_scheduler_type: Some(r.string_or("optim.lr_scheduler", "cosine")),
            profile_interval: Vec::new(),
            ..SftConfig::from_tree(root)?
        })
    }

    pub fn is_legacy(&self) -> bool {
        self.trainer == SftTrainer::Legacy
    }

    /// The key this config writes `key` (named as in `sft_trainer_engine`) under.
    pub fn key(&self, key: &'static str) -> &'static str {
        if self.is_legacy() {
            LEGACY_KEYS
                .iter()
                .find(|(k, _)| *k == key)
                .map_or(key, |(_, legacy)| legacy)
        } else {
            key
        }
    }

    /// Ranks of the run: `trainer.nnodes × trainer.n_gpus_per_node`.
    pub fn world(&self) -> i64 {
        self.nnodes.saturating_mul(self.n_gpus_per_node)
    }

    /// A rank's token budget per micro-batch under dynamic batching: `max_token_len_per_gpu`
    /// times the ranks a sequence is split over.
    pub fn token_budget(&self) -> i64 {
        self.max_token_len_per_gpu
            .saturating_mul(self.engine.sequence_parallel())
    }

    /// Data-parallel ranks: the world over the ranks that share one batch; `None` when the
    /// config does not state the world or the engine's layout is not derived.
    pub fn data_parallel(&self) -> Option<i64> {
        let mp = self.engine.model_parallel()?;
        (self.world_stated && mp > 0).then(|| self.world() / mp)
    }
}

struct Reader<'a> {
    root: &'a Node,
}

impl Reader<'_> {
    fn at(&self, key: &str) -> Option<&Node> {
        let path: Vec<&str> = key.split('.').collect();
        self.root.get_path(&path).filter(|n| !n.is_null())
    }

    fn bad(&self, key: &str, what: &str) -> Box<Diagnostic> {
        Box::new(
            Diagnostic::error(codes::SCHEMA_TYPE, format!("`{key}` must be {what}"))
                .with_key(key.to_owned())
                .with_primary(self.at(key).and_then(|n| n.origin.clone()), "this value"),
        )
    }

    fn opt_int(&self, key: &str) -> Result<Option<i64>, Box<Diagnostic>> {
        match self.at(key) {
            None => Ok(None),
            Some(n) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.bad(key, "an integer")),
        }
    }

    fn int_or(&self, key: &str, default: i64) -> Result<i64, Box<Diagnostic>> {
        Ok(self.opt_int(key)?.unwrap_or(default))
    }

    fn float_or(&self, key: &str, default: f64) -> f64 {
        self.at(key).and_then(Node::as_f64).unwrap_or(default)
    }

    fn bool_or(&self, key: &str, default: bool) -> bool {
        self.at(key).and_then(Node::as_bool).unwrap_or(default)
    }

    fn string(&self, key: &str) -> Option<String> {
        self.at(key).and_then(|n| match &n.value {
            Value::Scalar(Scalar::Str(s)) => Some(s.clone()),
            Value::Scalar(Scalar::Int(i)) => Some(i.to_string()),
            Value::Scalar(Scalar::Bool(b)) => Some(b.to_string()),
            _ => None,
        })
    }

    fn string_or(&self, key: &str, default: &str) -> String {
        self.string(key).unwrap_or_else(|| default.to_owned())
    }

    fn strings(&self, key: &str) -> Vec<String> {
        match self.at(key).map(|n| &n.value) {
            Some(Value::Seq(items)) => items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect(),
            Some(Value::Scalar(Scalar::Str(s))) => vec![s.clone()],
            _ => Vec::new(),
        }
    }

    fn ints(&self, key: &str) -> Vec<i64> {
        match self.at(key).map(|n| &n.value) {
            Some(Value::Seq(items)) => items.iter().filter_map(Node::as_i64).collect(),
            _ => Vec::new(),
        }
    }

    fn frequency(&self, key: &str) -> Result<Frequency, Box<Diagnostic>> {
        match self.at(key).map(|n| &n.value) {
            None => Ok(Frequency::Steps(-1)),
            Some(Value::Scalar(Scalar::Int(i))) => Ok(Frequency::Steps(*i)),
            Some(Value::Scalar(Scalar::Str(s))) if s == "after_each_epoch" => {
                Ok(Frequency::AfterEachEpoch)
            }
            Some(Value::Scalar(Scalar::Str(s))) => Ok(Frequency::Other(s.clone())),
            Some(_) => Err(self.bad(key, "an integer or `after_each_epoch`")),
        }
    }
}

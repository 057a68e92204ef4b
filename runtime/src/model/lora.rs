//! LoRA adapters as PEFT's `LoraModel` adds them (verl's `lora_rank` / `lora_alpha` /
//! `target_modules` / `exclude_modules`): every targeted linear layer `W` gains `A` (rank × in)
//! and `B` (out × rank) and computes `x W^T + b + (x A^T B^T) · alpha / rank`.
//!
//! - Which layers: PEFT's matching on the module name (`model.layers.0.self_attn.q_proj`): a
//!   list matches a name equal to an entry or ending in `.entry`, a single string is a regular
//!   expression over the whole name, `all-linear` is every linear layer of the decoder (the
//!   seven projections, a mixture-of-experts router and shared-expert gate) and of a vision
//!   tower, never the output layer. `exclude_modules`
//!   removes names the same way.
//! - A vision-language model's names are those of its module tree in transformers 4.52+ (what
//!   verl's PEFT sees, and what it saves): `model.language_model.layers.0.self_attn.q_proj`,
//!   `model.visual.blocks.0.attn.qkv`, where its checkpoints and verlc's variables say
//!   `model.layers.…` and `visual.…` ([`peft_module`], [`from_peft_module`]).
//! - Initialisation as PEFT's default: `A ~ U(-1/sqrt(in), 1/sqrt(in))` (Kaiming-uniform with
//!   `a = sqrt(5)`), `B = 0`, so a fresh adapter leaves the model unchanged. Drawn from the
//!   engine's seed and the variable's name, as [`super::init`] does.
//! - Adapters can be switched off ([`super::decoder::Model::set_adapters_enabled`]): verl's
//!   reference policy for a LoRA actor is the actor with its adapters disabled.
//! - Files: PEFT's adapter directory (`adapter_config.json`, `adapter_model.safetensors` with
//!   keys `base_model.model.<name>.lora_A.weight`), written by [`save_adapter`] and read by
//!   [`read_adapter`]; [`merged`] folds the adapters into the base weights (the rollout's
//!   weights, and an export transformers loads as a plain model).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use super::ModelError;
use crate::rng::Rng;

/// The linear layers of the decoder that PEFT's `all-linear` selects: the attention's and
/// the MLPs' projections, and a mixture-of-experts layer's router (`mlp.gate`) and shared
/// expert gate, which are linear modules in transformers too.
pub const ALL_LINEAR: [&str; 9] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate",
    "shared_expert_gate",
];

/// The suffixes naming every linear layer of a vision tower (its blocks' attention and MLP,
/// the patch mergers' two layers: Qwen2.5-VL's `gate/up/down_proj` and `merger.mlp.{0,2}`,
/// Qwen3-VL's `linear_fc{1,2}`), which PEFT's `all-linear` selects as well.
pub const TOWER_LINEAR: [&str; 9] = [
    "attn.qkv",
    "attn.proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "merger.mlp.0",
    "merger.mlp.2",
    "linear_fc1",
    "linear_fc2",
];

/// Where a vision-language model's text model and tower sit in transformers' module tree
/// (4.52+), and where verlc's variables (the checkpoints' names) put them.
const PEFT_TEXT: &str = "model.language_model.";
const PEFT_TOWER: &str = "model.visual.";
const TEXT: &str = "model.";
const TOWER: &str = "visual.";

/// The module name PEFT gives verlc's variable path `name` (`model.layers.0.mlp.up_proj`, or
/// a parameter under it) in a model with a vision tower (`vision`) or without.
pub fn peft_module(name: &str, vision: bool) -> String {
    if !vision {
        return name.to_owned();
    }
    if let Some(rest) = name.strip_prefix(TOWER) {
        format!("{PEFT_TOWER}{rest}")
    } else if let Some(rest) = name.strip_prefix(TEXT) {
        format!("{PEFT_TEXT}{rest}")
    } else {
        name.to_owned()
    }
}

/// verlc's variable path of a PEFT module or parameter name: [`peft_module`] undone for a
/// vision-language model's names, any other name as it is (so adapters saved under the
/// checkpoints' names load too, as PEFT loads them).
pub fn from_peft_module(name: &str) -> String {
    if let Some(rest) = name.strip_prefix(PEFT_TOWER) {
        format!("{TOWER}{rest}")
    } else if let Some(rest) = name.strip_prefix(PEFT_TEXT) {
        format!("{TEXT}{rest}")
    } else {
        name.to_owned()
    }
}

const PEFT_PREFIX: &str = "base_model.model.";
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// Which linear layers get adapters (or are excluded): PEFT's three ways of naming modules.
#[derive(Debug, Clone)]
pub enum LoraTargets {
    /// PEFT's `all-linear`: the decoder's seven projections and every linear layer of a
    /// vision tower, never the output layer.
    AllLinear,
    /// Module names: a module whose name equals an entry or ends in `.entry`.
    Names(Vec<String>),
    /// A regular expression the whole module name must match (PEFT's `re.fullmatch`).
    Regex(regex::Regex),
}

impl PartialEq for LoraTargets {
    fn eq(&self, o: &Self) -> bool {
        match (self, o) {
            (LoraTargets::AllLinear, LoraTargets::AllLinear) => true,
            (LoraTargets::Names(a), LoraTargets::Names(b)) => a == b,
            (LoraTargets::Regex(a), LoraTargets::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl LoraTargets {
    /// A regular expression matched against whole module names.
    pub fn regex(pattern: &str) -> Result<Self, String> {
        regex::Regex::new(&format!("^(?:{pattern})$"))
            .map(LoraTargets::Regex)
            .map_err(|e| format!("`{pattern}` is not a regular expression: {e}"))
    }

    fn selects(&self, module: &str) -> bool {
        match self {
            LoraTargets::AllLinear => {
                module.starts_with(PEFT_TOWER)
                    || ALL_LINEAR
                        .iter()
                        .any(|t| module.ends_with(&format!(".{t}")))
            }
            LoraTargets::Names(list) => list
                .iter()
                .any(|t| module == t || module.ends_with(&format!(".{t}"))),
            LoraTargets::Regex(re) => re.is_match(module),
        }
    }

    /// The value of `target_modules` / `exclude_modules` in adapter_config.json, for a model
    /// with a vision tower or without (`all-linear` as the names it selects there).
    fn to_json(&self, vision: bool) -> Value {
        match self {
            LoraTargets::AllLinear if vision => {
                json!(ALL_LINEAR.iter().chain(&TOWER_LINEAR).collect::<Vec<_>>())
            }
            LoraTargets::AllLinear => json!(ALL_LINEAR),
            LoraTargets::Names(n) => json!(n),
            LoraTargets::Regex(re) => {
                let p = re.as_str();
                json!(
                    p.strip_prefix("^(?:")
                        .and_then(|p| p.strip_suffix(")$"))
                        .unwrap_or(p)
                )
            }
        }
    }
}

/// A LoRA configuration (PEFT's `LoraConfig` for a causal LM, `bias="none"`, no dropout).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    pub targets: LoraTargets,
    /// Modules left out (`Names([])`: none).
    pub exclude: LoraTargets,
    /// A PEFT adapter to start from (verl's `lora_adapter_path`).
    pub adapter_dir: Option<PathBuf>,
}

impl LoraConfig {
    /// The factor of the adapter's output (`lora_alpha / r`).
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the linear layer PEFT names `module` ([`peft_module`]) gets an adapter.
    pub fn targets(&self, module: &str) -> bool {
        self.targets.selects(module) && !self.exclude.selects(module)
    }

    /// A PEFT adapter's configuration (its `r`, `lora_alpha`, `target_modules`,
    /// `exclude_modules`), as `PeftModel.from_pretrained` takes it.
    pub fn from_adapter_dir(dir: &Path) -> Result<Self, ModelError> {
        let file = dir.join(ADAPTER_CONFIG);
        let text = std::fs::read_to_string(&file).map_err(|e| ModelError::io(&file, e))?;
        let bad = |msg: String| ModelError::Config {
            file: file.clone(),
            msg,
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if let Some(t) = v
            .get("peft_type")
            .and_then(Value::as_str)
            .filter(|t| *t != "LORA")
        {
            return Err(bad(format!("peft_type is {t}, not LORA")));
        }
        for (key, ok) in [
            ("use_rslora", Value::Bool(false)),
            ("use_dora", Value::Bool(false)),
            ("bias", Value::String("none".into())),
        ] {
            if let Some(x) = v.get(key).filter(|x| !x.is_null() && **x != ok) {
                return Err(bad(format!("{key} = {x} is not supported (only {ok})")));
            }
        }
        let rank = v
            .get("r")
            .and_then(Value::as_i64)
            .filter(|r| *r > 0)
            .ok_or_else(|| bad("no positive `r`".into()))?;
        let alpha = v
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("no `lora_alpha`".into()))?;
        let selector = |key: &str, unset: LoraTargets| -> Result<LoraTargets, ModelError> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(unset),
                Some(Value::Array(a)) => Ok(LoraTargets::Names(
                    a.iter()
                        .map(|x| {
                            x.as_str()
                                .map(str::to_owned)
                                .ok_or_else(|| bad(format!("`{key}` holds a non-string")))
                        })
                        .collect::<Result<_, _>>()?,
                )),
                Some(Value::String(s)) if key == "target_modules" && s == "all-linear" => {
                    Ok(LoraTargets::AllLinear)
                }
                Some(Value::String(s)) => LoraTargets::regex(s).map_err(bad),
                Some(other) => Err(bad(format!("`{key}` = {other} is not supported"))),
            }
        };
        let peft_default = LoraTargets::Names(vec!["q_proj".into(), "v_proj".into()]);
        Ok(LoraConfig {
            rank,
            alpha,
            targets: selector("target_modules", peft_default)?,
            exclude: selector("exclude_modules", LoraTargets::Names(Vec::new()))?,
            adapter_dir: Some(dir.to_path_buf()),
        })
    }
}

/// True for the names of adapter variables.
pub fn is_adapter(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

/// One linear layer's adapter.
#[derive(Debug)]
pub struct LoraAdapter {
    pub a: Tensor,
    pub b: Tensor,
    scaling: f64,
    enabled: Arc<AtomicBool>,
}

impl LoraAdapter {
    /// Registers `lora_A.weight` (rank, in) and `lora_B.weight` (out, rank) under `p`, the
    /// linear layer's path.
    pub(crate) fn new(
        p: &tch::nn::Path,
        in_dim: i64,
        out_dim: i64,
        cfg: &LoraConfig,
        enabled: Arc<AtomicBool>,
    ) -> Self {
        let zero = tch::nn::Init::Const(0.0);
        LoraAdapter {
            a: (p / "lora_A").var("weight", &[cfg.rank, in_dim], zero),
            b: (p / "lora_B").var("weight", &[out_dim, cfg.rank], zero),
            scaling: cfg.scaling(),
            enabled,
        }
    }

    /// The adapter's contribution to the layer's output for `x`, or `None` while disabled.
    pub fn delta(&self, x: &Tensor) -> Option<Tensor> {
        self.enabled.load(Ordering::Relaxed).then(|| {
            x.linear::<&Tensor>(&self.a, None)
                .linear::<&Tensor>(&self.b, None)
                * self.scaling
        })
    }
}

/// Initialises every adapter variable of `vs` as PEFT does (see the module docs).
pub fn init_adapters(vs: &VarStore, seed: u64) -> Result<(), ModelError> {
    for (name, var) in vs.variables() {
        let value = if name.contains(".lora_B.") {
            var.zeros_like()
        } else if name.contains(".lora_A.") {
            let fan_in = var.size().get(1).copied().unwrap_or(1).max(1);
            let bound = 1.0 / (fan_in as f64).sqrt();
            let mut rng = Rng::derive(seed ^ 0x4c6f_5241, name_hash(&name));
            let data: Vec<f32> = (0..var.numel())
                .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                .collect();
            Tensor::from_slice(&data).view(var.size().as_slice())
        } else {
            continue;
        };
        tch::no_grad(|| var.shallow_clone().f_copy_(&value))?;
    }
    Ok(())
}

fn name_hash(bytes: &str) -> u64 {
    bytes.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Loads the adapter tensors of a PEFT directory into the adapter variables of `vs`; every
/// adapter variable must be in the file, with its shape.
pub fn load_adapter(vs: &VarStore, dir: &Path) -> Result<(), ModelError> {
    let file = dir.join(ADAPTER_WEIGHTS);
    let saved: HashMap<String, Tensor> = Tensor::read_safetensors(&file)
        .map_err(|e| ModelError::Corrupt {
            file: file.clone(),
            tensor: None,
            msg: e.to_string(),
        })?
        .into_iter()
        .map(|(k, t)| {
            (
                from_peft_module(k.strip_prefix(PEFT_PREFIX).unwrap_or(&k)),
                t,
            )
        })
        .collect();
    for (name, var) in vs.variables().into_iter().filter(|(n, _)| is_adapter(n)) {
        let t = saved.get(&name).ok_or_else(|| ModelError::Missing {
            dir: dir.to_path_buf(),
            tensor: format!("{PEFT_PREFIX}{name}"),
            more: 0,
        })?;
        if t.size() != var.size() {
            return Err(ModelError::ShapeMismatch {
                file: file.clone(),
                tensor: format!("{PEFT_PREFIX}{name}"),
                expected: var.size(),
                found: t.size(),
            });
        }
        tch::no_grad(|| var.shallow_clone().f_copy_(t))?;
    }
    Ok(())
}

/// Writes `params`' adapter tensors (by model name) as a PEFT adapter directory for the base
/// model `base_model` (recorded as `base_model_name_or_path`), under the names PEFT gives
/// them in a model with a vision tower (`vision`) or without.
pub fn save_adapter(
    dir: &Path,
    params: &[(String, Tensor)],
    cfg: &LoraConfig,
    base_model: &str,
    vision: bool,
) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let tensors: Vec<(String, Tensor)> = params
        .iter()
        .filter(|(n, _)| is_adapter(n))
        .map(|(n, t)| {
            Ok((
                format!("{PEFT_PREFIX}{}", peft_module(n, vision)),
                t.f_detach()?
                    .f_to_device(tch::Device::Cpu)?
                    .f_contiguous()?,
            ))
        })
        .collect::<Result<_, tch::TchError>>()?;
    let file = dir.join(ADAPTER_WEIGHTS);
    Tensor::write_safetensors(&tensors, &file).map_err(|e| ModelError::Corrupt {
        file: file.clone(),
        tensor: None,
        msg: e.to_string(),
    })?;
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "target_modules": cfg.targets.to_json(vision),
        "exclude_modules": match &cfg.exclude {
            LoraTargets::Names(n) if n.is_empty() => Value::Null,
            other => other.to_json(vision),
        },
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "modules_to_save": null,
        "inference_mode": false,
    });
    let file = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&config).unwrap_or_default();
    std::fs::write(&file, text).map_err(|e| ModelError::io(&file, e))
}

/// `params` with every adapter folded into its layer's weight (`W + scaling · B A`, in the
/// weight's dtype) and the adapter tensors dropped.
pub fn merged(
    params: Vec<(String, Tensor)>,
    cfg: &LoraConfig,
) -> Result<Vec<(String, Tensor)>, tch::TchError> {
    let (adapters, mut base): (Vec<_>, Vec<_>) =
        params.into_iter().partition(|(n, _)| is_adapter(n));
    let adapters: HashMap<String, Tensor> = adapters.into_iter().collect();
    for (name, w) in &mut base {
        let Some(layer) = name.strip_suffix(".weight") else {
            continue;
        };
        let (Some(a), Some(b)) = (
            adapters.get(&format!("{layer}.lora_A.weight")),
            adapters.get(&format!("{layer}.lora_B.weight")),
        ) else {
            continue;
        };
        let delta = b
            .f_to_kind(Kind::Float)?
            .f_matmul(&a.f_to_kind(Kind::Float)?)?
            .f_mul_scalar(cfg.scaling())?;
        *w = w
            .f_to_kind(Kind::Float)?
            .f_add(&delta.f_to_device(w.device())?)?
            .f_to_kind(w.kind())?;
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(targets: LoraTargets, exclude: LoraTargets) -> LoraConfig {
        LoraConfig {
            rank: 8,
            alpha: 16.0,
            targets,
            exclude,
            adapter_dir: None,
        }
    }

    #[test]
    fn modules_are_selected_as_peft_selects_them() {
        let q = "model.layers.3.self_attn.q_proj";
        let down = "model.layers.0.mlp.down_proj";
        let none = || LoraTargets::Names(Vec::new());
        let all = cfg(LoraTargets::AllLinear, none());
        assert!(all.targets(q) && all.targets(down));
        assert!(!all.targets("lm_head") && !all.targets("score"));
        let names = cfg(LoraTargets::Names(vec!["q_proj".into()]), none());
        assert!(names.targets(q) && !names.targets(down));
        // A suffix only counts after a dot.
        let partial = cfg(LoraTargets::Names(vec!["proj".into()]), none());
        assert!(!partial.targets(q));
        let regex = cfg(
            LoraTargets::regex(r".*\.layers\.0\..*").expect("regex"),
            none(),
        );
        assert!(regex.targets(down) && !regex.targets(q));
        // The whole name must match, as re.fullmatch.
        let anchored = cfg(LoraTargets::regex("q_proj").expect("regex"), none());
        assert!(!anchored.targets(q));
        let excluded = cfg(
            LoraTargets::AllLinear,
            LoraTargets::regex(".*mlp.*").expect("regex"),
        );
        assert!(excluded.targets(q) && !excluded.targets(down));
        assert!(LoraTargets::regex("(").is_err());
        assert_eq!(all.scaling(), 2.0);
    }

    #[test]
    fn a_vision_language_model_is_matched_by_its_module_tree_names() {
        let q = peft_module("model.layers.0.self_attn.q_proj", true);
        let qkv = peft_module("visual.blocks.1.attn.qkv", true);
        let merger = peft_module("visual.merger.mlp.2", true);
        assert_eq!(q, "model.language_model.layers.0.self_attn.q_proj");
        assert_eq!(qkv, "model.visual.blocks.1.attn.qkv");
        assert_eq!(peft_module("lm_head", true), "lm_head");
        assert_eq!(
            peft_module("model.layers.0.mlp", false),
            "model.layers.0.mlp"
        );
        for n in [&q, &qkv, &merger] {
            assert_eq!(peft_module(&from_peft_module(n), true), *n);
        }
        // Checkpoint names are verlc's names already.
        assert_eq!(
            from_peft_module("visual.blocks.0.attn.qkv"),
            "visual.blocks.0.attn.qkv"
        );
        let none = || LoraTargets::Names(Vec::new());
        let all = cfg(LoraTargets::AllLinear, none());
        assert!(all.targets(&q) && all.targets(&qkv) && all.targets(&merger));
        let text = cfg(
            LoraTargets::AllLinear,
            LoraTargets::regex(".*visual.*").expect("regex"),
        );
        assert!(text.targets(&q) && !text.targets(&qkv));
        // A regular expression over transformers' names, as verl's PEFT matches it.
        let lm = cfg(
            LoraTargets::regex(r"model\.language_model\..*_proj").expect("regex"),
            none(),
        );
        assert!(lm.targets(&q) && !lm.targets(&qkv));
        // all-linear is written as the names it selects, the tower's included.
        let dir = std::env::temp_dir().join(format!("verlc-lora-vl-{}", std::process::id()));
        save_adapter(&dir, &[], &all, "base", true).expect("save");
        let back = LoraConfig::from_adapter_dir(&dir).expect("read");
        for m in [
            &q,
            &qkv,
            &merger,
            &peft_module("visual.blocks.0.mlp.down_proj", true),
        ] {
            assert!(back.targets(m), "{m}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn adapter_configs_round_trip_through_peft_json() {
        let dir = std::env::temp_dir().join(format!("verlc-lora-cfg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for c in [
            cfg(LoraTargets::AllLinear, LoraTargets::Names(Vec::new())),
            cfg(
                LoraTargets::Names(vec!["q_proj".into(), "v_proj".into()]),
                LoraTargets::regex(".*visual.*").expect("regex"),
            ),
        ] {
            save_adapter(&dir, &[], &c, "base", false).expect("save");
            let back = LoraConfig::from_adapter_dir(&dir).expect("read");
            // all-linear is written as its seven names, which select the same modules.
            for m in [
                "model.layers.0.self_attn.q_proj",
                "model.layers.1.mlp.up_proj",
            ] {
                assert_eq!(back.targets(m), c.targets(m), "{m}");
            }
            assert_eq!((back.rank, back.alpha), (c.rank, c.alpha));
            assert_eq!(back.exclude, c.exclude);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

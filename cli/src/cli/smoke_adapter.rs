//! A LoRA adapter a smoke run starts from (`actor_rollout_ref.model.lora_adapter_path`): its
//! weights fit the full model, not the scaled stand-in, so they are read, not loaded. What is
//! checked: the directory is a PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`),
//! and every tensor's name and shape fits the model's `config.json` (its layer, its module's
//! input and output widths, the adapter's rank), which is what a wrong or stale adapter gets
//! wrong. The stand-in then trains a fresh adapter of the same rank, alpha and target modules.

use std::path::Path;

use serde_json::Value;

/// What the stand-in's fresh adapter takes from the user's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AdapterShape {
    pub rank: i64,
    pub alpha: f64,
    /// PEFT's `target_modules`: a list of names, or one regular expression (or `all-linear`).
    pub targets: Value,
}

/// Reads the adapter in `dir` and checks its tensors against `model_config` (the model's
/// `config.json`, its `text_config` for a multimodal checkpoint; `None` for a built-in model:
/// the tensors are then only read).
pub(crate) fn read_adapter(
    dir: &Path,
    model_config: Option<&Value>,
) -> Result<AdapterShape, String> {
    let at = |name: &str| dir.join(name);
    let text = std::fs::read_to_string(at("adapter_config.json")).map_err(|e| {
        format!(
            "{}: {e} (a PEFT adapter directory has adapter_config.json and adapter_model.safetensors)",
            at("adapter_config.json").display()
        )
    })?;
    let config: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: {e}", at("adapter_config.json").display()))?;
    let rank = config.get("r").and_then(Value::as_i64).unwrap_or(8);
    let alpha = config
        .get("lora_alpha")
        .and_then(Value::as_f64)
        .unwrap_or(8.0);
    let targets = config.get("target_modules").cloned().unwrap_or(Value::Null);
    let weights = at("adapter_model.safetensors");
    let tensors = safetensors_shapes(&weights)?;
    if tensors.is_empty() {
        return Err(format!("{}: no tensors", weights.display()));
    }
    let Some(model) = model_config else {
        return Ok(AdapterShape {
            rank,
            alpha,
            targets,
        });
    };
    let dims = ModelDims::of(model.get("text_config").unwrap_or(model));
    let tower = model.get("vision_config").map(TowerDims::of);
    let mut wrong: Vec<String> = tensors
        .iter()
        .filter_map(|(name, shape)| {
            let why = if name.split('.').any(|p| p == "visual") {
                match &tower {
                    Some(t) => t.problem(name, shape, rank),
                    None => Some("the model has no vision tower".into()),
                }
            } else {
                dims.problem(name, shape, rank)
            };
            why.map(|why| format!("{name} {shape:?}: {why}"))
        })
        .collect();
    if !wrong.is_empty() {
        let n = wrong.len();
        wrong.truncate(3);
        return Err(format!(
            "{}: {n} of its {} tensors do not fit the model ({}); the first: {}",
            weights.display(),
            tensors.len(),
            dims,
            wrong.join("; ")
        ));
    }
    Ok(AdapterShape {
        rank,
        alpha,
        targets,
    })
}

/// Tensor names and shapes of a safetensors file, from its header (the 8-byte length, then
/// JSON); the data is not read.
fn safetensors_shapes(file: &Path) -> Result<Vec<(String, Vec<i64>)>, String> {
    use std::io::Read;
    let shown = file.display();
    let mut f = std::fs::File::open(file).map_err(|e| format!("{shown}: {e}"))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| format!("{shown}: not a safetensors file ({e})"))?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(format!(
            "{shown}: not a safetensors file (a header of {len} bytes)"
        ));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)
        .map_err(|e| format!("{shown}: truncated header ({e})"))?;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&header)
        .map_err(|e| format!("{shown}: the header is not JSON ({e})"))?;
    let mut out: Vec<(String, Vec<i64>)> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let shape = v
                .get("shape")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            (k, shape)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The widths of a decoder's linear layers, from its `config.json`.
struct ModelDims {
    layers: i64,
    hidden: i64,
    intermediate: i64,
    q_out: i64,
    kv_out: i64,
    moe_intermediate: Option<i64>,
}

impl ModelDims {
    fn of(c: &Value) -> Self {
        let get = |k: &str| c.get(k).and_then(Value::as_i64);
        let hidden = get("hidden_size").unwrap_or(0);
        let heads = get("num_attention_heads").unwrap_or(1).max(1);
        let kv = get("num_key_value_heads").unwrap_or(heads);
        let head_dim = get("head_dim").unwrap_or(hidden / heads);
        ModelDims {
            layers: get("num_hidden_layers").unwrap_or(0),
            hidden,
            intermediate: get("intermediate_size").unwrap_or(0),
            q_out: heads * head_dim,
            kv_out: kv * head_dim,
            moe_intermediate: get("moe_intermediate_size"),
        }
    }

    /// `(in, out)` features of the linear layer named `module`, where the family has it.
    fn widths(&self, module: &str, expert: bool) -> Option<(i64, i64)> {
        let inter = if expert {
            self.moe_intermediate.unwrap_or(self.intermediate)
        } else {
            self.intermediate
        };
        Some(match module {
            "q_proj" => (self.hidden, self.q_out),
            "k_proj" | "v_proj" => (self.hidden, self.kv_out),
            "o_proj" => (self.q_out, self.hidden),
            "gate_proj" | "up_proj" => (self.hidden, inter),
            "down_proj" => (inter, self.hidden),
            _ => return None,
        })
    }

    /// Why the tensor `name` of `shape` does not fit (PEFT names it
    /// `...layers.<i>...<module>.lora_A.weight`, `[rank, in]`, or `lora_B`, `[out, rank]`).
    fn problem(&self, name: &str, shape: &[i64], rank: i64) -> Option<String> {
        let parts: Vec<&str> = name.split('.').collect();
        if let Some(i) = parts.iter().position(|p| *p == "layers")
            && let Some(layer) = parts.get(i + 1).and_then(|l| l.parse::<i64>().ok())
            && self.layers > 0
            && layer >= self.layers
        {
            return Some(format!(
                "layer {layer}, and the model has {} layers",
                self.layers
            ));
        }
        let side = parts
            .iter()
            .position(|p| *p == "lora_A" || *p == "lora_B")?;
        let module = parts.get(side.checked_sub(1)?)?;
        let expert = parts.contains(&"experts");
        let want = expected(&parts, side, self.widths(module, expert)?, rank);
        (shape != want).then(|| format!("expected {want:?} (rank {rank})"))
    }
}

/// Which side of a LoRA tensor `parts` (a PEFT name split at dots) holds, where: the index of
/// `lora_A`/`lora_B` and the expected shape for a layer of `(in, out)` features.
fn expected(parts: &[&str], side: usize, (input, output): (i64, i64), rank: i64) -> [i64; 2] {
    if parts[side] == "lora_A" {
        [rank, input]
    } else {
        [output, rank]
    }
}

/// The widths of a Qwen2.5-VL vision tower's linear layers, from `vision_config`.
struct TowerDims {
    depth: i64,
    hidden: i64,
    intermediate: i64,
    merged: i64,
    out: i64,
}

impl TowerDims {
    fn of(c: &Value) -> Self {
        let get = |k: &str, or: i64| c.get(k).and_then(Value::as_i64).unwrap_or(or);
        let hidden = get("hidden_size", 0);
        let merge = get("spatial_merge_size", 2);
        TowerDims {
            depth: get("depth", 0),
            hidden,
            intermediate: get("intermediate_size", 0),
            merged: hidden * merge * merge,
            out: get("out_hidden_size", 0),
        }
    }

    /// Why the tower's tensor `name` (`...visual.blocks.<i>.attn.qkv.lora_A.weight`,
    /// `...visual.merger.mlp.0.lora_B.weight`) of `shape` does not fit.
    fn problem(&self, name: &str, shape: &[i64], rank: i64) -> Option<String> {
        let parts: Vec<&str> = name.split('.').collect();
        if let Some(i) = parts.iter().position(|p| *p == "blocks")
            && let Some(block) = parts.get(i + 1).and_then(|b| b.parse::<i64>().ok())
            && self.depth > 0
            && block >= self.depth
        {
            return Some(format!(
                "vision block {block}, and the tower has {} blocks",
                self.depth
            ));
        }
        let side = parts
            .iter()
            .position(|p| *p == "lora_A" || *p == "lora_B")?;
        let module = parts[..side]
            .iter()
            .rev()
            .take(2)
            .rev()
            .copied()
            .collect::<Vec<_>>();
        let (h, i) = (self.hidden, self.intermediate);
        let widths = match module.as_slice() {
            ["attn", "qkv"] => (h, 3 * h),
            ["attn", "proj"] => (h, h),
            ["mlp", "gate_proj" | "up_proj"] => (h, i),
            ["mlp", "down_proj"] => (i, h),
            ["mlp", "0"] => (self.merged, self.merged),
            ["mlp", "2"] => (self.merged, self.out),
            _ => return None,
        };
        let want = expected(&parts, side, widths, rank);
        (shape != want).then(|| format!("expected {want:?} (rank {rank}) in the vision tower"))
    }
}

impl std::fmt::Display for ModelDims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers, hidden {}, intermediate {}",
            self.layers, self.hidden, self.intermediate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file with these tensors (zeros; bf16).
    fn write_adapter(dir: &Path, rank: i64, tensors: &[(&str, [i64; 2])]) {
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(
            dir.join("adapter_config.json"),
            format!(
                r#"{{"r": {rank}, "lora_alpha": 16, "target_modules": ["q_proj", "down_proj"]}}"#
            ),
        )
        .expect("config");
        let mut header = serde_json::Map::new();
        let mut offset = 0i64;
        for (name, shape) in tensors {
            let bytes = shape[0] * shape[1] * 2;
            header.insert(
                (*name).to_owned(),
                serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
        let header = Value::Object(header).to_string();
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend(header.as_bytes());
        file.extend(vec![0u8; offset as usize]);
        std::fs::write(dir.join("adapter_model.safetensors"), file).expect("weights");
    }

    #[test]
    fn an_adapter_of_another_model_is_named_and_one_of_this_model_passes() {
        let model = serde_json::json!({"model_type": "qwen2", "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2});
        let root = std::env::temp_dir().join(format!("verlc-smoke-adapter-{}", std::process::id()));
        let q = "base_model.model.model.layers.1.self_attn.q_proj";
        let down = "base_model.model.model.layers.0.mlp.down_proj";
        let good = root.join("good");
        write_adapter(
            &good,
            4,
            &[
                (&format!("{q}.lora_A.weight"), [4, 64]),
                (&format!("{q}.lora_B.weight"), [64, 4]),
                (&format!("{down}.lora_A.weight"), [4, 96]),
                (&format!("{down}.lora_B.weight"), [64, 4]),
            ],
        );
        let shape = read_adapter(&good, Some(&model)).expect("fits");
        assert_eq!((shape.rank, shape.alpha), (4, 16.0));
        // Trained on a wider model.
        let wide = root.join("wide");
        write_adapter(&wide, 4, &[(&format!("{q}.lora_A.weight"), [4, 128])]);
        let e = read_adapter(&wide, Some(&model)).expect_err("wrong width");
        assert!(
            e.contains("q_proj.lora_A.weight [4, 128]") && e.contains("[4, 64]"),
            "{e}"
        );
        // On a deeper one.
        let deep = root.join("deep");
        let l5 = "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight";
        write_adapter(&deep, 4, &[(l5, [4, 64])]);
        let e = read_adapter(&deep, Some(&model)).expect_err("no layer 5");
        assert!(e.contains("layer 5, and the model has 2 layers"), "{e}");
        // A vision-language model's adapter (PEFT's names in transformers' module tree) is
        // checked against the tower's widths for the tower's layers.
        let mut vl = model.clone();
        vl["vision_config"] = serde_json::json!({"depth": 2, "hidden_size": 32,
            "intermediate_size": 48, "out_hidden_size": 64, "spatial_merge_size": 2});
        let qkv = "base_model.model.model.visual.blocks.1.attn.qkv";
        let merger = "base_model.model.model.visual.merger.mlp.2";
        let lq = "base_model.model.model.language_model.layers.1.self_attn.q_proj";
        let tower = root.join("tower");
        write_adapter(
            &tower,
            4,
            &[
                (&format!("{qkv}.lora_A.weight"), [4, 32]),
                (&format!("{qkv}.lora_B.weight"), [96, 4]),
                (&format!("{merger}.lora_A.weight"), [4, 128]),
                (&format!("{merger}.lora_B.weight"), [64, 4]),
                (&format!("{lq}.lora_A.weight"), [4, 64]),
            ],
        );
        read_adapter(&tower, Some(&vl)).expect("a tower adapter that fits");
        let e = read_adapter(&tower, Some(&model)).expect_err("no tower");
        assert!(e.contains("the model has no vision tower"), "{e}");
        let wide = root.join("wide-tower");
        write_adapter(&wide, 4, &[(&format!("{qkv}.lora_B.weight"), [192, 4])]);
        let e = read_adapter(&wide, Some(&vl)).expect_err("a wider tower");
        assert!(
            e.contains("expected [96, 4] (rank 4) in the vision tower"),
            "{e}"
        );
        // Not an adapter directory.
        let e = read_adapter(&root.join("none"), Some(&model)).expect_err("missing");
        assert!(e.contains("adapter_config.json"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}

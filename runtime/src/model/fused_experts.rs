//! Qwen3-VL-MoE's checkpoint layout of its routed experts: each sparse layer stores every
//! expert in two tensors, `mlp.experts.gate_up_proj` and `mlp.experts.down_proj`, where the
//! model holds one SwiGLU MLP per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`, as
//! Qwen3-MoE's checkpoints store them). Two orientations exist:
//!
//! - the published checkpoints' (transformers 4.57, and what vLLM reads): `gate_up_proj`
//!   `(E, H, 2I)` multiplied from the right (`x @ gate_up[e]`, gate columns first), `down_proj`
//!   `(E, I, H)`;
//! - transformers 5's, which it also saves: `gate_up_proj` `(E, 2I, H)` and `down_proj`
//!   `(E, H, I)`, each expert a linear layer's weight.
//!
//! transformers 5 tells them apart by shape (it transposes a tensor whose shape is not its
//! own); so does [`FusedExperts::split`], and where the shape cannot tell (`H = 2I` for
//! `gate_up_proj`, `H = I` for `down_proj`) the checkpoint's `transformers_version` does.
//! [`FusedExperts::fuse`] writes the published orientation, which both transformers releases
//! and vLLM load.
use tch::Tensor;

use super::ModelConfig;

const GATE_UP: &str = "mlp.experts.gate_up_proj";
const DOWN: &str = "mlp.experts.down_proj";

/// The sizes that place each expert's rows in the fused tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedExperts {
    experts: i64,
    hidden: i64,
    intermediate: i64,
    /// Where the shape is ambiguous, read the tensors in transformers 5's orientation (a
    /// checkpoint transformers 5 wrote).
    transformers5: bool,
}

impl FusedExperts {
    /// The layout of `cfg`'s checkpoint: `Some` for a family whose experts are stored fused.
    pub fn of(cfg: &ModelConfig) -> Option<Self> {
        if cfg.model_type != "qwen3_vl_moe" || cfg.moe.num_experts <= 0 {
            return None;
        }
        let transformers5 = cfg
            .extra
            .get("transformers_version")
            .and_then(serde_json::Value::as_str)
            .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
            .is_some_and(|major| major >= 5);
        Some(FusedExperts {
            experts: cfg.moe.num_experts,
            hidden: cfg.hidden_size,
            intermediate: cfg.moe.moe_intermediate_size,
            transformers5,
        })
    }

    /// Whether checkpoint tensor `name` holds a layer's experts fused.
    pub fn is_fused(name: &str) -> bool {
        name.ends_with(GATE_UP) || name.ends_with(DOWN)
    }

    /// Whether a tensor of shape `(E, rows, cols)` is in transformers 5's orientation, where
    /// the published one is `(E, cols, rows)`.
    fn transposed(&self, name: &str, size: &[i64], rows: i64, cols: i64) -> Result<bool, String> {
        let e = self.experts;
        match size {
            [n, r, c] if *n == e && (*r, *c) == (rows, cols) && (*r, *c) == (cols, rows) => {
                Ok(self.transformers5)
            }
            [n, r, c] if *n == e && (*r, *c) == (rows, cols) => Ok(true),
            [n, r, c] if *n == e && (*r, *c) == (cols, rows) => Ok(false),
            _ => Err(format!(
                "`{name}` has shape {size:?}; this config's {e} experts need ({e}, {cols}, {rows}) or ({e}, {rows}, {cols})"
            )),
        }
    }

    /// The held tensors of checkpoint tensor `name` (itself when it is not fused).
    pub fn split(&self, name: &str, t: &Tensor) -> Result<Vec<(String, Tensor)>, String> {
        let (h, i) = (self.hidden, self.intermediate);
        let size = t.size();
        if let Some(prefix) = name.strip_suffix(GATE_UP) {
            // Transformers 5: expert e's (2I, H) weight, gate rows first.
            let linear = self.transposed(name, &size, 2 * i, h)?;
            let mut out = Vec::with_capacity(2 * self.experts as usize);
            for e in 0..self.experts {
                let w = t.get(e);
                let w = if linear { w } else { w.tr() };
                let parts = w.split_with_sizes([i, i], 0);
                out.push((
                    format!("{prefix}mlp.experts.{e}.gate_proj.weight"),
                    parts[0].shallow_clone(),
                ));
                out.push((
                    format!("{prefix}mlp.experts.{e}.up_proj.weight"),
                    parts[1].shallow_clone(),
                ));
            }
            return Ok(out);
        }
        if let Some(prefix) = name.strip_suffix(DOWN) {
            // Transformers 5: expert e's (H, I) weight.
            let linear = self.transposed(name, &size, h, i)?;
            return Ok((0..self.experts)
                .map(|e| {
                    let w = t.get(e);
                    (
                        format!("{prefix}mlp.experts.{e}.down_proj.weight"),
                        if linear { w } else { w.tr() },
                    )
                })
                .collect());
        }
        Ok(vec![(name.to_owned(), t.shallow_clone())])
    }

    /// `named` (held tensors) in the published checkpoint layout: each layer's experts fused
    /// into `gate_up_proj` and `down_proj` in place of expert 0's weights; everything else
    /// unchanged. Every expert of a layer must be present (gathered, not one rank's share).
    pub fn fuse(&self, named: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>, String> {
        // By name once: a large model has tens of thousands of expert weights.
        let by_name: std::collections::HashMap<&str, &Tensor> =
            named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let find = |prefix: &str, e: i64, leaf: &str| -> Result<Tensor, String> {
            let want = format!("{prefix}mlp.experts.{e}.{leaf}.weight");
            by_name
                .get(want.as_str())
                .map(|t| t.shallow_clone())
                .ok_or_else(|| format!("`{want}` is missing; the checkpoint stores every expert of a layer in one tensor"))
        };
        let mut out = Vec::with_capacity(named.len());
        for (name, t) in named {
            let Some((prefix, leaf)) = expert_weight(name) else {
                out.push((name.clone(), t.shallow_clone()));
                continue;
            };
            // Expert 0's gate stands for the layer; the other weights are in its tensors.
            if leaf != (0, "gate_proj") {
                continue;
            }
            let mut gate_up = Vec::with_capacity(self.experts as usize);
            let mut down = Vec::with_capacity(self.experts as usize);
            for e in 0..self.experts {
                let (g, u) = (find(prefix, e, "gate_proj")?, find(prefix, e, "up_proj")?);
                gate_up.push(Tensor::cat(&[g, u], 0).tr());
                down.push(find(prefix, e, "down_proj")?.tr());
            }
            out.push((
                format!("{prefix}{GATE_UP}"),
                Tensor::stack(&gate_up, 0).contiguous(),
            ));
            out.push((
                format!("{prefix}{DOWN}"),
                Tensor::stack(&down, 0).contiguous(),
            ));
        }
        Ok(out)
    }
}

/// `(prefix, (expert, leaf))` of a held expert weight `{prefix}mlp.experts.{e}.{leaf}.weight`.
fn expert_weight(name: &str) -> Option<(&str, (i64, &str))> {
    let at = name.find("mlp.experts.")?;
    let (prefix, rest) = name.split_at(at);
    let rest = rest.strip_prefix("mlp.experts.")?.strip_suffix(".weight")?;
    let (e, leaf) = rest.split_once('.')?;
    let e: i64 = e.parse().ok()?;
    matches!(leaf, "gate_proj" | "up_proj" | "down_proj").then_some((prefix, (e, leaf)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    fn layout(transformers5: bool) -> FusedExperts {
        FusedExperts {
            experts: 3,
            hidden: 6,
            intermediate: 2,
            transformers5,
        }
    }

    /// Splitting either orientation gives each expert's linear weights; fusing them again
    /// gives the published orientation bit for bit.
    #[test]
    fn both_orientations_split_and_fuse_back_to_the_published_one() {
        let f = layout(false);
        let gate_up = Tensor::randn([3, 6, 4], (Kind::Float, tch::Device::Cpu));
        let down = Tensor::randn([3, 2, 6], (Kind::Float, tch::Device::Cpu));
        let p = "model.layers.1.";
        let mut held = f.split(&format!("{p}{GATE_UP}"), &gate_up).unwrap();
        held.extend(f.split(&format!("{p}{DOWN}"), &down).unwrap());
        assert_eq!(held.len(), 9);
        let get = |n: &str| &held.iter().find(|(k, _)| k == n).unwrap().1;
        // x @ gate_up[e] = (x @ gate.T, x @ up.T)
        let x = Tensor::randn([5, 6], (Kind::Float, tch::Device::Cpu));
        let want = x.matmul(&gate_up.get(2));
        let got = Tensor::cat(
            &[
                x.matmul(&get("model.layers.1.mlp.experts.2.gate_proj.weight").tr()),
                x.matmul(&get("model.layers.1.mlp.experts.2.up_proj.weight").tr()),
            ],
            1,
        );
        assert!(want.allclose(&got, 1e-6, 1e-6, false));
        // transformers 5's orientation of the same experts splits to the same weights.
        let f5 = layout(true);
        let mut held5 = f5
            .split(&format!("{p}{GATE_UP}"), &gate_up.transpose(1, 2))
            .unwrap();
        held5.extend(
            f5.split(&format!("{p}{DOWN}"), &down.transpose(1, 2))
                .unwrap(),
        );
        for ((a, x), (b, y)) in held.iter().zip(&held5) {
            assert_eq!(a, b);
            assert!(x.equal(y), "{a}");
        }
        let fused = f.fuse(&held).unwrap();
        assert_eq!(fused.len(), 2);
        assert!(fused[0].1.equal(&gate_up) && fused[1].1.equal(&down));
        assert!(
            f.split("model.layers.1.mlp.experts.down_proj", &gate_up)
                .is_err()
        );
    }

    /// `H = 2I`: the shape cannot tell, the checkpoint's transformers release does.
    #[test]
    fn a_square_expert_follows_the_checkpoints_transformers_release() {
        let (old, new) = (layout(false), layout(true));
        let (old, new) = (
            FusedExperts {
                hidden: 4,
                intermediate: 2,
                ..old
            },
            FusedExperts {
                hidden: 4,
                intermediate: 2,
                ..new
            },
        );
        let t = Tensor::randn([3, 4, 4], (Kind::Float, tch::Device::Cpu));
        let name = "model.layers.0.mlp.experts.gate_up_proj";
        let a = old.split(name, &t).unwrap();
        let b = new.split(name, &t).unwrap();
        assert!(a[0].1.equal(&t.get(0).tr().narrow(0, 0, 2)));
        assert!(b[0].1.equal(&t.get(0).narrow(0, 0, 2)));
    }
}

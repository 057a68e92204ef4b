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
//!
//! The interleaved-biased style (a family row's `expert_style`) stores them in the published
//! orientation with gate and up columns interleaved (column `2j` is gate unit `j`, `2j + 1`
//! up unit `j`) and a bias beside each tensor (`gate_up_proj_bias` `(E, 2I)`, interleaved
//! alike; `down_proj_bias` `(E, H)`).
use tch::Tensor;

use super::ModelConfig;

const GATE_UP: &str = "mlp.experts.gate_up_proj";
const DOWN: &str = "mlp.experts.down_proj";
const GATE_UP_BIAS: &str = "mlp.experts.gate_up_proj_bias";
const DOWN_BIAS: &str = "mlp.experts.down_proj_bias";

/// How one expert's tensor is taken from its slice of a fused one.
type Pick = fn(&Tensor) -> Tensor;

/// The sizes that place each expert's rows in the fused tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedExperts {
    experts: i64,
    hidden: i64,
    intermediate: i64,
    /// Where the shape is ambiguous, read the tensors in transformers 5's orientation (a
    /// checkpoint transformers 5 wrote).
    transformers5: bool,
    /// The interleaved-biased layout: gate and up columns interleaved, biases beside the weights.
    interleaved: bool,
}

impl FusedExperts {
    /// The layout of `cfg`'s checkpoint: `Some` for a family whose experts are stored fused.
    pub fn of(cfg: &ModelConfig) -> Option<Self> {
        use verlc_spec::families::ExpertStyle;
        let style = cfg.arch().ok()?.row().expert_style;
        if style == ExpertStyle::PerExpert || cfg.moe.num_experts <= 0 {
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
            interleaved: style == ExpertStyle::FusedInterleavedBiased,
        })
    }

    /// Whether checkpoint tensor `name` holds a layer's experts fused.
    pub fn is_fused(name: &str) -> bool {
        [GATE_UP, DOWN, GATE_UP_BIAS, DOWN_BIAS]
            .iter()
            .any(|s| name.ends_with(s))
    }

    /// An interleaved-biased fused tensor `name` (published orientation) as each expert's tensors.
    fn split_interleaved(&self, name: &str, t: &Tensor) -> Result<Vec<(String, Tensor)>, String> {
        let (e, h, i) = (self.experts, self.hidden, self.intermediate);
        let size = t.size();
        let shape_error = |want: Vec<i64>| {
            Err(format!(
                "`{name}` has shape {size:?}; this config's experts need {want:?}"
            ))
        };
        let per_expert = |prefix: &str, parts: &[(&str, Pick)]| {
            let mut out = Vec::with_capacity(parts.len() * e as usize);
            for x in 0..e {
                let w = t.get(x);
                for (leaf, pick) in parts {
                    out.push((format!("{prefix}mlp.experts.{x}.{leaf}"), pick(&w)));
                }
            }
            out
        };
        // Column (or bias entry) 2j is gate unit j, 2j + 1 up unit j.
        let even = |w: &Tensor| w.slice(0, 0, None, 2);
        let odd = |w: &Tensor| w.slice(0, 1, None, 2);
        if let Some(prefix) = name.strip_suffix(GATE_UP_BIAS) {
            if size != [e, 2 * i] {
                return shape_error(vec![e, 2 * i]);
            }
            return Ok(per_expert(
                prefix,
                &[("gate_proj.bias", even), ("up_proj.bias", odd)],
            ));
        }
        if let Some(prefix) = name.strip_suffix(DOWN_BIAS) {
            if size != [e, h] {
                return shape_error(vec![e, h]);
            }
            return Ok(per_expert(
                prefix,
                &[("down_proj.bias", |w| w.shallow_clone())],
            ));
        }
        if let Some(prefix) = name.strip_suffix(GATE_UP) {
            if size != [e, h, 2 * i] {
                return shape_error(vec![e, h, 2 * i]);
            }
            return Ok(per_expert(
                prefix,
                &[
                    ("gate_proj.weight", |w| w.tr().slice(0, 0, None, 2)),
                    ("up_proj.weight", |w| w.tr().slice(0, 1, None, 2)),
                ],
            ));
        }
        if let Some(prefix) = name.strip_suffix(DOWN) {
            if size != [e, i, h] {
                return shape_error(vec![e, i, h]);
            }
            return Ok(per_expert(prefix, &[("down_proj.weight", |w| w.tr())]));
        }
        Ok(vec![(name.to_owned(), t.shallow_clone())])
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
        if self.interleaved {
            return self.split_interleaved(name, t);
        }
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
            let want = format!("{prefix}mlp.experts.{e}.{leaf}");
            by_name
                .get(want.as_str())
                .map(|t| t.shallow_clone())
                .ok_or_else(|| format!("`{want}` is missing; the checkpoint stores every expert of a layer in one tensor"))
        };
        let mut out = Vec::with_capacity(named.len());
        for (name, t) in named {
            let Some((prefix, leaf)) = expert_tensor(name) else {
                out.push((name.clone(), t.shallow_clone()));
                continue;
            };
            // Expert 0's gate stands for the layer; the other tensors are in its fused ones.
            if leaf != (0, "gate_proj.weight") {
                continue;
            }
            let (mut gate_up, mut down) = (Vec::new(), Vec::new());
            let (mut gate_up_bias, mut down_bias) = (Vec::new(), Vec::new());
            for e in 0..self.experts {
                let gu = |kind: &str| -> Result<Tensor, String> {
                    let (g, u) = (
                        find(prefix, e, &format!("gate_proj.{kind}"))?,
                        find(prefix, e, &format!("up_proj.{kind}"))?,
                    );
                    Ok(if self.interleaved {
                        // Rows g0, u0, g1, u1, ...
                        let mut shape = g.size();
                        shape[0] *= 2;
                        Tensor::stack(&[g, u], 1).reshape(&shape[..])
                    } else {
                        Tensor::cat(&[g, u], 0)
                    })
                };
                gate_up.push(gu("weight")?.tr());
                down.push(find(prefix, e, "down_proj.weight")?.tr());
                if self.interleaved {
                    gate_up_bias.push(gu("bias")?);
                    down_bias.push(find(prefix, e, "down_proj.bias")?);
                }
            }
            let fused = [
                (GATE_UP, gate_up),
                (GATE_UP_BIAS, gate_up_bias),
                (DOWN, down),
                (DOWN_BIAS, down_bias),
            ];
            for (leaf, parts) in fused.into_iter().filter(|(_, p)| !p.is_empty()) {
                out.push((
                    format!("{prefix}{leaf}"),
                    Tensor::stack(&parts, 0).contiguous(),
                ));
            }
        }
        Ok(out)
    }
}

/// `(prefix, (expert, leaf))` of a held expert tensor `{prefix}mlp.experts.{e}.{leaf}`, the
/// leaf a projection's `weight` or `bias`.
fn expert_tensor(name: &str) -> Option<(&str, (i64, &str))> {
    let at = name.find("mlp.experts.")?;
    let (prefix, rest) = name.split_at(at);
    let (e, leaf) = rest.strip_prefix("mlp.experts.")?.split_once('.')?;
    let e: i64 = e.parse().ok()?;
    let (module, kind) = leaf.split_once('.')?;
    (matches!(module, "gate_proj" | "up_proj" | "down_proj") && matches!(kind, "weight" | "bias"))
        .then_some((prefix, (e, leaf)))
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
            interleaved: false,
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

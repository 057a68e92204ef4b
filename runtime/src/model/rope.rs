//! Rotary position embeddings with the `rope_scaling` types of Hugging Face's
//! `modeling_rope_utils`: default, linear, dynamic (NTK), llama3 and yarn.

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::ModelConfig;

/// A parsed `rope_scaling` entry.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Linear {
        factor: f64,
    },
    Dynamic {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_pos: f64,
    },
    Yarn {
        factor: f64,
        attention_factor: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        original_max_pos: f64,
        truncate: bool,
    },
}

impl RopeScaling {
    pub fn from_config(cfg: &ModelConfig) -> Result<Self, String> {
        let Some(map) = &cfg.rope_scaling else {
            return Ok(RopeScaling::Default);
        };
        let num = |k: &str| map.get(k).and_then(Value::as_f64);
        let need =
            |k: &str| num(k).ok_or_else(|| format!("rope_scaling.{k} is missing or not a number"));
        let kind = map
            .get("rope_type")
            .or_else(|| map.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        Ok(match kind {
            // Qwen2-VL's multimodal rotary: default frequencies, the position axes chosen per
            // dimension section ([`RotaryEmbedding::cos_sin`] of positions `(B, T, 3)`).
            "default" | "mrope" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: need("factor")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: need("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_pos: need("original_max_position_embeddings")?,
            },
            "yarn" => RopeScaling::Yarn {
                factor: need("factor")?,
                attention_factor: num("attention_factor"),
                beta_fast: num("beta_fast").filter(|v| *v != 0.0).unwrap_or(32.0),
                beta_slow: num("beta_slow").filter(|v| *v != 0.0).unwrap_or(1.0),
                mscale: num("mscale"),
                mscale_all_dim: num("mscale_all_dim"),
                original_max_pos: num("original_max_position_embeddings")
                    .filter(|v| *v != 0.0)
                    .unwrap_or(cfg.max_position_embeddings as f64),
                truncate: map.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            },
            other => return Err(format!("rope_scaling type `{other}` is not supported")),
        })
    }
}

/// Inverse frequencies and the cos/sin scaling of one model.
#[derive(Debug)]
pub struct RotaryEmbedding {
    inv_freq: Tensor,
    attention_scaling: f64,
    scaling: RopeScaling,
    dim: i64,
    base: f64,
    max_pos: i64,
    /// `rope_scaling.mrope_section` of a vision-language model (Qwen2-VL's M-RoPE): positions
    /// `(B, T, 3)` then pick each dimension section's axis ([`RotaryEmbedding::cos_sin`]).
    mrope_section: Option<Vec<i64>>,
    /// Qwen3-VL's interleaved M-RoPE: frequency `j` follows height when `j % 3 == 1` and
    /// width when `j % 3 == 2` (within three times their sections), time otherwise, instead
    /// of a block per axis.
    mrope_interleaved: bool,
}

/// `1 / base^(arange(0, dim, 2) / dim)` in f32, as transformers computes it.
fn default_inv_freq(base: f64, dim: i64, device: Device) -> Tensor {
    let exps = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device)).to_kind(Kind::Float)
        / dim as f64;
    Tensor::scalar_tensor(base, (Kind::Float, device))
        .pow(&exps)
        .reciprocal()
}

fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl RotaryEmbedding {
    pub fn new(cfg: &ModelConfig, device: Device) -> Result<Self, String> {
        let scaling = RopeScaling::from_config(cfg)?;
        // Qwen3.5 rotates only the first `rotary_dim` features of each head.
        let (dim, base) = (cfg.rotary_dim(), cfg.rope_theta);
        let mut attention_scaling = 1.0;
        let inv_freq = match &scaling {
            RopeScaling::Default | RopeScaling::Dynamic { .. } => {
                default_inv_freq(base, dim, device)
            }
            RopeScaling::Linear { factor } => default_inv_freq(base, dim, device) / *factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_pos,
            } => {
                let inv = default_inv_freq(base, dim, device);
                let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
                let low_wl = original_max_pos / low_freq_factor;
                let high_wl = original_max_pos / high_freq_factor;
                let scaled = inv.where_self(&wavelen.le(low_wl), &(&inv / *factor));
                let smooth = (wavelen.reciprocal() * *original_max_pos - *low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed =
                    (smooth.ones_like() - &smooth) * &scaled / *factor + &smooth * &scaled;
                let medium = wavelen.ge(high_wl).logical_and(&wavelen.le(low_wl));
                smoothed.where_self(&medium, &scaled)
            }
            RopeScaling::Yarn {
                factor,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                original_max_pos,
                truncate,
            } => {
                attention_scaling = match (attention_factor, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a,
                    (None, Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => {
                        yarn_mscale(*factor, *m) / yarn_mscale(*factor, *ma)
                    }
                    _ => yarn_mscale(*factor, 1.0),
                };
                let d = dim as f64;
                let corr = |rot: f64| {
                    (d * (original_max_pos / (rot * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (corr(*beta_fast), corr(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                let pos_freqs = Tensor::scalar_tensor(base, (Kind::Float, device)).pow(
                    &(Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device))
                        .to_kind(Kind::Float)
                        / d),
                );
                let extra = pos_freqs.reciprocal();
                let inter = (&pos_freqs * *factor).reciprocal();
                let ramp = ((Tensor::arange(dim / 2, (Kind::Float, device)) - low) / (high - low))
                    .clamp(0.0, 1.0);
                let extra_factor = ramp.ones_like() - ramp;
                &inter * (extra_factor.ones_like() - &extra_factor) + extra * extra_factor
            }
        };
        let interleaved = cfg
            .arch()
            .is_ok_and(|a| a.tower().is_some_and(|t| t.interleaved_mrope()))
            || cfg
                .rope_scaling
                .as_ref()
                .and_then(|m| m.get("mrope_interleaved"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
        let mrope_section = match cfg
            .rope_scaling
            .as_ref()
            .and_then(|m| m.get("mrope_section"))
        {
            None | Some(Value::Null) => None,
            Some(v) => {
                let sections: Vec<i64> = serde_json::from_value(v.clone())
                    .map_err(|e| format!("rope_scaling.mrope_section: {e}"))?;
                // Interleaved sections pick every third frequency up to their size, as far as
                // there are frequencies (Qwen3.5's default [11, 11, 10] on any head); contiguous
                // ones must tile the rotary half exactly.
                let fits = if interleaved {
                    sections.iter().all(|s| *s >= 0)
                } else {
                    sections.iter().sum::<i64>() == dim / 2
                };
                if sections.len() != 3 || !fits {
                    return Err(format!(
                        "rope_scaling.mrope_section {sections:?} must be three sizes summing to half the rotary dimension ({})",
                        dim / 2
                    ));
                }
                Some(sections)
            }
        };
        Ok(RotaryEmbedding {
            inv_freq,
            attention_scaling,
            scaling,
            dim,
            base,
            max_pos: cfg.max_position_embeddings,
            mrope_interleaved: mrope_section.is_some() && interleaved,
            mrope_section,
        })
    }

    /// The inverse frequencies for a batch whose largest position is `max_position`
    /// (only dynamic NTK scaling depends on it).
    fn inv_freq_for(&self, position_ids: &Tensor) -> Tensor {
        match self.scaling {
            RopeScaling::Dynamic { factor } => {
                let seq_len = position_ids.max().int64_value(&[]) + 1;
                if seq_len <= self.max_pos {
                    return self.inv_freq.shallow_clone();
                }
                let ratio = factor * seq_len as f64 / self.max_pos as f64 - (factor - 1.0);
                let base = self.base * ratio.powf(self.dim as f64 / (self.dim as f64 - 2.0));
                default_inv_freq(base, self.dim, self.inv_freq.device())
            }
            _ => self.inv_freq.shallow_clone(),
        }
    }

    /// cos and sin of shape (B, 1, T, rotary_dim) in `kind`, for positions (B, T); a model with
    /// M-RoPE sections also takes multimodal positions (B, T, 3) (time, height, width).
    pub fn cos_sin(&self, position_ids: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        if let (Some(sections), 3) = (&self.mrope_section, position_ids.dim()) {
            return self.mrope_tables(&position_ids.permute([2, 0, 1]), sections, kind);
        }
        if position_ids.dim() == 3 {
            // Multimodal positions for a text model: the text axis.
            return self.cos_sin(&position_ids.select(-1, 0), kind);
        }
        let inv = self.inv_freq_for(position_ids);
        let freqs = position_ids.to_kind(Kind::Float).unsqueeze(-1) * inv.view([1, 1, -1]);
        self.tables(&Tensor::cat(&[&freqs, &freqs], -1), kind)
    }

    /// cos and sin `(B, 1, T, D)` in `kind` of the angles `emb` `(B, T, D)`, scaled by the
    /// rope type's attention factor.
    fn tables(&self, emb: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let (mut cos, mut sin) = (emb.cos(), emb.sin());
        if self.attention_scaling != 1.0 {
            cos *= self.attention_scaling;
            sin *= self.attention_scaling;
        }
        (
            cos.to_kind(kind).unsqueeze(1),
            sin.to_kind(kind).unsqueeze(1),
        )
    }
}

impl RotaryEmbedding {
    /// cos and sin `(B, 1, T, rotary_dim)` of multimodal positions `(3, B, T)` (time, height,
    /// width; Qwen2-VL's M-RoPE): the frequencies of each axis, then for the dimensions in
    /// `sections` (sizes summing to half the rotary dimension, repeated for the second half)
    /// the axis the section's index names, cyclically.
    fn mrope_tables(
        &self,
        position_ids: &Tensor,
        sections: &[i64],
        kind: Kind,
    ) -> (Tensor, Tensor) {
        let freqs =
            position_ids.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, 1, -1]);
        if self.mrope_interleaved {
            return self.interleaved_tables(&freqs, sections, kind);
        }
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        let split: Vec<i64> = sections.iter().chain(sections).copied().collect();
        let pick = |t: &Tensor| {
            let parts = t.split_with_sizes(&split, -1);
            let chosen: Vec<Tensor> = parts
                .iter()
                .enumerate()
                .map(|(i, part)| part.select(0, (i % 3) as i64))
                .collect();
            Tensor::cat(&chosen, -1)
        };
        // Picking the angles, then their cos and sin, is picking from the tables.
        self.tables(&pick(&emb), kind)
    }
}

impl RotaryEmbedding {
    /// [`RotaryEmbedding::mrope_tables`] of Qwen3-VL's interleaved layout, from the
    /// frequencies `freqs` `(3, B, T, D / 2)` of each axis.
    fn interleaved_tables(&self, freqs: &Tensor, sections: &[i64], kind: Kind) -> (Tensor, Tensor) {
        let half = freqs.size()[3];
        let axis: Vec<i64> = (0..half)
            .map(|j| match j % 3 {
                1 if j < 3 * sections[1] => 1,
                2 if j < 3 * sections[2] => 2,
                _ => 0,
            })
            .collect();
        let index = Tensor::from_slice(&axis)
            .to_device(freqs.device())
            .view([1, 1, 1, half])
            .expand([1, freqs.size()[1], freqs.size()[2], half], false);
        let chosen = freqs.gather(0, &index, false).squeeze_dim(0);
        self.tables(&Tensor::cat(&[&chosen, &chosen], -1), kind)
    }
}

/// `x * cos + rotate_half(x) * sin` for x of shape (B, H, T, D); with tables narrower than
/// `D` (partial rotary), only the first features rotate and the rest pass through.
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let (d, r) = (x.size()[3], cos.size()[3]);
    if r < d {
        let rotated = apply_rotary(&x.narrow(3, 0, r), cos, sin);
        return Tensor::cat(&[&rotated, &x.narrow(3, r, d - r)], 3);
    }
    let half = d / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    let rotated = Tensor::cat(&[&x2.neg(), &x1], 3);
    x * cos + rotated * sin
}

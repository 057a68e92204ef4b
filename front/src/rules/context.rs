//! What a rule sees: the typed config, the composed tree with origins, and optional model
//! dimensions from the checkpoint's `config.json`.

use serde::Deserialize;

use crate::config::VerlConfig;
use crate::load::node::{Node, split_key};
use crate::source::{Origin, SourceKind, SourceMap};

pub struct RuleContext<'a> {
    pub config: &'a VerlConfig,
    pub root: &'a Node,
    /// The texts origins point into: tells a user's value from a built-in default.
    pub sources: &'a SourceMap,
    pub model: Option<&'a ModelDims>,
    /// Dotted keys still `???` (mandatory, never set); the typed config sees them as null.
    pub missing: &'a [String],
    /// The defaults to compare with when not verlc's built-in tree of the config's flavour
    /// (a tree of another verl release: its own defaults).
    pub defaults: Option<&'a Node>,
    /// `(major, minor, patch)` of that other release ([`crate::load::version::release_triple`]);
    /// `None` for the modelled one (0.7.0).
    pub release: Option<(u32, u32, u32)>,
}

impl RuleContext<'_> {
    /// Whether the config's release is at least `v` (the modelled 0.7 counts as 0.7).
    pub fn release_at_least(&self, v: (u32, u32)) -> bool {
        self.release.map_or((0, 7), |(a, b, _)| (a, b)) >= v
    }

    /// `(major, minor, patch)` of the config's release (the modelled one is 0.7.0).
    pub fn release_triple(&self) -> (u32, u32, u32) {
        self.release.unwrap_or((0, 7, 0))
    }

    /// verl 0.9's v1 trainer mode when that trainer runs (a 0.9+ release with
    /// `trainer.use_v1` not false); `None` where the legacy trainer runs.
    pub fn v1_trainer_mode(&self) -> Option<crate::config::TrainerMode> {
        let t = &self.config.trainer;
        if !self.release_at_least((0, 9)) || t.use_v1 == Some(false) {
            return None;
        }
        Some(
            t.v1.as_ref()
                .map_or(crate::config::TrainerMode::Sync, |v| v.trainer_mode),
        )
    }

    /// The config's release as text (`0.9.0`; a development snapshot: the release it follows).
    pub fn release_label(&self) -> String {
        match self.release_triple() {
            (a, b, u32::MAX) => format!("{a}.{b} (a development snapshot after it)"),
            (a, b, c) => format!("{a}.{b}.{c}"),
        }
    }
}

impl<'a> RuleContext<'a> {
    /// The tree node of a dotted key.
    pub fn node(&self, key: &str) -> Option<&'a Node> {
        self.root.get_path(&split_key(key))
    }

    /// Where the value of a dotted key was written (file, built-in default or override).
    pub fn origin(&self, key: &str) -> Option<Origin> {
        self.node(key).and_then(|n| n.origin.clone())
    }

    /// Whether the value of `key` is the user's choice: written in their own file or an
    /// override and different from verl's default (so a `--config-dir` on verl's own tree
    /// does not count verl's defaults as choices).
    pub fn user_set(&self, key: &str) -> bool {
        let Some(n) = self.node(key) else {
            return false;
        };
        let written = n
            .origin
            .as_ref()
            .is_some_and(|o| self.sources.get(o.source).kind != SourceKind::Builtin);
        written
            && self
                .default_node(key)
                .is_none_or(|d| d.to_json() != n.to_json())
    }

    /// The built-in default of a dotted key (for the config's flavour).
    pub fn default_node(&self, key: &str) -> Option<&Node> {
        self.default_tree()?.get_path(&split_key(key))
    }

    /// The default tree of the config's flavour (see [`Self::defaults`]).
    pub fn default_tree(&self) -> Option<&Node> {
        Some(
            self.defaults
                .unwrap_or_else(|| crate::load::compose::builtin_tree(self.config.flavour())),
        )
    }
}

/// The parts of a Hugging Face `config.json` the model-aware rules and `explain` use.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ModelDims {
    pub hidden_size: u64,
    pub num_attention_heads: u64,
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    pub num_hidden_layers: u64,
    pub vocab_size: u64,
    #[serde(default)]
    pub intermediate_size: Option<u64>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub head_dim: Option<u64>,
    #[serde(default)]
    pub model_type: Option<String>,
    /// Longest context the model was trained for (rollout engines cap `max_model_len` here).
    #[serde(default)]
    pub max_position_embeddings: Option<u64>,
    /// Biases on the q/k/v projections (Llama's `attention_bias`; Qwen2 always has them).
    #[serde(default)]
    pub attention_bias: Option<bool>,
    /// Mixture of experts (Qwen3-MoE's keys; absent for dense models).
    #[serde(flatten)]
    pub moe: MoeDims,
    /// Gated DeltaNet layers (Qwen3.5's keys; absent for other families).
    #[serde(flatten)]
    pub linear: LinearDims,
    /// The vision tower's sizes (`vision_config`), counted for a family whose vision tower
    /// verlc trains (Qwen2.5-VL).
    #[serde(default)]
    pub vision_config: Option<VisionDims>,
}

/// A Qwen2.5-VL `vision_config`; absent keys take transformers' defaults.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct VisionDims {
    #[serde(default = "vision_defaults::depth")]
    pub depth: u64,
    #[serde(default = "vision_defaults::hidden_size")]
    pub hidden_size: u64,
    #[serde(default = "vision_defaults::intermediate_size")]
    pub intermediate_size: u64,
    #[serde(default = "vision_defaults::out_hidden_size")]
    pub out_hidden_size: u64,
    #[serde(default = "vision_defaults::patch_size")]
    pub patch_size: u64,
    #[serde(default = "vision_defaults::temporal_patch_size")]
    pub temporal_patch_size: u64,
    #[serde(default = "vision_defaults::in_channels", alias = "in_chans")]
    pub in_channels: u64,
    #[serde(default = "vision_defaults::spatial_merge_size")]
    pub spatial_merge_size: u64,
    /// Qwen3-VL's learned position grid (absent in Qwen2.5-VL's configs).
    #[serde(default)]
    pub num_position_embeddings: Option<u64>,
    /// Qwen3-VL's DeepStack levels, each with a merger of its own.
    #[serde(default)]
    pub deepstack_visual_indexes: Option<Vec<u64>>,
}

mod vision_defaults {
    pub fn depth() -> u64 {
        32
    }
    pub fn hidden_size() -> u64 {
        1280
    }
    pub fn intermediate_size() -> u64 {
        3420
    }
    pub fn out_hidden_size() -> u64 {
        3584
    }
    pub fn patch_size() -> u64 {
        14
    }
    pub fn temporal_patch_size() -> u64 {
        2
    }
    pub fn in_channels() -> u64 {
        3
    }
    pub fn spatial_merge_size() -> u64 {
        2
    }
}

impl VisionDims {
    /// The tower's parameters: the patch embedding, each block (two norms, the biased fused
    /// qkv and output projections, the biased gated MLP) and the merger (a norm, then
    /// Linear-GELU-Linear over `merge²` neighbouring patches). A Qwen3-VL tower has a biased
    /// patch embedding, the position grid, LayerNorms with biases, a two-layer MLP and a merger
    /// per DeepStack level besides the main one (their norms over the merged width); Qwen3.5's
    /// the same without DeepStack mergers.
    pub fn params_of(&self, tower: verlc_spec::families::VisionTower) -> u64 {
        if !tower.qwen3_style() {
            return self.params();
        }
        let m = product;
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let patch = self.patch_kernel().saturating_add(h);
        let positions = m(&[self.num_position_embeddings.unwrap_or(2304), h]);
        let block = [
            m(&[4, h]),
            m(&[h, 3, h]).saturating_add(m(&[3, h])),
            m(&[h, h]).saturating_add(h),
            m(&[h, i]).saturating_add(i),
            m(&[i, h]).saturating_add(h),
        ]
        .iter()
        .fold(0u64, |acc, x| acc.saturating_add(*x));
        let merged = m(&[h, self.spatial_merge_size, self.spatial_merge_size]);
        let linears = m(&[merged, merged])
            .saturating_add(merged)
            .saturating_add(m(&[merged, self.out_hidden_size]))
            .saturating_add(self.out_hidden_size);
        let levels = if tower.deepstack() {
            self.deepstack_visual_indexes
                .as_ref()
                .map_or(3, |d| d.len() as u64)
        } else {
            0
        };
        let mergers = linears
            .saturating_add(m(&[2, h]))
            .saturating_add(m(&[levels, linears.saturating_add(m(&[2, merged]))]));
        patch
            .saturating_add(positions)
            .saturating_add(block.saturating_mul(self.depth))
            .saturating_add(mergers)
    }

    /// The patch embedding's kernel: a `temporal × patch²` patch of every channel per output.
    fn patch_kernel(&self) -> u64 {
        product(&[
            self.hidden_size,
            self.in_channels,
            self.temporal_patch_size,
            self.patch_size,
            self.patch_size,
        ])
    }

    /// [`VisionDims::params_of`] a Qwen2.5-VL tower.
    pub fn params(&self) -> u64 {
        let m = product;
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let patch = self.patch_kernel();
        let block = [
            m(&[2, h]),
            m(&[h, 3, h]).saturating_add(m(&[3, h])),
            m(&[h, h]).saturating_add(h),
            m(&[2, h, i]).saturating_add(m(&[2, i])),
            m(&[i, h]).saturating_add(h),
        ]
        .iter()
        .fold(0u64, |acc, x| acc.saturating_add(*x));
        let merged = m(&[h, self.spatial_merge_size, self.spatial_merge_size]);
        let merger = h
            .saturating_add(m(&[merged, merged]))
            .saturating_add(merged)
            .saturating_add(m(&[merged, self.out_hidden_size]))
            .saturating_add(self.out_hidden_size);
        patch
            .saturating_add(block.saturating_mul(self.depth))
            .saturating_add(merger)
    }
}

/// The product of `factors`, saturating instead of overflowing on absurd dimensions.
fn product(factors: &[u64]) -> u64 {
    factors.iter().fold(1u64, |acc, f| acc.saturating_mul(*f))
}

/// The linear-attention keys of a Qwen3.5 `config.json`; absent keys take transformers'
/// `Qwen3_5TextConfig` defaults when the model is a Qwen3.5.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct LinearDims {
    #[serde(default)]
    pub layer_types: Vec<String>,
    #[serde(default)]
    pub full_attention_interval: Option<u64>,
    #[serde(default)]
    pub linear_conv_kernel_dim: Option<u64>,
    #[serde(default)]
    pub linear_key_head_dim: Option<u64>,
    #[serde(default)]
    pub linear_value_head_dim: Option<u64>,
    #[serde(default)]
    pub linear_num_key_heads: Option<u64>,
    #[serde(default)]
    pub linear_num_value_heads: Option<u64>,
}

/// The expert keys of a mixture-of-experts `config.json` (all default for a dense model).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct MoeDims {
    /// transformers 5 writes Qwen3-VL-MoE's as `num_local_experts`.
    #[serde(default, alias = "num_local_experts")]
    pub num_experts: u64,
    #[serde(default)]
    pub num_experts_per_tok: u64,
    #[serde(default)]
    pub moe_intermediate_size: u64,
    #[serde(default)]
    pub decoder_sparse_step: Option<u64>,
    #[serde(default)]
    pub mlp_only_layers: Vec<u64>,
    /// Qwen3.5-MoE's shared expert width (0: none).
    #[serde(default)]
    pub shared_expert_intermediate_size: u64,
}

impl ModelDims {
    pub fn kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> u64 {
        // The family's config class default (Qwen3's is 128), else hidden / heads.
        let default = self
            .family()
            .and_then(|f| f.default_head_dim())
            .map_or(self.hidden_size / self.num_attention_heads.max(1), |d| {
                d.max(0) as u64
            });
        self.head_dim.unwrap_or(default)
    }

    /// The model's family (a row of the spec's model table).
    fn family(&self) -> Option<&'static verlc_spec::families::FamilyRow> {
        self.model_type
            .as_deref()
            .and_then(verlc_spec::families::of_checkpoint)
    }

    /// The vision tower's parameters (0 for a text model).
    pub fn vision_params(&self) -> u64 {
        match (&self.vision_config, self.family().and_then(|f| f.vision)) {
            (Some(v), Some(tower)) => v.params_of(tower),
            _ => 0,
        }
    }

    /// Whether the q/k/v projections carry biases (always in Qwen2, as transformers builds it).
    pub fn qkv_bias(&self) -> bool {
        let default = self
            .family()
            .is_some_and(|f| f.default_flag("attention_bias"));
        self.family().is_some_and(|f| f.qkv_bias) || self.attention_bias.unwrap_or(default)
    }

    /// Parameters of the largest decoder layer (a sparse one, when the model has experts):
    /// attention (with Qwen2's q/k/v biases), MLP and the two norms. Saturates instead of
    /// overflowing on absurd dimensions.
    pub fn layer_params(&self) -> u64 {
        let mixer = if self.linear_layers() > 0 {
            self.attention_params().max(self.linear_params())
        } else {
            self.attention_params()
        };
        mixer.saturating_add(if self.sparse_layers() > 0 {
            self.experts_params(self.moe.num_experts)
        } else {
            self.dense_mlp_params()
        })
    }

    /// How many layers have experts, by transformers' rule (not in `mlp_only_layers`, and every
    /// `decoder_sparse_step`-th layer); counted, not enumerated: a config may claim any number
    /// of layers.
    pub fn sparse_layers(&self) -> u64 {
        let e = &self.moe;
        if e.num_experts == 0 {
            return 0;
        }
        let step = e.decoder_sparse_step.unwrap_or(1).max(1);
        let mut dense_listed: Vec<u64> = e
            .mlp_only_layers
            .iter()
            .copied()
            .filter(|&l| l < self.num_hidden_layers && (l + 1).is_multiple_of(step))
            .collect();
        dense_listed.sort_unstable();
        dense_listed.dedup();
        (self.num_hidden_layers / step).saturating_sub(dense_listed.len() as u64)
    }

    /// Parameters of the routed experts of every sparse layer (what expert parallelism
    /// splits; the router and a shared expert are not among them).
    pub fn routed_expert_params(&self) -> u64 {
        self.experts_params(self.moe.num_experts)
            .saturating_sub(self.experts_params(0))
            .saturating_mul(self.sparse_layers())
    }

    /// Parameters of every decoder layer together.
    pub fn all_layers_params(&self) -> u64 {
        self.layers_params(self.moe.num_experts)
    }

    /// [`ModelDims::all_layers_params`] counting, in sparse layers, only the experts one token
    /// runs through (`num_experts_per_tok`).
    pub fn active_layers_params(&self) -> u64 {
        self.layers_params(self.moe.num_experts_per_tok)
    }

    /// Whether the model is a Qwen3.5 or a Qwen3-Next (Gated DeltaNet layers among gated
    /// attention).
    pub fn is_hybrid(&self) -> bool {
        self.model_type.as_deref().is_some_and(|t| {
            verlc_spec::families::of_checkpoint(t).is_some_and(|r| r.linear_attention)
        })
    }

    /// How many layers are Gated DeltaNet layers: `layer_types`' count, else every layer but
    /// each `full_attention_interval`-th (4).
    pub fn linear_layers(&self) -> u64 {
        if !self.is_hybrid() {
            return 0;
        }
        let l = &self.linear;
        if !l.layer_types.is_empty() {
            let n = l
                .layer_types
                .iter()
                .filter(|t| *t == "linear_attention")
                .count();
            return (n as u64).min(self.num_hidden_layers);
        }
        let every = l.full_attention_interval.unwrap_or(4).max(1);
        self.num_hidden_layers - self.num_hidden_layers / every
    }

    /// One Gated DeltaNet token mixer: q/k/v, z, a and b projections, the convolution,
    /// `dt_bias` and `A_log`, the gated norm and `out_proj`.
    fn linear_params(&self) -> u64 {
        let m = |factors: &[u64]| factors.iter().fold(1u64, |acc, f| acc.saturating_mul(*f));
        let l = &self.linear;
        let (kd, vd) = (
            l.linear_key_head_dim.unwrap_or(128),
            l.linear_value_head_dim.unwrap_or(128),
        );
        let (nk, nv) = (
            l.linear_num_key_heads.unwrap_or(16),
            l.linear_num_value_heads.unwrap_or(32),
        );
        let (key, value) = (m(&[nk, kd]), m(&[nv, vd]));
        let conv = key.saturating_mul(2).saturating_add(value);
        let h = self.hidden_size;
        [
            m(&[h, conv]),
            m(&[h, value]),
            m(&[2, h, nv]),
            m(&[conv, l.linear_conv_kernel_dim.unwrap_or(4)]),
            m(&[2, nv]),
            vd,
            m(&[value, h]),
            m(&[2, h]),
        ]
        .iter()
        .fold(0u64, |acc, x| acc.saturating_add(*x))
    }

    fn layers_params(&self, experts: u64) -> u64 {
        let sparse = self.sparse_layers();
        let dense = self.num_hidden_layers.saturating_sub(sparse);
        let linear = self.linear_layers();
        self.num_hidden_layers
            .saturating_sub(linear)
            .saturating_mul(self.attention_params())
            .saturating_add(linear.saturating_mul(self.linear_params()))
            .saturating_add(dense.saturating_mul(self.dense_mlp_params()))
            .saturating_add(sparse.saturating_mul(self.experts_params(experts)))
    }

    /// SwiGLU MLP of `intermediate_size`.
    fn dense_mlp_params(&self) -> u64 {
        let h = self.hidden_size;
        let inter = self.intermediate_size.unwrap_or(h.saturating_mul(4));
        h.saturating_mul(inter).saturating_mul(3)
    }

    /// The router, `experts` SwiGLU experts of `moe_intermediate_size` and the shared expert
    /// with its gate (Qwen3.5-MoE), which every token runs through.
    fn experts_params(&self, experts: u64) -> u64 {
        let h = self.hidden_size;
        let biased = self.family().is_some_and(|f| f.expert_style.biased());
        // Interleaved biased experts are `intermediate_size` wide, with biases on the router and on
        // each expert's projections.
        let width = match self.moe.moe_intermediate_size {
            0 if biased => self.intermediate_size.unwrap_or(0),
            w => w,
        };
        let one = h
            .saturating_mul(width)
            .saturating_mul(3)
            .saturating_add(if biased {
                width.saturating_mul(2).saturating_add(h)
            } else {
                0
            });
        let router_bias = if biased { self.moe.num_experts } else { 0 };
        let si = self.moe.shared_expert_intermediate_size;
        let shared = if si > 0 {
            h.saturating_mul(si).saturating_mul(3).saturating_add(h)
        } else {
            0
        };
        h.saturating_mul(self.moe.num_experts)
            .saturating_add(router_bias)
            .saturating_add(experts.saturating_mul(one))
            .saturating_add(shared)
    }

    /// Attention (with Qwen2's q/k/v biases) and the two norms of one layer.
    fn attention_params(&self) -> u64 {
        let m = |factors: &[u64]| factors.iter().fold(1u64, |acc, f| acc.saturating_mul(*f));
        let h = self.hidden_size;
        let hd = self.head_dim();
        // Qwen3.5's q_proj also yields the output gate; it and Qwen3 norm q and k per head.
        let gate = if self.is_hybrid() { 2 } else { 1 };
        let q = m(&[gate, h, self.num_attention_heads, hd]);
        let kv = m(&[2, h, self.kv_heads(), hd]);
        let o = m(&[self.num_attention_heads, hd, h]);
        let bias = if self.qkv_bias() {
            m(&[self.num_attention_heads, hd]).saturating_add(m(&[2, self.kv_heads(), hd]))
        } else {
            0
        };
        // The output projection's bias: `attention_bias` in the families that follow it for
        // all four projections (Llama's convention; Qwen2 and Seed-OSS have their own).
        let family = self.family();
        let o_bias = family.is_some_and(|f| {
            !f.qkv_bias
                && !f.attention_out_bias
                && self
                    .attention_bias
                    .unwrap_or(f.default_flag("attention_bias"))
        });
        let bias = bias.saturating_add(if o_bias { h } else { 0 });
        let sinks = if family.is_some_and(|f| f.attention_sinks) {
            self.num_attention_heads
        } else {
            0
        };
        let bias = bias.saturating_add(sinks);
        let qk_norm = family.is_some_and(|f| f.qk_norm);
        // Two norms a layer; four with Gemma 2's norms after attention and MLP.
        let sandwich = family.is_some_and(|f| f.sandwich_norms);
        let norms = h
            .saturating_mul(if sandwich { 4 } else { 2 })
            .saturating_add(if qk_norm { 2 * hd } else { 0 });
        [q, kv, o, bias, norms]
            .iter()
            .fold(0u64, |acc, x| acc.saturating_add(*x))
    }

    /// The token embedding (`vocab × hidden`).
    pub fn embedding_params(&self) -> u64 {
        self.vocab_size.saturating_mul(self.hidden_size)
    }

    /// The output layer: its own `vocab × hidden` matrix, or none when tied to the embedding.
    pub fn head_params(&self) -> u64 {
        let tied_by_default = self.family().is_some_and(|f| f.tied_by_default());
        if self.tie_word_embeddings.unwrap_or(tied_by_default) {
            0
        } else {
            self.embedding_params()
        }
    }

    /// Parameter count of a Llama/Qwen-style decoder (embeddings, attention, SwiGLU MLPs or
    /// experts, norms, output layer) and a vision-language model's tower. Saturates instead of overflowing on absurd dimensions.
    pub fn param_count(&self) -> u64 {
        self.all_layers_params()
            .saturating_add(self.embedding_params())
            .saturating_add(self.head_params())
            .saturating_add(self.hidden_size)
            .saturating_add(self.vision_params())
    }
}

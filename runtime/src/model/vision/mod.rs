//! Vision-language models: a vision tower (one file per family) turns pixel patches into
//! embeddings for the language model's image placeholders, and the text model runs under
//! multimodal rotary positions ([`mrope`]).
//!
//! A family with a vision tower (`vision` in its row of `verlc_spec::families`) is a
//! [`crate::model::CausalLm`] whose `vision` holds a [`Vision`]: the engines and the rollout
//! run it as any causal LM, given each row's images ([`ProcessedImage`]) and positions
//! `(B, T, 3)`; the rotary embedding picks the M-RoPE tables for such positions.

mod attention;
pub mod mrope;
pub mod qwen2_5_vl;
pub mod qwen3_vl;

use serde_json::Value;
use tch::{Kind, Tensor};

use super::ModelConfig;
use super::decoder::Model;
pub use mrope::MropeTokens;
use qwen2_5_vl::{VisionConfig, VisionError, VisionTower};
use qwen3_vl::{Qwen3VisionConfig, Qwen3VisionTower};

/// An image or a video as the vision tower takes it: `pixel_values` `(t·h·w, patch_width)`
/// row-major and its patch grid `[t, h, w]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    pub pixel_values: Vec<f32>,
    pub grid_thw: [i64; 3],
    /// A video's seconds per temporal patch (its frames' time positions step by this times
    /// `tokens_per_second`); `None` for an image.
    pub seconds_per_grid: Option<f64>,
    /// A video's time at each temporal patch, in seconds, as Qwen3-VL's processor writes it
    /// into the prompt (`<1.5 seconds>`); empty for an image.
    pub timestamps: Vec<f64>,
}

impl ProcessedImage {
    /// The language model's placeholder tokens for it (one per merged patch).
    pub fn tokens(&self, merge_size: usize) -> usize {
        let [t, h, w] = self.grid_thw;
        (t * h * w) as usize / (merge_size * merge_size)
    }
}

/// The vision part of a vision-language model: its tower (`visual.*`), the token ids that
/// mark vision spans, and the M-RoPE sections.
#[derive(Debug)]
pub struct Vision {
    pub tower: Tower,
    pub tokens: MropeTokens,
}

/// A family's vision tower.
#[derive(Debug)]
pub enum Tower {
    Qwen2_5Vl(VisionTower),
    /// Qwen3-VL's, with DeepStack features (Qwen3.5's: the same without them).
    Qwen3Vl(Qwen3VisionTower),
}

impl Tower {
    /// The embeddings of `pixels` (patches of the images of `grids`, in order) and the
    /// DeepStack features (none for Qwen2.5-VL).
    pub fn forward(
        &self,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<qwen3_vl::TowerOutput, VisionError> {
        match self {
            Tower::Qwen2_5Vl(t) => Ok(qwen3_vl::TowerOutput {
                embeds: t.forward(pixels, grids)?,
                deepstack: Vec::new(),
            }),
            Tower::Qwen3Vl(t) => t.forward(pixels, grids),
        }
    }
}

/// A batch's input embeddings `x` `(B, T, hidden)` (vision embeddings in the image
/// placeholders) and what the text model adds to the outputs of its first layers: Qwen3-VL's
/// DeepStack features at the placeholders, zero elsewhere, one `(B, T, hidden)` per level
/// (none for other models).
#[derive(Debug)]
pub struct InputEmbeds {
    pub x: Tensor,
    pub deepstack: Vec<Tensor>,
}

impl InputEmbeds {
    /// Token embeddings alone.
    pub fn tokens(x: Tensor) -> Self {
        InputEmbeds {
            x,
            deepstack: Vec::new(),
        }
    }

    /// Every tensor laid out by `f` (packed, sharded) the same way.
    pub fn map<E>(&self, f: impl Fn(&Tensor) -> Result<Tensor, E>) -> Result<Self, E> {
        Ok(InputEmbeds {
            x: f(&self.x)?,
            deepstack: self.deepstack.iter().map(&f).collect::<Result<_, _>>()?,
        })
    }
}

impl Vision {
    /// The vision part `cfg` describes (`None` for a text-only family), its tower registered
    /// under `root / "visual"`, with LoRA adapters where `adapters` target its layers.
    pub(crate) fn from_config(
        cfg: &ModelConfig,
        root: &tch::nn::Path,
        adapters: Option<crate::model::layers::Adapters<'_>>,
    ) -> Result<Option<Self>, String> {
        if !cfg.arch()?.has_vision() {
            return Ok(None);
        }
        let Some(raw @ Value::Object(_)) = cfg.extra.get("vision_config") else {
            return Err(format!(
                "model_type `{}` without a `vision_config`",
                cfg.model_type
            ));
        };
        let parse = |e: serde_json::Error| format!("vision_config: {e}");
        let at = root / "visual";
        // The tower, and the sizes the text model checks against it.
        let kind = cfg.arch()?.tower();
        let (tower, out_hidden, merge) = if kind.is_some_and(|t| t.qwen3_style()) {
            let mut v: Qwen3VisionConfig = serde_json::from_value(raw.clone()).map_err(parse)?;
            if !kind.is_some_and(|t| t.deepstack()) {
                // Qwen3.5's tower has no DeepStack mergers, whatever its config says.
                v.deepstack_visual_indexes.clear();
            }
            if v.deepstack_visual_indexes.len() as i64 >= cfg.num_hidden_layers {
                return Err(format!(
                    "vision_config.deepstack_visual_indexes has {} levels for a text model of {} layers (the last layer takes none)",
                    v.deepstack_visual_indexes.len(),
                    cfg.num_hidden_layers
                ));
            }
            let tower = Qwen3VisionTower::new(&at, &v, adapters).map_err(|e| e.to_string())?;
            (
                Tower::Qwen3Vl(tower),
                v.out_hidden_size,
                v.spatial_merge_size,
            )
        } else {
            let v: VisionConfig = serde_json::from_value(raw.clone()).map_err(parse)?;
            let tower = VisionTower::with_adapters(&at, &v, adapters).map_err(|e| e.to_string())?;
            (
                Tower::Qwen2_5Vl(tower),
                v.out_hidden_size,
                v.spatial_merge_size,
            )
        };
        if out_hidden != cfg.hidden_size {
            return Err(format!(
                "vision_config.out_hidden_size ({out_hidden}) is not the text model's hidden_size ({})",
                cfg.hidden_size
            ));
        }
        let mrope = cfg
            .rope_scaling
            .as_ref()
            .and_then(|m| m.get("mrope_section"))
            .is_some_and(|v| !v.is_null());
        if !mrope {
            return Err(
                "rope_scaling.mrope_section is missing (multimodal rotary positions)".into(),
            );
        }
        let tokens = MropeTokens {
            spatial_merge_size: merge,
            ..Self::tokens_of(cfg)?
        };
        Ok(Some(Vision { tower, tokens }))
    }

    /// The vision tokens and settings of `cfg`'s multimodal positions (what a pipeline stage
    /// without the tower needs to compute them); `cfg` must be a vision-language model's.
    pub fn tokens_of(cfg: &ModelConfig) -> Result<MropeTokens, String> {
        let id = |k: &str| {
            cfg.extra
                .get(k)
                .and_then(Value::as_i64)
                .ok_or_else(|| format!("`{k}` is missing"))
        };
        let vision = cfg.extra.get("vision_config");
        let setting = |k: &str| vision.and_then(|v| v.get(k));
        Ok(MropeTokens {
            image_token_id: id("image_token_id")?,
            video_token_id: id("video_token_id")?,
            vision_start_token_id: id("vision_start_token_id")?,
            // Both towers' default.
            spatial_merge_size: setting("spatial_merge_size")
                .and_then(Value::as_i64)
                .unwrap_or(2),
            tokens_per_second: setting("tokens_per_second")
                .and_then(Value::as_f64)
                .unwrap_or(2.0),
            timestamped_videos: cfg.arch()?.tower().is_some_and(|t| t.timestamped_videos()),
        })
    }

    /// How many of the text model's first layers take DeepStack features (Qwen3-VL's
    /// `deepstack_visual_indexes`; none for other towers or a text model).
    pub fn deepstack_levels(cfg: &ModelConfig) -> Result<usize, String> {
        if !cfg.arch()?.tower().is_some_and(|t| t.deepstack()) {
            return Ok(0);
        }
        let raw = cfg.extra.get("vision_config").cloned().unwrap_or_default();
        let v: Qwen3VisionConfig =
            serde_json::from_value(raw).map_err(|e| format!("vision_config: {e}"))?;
        Ok(v.deepstack_visual_indexes.len())
    }

    /// Names (under `visual.`) and shapes of the tower's parameters `cfg` describes, in a
    /// fixed order (none for a text-only family): what a pipeline stage without the tower
    /// needs to receive it from the first stage. Built once in a scratch store on the host,
    /// so it costs the tower's size in host memory while it runs.
    pub fn param_shapes(cfg: &ModelConfig) -> Result<Vec<(String, Vec<i64>)>, String> {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        if Self::from_config(cfg, &vs.root(), None)?.is_none() {
            return Ok(Vec::new());
        }
        let mut out: Vec<(String, Vec<i64>)> = vs
            .variables()
            .into_iter()
            .map(|(n, t)| (n, t.size()))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Which of `items` are videos (the placeholders their rows of the tower's output fill).
    pub fn video_flags(items: &[&ProcessedImage]) -> Vec<bool> {
        items.iter().map(|i| i.seconds_per_grid.is_some()).collect()
    }

    /// The tower's input for `images` (images and videos, in order): their patches stacked
    /// `(Σ t·h·w, patch_width)` on `device`, and their grids ([`Vision::video_flags`] says
    /// which are videos).
    pub fn pixels(
        images: &[&ProcessedImage],
        device: tch::Device,
    ) -> Result<(Tensor, Vec<[i64; 3]>), VisionError> {
        let grids: Vec<[i64; 3]> = images.iter().map(|i| i.grid_thw).collect();
        // Slice copies, not an iterator chain: unoptimised builds (the tests, `verlc smoke`'s
        // trainers) spent a fifth of a video run's CPU in a flattening `collect` here.
        let mut data: Vec<f32> =
            Vec::with_capacity(images.iter().map(|i| i.pixel_values.len()).sum());
        for image in images {
            data.extend_from_slice(&image.pixel_values);
        }
        let rows: i64 = grids.iter().map(|[t, h, w]| t * h * w).sum();
        let width = if rows > 0 {
            data.len() as i64 / rows
        } else {
            0
        };
        Ok((
            Tensor::from_slice(&data)
                .f_view([rows, width])?
                .f_to(device)?,
            grids,
        ))
    }

    /// [`Vision::embed`] of the images' patches `pixels` (of the patch grids `grids`, in
    /// order); no grids: the token embeddings, which must then hold no placeholder.
    pub fn embed_pixels(
        &self,
        model: &Model,
        input_ids: &Tensor,
        prompt_width: i64,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<InputEmbeds, VisionError> {
        let x = model.f_embed(input_ids)?;
        self.merge(x, input_ids, prompt_width, pixels, grids)
    }

    /// [`Vision::embed_pixels`] given the token embeddings `x` `(B, T, hidden)` of `input_ids`
    /// (a Megatron stage's, reduced over its tensor-parallel group): the tower's embeddings
    /// replace them in the prompts' image placeholders.
    pub fn merge(
        &self,
        x: Tensor,
        input_ids: &Tensor,
        prompt_width: i64,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<InputEmbeds, VisionError> {
        let out = if grids.is_empty() {
            None
        } else {
            Some(self.tower.forward(pixels, grids)?)
        };
        self.place(x, input_ids, prompt_width, out, grids, &[])
    }

    /// [`Vision::merge`] given the tower's output `out` (`None`: no items) for items of the
    /// patch grids `grids`, in order, of which `videos` says which are videos (empty: none):
    /// each image's rows of the output go into the prompts' image placeholders and each
    /// video's into the video placeholders, in order (as transformers fills `image_token_id`
    /// from `pixel_values` and `video_token_id` from `pixel_values_videos`); its DeepStack
    /// features at the same places of zero tensors.
    pub fn place(
        &self,
        x: Tensor,
        input_ids: &Tensor,
        prompt_width: i64,
        out: Option<qwen3_vl::TowerOutput>,
        grids: &[[i64; 3]],
        videos: &[bool],
    ) -> Result<InputEmbeds, VisionError> {
        if !videos.is_empty() && videos.len() != grids.len() {
            return Err(VisionError::Text(format!(
                "{} video flags for {} items",
                videos.len(),
                grids.len()
            )));
        }
        let merge = self.tokens.spatial_merge_size.max(1);
        let sizes: Vec<i64> = grids
            .iter()
            .map(|[t, h, w]| t * h * w / (merge * merge))
            .collect();
        // Each item's rows of a tower output, then the images' and the videos' apart (all
        // the images' when there is no video).
        let split = |t: &Tensor| -> Result<(Option<Tensor>, Option<Tensor>), VisionError> {
            if !videos.contains(&true) {
                return Ok((Some(t.shallow_clone()), None));
            }
            let parts = t.f_split_with_sizes(&sizes, 0)?;
            let pick = |video: bool| -> Result<Option<Tensor>, VisionError> {
                let rows: Vec<&Tensor> = parts
                    .iter()
                    .zip(videos)
                    .filter(|(_, v)| **v == video)
                    .map(|(p, _)| p)
                    .collect();
                Ok(if rows.is_empty() {
                    None
                } else {
                    Some(Tensor::f_cat(&rows, 0)?)
                })
            };
            Ok((pick(false)?, pick(true)?))
        };
        let (images, videos_rows, levels) = match &out {
            Some(o) => {
                let (images, videos) = split(&o.embeds)?;
                let levels = o
                    .deepstack
                    .iter()
                    .map(&split)
                    .collect::<Result<Vec<_>, _>>()?;
                (images, videos, levels)
            }
            None => (None, None, Vec::new()),
        };
        let mut embeds = InputEmbeds {
            deepstack: levels
                .iter()
                .map(|_| x.f_zeros_like())
                .collect::<Result<_, _>>()?,
            x,
        };
        let (image_levels, video_levels) = levels.into_iter().unzip();
        for (token, rows) in [
            (
                self.tokens.image_token_id,
                Visuals {
                    embeds: images,
                    deepstack: image_levels,
                },
            ),
            (
                self.tokens.video_token_id,
                Visuals {
                    embeds: videos_rows,
                    deepstack: video_levels,
                },
            ),
        ] {
            let at = Placeholders {
                input_ids,
                prompt_width,
                token,
            };
            fill(&mut embeds, &at, rows)?;
        }
        Ok(embeds)
    }

    /// Token embeddings of `input_ids` `(B, T)` whose prompt columns (the first
    /// `prompt_width`) hold the placeholders of `items`, images and videos in the order they
    /// appear, row-major: the tower embeds them together, then each image's embeddings fill
    /// the image placeholders and each video's the video placeholders, in order (as
    /// transformers fills `image_token_id` from `pixel_values` and `video_token_id` from
    /// `pixel_values_videos`). A response that samples a placeholder token keeps its token
    /// embedding, as its positions are text positions.
    pub fn embed(
        &self,
        model: &Model,
        input_ids: &Tensor,
        prompt_width: i64,
        items: &[&ProcessedImage],
    ) -> Result<InputEmbeds, VisionError> {
        let x = model.f_embed(input_ids)?;
        if items.is_empty() {
            return self.place(x, input_ids, prompt_width, None, &[], &[]);
        }
        let (pixels, grids) = Self::pixels(items, input_ids.device())?;
        let out = self.tower.forward(&pixels, &grids)?;
        self.place(
            x,
            input_ids,
            prompt_width,
            Some(out),
            &grids,
            &Self::video_flags(items),
        )
    }

    /// M-RoPE positions `(B, T, 3)` and each row's rope delta for rows holding `items`
    /// (images and videos in order of appearance; Qwen3-VL's videos frame by frame, as its
    /// processor lays them out).
    pub fn item_positions(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        items: &[&ProcessedImage],
    ) -> Result<(Tensor, Vec<i64>), VisionError> {
        self.tokens.item_positions(input_ids, attention_mask, items)
    }

    /// [`MropeTokens::positions`] of this model's vision tokens.
    pub fn positions(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<(Tensor, Vec<i64>), VisionError> {
        self.tokens.positions(input_ids, attention_mask, grids)
    }
}

/// The placeholders of one kind (`token`) in the prompt columns (the first `prompt_width`)
/// of `input_ids`.
struct Placeholders<'a> {
    input_ids: &'a Tensor,
    prompt_width: i64,
    token: i64,
}

/// The tower's rows for one kind of placeholder, in order: the embeddings and each DeepStack
/// level's features (`None`: none of this kind).
struct Visuals {
    embeds: Option<Tensor>,
    deepstack: Vec<Option<Tensor>>,
}

/// `rows` into the placeholders `at` of `embeds.x`, and each DeepStack level's rows into the
/// same places of its level; the placeholders and the rows must be as many.
fn fill(embeds: &mut InputEmbeds, at: &Placeholders<'_>, rows: Visuals) -> Result<(), VisionError> {
    let t = at.input_ids.size().get(1).copied().unwrap_or(0);
    let in_prompt = Tensor::f_arange(t, (Kind::Int64, at.input_ids.device()))?
        .f_lt(at.prompt_width)?
        .f_unsqueeze(0)?;
    let slots = at.input_ids.f_eq(at.token)?.f_logical_and(&in_prompt)?;
    let placeholders = slots.f_sum(Kind::Int64)?.f_int64_value(&[])?;
    let embeddings = rows.embeds.as_ref().map_or(0, |r| r.size()[0]);
    if placeholders != embeddings {
        return Err(VisionError::Placeholders {
            placeholders,
            embeddings,
        });
    }
    let Some(values) = rows.embeds else {
        return Ok(());
    };
    let kind = embeds.x.kind();
    let slots = slots.f_unsqueeze(-1)?.f_expand_as(&embeds.x)?;
    embeds.x = embeds
        .x
        .f_masked_scatter(&slots, &values.f_to_kind(kind)?)?;
    for (level, features) in embeds.deepstack.iter_mut().zip(rows.deepstack) {
        if let Some(features) = features {
            *level = level.f_masked_scatter(&slots, &features.f_to_kind(kind)?)?;
        }
    }
    Ok(())
}

impl MropeTokens {
    /// M-RoPE positions `(B, T, 3)` of a padded batch (`attention_mask` 1 on real tokens,
    /// padding at 1) whose rows hold images of the patch grids `grids` in order, and each
    /// row's rope delta.
    pub fn positions(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<(Tensor, Vec<i64>), VisionError> {
        self.positions_with(input_ids, attention_mask, grids, &[])
    }

    /// [`MropeTokens::positions`] of rows holding `items`, images and videos in order of
    /// appearance.
    pub fn item_positions(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        items: &[&ProcessedImage],
    ) -> Result<(Tensor, Vec<i64>), VisionError> {
        let images: Vec<[i64; 3]> = items
            .iter()
            .filter(|i| i.seconds_per_grid.is_none())
            .map(|i| i.grid_thw)
            .collect();
        let videos: Vec<mrope::VideoGrid> = items
            .iter()
            .filter_map(|i| {
                i.seconds_per_grid.map(|s| mrope::VideoGrid {
                    thw: i.grid_thw,
                    seconds_per_grid: s,
                })
            })
            .collect();
        self.positions_with(input_ids, attention_mask, &images, &videos)
    }

    /// [`MropeTokens::positions`] of rows holding images of the grids `images` and videos
    /// `videos`, each in order.
    pub fn positions_with(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        grids: &[[i64; 3]],
        videos: &[mrope::VideoGrid],
    ) -> Result<(Tensor, Vec<i64>), VisionError> {
        let rows: Vec<Vec<i64>> = Vec::try_from(&input_ids.f_to_device(tch::Device::Cpu)?)?;
        let mask: Vec<Vec<i64>> = Vec::try_from(
            &attention_mask
                .f_to_kind(Kind::Int64)?
                .f_to_device(tch::Device::Cpu)?,
        )?;
        let (pos, deltas) = mrope::batch_position_ids(&rows, &mask, grids, videos, self)?;
        let (b, t) = (rows.len() as i64, rows.first().map_or(0, Vec::len) as i64);
        let axes = pos
            .iter()
            .map(|axis| Tensor::from_slice(axis).f_view([b, t]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((
            Tensor::f_stack(&axes, -1)?.f_to_device(input_ids.device())?,
            deltas,
        ))
    }
}

impl Vision {
    /// A padded batch's embeddings with the images of `grids` (patches `pixels`) in its
    /// placeholders, its positions `(B, T, 3)` and each row's rope delta.
    fn prefill(
        &self,
        model: &Model,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<(InputEmbeds, Tensor, Vec<i64>), VisionError> {
        let (pos, deltas) = self.positions(input_ids, attention_mask, grids)?;
        let t = input_ids.size()[1];
        let x = self.embed_pixels(model, input_ids, t, pixels, grids)?;
        Ok((x, pos, deltas))
    }
}

/// A model's vision part, or an error naming a text-only model (`cfg`'s) given images.
fn tower_of<'a>(
    vision: Option<&'a Vision>,
    cfg: &super::ModelConfig,
) -> Result<&'a Vision, VisionError> {
    vision.ok_or_else(|| {
        VisionError::Text(format!(
            "model_type `{}` has no vision tower",
            cfg.model_type
        ))
    })
}

impl super::ValueModel {
    /// Values `(B, T)` in f32 of a padded batch whose image placeholders take, in order, the
    /// embeddings of `pixels` (patches of the images of `grids`), at the rows' M-RoPE
    /// positions: the value head on the last hidden states of the image-text model, as verl's
    /// critic on such a model computes them (TRL's value head, its dropout off).
    pub fn forward_pixels(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<Tensor, VisionError> {
        let vision = tower_of(self.vision.as_ref(), &self.config)?;
        let (x, pos, _) = vision.prefill(&self.model, input_ids, attention_mask, pixels, grids)?;
        let (cos, sin) = self.model.rotary().cos_sin(&pos, x.x.kind());
        let hidden = self
            .model
            .forward_embeds(x, (&cos, &sin), Some(attention_mask), None);
        Ok(self
            .score()
            .forward(&hidden)
            .squeeze_dim(-1)
            .to_kind(Kind::Float))
    }
}

impl super::CausalLm {
    /// The vision part, or an error for a text-only model given images.
    pub fn vision(&self) -> Result<&Vision, VisionError> {
        tower_of(self.vision.as_ref(), &self.config)
    }

    /// Logits `(B, T, vocab)` of a padded batch (`attention_mask` 1 on real tokens) whose
    /// image placeholders take, in order, the embeddings of `pixels` (patches of the images of
    /// `grids`), at the rows' M-RoPE positions.
    pub fn forward_pixels(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<Tensor, VisionError> {
        let (x, pos, _) = self.vision_prefill(input_ids, attention_mask, pixels, grids)?;
        Ok(self.logits_of_embeds(x, &pos, attention_mask))
    }

    /// Logits of input embeddings `x` at multimodal positions `pos` `(B, T, 3)`.
    fn logits_of_embeds(&self, x: InputEmbeds, pos: &Tensor, attention_mask: &Tensor) -> Tensor {
        let (cos, sin) = self.model.rotary().cos_sin(pos, x.x.kind());
        let hidden = self
            .model
            .forward_embeds(x, (&cos, &sin), Some(attention_mask), None);
        self.logits(&hidden)
    }

    /// Logits `(B, T, vocab)` of a padded batch whose rows hold `items`, images and videos in
    /// order of appearance (see [`Vision::embed`]), at the rows' M-RoPE positions.
    pub fn forward_items(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        items: &[&ProcessedImage],
    ) -> Result<Tensor, VisionError> {
        let (pos, _) = self
            .vision()?
            .item_positions(input_ids, attention_mask, items)?;
        self.forward_rollout_rows(input_ids, attention_mask, &pos, input_ids.size()[1], items)
    }

    /// Logits `(B, T, vocab)` of rollout rows as the actor's forward sees them: placeholders
    /// filled in the prompt columns (the first `prompt_width`) only, at the rollout's
    /// `position_ids` (a response that samples a placeholder token keeps its text embedding
    /// and position).
    pub fn forward_rollout_rows(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        position_ids: &Tensor,
        prompt_width: i64,
        items: &[&ProcessedImage],
    ) -> Result<Tensor, VisionError> {
        let x = self
            .vision()?
            .embed(&self.model, input_ids, prompt_width, items)?;
        Ok(self.logits_of_embeds(x, position_ids, attention_mask))
    }

    /// The prompt's embeddings (vision embeddings in the placeholders), its positions
    /// `(B, T, 3)` and each row's rope delta (where generated tokens' positions continue).
    fn vision_prefill(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        pixels: &Tensor,
        grids: &[[i64; 3]],
    ) -> Result<(InputEmbeds, Tensor, Vec<i64>), VisionError> {
        self.vision()?
            .prefill(&self.model, input_ids, attention_mask, pixels, grids)
    }

    /// Greedy decoding of `max_new_tokens` tokens after each row of a left-padded batch with
    /// images (no stop token), with a KV cache: each new token's three position ids are its
    /// index plus the row's rope delta.
    pub fn generate_greedy_pixels(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        pixels: &Tensor,
        grids: &[[i64; 3]],
        max_new_tokens: i64,
    ) -> Result<Tensor, VisionError> {
        let (x, pos, deltas) = self.vision_prefill(input_ids, attention_mask, pixels, grids)?;
        let (b, t) = (input_ids.size()[0], input_ids.size()[1]);
        let model = &self.model;
        let (kind, device) = (x.x.kind(), x.x.device());
        let mut cache = super::KvCache::new(&self.config, b, t + max_new_tokens, kind, device);
        let mut mask = attention_mask.shallow_clone();
        let (cos, sin) = model.rotary().cos_sin(&pos, kind);
        let hidden = model.forward_embeds(x, (&cos, &sin), Some(&mask), Some(&mut cache));
        let mut next = self
            .logits(&hidden.f_narrow(1, t - 1, 1)?)
            .f_argmax(-1, false)?;
        let mut out = vec![next.shallow_clone()];
        for step in 1..max_new_tokens {
            mask = Tensor::f_cat(&[&mask, &mask.f_ones_like()?.f_narrow(1, 0, 1)?], 1)?;
            let at: Vec<i64> = deltas.iter().map(|d| t + step - 1 + d).collect();
            // Text positions: all three axes equal, the ordinary rotary.
            let pos = Tensor::from_slice(&at)
                .f_view([b, 1])?
                .f_to(input_ids.device())?;
            let hidden = model.forward(&next, &pos, Some(&mask), Some(&mut cache));
            next = self.logits(&hidden).f_argmax(-1, false)?;
            out.push(next.shallow_clone());
        }
        Ok(Tensor::f_cat(&out, 1)?)
    }
}

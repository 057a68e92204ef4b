//! Heads on the backbone: the causal LM (`lm_head`, or the tied embedding) for the actor,
//! reference and rollout, and the value head (`score`, as `*ForTokenClassification` with one
//! label) for the critic.

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::ModelConfig;
use super::cache::KvCache;
use super::decoder::{Linear, Model};

/// `*ForCausalLM`: backbone plus vocabulary projection.
#[derive(Debug)]
pub struct CausalLm {
    pub model: Model,
    lm_head: Option<Linear>,
    pub config: ModelConfig,
    /// A vision-language model's vision tower (`visual.*`) and vision token ids.
    pub vision: Option<super::vision::Vision>,
}

impl CausalLm {
    /// Registers `model.*`, unless embeddings are tied `lm_head.weight`, and a
    /// vision-language model's tower (`visual.*`) under `root`.
    pub fn new(cfg: &ModelConfig, root: Path) -> Result<Self, String> {
        cfg.validate()?;
        let model = Model::new(cfg, &root / "model")?;
        let lm_head = (!cfg.tie_word_embeddings)
            .then(|| Linear::new(&root / "lm_head", cfg.hidden_size, cfg.vocab_size, false));
        let adapters = super::layers::Adapters::of(cfg.lora.as_ref(), model.adapter_switch(), true);
        let vision = super::vision::Vision::from_config(cfg, &root, adapters)?;
        Ok(CausalLm {
            model,
            lm_head,
            config: cfg.clone(),
            vision,
        })
    }

    /// Logits (B, T, vocab) in the model's dtype. See [`Model::forward`] for the arguments.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.logits(
            &self
                .model
                .forward(input_ids, position_ids, attention_mask, cache),
        )
    }

    /// Projects hidden states (…, hidden) to logits (…, vocab), soft-capped where the family
    /// caps them.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        soft_cap(
            hidden.linear::<&Tensor>(self.head_weight(), None),
            self.config.final_logit_softcap(),
        )
    }

    /// The vocabulary projection (vocab, hidden): `lm_head.weight` or the tied embedding.
    pub fn head_weight(&self) -> &Tensor {
        match &self.lm_head {
            Some(head) => &head.weight,
            None => &self.model.embed_tokens,
        }
    }

    pub fn device(&self) -> tch::Device {
        self.model.embed_tokens.device()
    }

    pub fn kind(&self) -> Kind {
        self.model.embed_tokens.kind()
    }
}

/// `*ForTokenClassification` with `num_labels = 1`: one value per token (the critic).
#[derive(Debug)]
pub struct ValueModel {
    pub model: Model,
    score: Linear,
    pub config: ModelConfig,
    /// A vision-language model's vision tower (`visual.*`): verl's critic on such a model
    /// (TRL's value head over the image-text model) reads the rows' images as the actor does.
    pub vision: Option<super::vision::Vision>,
}

impl ValueModel {
    /// Registers `model.*`, `score.{weight,bias}` and a vision-language model's tower
    /// (`visual.*`) under `root`.
    pub fn new(cfg: &ModelConfig, root: Path) -> Result<Self, String> {
        cfg.validate()?;
        let model = Model::new(cfg, &root / "model")?;
        let score = Linear::new(&root / "score", cfg.hidden_size, 1, true);
        let adapters = super::layers::Adapters::of(cfg.lora.as_ref(), model.adapter_switch(), true);
        let vision = super::vision::Vision::from_config(cfg, &root, adapters)?;
        Ok(ValueModel {
            model,
            score,
            config: cfg.clone(),
            vision,
        })
    }

    /// The value projection (`score`).
    pub fn score(&self) -> &Linear {
        &self.score
    }

    /// Values (B, T) in f32.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Tensor {
        let hidden = self
            .model
            .forward(input_ids, position_ids, attention_mask, None);
        self.score
            .forward(&hidden)
            .squeeze_dim(-1)
            .to_kind(Kind::Float)
    }

    /// Values (B, R) of the positions that precede each of the last `response_len` tokens,
    /// as verl's critic takes them (`values[:, -R - 1 : -1]`).
    pub fn response_values(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        response_len: i64,
    ) -> Tensor {
        let x = super::vision::InputEmbeds::tokens(self.model.embed(input_ids));
        self.response_values_embeds(x, position_ids, attention_mask, response_len)
    }

    /// [`ValueModel::response_values`] of input embeddings `x` (a vision-language model's,
    /// the tower's embeddings in the placeholders).
    pub fn response_values_embeds(
        &self,
        x: super::vision::InputEmbeds,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        response_len: i64,
    ) -> Tensor {
        let total = x.x.size()[1];
        let hidden = self.model.forward_window_embeds(
            x,
            position_ids,
            attention_mask,
            total - response_len - 1,
            response_len,
        );
        self.score
            .forward(&hidden)
            .squeeze_dim(-1)
            .to_kind(Kind::Float)
    }
}

/// `cap · tanh(x / cap)` (a family's soft-capped logits), or `x` without a cap.
pub fn soft_cap(x: Tensor, cap: Option<f64>) -> Tensor {
    match cap {
        Some(c) => (x / c).tanh() * c,
        None => x,
    }
}

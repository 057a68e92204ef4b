//! The sparse mixture-of-experts MLP of Qwen3-MoE (transformers' `Qwen3MoeSparseMoeBlock`):
//! a router (`mlp.gate`, hidden -> experts, no bias) scores every token; softmax in f32, the
//! top-k experts per token, their weights renormalised to sum to one when `norm_topk_prob`;
//! each chosen expert (`mlp.experts.{e}`, a SwiGLU MLP of `moe_intermediate_size`) runs on its
//! tokens and the weighted outputs are summed per token.
//!
//! Experts run grouped: the (token, choice) pairs are sorted by expert, so each expert is one
//! matmul chain over a contiguous block of rows, and experts no token chose do not run (never
//! a loop of every expert over every token). All steps are differentiable; the router's
//! gradient reaches it through the routing weights, as in transformers. The load-balancing
//! auxiliary loss (`output_router_logits`) is not computed here.
//!
//! Qwen3.5-MoE adds a shared expert (`mlp.shared_expert`, a SwiGLU MLP of
//! `shared_expert_intermediate_size` every token runs through) scaled per token by
//! `sigmoid(mlp.shared_expert_gate(x))`.
use tch::nn::Path;
use tch::{Kind, Tensor};

use super::ModelConfig;
use super::decoder::{LayerPlace, Mlp};
use super::layers::{Linear, Split};

#[derive(Debug)]
pub struct SparseMoe {
    gate: Linear,
    experts: Vec<Mlp>,
    /// Qwen3.5-MoE's shared expert and its gate (hidden -> 1).
    shared: Option<(Mlp, Linear)>,
    top_k: i64,
    norm_topk_prob: bool,
}

impl SparseMoe {
    pub(crate) fn build(cfg: &ModelConfig, p: Path, at: LayerPlace<'_>) -> Result<Self, String> {
        let m = &cfg.moe;
        let h = cfg.hidden_size;
        let gate = at.linear(
            &p / "gate",
            "mlp.gate",
            (h, m.num_experts, false),
            Split::Whole,
        )?;
        let experts = (0..m.num_experts)
            .map(|e| {
                let prefix = format!("mlp.experts.{e}");
                let dims = (h, m.moe_intermediate_size, false);
                Mlp::build(&p / "experts" / e, at, &prefix, dims)
            })
            .collect::<Result<_, _>>()?;
        let shared = if m.shared_expert_intermediate_size > 0 {
            let dims = (h, m.shared_expert_intermediate_size, false);
            let mlp = Mlp::build(&p / "shared_expert", at, "mlp.shared_expert", dims)?;
            let gate = at.linear(
                &p / "shared_expert_gate",
                "mlp.shared_expert_gate",
                (h, 1, false),
                Split::Whole,
            )?;
            Some((mlp, gate))
        } else {
            None
        };
        Ok(SparseMoe {
            gate,
            experts,
            shared,
            top_k: m.num_experts_per_tok,
            norm_topk_prob: m.norm_topk_prob,
        })
    }

    /// Whether the experts are split over a tensor-parallel group (their `down_proj` by
    /// rows): then [`SparseMoe::partial`] is this rank's share of the output.
    pub fn is_split(&self) -> bool {
        self.experts.first().is_some_and(Mlp::is_split)
    }

    /// `x` (…, hidden) -> (…, hidden), with whole experts.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.combine(x, Mlp::forward)
    }

    /// This rank's partial output under tensor parallelism (every expert's row-split
    /// `down_proj` before the sum over the group): routing is computed on the replicated
    /// input alike on every rank, so the routed sum of partial outputs sums to the whole.
    /// The router's (and the shared-expert gate's) weight gradient is then partial per rank
    /// and summed over the group by the engine.
    pub fn partial(&self, x: &Tensor) -> Tensor {
        self.combine(x, Mlp::partial)
    }

    /// The block with each expert's output given by `expert`.
    fn combine(&self, x: &Tensor, expert_fn: impl Fn(&Mlp, &Tensor) -> Tensor) -> Tensor {
        let shape = x.size();
        let hidden = shape.last().copied().unwrap_or(0);
        let flat = x.reshape([-1, hidden]);
        if flat.size()[0] == 0 {
            return x.zeros_like();
        }
        let probs = self.gate.forward(&flat).softmax(-1, Kind::Float);
        let (mut weights, chosen) = probs.topk(self.top_k, -1, true, true);
        if self.norm_topk_prob {
            weights = &weights / weights.sum_dim_intlist(-1, true, Kind::Float);
        }
        let weights = weights.to_kind(x.kind());
        // Pair j is token j / k's (j % k)-th choice; sorting the pairs by expert makes each
        // expert's tokens one block.
        let chosen = chosen.reshape([-1]);
        let order = chosen.argsort_stable(true, 0, false);
        let tokens = order.floor_divide_scalar(self.top_k);
        let rows = flat.index_select(0, &tokens);
        let counts = chosen.bincount::<Tensor>(None, self.experts.len() as i64);
        let counts = Vec::<i64>::try_from(&counts).unwrap_or_default();
        let mut outputs = Vec::with_capacity(self.experts.len());
        let mut start = 0;
        for (mlp, &n) in self.experts.iter().zip(&counts) {
            if n > 0 {
                outputs.push(expert_fn(mlp, &rows.narrow(0, start, n)));
                start += n;
            }
        }
        let expert_out = Tensor::cat(&outputs, 0);
        let pair_weights = weights.reshape([-1]).index_select(0, &order).unsqueeze(-1);
        let routed = flat
            .zeros_like()
            .index_add(0, &tokens, &(expert_out * pair_weights));
        let out = match &self.shared {
            Some((mlp, gate)) => routed + gate.forward(&flat).sigmoid() * expert_fn(mlp, &flat),
            None => routed,
        };
        out.reshape(shape)
    }
}

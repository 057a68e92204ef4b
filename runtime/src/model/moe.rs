//! The sparse mixture-of-experts MLP of Qwen3-MoE (transformers' `Qwen3MoeSparseMoeBlock`):
//! a router (`mlp.gate`, hidden -> experts, no bias) scores every token; softmax in f32, the
//! top-k experts per token, their weights renormalised to sum to one when `norm_topk_prob`;
//! each chosen expert (`mlp.experts.{e}`, a SwiGLU MLP of `moe_intermediate_size`) runs on its
//! tokens and the weighted outputs are summed per token.
//!
//! Experts run grouped: the (token, choice) pairs are sorted by expert, so each expert is one
//! matmul chain over a contiguous block of rows, and experts no token chose do not run (never
//! a loop of every expert over every token). All steps are differentiable; the router's
//! gradient reaches it through the routing weights, as in transformers. The router's
//! load-balancing and z-losses, which Megatron adds to the gradient when configured, are
//! [`SparseMoe::router_losses`] (verl's FSDP path never adds transformers' auxiliary loss).
//!
//! Under expert parallelism (Megatron's `expert_model_parallel_size`) a rank holds a
//! contiguous range of the experts ([`SparseMoe::standalone`] with a range, then
//! [`SparseMoe::set_expert_group`]); each rank routes its own tokens, the (token, choice)
//! pairs travel to the ranks of their experts and back with differentiable all-to-alls
//! ([`RankGroup::all_to_all_rows`]), and the weighted combination stays with
//! the token. An expert's weight gradient then holds the contributions of every rank of the
//! group's tokens; the router's only its own rank's.
//!
//! Under Megatron's tensor parallelism an expert is split like a dense MLP (expert tensor
//! parallel = TP: [`SparseMoe::try_partial`]) or kept whole (expert tensor parallel 1:
//! [`SparseMoe::try_share`], each tensor rank routing its share of the replicated tokens).
//!
//! Qwen3.5-MoE adds a shared expert (`mlp.shared_expert`, a SwiGLU MLP of
//! `shared_expert_intermediate_size` every token runs through) scaled per token by
//! `sigmoid(mlp.shared_expert_gate(x))`.
use std::ops::Range;

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::ModelConfig;
use super::decoder::{LayerPlace, Mlp};
use super::layers::{Activation, Linear, Split};
use super::rank_group::{CollectiveError, RankGroup, SharedRankGroup};

/// The coefficients of the router losses Megatron adds to the gradient (see
/// [`SparseMoe::router_losses`]): `moe_aux_loss_coeff` when the load-balancing type is
/// `aux_loss`, and `moe_z_loss_coeff`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RouterLossCoeffs {
    pub load_balancing: f64,
    pub z: f64,
}

impl RouterLossCoeffs {
    pub fn any(&self) -> bool {
        self.load_balancing != 0.0 || self.z != 0.0
    }
}

#[derive(Debug)]
pub struct SparseMoe {
    gate: Linear,
    /// The experts this rank holds: `first..first + experts.len()` of `num_experts`.
    experts: Vec<Mlp>,
    first: i64,
    num_experts: i64,
    /// Qwen3.5-MoE's shared expert and its gate (hidden -> 1).
    shared: Option<(Mlp, Linear)>,
    top_k: i64,
    norm_topk_prob: bool,
    /// The expert-parallel group (each rank holds an equal, consecutive range of experts).
    ep: Option<SharedRankGroup>,
    /// Router logits in fp32 ([`SparseMoe::set_fp32_router`]).
    fp32_router: bool,
}

impl SparseMoe {
    pub(crate) fn build(cfg: &ModelConfig, p: Path, at: LayerPlace<'_>) -> Result<Self, String> {
        Self::build_range(cfg, p, at, 0..cfg.moe.num_experts)
    }

    /// Layer `layer`'s block of `cfg` holding experts `experts` (all of them for one rank;
    /// a range of equal size per rank under expert parallelism), parameters named as in the
    /// checkpoint (`model.layers.{layer}.mlp.experts.{e}...`, `e` the global index).
    pub fn standalone(
        cfg: &ModelConfig,
        p: Path,
        layer: usize,
        experts: Range<i64>,
    ) -> Result<Self, String> {
        let at = LayerPlace {
            index: layer,
            slot: 0,
            tp: 1,
            adapters: None,
            experts: None,
            expert_tp: 1,
        };
        Self::build_range(cfg, p, at, experts)
    }

    pub(crate) fn build_range(
        cfg: &ModelConfig,
        p: Path,
        at: LayerPlace<'_>,
        range: Range<i64>,
    ) -> Result<Self, String> {
        let m = &cfg.moe;
        let h = cfg.hidden_size;
        if range.start < 0 || range.end > m.num_experts || range.is_empty() {
            return Err(format!(
                "experts {range:?} are not a range of the model's {}",
                m.num_experts
            ));
        }
        let (router, biased) = (Self::router_name(cfg), cfg.expert_style().biased());
        let gate = at.linear(
            &p / router,
            &format!("mlp.{router}"),
            (h, m.num_experts, biased),
            Split::Whole,
        )?;
        let first = range.start;
        // Experts stored fused are parameters, not linear modules, in transformers: PEFT
        // cannot adapt them, so neither does verlc.
        let fused = super::fused_experts::FusedExperts::of(cfg).is_some();
        let expert_at = LayerPlace {
            tp: at.expert_tp,
            adapters: at.adapters.filter(|_| !fused),
            ..at
        };
        let act = if biased {
            Activation::ClampedSwiglu {
                limit: cfg.swiglu_limit(),
            }
        } else {
            Activation::Silu
        };
        let experts = range
            .map(|e| {
                let prefix = format!("mlp.experts.{e}");
                let dims = (h, m.moe_intermediate_size, biased);
                let mlp = Mlp::build(&p / "experts" / e, expert_at, &prefix, dims)?;
                Ok::<_, String>(mlp.with_activation(act))
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
            first,
            num_experts: m.num_experts,
            shared,
            top_k: m.num_experts_per_tok,
            norm_topk_prob: m.norm_topk_prob,
            ep: None,
            fp32_router: false,
        })
    }

    /// The router's module name: `router` for biased experts, else `gate`.
    pub fn router_name(cfg: &ModelConfig) -> &'static str {
        if cfg.expert_style().biased() {
            "router"
        } else {
            "gate"
        }
    }

    /// Splits the experts over `group`: this rank must hold range `rank * E/size..` of equal
    /// size `E/size` ([`SparseMoe::standalone`]). The group must outlive the block's graphs.
    pub fn set_expert_group(&mut self, group: SharedRankGroup) -> Result<(), String> {
        let local = self.experts.len() as i64;
        let (size, rank) = (group.size() as i64, group.rank() as i64);
        if local * size != self.num_experts || self.first != rank * local {
            return Err(format!(
                "rank {rank} of {size} holds experts {}..{} of {}: expert parallelism needs range {}..{}",
                self.first,
                self.first + local,
                self.num_experts,
                rank * self.num_experts / size.max(1),
                (rank + 1) * self.num_experts / size.max(1),
            ));
        }
        self.ep = (size > 1).then_some(group);
        Ok(())
    }

    /// Whether the experts are split over a tensor-parallel group (their `down_proj` by
    /// rows): then [`SparseMoe::try_partial`] is this rank's share of the output.
    pub fn is_split(&self) -> bool {
        self.experts.first().is_some_and(Mlp::is_split)
    }

    /// `x` (…, hidden) -> (…, hidden) on one rank that holds every expert (a block split over
    /// an expert-parallel group runs through [`SparseMoe::try_forward`], which exchanges
    /// tokens and can fail).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        debug_assert!(
            self.ep.is_none(),
            "an expert-parallel block takes try_forward"
        );
        self.combine(x, Mlp::forward)
    }

    /// `x` (…, hidden) -> (…, hidden), exchanged over the expert-parallel group when there is
    /// one (whose failure is the error).
    pub fn try_forward(&self, x: &Tensor) -> Result<Tensor, CollectiveError> {
        match &self.ep {
            Some(ep) => self.combine_parallel(x, ep.as_ref(), &Mlp::forward),
            None => Ok(self.combine(x, Mlp::forward)),
        }
    }

    /// This rank's partial output under tensor parallelism (every expert's row-split
    /// `down_proj` before the sum over the group): routing is computed on the replicated
    /// input alike on every rank, so the routed sum of partial outputs sums to the whole.
    /// The router's (and the shared-expert gate's) weight gradient is then partial per rank
    /// and summed over the group by the engine. With an expert-parallel group as well (its
    /// ranks share this rank's tensor-parallel rank), the tokens are exchanged as in
    /// [`SparseMoe::try_forward`] and each rank's experts give their partial outputs.
    pub fn try_partial(&self, x: &Tensor) -> Result<Tensor, CollectiveError> {
        match &self.ep {
            Some(ep) => self.combine_parallel(x, ep.as_ref(), &Mlp::partial),
            None => Ok(self.combine(x, Mlp::partial)),
        }
    }

    /// Computes the router's logits in fp32 (Megatron's `moe_router_dtype: fp32`): input and
    /// weight cast up, so bf16 runs route on fp32 scores.
    pub fn set_fp32_router(&mut self, on: bool) {
        self.fp32_router = on;
    }

    /// The router's logits `(tokens, experts)` of `flat` `(tokens, hidden)`.
    fn router_logits(&self, flat: &Tensor) -> Tensor {
        if self.fp32_router && flat.kind() != Kind::Float {
            let w = self.gate.weight.to_kind(Kind::Float);
            return flat.to_kind(Kind::Float).matmul(&w.tr());
        }
        self.gate.forward(flat)
    }

    /// This rank's share of the router's load-balancing loss and z-loss for `x` (…, hidden)
    /// over its real tokens (`valid`, 1 for real, the shape of `x` without hidden; `None`:
    /// all), as Megatron's `aux_loss` load balancing and `moe_z_loss_coeff` compute them,
    /// without their coefficients:
    /// - load balancing: `E / (k T²) Σ_e S_e C_e`, with `S_e` this rank's sum of the fp32
    ///   softmax of expert `e` over its tokens, `C_e` the tokens that chose `e` among their
    ///   top-k and `T` the tokens, both counted over the `group` (the context-parallel ranks
    ///   that split the sequences; `None`: this rank's tokens only), so the shares of the
    ///   group sum to the loss of all its tokens and its gradient is their sum;
    /// - z-loss: `Σ logsumexp(logits)² / T` over this rank's tokens, shared the same way.
    ///
    /// Counts are not differentiable (as in Megatron); both terms are differentiable in the
    /// router's scores.
    pub fn router_losses(
        &self,
        x: &Tensor,
        valid: Option<&Tensor>,
        group: Option<&dyn RankGroup>,
    ) -> Result<(Tensor, Tensor), CollectiveError> {
        let bad = |e: tch::TchError| CollectiveError(e.to_string());
        let hidden = x.size().last().copied().unwrap_or(0);
        let flat = x.reshape([-1, hidden]);
        let logits = self.router_logits(&flat).to_kind(Kind::Float);
        let real = match valid {
            Some(v) => v.reshape([-1]).to_kind(Kind::Float),
            None => Tensor::ones([flat.size()[0]], (Kind::Float, x.device())),
        };
        let probs = logits.softmax(-1, Kind::Float);
        let (_, chosen) = probs.topk(self.top_k, -1, true, true);
        let picks = Tensor::zeros_like(&probs).scatter_value(-1, &chosen, 1.0) * real.unsqueeze(-1);
        // [C_1..C_E, T], summed over the group.
        let counts = Tensor::cat(
            &[
                picks.sum_dim_intlist(0, false, Kind::Float),
                real.sum(Kind::Float).reshape([1]),
            ],
            0,
        )
        .detach()
        .contiguous();
        if let Some(g) = group.filter(|g| g.size() > 1) {
            g.sum_in_place(&counts)?;
        }
        let total = counts.f_get(self.num_experts).map_err(bad)?.clamp_min(1.0);
        let c = counts.narrow(0, 0, self.num_experts);
        let s = (&probs * real.unsqueeze(-1)).sum_dim_intlist(0, false, Kind::Float);
        let balance = (s * c).sum(Kind::Float) * (self.num_experts as f64 / self.top_k as f64)
            / total.square();
        let lse = logits.logsumexp([-1], false);
        let z = (lse.square() * &real).sum(Kind::Float) / total;
        Ok((balance, z))
    }

    /// Each token's routing: its top-k weights (renormalised when `norm_topk_prob`) in `x`'s
    /// kind, and the experts chosen, flattened to one (token, choice) pair per row.
    fn route(&self, flat: &Tensor) -> (Tensor, Tensor) {
        let probs = self.router_logits(flat).softmax(-1, Kind::Float);
        let (mut weights, chosen) = probs.topk(self.top_k, -1, true, true);
        if self.norm_topk_prob {
            weights = &weights / weights.sum_dim_intlist(-1, true, Kind::Float);
        }
        (weights.to_kind(flat.kind()), chosen.reshape([-1]))
    }

    /// Pair j is token j / k's (j % k)-th choice; sorting the pairs by expert makes each
    /// expert's tokens one block. Returns the order and each sorted pair's token.
    fn sort_pairs(&self, chosen: &Tensor) -> (Tensor, Tensor) {
        let order = chosen.argsort_stable(true, 0, false);
        let tokens = order.floor_divide_scalar(self.top_k);
        (order, tokens)
    }

    /// The routed experts' part of the block from each sorted pair's expert output: weighted
    /// and summed per token (`flat`'s rows).
    fn weigh(
        flat: &Tensor,
        (order, tokens): (&Tensor, &Tensor),
        weights: &Tensor,
        expert_out: &Tensor,
    ) -> Tensor {
        let pair_weights = weights.reshape([-1]).index_select(0, order).unsqueeze(-1);
        flat.zeros_like()
            .index_add(0, tokens, &(expert_out * pair_weights))
    }

    /// `routed` plus the shared expert on `flat` (its output given by `expert_fn`), if any.
    fn with_shared(
        &self,
        flat: &Tensor,
        routed: Tensor,
        expert_fn: impl Fn(&Mlp, &Tensor) -> Tensor,
    ) -> Tensor {
        match &self.shared {
            Some((mlp, gate)) => routed + gate.forward(flat).sigmoid() * expert_fn(mlp, flat),
            None => routed,
        }
    }

    /// The experts on their blocks of `rows` (`sizes[e]` rows each, in expert order).
    fn run_experts(
        &self,
        rows: &Tensor,
        sizes: &[i64],
        expert_fn: &impl Fn(&Mlp, &Tensor) -> Tensor,
    ) -> Tensor {
        let mut outputs = Vec::with_capacity(self.experts.len());
        let mut start = 0;
        for (mlp, &n) in self.experts.iter().zip(sizes) {
            if n > 0 {
                outputs.push(expert_fn(mlp, &rows.narrow(0, start, n)));
                start += n;
            }
        }
        if outputs.is_empty() {
            rows.zeros_like()
        } else {
            Tensor::cat(&outputs, 0)
        }
    }

    /// The block with each expert's output given by `expert`, every expert on this rank.
    fn combine(&self, x: &Tensor, expert_fn: impl Fn(&Mlp, &Tensor) -> Tensor) -> Tensor {
        let shape = x.size();
        let hidden = shape.last().copied().unwrap_or(0);
        let flat = x.reshape([-1, hidden]);
        if flat.size()[0] == 0 {
            return x.zeros_like();
        }
        let routed = self.routed(&flat, &expert_fn);
        self.with_shared(&flat, routed, expert_fn).reshape(shape)
    }

    /// The routed experts' part of the block on `flat` (tokens, hidden), every expert on
    /// this rank.
    fn routed(&self, flat: &Tensor, expert_fn: &impl Fn(&Mlp, &Tensor) -> Tensor) -> Tensor {
        let (weights, chosen) = self.route(flat);
        let (order, tokens) = self.sort_pairs(&chosen);
        let rows = flat.index_select(0, &tokens);
        let counts = chosen.bincount::<Tensor>(None, self.num_experts);
        let counts = Vec::<i64>::try_from(&counts).unwrap_or_default();
        let expert_out = self.run_experts(&rows, &counts, expert_fn);
        Self::weigh(flat, (&order, &tokens), &weights, &expert_out)
    }

    /// The block under expert parallelism (see the module's doc). Every rank of the group
    /// must call it (a rank without tokens too: it still serves the others).
    fn combine_parallel(
        &self,
        x: &Tensor,
        ep: &dyn RankGroup,
        expert_fn: &impl Fn(&Mlp, &Tensor) -> Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let shape = x.size();
        let hidden = shape.last().copied().unwrap_or(0);
        let flat = x.reshape([-1, hidden]);
        let routed = self.routed_parallel(&flat, ep, expert_fn)?;
        Ok(self.with_shared(&flat, routed, expert_fn).reshape(shape))
    }

    /// This rank's share of the block when the tokens `x` (…, hidden), the same on every rank
    /// of a tensor-parallel group of `size`, meet whole experts (Megatron's expert tensor
    /// parallelism 1): the tokens split into `size` consecutive runs, this rank (`rank`)
    /// routes its run to its experts (through the expert-parallel group's exchange when there
    /// is one; every rank of it must call) and places their output at those tokens, zeros
    /// elsewhere; a shared expert split over the group adds its partial output on every
    /// token. The sum over the group is the block's output. The experts' and the router's
    /// weight gradients are then this rank's tokens' (summed over the group, or over the
    /// ranks that hold the same experts, by the engine).
    pub fn try_share(&self, x: &Tensor, rank: i64, size: i64) -> Result<Tensor, CollectiveError> {
        let shape = x.size();
        let hidden = shape.last().copied().unwrap_or(0);
        let flat = x.reshape([-1, hidden]);
        let n = flat.size()[0];
        let (start, end) = (n * rank / size.max(1), n * (rank + 1) / size.max(1));
        let mine = flat.narrow(0, start, end - start);
        let routed = match &self.ep {
            Some(ep) => self.routed_parallel(&mine, ep.as_ref(), &Mlp::forward)?,
            None if end > start => self.routed(&mine, &Mlp::forward),
            None => mine.zeros_like(),
        };
        let zeros = |rows: i64| Tensor::zeros([rows, hidden], (flat.kind(), flat.device()));
        let placed = Tensor::cat(&[zeros(start), routed, zeros(n - end)], 0);
        Ok(self.with_shared(&flat, placed, Mlp::partial).reshape(shape))
    }

    /// The routed experts' part of the block on this rank's `flat` (tokens, hidden) under
    /// expert parallelism.
    fn routed_parallel(
        &self,
        flat: &Tensor,
        ep: &dyn RankGroup,
        expert_fn: &impl Fn(&Mlp, &Tensor) -> Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let bad = |e: tch::TchError| CollectiveError(e.to_string());
        let device = flat.device();
        let (weights, chosen) = self.route(flat);
        let (order, tokens) = self.sort_pairs(&chosen);
        let rows = flat.index_select(0, &tokens);
        // Pairs per expert on every rank of the group: what each sends and receives.
        let counts = chosen
            .bincount::<Tensor>(None, self.num_experts)
            .to_kind(Kind::Int64)
            .contiguous();
        let size = ep.size();
        let all = Tensor::zeros([size as i64, self.num_experts], (Kind::Int64, device));
        ep.all_gather_into(&all, &counts)?;
        let all = Vec::<Vec<i64>>::try_from(&all).map_err(bad)?;
        let local = self.experts.len();
        let me = ep.rank();
        let to = |src: &[i64], rank: usize| -> i64 {
            src[rank * local..(rank + 1) * local].iter().sum()
        };
        let send: Vec<i64> = (0..size).map(|r| to(&all[me], r)).collect();
        let recv: Vec<i64> = (0..size).map(|s| to(&all[s], me)).collect();
        let received = ep.all_to_all_rows(&rows, &send, &recv)?;
        // Received: per source rank, its pairs for this rank's experts in expert order.
        // Regroup them by expert, run each expert once, and put the rows back in place.
        let mut starts = Vec::with_capacity(size);
        let mut at = 0;
        for &n in &recv {
            starts.push(at);
            at += n;
        }
        let mut index: Vec<i64> = Vec::with_capacity(at as usize);
        let mut sizes = Vec::with_capacity(local);
        let mine = me * local;
        for e in 0..local {
            let mut n = 0;
            for (s, src) in all.iter().enumerate() {
                let before: i64 = src[mine..mine + e].iter().sum();
                let count = src[mine + e];
                index.extend(starts[s] + before..starts[s] + before + count);
                n += count;
            }
            sizes.push(n);
        }
        let index = Tensor::from_slice(&index).to_device(device);
        let grouped = received.index_select(0, &index);
        let done = self.run_experts(&grouped, &sizes, expert_fn);
        let in_place = done.zeros_like().index_add(0, &index, &done);
        let expert_out = ep.all_to_all_rows(&in_place, &recv, &send)?;
        Ok(Self::weigh(flat, (&order, &tokens), &weights, &expert_out))
    }
}

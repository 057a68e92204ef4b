//! Expert parallelism at the block (2 Gloo ranks): a Qwen3-MoE sparse block whose 4 experts
//! are split 2 and 2 over the ranks, each rank routing its own (uneven, or no) tokens through
//! the all-to-all exchange, gives the outputs, input gradients, router gradients and expert
//! gradients of the whole block in one process (experts' gradients holding both ranks'
//! tokens' contributions, the router's its own rank's).

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use verlc_runtime::model::moe::SparseMoe;
use verlc_runtime::parallel::dist::ProcessGroup;

use crate::rank_test;
use crate::support::{max_diff, tiny_moe_config, tiny_qwen3_5_config};

const TOL: f64 = 1e-5;

/// Tokens of rank `rank` in round `round`, the same on every rank that computes them.
fn tokens(rank: usize, round: usize, hidden: i64) -> Tensor {
    let n = [[5, 7], [6, 0]][round][rank];
    tch::manual_seed(100 + (10 * round + rank) as i64);
    Tensor::randn([n, hidden], (Kind::Float, Device::Cpu))
}

/// A fixed projection of the output, so each rank's loss weighs its tokens differently.
fn loss(y: &Tensor, rank: usize, round: usize) -> Tensor {
    tch::manual_seed(200 + (10 * round + rank) as i64);
    let w = Tensor::randn(y.size(), (Kind::Float, Device::Cpu));
    (y * w).sum(Kind::Float)
}

fn seeded_block(experts: std::ops::Range<i64>) -> (VarStore, SparseMoe) {
    let cfg = tiny_moe_config();
    let vs = VarStore::new(Device::Cpu);
    let block = SparseMoe::standalone(&cfg, vs.root(), 0, experts).expect("block");
    // Every parameter from a stream of its own name: the same values on both sides.
    for (name, mut t) in vs.variables() {
        let seed = name
            .bytes()
            .fold(7i64, |h, b| h.wrapping_mul(31).wrapping_add(b as i64));
        tch::manual_seed(seed);
        tch::no_grad(|| {
            t.copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.2));
        });
        let _ = t.set_requires_grad(true);
    }
    (vs, block)
}

fn grads(vs: &VarStore) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| {
            let g = t.grad();
            // No gradient yet (nothing reached it): zero.
            let g = if g.defined() {
                g.copy()
            } else {
                t.zeros_like()
            };
            (n, g)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

rank_test!(expert_parallel_block_matches_one_process, 2, |world| {
    let rank = world.rank();
    let hidden = tiny_moe_config().hidden_size;
    let (ep_vs, mut ep_block) = seeded_block(2 * rank as i64..2 * rank as i64 + 2);
    ep_block
        .set_expert_group(std::sync::Arc::new(world.clone()))
        .expect("expert group");
    // A rank's range must be its own share.
    let (_, mut wrong) = seeded_block(0..2);
    if rank == 1 {
        assert!(
            wrong
                .set_expert_group(std::sync::Arc::new(world.clone()))
                .is_err()
        );
    }
    for round in 0..2 {
        for (_, mut t) in ep_vs.variables() {
            t.zero_grad();
        }
        // Expert parallel: this rank's tokens.
        let x = tokens(rank, round, hidden).set_requires_grad(true);
        let y = ep_block.try_forward(&x).expect("exchange");
        loss(&y, rank, round).backward();
        let ep_grads = grads(&ep_vs);

        // One process, every expert: this rank's loss alone (outputs, input and router
        // gradients), and both ranks' losses (expert gradients).
        let (full_vs, full) = seeded_block(0..4);
        let x_ref = tokens(rank, round, hidden).set_requires_grad(true);
        let y_ref = full.forward(&x_ref);
        assert_eq!(y.size(), y_ref.size());
        if y.numel() > 0 {
            assert!(max_diff(&y, &y_ref) < TOL, "round {round}: outputs differ");
        }
        // (A rank without tokens has no loss to back-propagate in one process; in the
        // expert-parallel run it still joins the exchange, forward and backward.)
        if x.numel() > 0 {
            loss(&y_ref, rank, round).backward();
            assert!(
                max_diff(&x.grad(), &x_ref.grad()) < TOL,
                "round {round}: input grads"
            );
        }
        let own = grads(&full_vs);
        let other = tokens(1 - rank, round, hidden);
        if other.numel() > 0 {
            loss(&full.forward(&other), 1 - rank, round).backward();
        }
        let both = grads(&full_vs);
        for (name, g) in &ep_grads {
            let (reference, what) = if name.starts_with("gate.") {
                (&own, "its own tokens")
            } else {
                (&both, "both ranks' tokens")
            };
            let want = &reference
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name} is not a parameter of the whole block"))
                .1;
            let d = max_diff(g, want);
            assert!(d < TOL, "round {round}, {name} (from {what}): {d}");
        }
        // Experts held: this rank's two, by their global names.
        let held: Vec<&str> = ep_grads
            .iter()
            .filter(|(n, _)| n.ends_with("down_proj.weight"))
            .map(|(n, _)| n.as_str())
            .collect();
        let first = 2 * rank;
        assert_eq!(
            held,
            vec![
                format!("experts.{first}.down_proj.weight"),
                format!("experts.{}.down_proj.weight", first + 1)
            ]
        );
    }
});

// The Megatron module with expert parallelism 2 over 2 data-parallel ranks (each holds 2 of
// the 4 experts; tokens reach their experts through the exchange; expert gradients averaged
// as dense ones are): 20 steps, every one clipped (below the gradients' norm), follow the
// single-process model and optimizer, loss by loss and grad norm by grad norm (the norm counts
// every expert once), and the gathered final weights (every expert, from its rank) match.
// With the replicated optimizer, then the distributed one (the experts' state in a buffer of
// their own; with EP = DP each rank owns its experts' state whole).
rank_test!(
    megatron_module_with_expert_parallelism_matches_one_process,
    2,
    |world| {
        let cases = [
            ((1, 1, 1), SPLIT_EP2, false, false),
            ((1, 1, 1), SPLIT_EP2, false, true),
        ];
        moe_cases(&world, &tiny_moe_config(), &cases);
    }
);

// Tensor parallel 2 x expert parallel 2 on 4 ranks (2 data-parallel ranks of 2 tensor ranks):
// each expert's weights split over TP as dense MLPs are, the experts split over the EP group
// of each tensor rank; tokens exchanged among the ranks of one tensor rank, their partial
// outputs reduced over TP after the exchange back; with sequence parallelism and the
// distributed optimizer (without either: the 4-rank trainer test, trainer/distributed.rs).
// Then EP 2 over 4 data-parallel ranks with the distributed optimizer: the experts' state
// sharded over the 2 ranks that hold the same experts, the dense state over all 4; and EP 2 on
// each of 2 pipeline stages (each stage's experts split over its 2 data-parallel ranks).
rank_test!(
    megatron_module_with_tensor_and_expert_parallelism_matches_one_process,
    4,
    |world| {
        let cases = [
            ((2, 1, 1), SPLIT_EP2, true, true),
            ((1, 1, 1), SPLIT_EP2, false, true),
            ((1, 1, 2), SPLIT_EP2, false, true),
        ];
        moe_cases(&world, &tiny_moe_config(), &cases);
    }
);

// Whole experts under tensor parallel 2 (Megatron's `expert_tensor_parallel_size: 1`, verl's
// MoE examples' layout), on 2 ranks: with expert parallel 2 the experts split over the tensor
// group itself (each tensor rank routes its half of the tokens, exchanged with the other),
// with sequence parallelism and either optimizer; with expert parallel 1 every rank holds
// every expert whole, its share of the tokens' gradient summed over TP (without sequence
// parallelism, the replicated optimizer; with both, the distributed one). Then a Qwen3.5-MoE
// with whole experts under TP 2 and with expert parallel 2 over data-parallel ranks.
rank_test!(
    megatron_module_with_whole_experts_under_tensor_parallelism_matches_one_process,
    2,
    |world| {
        let cases = [
            ((2, 1, 1), WHOLE_EP2, true, false),
            ((2, 1, 1), WHOLE_EP2, true, true),
            ((2, 1, 1), WHOLE_EP1, false, false),
            ((2, 1, 1), WHOLE_EP1, true, true),
        ];
        moe_cases(&world, &tiny_moe_config(), &cases);
        // Qwen3.5-MoE: Gated DeltaNet layers split by heads, whole experts over the tensor
        // group, the shared expert split like a dense MLP.
        let cases = [
            ((2, 1, 1), WHOLE_EP2, true, true),
            ((1, 1, 1), SPLIT_EP2, false, false),
        ];
        moe_cases(&world, &tiny_qwen3_5_config(true), &cases);
        // gpt-oss: heads split with their sinks, a sliding-window layer and a full one, the
        // biased router's gradient summed over TP, whole biased experts over the tensor group
        // (with expert parallel 2 and with 1); and on one tensor rank, pipeline parallel 2.
        let uri = "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&arch=gpt_oss&experts=4&experts_per_tok=2&moe_intermediate=16&window=4";
        let uri = verlc_runtime::builtin_uri::BuiltinUri::parse(uri)
            .unwrap()
            .unwrap();
        let mut gpt_oss = verlc_runtime::model::builtin::config(&uri).unwrap();
        gpt_oss.tie_word_embeddings = false;
        gpt_oss.extra.remove("pad_token_id");
        assert!(gpt_oss.attention_sinks() && gpt_oss.attention_window(0).is_some());
        let cases = [
            ((2, 1, 1), WHOLE_EP2, true, true),
            ((2, 1, 1), WHOLE_EP1, false, false),
            ((1, 1, 2), WHOLE_EP1, false, false),
        ];
        moe_cases(&world, &gpt_oss, &cases);
    }
);

// Whole experts on 4 ranks: TP 2 x DP 2 with EP 2 (each tensor group one expert-parallel
// group; the ranks two apart hold the same experts) and EP 4 (one group over both data-parallel
// replicas), with the distributed optimizer; and TP 2 x PP 2 with EP 2 and the replicated one.
rank_test!(
    megatron_module_with_whole_experts_over_tensor_and_data_ranks_matches_one_process,
    4,
    |world| {
        let cases = [
            ((2, 1, 1), WHOLE_EP2, true, true),
            ((2, 1, 1), Experts { ep: 4, whole: true }, true, true),
            ((2, 1, 2), WHOLE_EP2, true, false),
        ];
        moe_cases(&world, &tiny_moe_config(), &cases);
    }
);

// Expert parallelism with context parallelism (Megatron folds the context ranks into the
// expert grid): on 2 ranks, CP 2 with EP 2 over the context group (each rank routes its
// positions' tokens to the other's experts), with either optimizer; the context ranks' sum of
// gradients leaves the experts out (each holds others).
rank_test!(
    megatron_module_with_expert_and_context_parallelism_matches_one_process,
    2,
    |world| {
        let cases = [
            ((1, 2, 1), SPLIT_EP2, false, false),
            ((1, 2, 1), SPLIT_EP2, false, true),
        ];
        moe_cases(&world, &tiny_moe_config(), &cases);
    }
);

// On 4 ranks, TP 2 x CP 2: whole experts over EP 2 (the tensor group) with sequence
// parallelism and the distributed optimizer, and experts split over TP with EP 2 over the
// context ranks, the replicated optimizer.
rank_test!(
    megatron_module_with_tensor_expert_and_context_parallelism_matches_one_process,
    4,
    |world| {
        let cases = [
            ((2, 2, 1), WHOLE_EP2, true, true),
            ((2, 2, 1), SPLIT_EP2, true, false),
        ];
        moe_cases(&world, &tiny_moe_config(), &cases);
    }
);

/// One layout of [`ep_module_matches_one_process`]: (tensor, context, pipeline) parallel
/// sizes, the experts' placement, sequence parallelism, the distributed optimizer.
type Case = ((usize, usize, usize), Experts, bool, bool);

fn moe_cases(world: &ProcessGroup, cfg: &verlc_runtime::model::ModelConfig, cases: &[Case]) {
    for &(grid, experts, sequence_parallel, distributed) in cases {
        ep_module_matches_one_process(world, cfg, grid, experts, sequence_parallel, distributed);
    }
}

/// How the test lays out the experts: expert parallel `ep`, each expert split over TP or
/// `whole` (expert tensor parallel 1).
#[derive(Clone, Copy)]
struct Experts {
    ep: usize,
    whole: bool,
}

const SPLIT_EP2: Experts = Experts {
    ep: 2,
    whole: false,
};
const WHOLE_EP2: Experts = Experts { ep: 2, whole: true };
const WHOLE_EP1: Experts = Experts { ep: 1, whole: true };

/// The experts laid out as `experts` over the ranks left by tensor parallel `tp` and pipeline
/// parallel `pp` on `world`, with the distributed optimizer or the replicated one.
fn ep_module_matches_one_process(
    world: &ProcessGroup,
    cfg: &verlc_runtime::model::ModelConfig,
    (tp, cp, pp): (usize, usize, usize),
    experts: Experts,
    sequence_parallel: bool,
    distributed: bool,
) {
    use verlc_runtime::engine::megatron::{HeadKind, MegatronModule, ParallelSettings};
    use verlc_runtime::optim::LossScaling;
    use verlc_runtime::parallel::layout::{ProcessGroups, RankLayout};

    use crate::parity::{LEN, LOCKSTEP_STEPS, Parallel, ROWS};
    use crate::support::{Reference, Setup, full_weights, lockstep, make_groups, reference_model};

    let cfg = cfg.clone();
    let mut setup = Setup::fp32();
    setup.optim.clip_grad = 0.05;
    let dp = world.size() / (tp * cp * pp);
    let layout = RankLayout::megatron(tp, cp, pp, dp).unwrap();
    let groups = ProcessGroups::with_experts(world, &layout, experts.ep, !experts.whole).unwrap();
    let ep_rank = groups.experts.as_ref().map_or(0, |e| e.ep.rank());
    let mut m = MegatronModule::with_sequence_parallel(
        &cfg,
        HeadKind::CausalLm,
        Some(groups),
        Device::Cpu,
        Kind::Float,
        sequence_parallel,
    )
    .unwrap();
    // The first layer of this rank's pipeline stage.
    let layer = m.model.stage.layers.start;
    let local: Vec<(String, Vec<i64>)> = m
        .model
        .params()
        .into_iter()
        .filter(|p| {
            p.name
                .starts_with(&format!("model.layers.{layer}.mlp.experts."))
                && p.name.ends_with("down_proj.weight")
        })
        .map(|p| (p.name, p.tensor.size()))
        .collect();
    // 4 / EP experts per rank, each down_proj (hidden, moe_intermediate) split by rows over
    // TP, or whole.
    let per_rank = 4 / experts.ep as i64;
    let first = per_rank * ep_rank as i64;
    let width = if experts.whole {
        cfg.moe.moe_intermediate_size
    } else {
        cfg.moe.moe_intermediate_size / tp as i64
    };
    let expected: Vec<(String, Vec<i64>)> = (first..first + per_rank)
        .map(|e| {
            (
                format!("model.layers.{layer}.mlp.experts.{e}.down_proj.weight"),
                vec![cfg.hidden_size, width],
            )
        })
        .collect();
    assert_eq!(local, expected);
    let (vs, _) = reference_model(&cfg, Kind::Float);
    m.load_full(&full_weights(&vs)).unwrap();
    m.build_optimizer(
        setup.optim,
        make_groups,
        ParallelSettings {
            use_distributed_optimizer: distributed,
            ..Default::default()
        },
        LossScaling::LINKED,
    )
    .unwrap();
    if distributed {
        let Some(verlc_runtime::engine::megatron::ModuleOptimizer::Distributed(o)) = m.optimizer()
        else {
            panic!("expected the distributed optimizer");
        };
        // Expert state is held once per expert-DP group, dense state once per DP group.
        let owned = o.owned_main_params();
        let expert_numel: usize = owned
            .iter()
            .filter(|(n, ..)| n.contains(".mlp.experts."))
            .map(|(_, r, _)| r.len())
            .sum();
        let local_expert_numel: usize = m
            .model
            .params()
            .iter()
            .filter(|p| p.name.contains(".mlp.experts."))
            .map(|p| p.tensor.numel())
            .sum();
        // The ranks that hold the same experts (with whole experts and no expert
        // parallelism, experts are dense parameters, sharded over DP x CP).
        let expert_dp = match (experts.whole, experts.ep) {
            (true, 1) => cp * dp,
            (true, ep) => tp * cp * dp / ep,
            (false, ep) => cp * dp / ep,
        };
        assert!(
            expert_numel * expert_dp <= local_expert_numel + 64 * expert_dp,
            "{expert_numel} expert elements owned of {local_expert_numel} over {expert_dp}"
        );
    }

    // In lockstep with one process; the norm the clipping used counts every expert once.
    let mut reference = Reference::new(&cfg, ROWS, LEN, &setup);
    let mut parallel = Parallel::new(world, &mut m, &cfg, tp * cp, 1);
    let t = lockstep(&mut reference, &mut parallel, LOCKSTEP_STEPS, 1e-5);
    assert!(
        t.norms.iter().all(|n| *n > setup.optim.clip_grad),
        "every step is clipped: {:?}",
        t.norms
    );
    assert!(
        t.losses[LOCKSTEP_STEPS - 1] < t.losses[0] * 0.9,
        "{:?}",
        t.losses
    );
}

//! The rollout at another tensor parallel size than training's (verl's
//! `rollout.tensor_model_parallel_size`): smaller (the replicas of one training TP group split
//! its prompts) and larger (one replica spans data-parallel ranks), with pipeline stages and
//! with parameter offload. Each rank's rollout generates what the whole model generates for
//! that rank's prompts and seed: the same tokens, masks and positions, the same log-probs.
use verlc_runtime::engine::megatron::MegatronEngine;
use verlc_runtime::model::CausalLm;
use verlc_runtime::parallel::dist::ProcessGroup;

use crate::engine::{assert_rollout_matches, engine_settings, megatron_settings};
use crate::rank_test;

/// A fresh engine at `(tp, pp, dp)` checked with its rollout at TP `rollout_tp`.
fn check(world: &ProcessGroup, dims: (usize, usize, usize), rollout_tp: usize, offload: bool) {
    let settings = megatron_settings(Some(world), dims, false, offload);
    let mut mega = MegatronEngine::<CausalLm>::new(engine_settings(), settings).unwrap();
    let full = verlc_runtime::engine::Engine::per_tensor_params(&mega).unwrap();
    assert_rollout_matches(&mut mega, &full, Some(rollout_tp));
}

rank_test!(rollout_tp_other_than_training_on_2_ranks, 2, |world| {
    // TP 2 -> rollout TP 1: two replicas, each with half of the prompts.
    check(&world, (2, 1, 1), 1, false);
    // The same with the parameters parked in host memory while the rollout generates.
    check(&world, (2, 1, 1), 1, true);
    // DP 2 -> rollout TP 2: one replica generates both ranks' prompts.
    check(&world, (1, 1, 2), 2, false);
});

rank_test!(rollout_tp_other_than_training_on_4_ranks, 4, |world| {
    // With pipeline stages: each stage reshards its own layers.
    check(&world, (2, 2, 1), 1, false);
    check(&world, (1, 2, 2), 2, false);
    // TP 2 x DP 2 -> rollout TP 1: four replicas.
    check(&world, (2, 1, 2), 1, false);
});

//! The router's load-balancing and z-losses (Megatron's `aux_loss` load balancing and
//! `moe_z_loss_coeff`, added to the gradient only) on a Qwen3-MoE: under context parallelism 2
//! and under tensor parallelism 2 with sequence parallelism, training follows the one-process
//! module step by step in lockstep (losses, grad norms, updated weights), and the losses move
//! the weights (the run without them ends elsewhere).
use tch::{Device, Kind, Tensor};
use verlc_runtime::engine::megatron::{HeadKind, MegatronModule, ParallelSettings};
use verlc_runtime::model::moe::RouterLossCoeffs;
use verlc_runtime::optim::LossScaling;
use verlc_runtime::parallel::dist::ProcessGroup;
use verlc_runtime::parallel::layout::{ProcessGroups, RankLayout};

use crate::parity::{LOCKSTEP_STEPS, Parallel, train_steps};
use crate::rank_test;
use crate::support::{
    Setup, full_weights, lockstep, make_groups, max_diff, reference_model, tiny_moe_config,
};

const COEFFS: RouterLossCoeffs = RouterLossCoeffs {
    load_balancing: 0.5,
    z: 0.05,
};

/// The Qwen3-MoE module of `layout` (`None`: one process) over `world` with the router's
/// losses `coeffs`, its optimizer built, and how many ranks compute each of its losses.
fn module(
    world: &ProcessGroup,
    layout: Option<RankLayout>,
    sequence_parallel: bool,
    coeffs: RouterLossCoeffs,
) -> (MegatronModule, usize) {
    let cfg = tiny_moe_config();
    let setup = Setup::fp32();
    let copies = layout
        .as_ref()
        .map_or(world.size(), |l| l.size("tp") * l.size("cp"));
    let groups = layout.map(|l| ProcessGroups::new(world, &l).unwrap());
    let mut m = MegatronModule::with_sequence_parallel(
        &cfg,
        HeadKind::CausalLm,
        groups,
        Device::Cpu,
        Kind::Float,
        sequence_parallel,
    )
    .unwrap();
    m.model.set_router(coeffs, false);
    let (vs, _) = reference_model(&cfg, Kind::Float);
    m.load_full(&full_weights(&vs)).unwrap();
    m.build_optimizer(
        setup.optim,
        make_groups,
        ParallelSettings::default(),
        LossScaling::LINKED,
    )
    .unwrap();
    (m, copies)
}

/// The final weights of [`STEPS`] free-running steps in one process.
fn one_process_weights(world: &ProcessGroup, coeffs: RouterLossCoeffs) -> Vec<(String, Tensor)> {
    let (mut m, copies) = module(world, None, false, coeffs);
    train_steps(world, &mut m, &tiny_moe_config(), copies, 2);
    m.full_params().unwrap()
}

rank_test!(
    router_losses_follow_one_process_under_cp_and_tp,
    2,
    |world| {
        let with = one_process_weights(&world, COEFFS);
        let without = one_process_weights(&world, RouterLossCoeffs::default());
        let moved = with
            .iter()
            .filter(|(n, _)| n.ends_with("mlp.gate.weight"))
            .map(|(n, w)| max_diff(w, &without.iter().find(|(m, _)| m == n).unwrap().1))
            .fold(0.0, f64::max);
        assert!(
            moved > 1e-3,
            "the router losses do not move the router ({moved})"
        );
        let cfg = tiny_moe_config();
        for (what, (tp, cp), sp) in [
            ("CP=2", (1, 2), false),
            ("TP=2 with sequence parallelism", (2, 1), true),
        ] {
            let (mut one, one_copies) = module(&world, None, false, COEFFS);
            let layout = RankLayout::megatron(tp, cp, 1, 1).unwrap();
            let (mut m, copies) = module(&world, Some(layout), sp, COEFFS);
            let mut reference = Parallel::new(&world, &mut one, &cfg, one_copies, 2);
            let mut parallel = Parallel::new(&world, &mut m, &cfg, copies, 2);
            lockstep(&mut reference, &mut parallel, LOCKSTEP_STEPS, 1e-5);
            assert_eq!(
                m.router_values().len(),
                2 * 2,
                "{what}: one value per MoE layer (2) and micro-batch (2)"
            );
        }
    }
);

//! Vocab-parallel log-probs, entropy and cross-entropy equal the full-vocabulary computation,
//! values and gradients, on 2 ranks (vocabulary 37: the last rank's part is padded).
use tch::{Device, Kind, Tensor};
use verlc_runtime::logits::TokenStats;
use verlc_runtime::logits::logprob::{
    entropy_from_logits, log_probs_from_logits, sum_pi_squared_from_logits,
};
use verlc_runtime::model::tensor_parallel::ShardSpec;
use verlc_runtime::parallel::tp::shard::{gather_tensor, shard_tensor};
use verlc_runtime::parallel::tp::{
    VocabPartition, vocab_parallel_cross_entropy, vocab_parallel_log_probs,
};

use crate::rank_test;
use crate::support::max_diff;

/// This rank's vocabulary columns' gradient of `local` gathered into the whole `(b, t, v)`.
fn whole_grad(
    local: &Tensor,
    part: &VocabPartition,
    pg: &verlc_runtime::parallel::dist::ProcessGroup,
    [b, t, v]: [i64; 3],
) -> Tensor {
    let cols = local
        .grad()
        .view([-1, part.per_rank])
        .transpose(0, 1)
        .contiguous();
    gather_tensor(&cols, ShardSpec::Vocab, Some(pg), v)
        .unwrap()
        .transpose(0, 1)
        .reshape([b, t, v])
}

rank_test!(log_probs_and_entropy_equal_full_vocab, 2, |pg| {
    tch::manual_seed(3);
    let (b, t, v) = (3, 5, 37);
    let full = Tensor::randn([b, t, v], (Kind::Float, Device::Cpu)) * 3.0;
    let labels = Tensor::randint(v, [b, t], (Kind::Int64, Device::Cpu));
    let (w1, w2) = (
        Tensor::randn([b, t], (Kind::Float, Device::Cpu)),
        Tensor::randn([b, t], (Kind::Float, Device::Cpu)),
    );

    // Reference on the full logits.
    let full_leaf = full.detach().set_requires_grad(true);
    let lp = log_probs_from_logits(&full_leaf, &labels);
    let ent = entropy_from_logits(&full_leaf);
    (&lp * &w1 + &ent * &w2).sum(Kind::Float).backward();
    let full_grad = full_leaf.grad();

    let (rank, size) = (pg.rank() as i64, pg.size() as i64);
    let part = VocabPartition::new(v, rank, size).unwrap();
    assert_eq!((part.per_rank, part.padded), (19, 38));
    // This rank's columns of the logits, the last part padded (as the output layer makes them).
    let rows = full.view([-1, v]).transpose(0, 1);
    let local = shard_tensor(&rows, ShardSpec::Vocab, rank, size)
        .unwrap()
        .transpose(0, 1)
        .reshape([b, t, -1]);
    let local = local.detach().set_requires_grad(true);
    let stats = TokenStats {
        entropy: true,
        sum_pi_squared: true,
    };
    let out = vocab_parallel_log_probs(
        &local,
        &labels,
        &part,
        Some(&pg),
        stats,
        verlc_runtime::logits::topk::TopK::Off,
        None,
    )
    .unwrap();
    let entropy = out.entropy.as_ref().unwrap();
    // Σπ² from the split vocabulary equals the full softmax's.
    let sq = sum_pi_squared_from_logits(&full);
    let sq_split = out.sum_pi_squared.as_ref().unwrap();
    assert!(
        max_diff(sq_split, &sq) < 1e-6,
        "sum_pi_squared differs by {}",
        max_diff(sq_split, &sq)
    );
    assert!(
        max_diff(&out.log_probs, &lp) < 1e-5,
        "log-probs differ by {}",
        max_diff(&out.log_probs, &lp)
    );
    assert!(
        max_diff(entropy, &ent) < 1e-5,
        "entropy differs by {}",
        max_diff(entropy, &ent)
    );
    (&out.log_probs * &w1 + entropy * &w2)
        .sum(Kind::Float)
        .backward();
    // Each rank's gradient is exactly its slice of the full gradient (padding gets none).
    let grad = whole_grad(&local, &part, &pg, [b, t, v]);
    assert!(
        max_diff(&grad, &full_grad) < 1e-5,
        "grads differ by {}",
        max_diff(&grad, &full_grad)
    );
    let pad = local
        .grad()
        .narrow(-1, part.valid(), part.per_rank - part.valid());
    assert_eq!(pad.abs().sum(Kind::Float).double_value(&[]), 0.0);

    let ce = vocab_parallel_cross_entropy(&local.detach(), &labels, &part, Some(&pg)).unwrap();
    assert!(max_diff(&ce, &lp.neg()) < 1e-5);
});

// The top-k of the split vocabulary: a teacher's own top-k (ids and log-probs) and the
// student's top-k forward KL against it equal the whole-vocabulary computation (verl's FSDP
// form), values and gradients, with a clamp that bites; the masses are Megatron's (after the
// clamp), checked against the same formula on the whole vocabulary.
rank_test!(topk_equals_full_vocab, 2, |pg| {
    use verlc_runtime::algo::topk_kl::{MassAt, TopKKl, forward_kl_topk};
    use verlc_runtime::logits::topk::{TopK, TopKOutput, TopKTargets, topk_columns, topk_output};
    tch::manual_seed(4);
    let (b, t, v, k) = (3, 5, 37, 6);
    let clamp = Some(-3.0);
    let teacher_full = Tensor::randn([b, t, v], (Kind::Float, Device::Cpu)) * 3.0;
    let student_full = Tensor::randn([b, t, v], (Kind::Float, Device::Cpu)) * 2.0;
    let labels = Tensor::randint(v, [b, t], (Kind::Int64, Device::Cpu));
    let w = Tensor::rand([b, t], (Kind::Float, Device::Cpu));
    let (rank, size) = (pg.rank() as i64, pg.size() as i64);
    let part = VocabPartition::new(v, rank, size).unwrap();
    let split = |full: &Tensor| {
        let rows = full.view([-1, v]).transpose(0, 1);
        shard_tensor(&rows, ShardSpec::Vocab, rank, size)
            .unwrap()
            .transpose(0, 1)
            .reshape([b, t, -1])
    };
    let own = |cols: &Tensor| match topk_output(cols, TopK::Own(k)).unwrap() {
        Some(TopKOutput::Own(t)) => t,
        other => panic!("{other:?}"),
    };

    // The teacher's own top-k.
    let whole = own(&topk_columns(&teacher_full, TopK::Own(k), None)
        .unwrap()
        .unwrap());
    let out = vocab_parallel_log_probs(
        &split(&teacher_full),
        &labels,
        &part,
        Some(&pg),
        TokenStats::default(),
        TopK::Own(k),
        None,
    )
    .unwrap();
    let parallel = own(out.topk.as_ref().expect("top-k"));
    assert!(parallel.ids.equal(&whole.ids), "top-k ids differ");
    assert!(max_diff(&parallel.log_probs, &whole.log_probs) < 1e-5);

    // The student's KL against it.
    let asked = TopK::KlToTeacher {
        k,
        log_prob_min_clamp: clamp,
    };
    let full_leaf = student_full.detach().set_requires_grad(true);
    let ref_cols = topk_columns(&full_leaf, asked, Some(&whole))
        .unwrap()
        .unwrap();
    let reference = TopKKl::from_columns(&ref_cols).unwrap();
    (&reference.loss * &w).sum(Kind::Float).backward();
    let local = split(&student_full).detach().set_requires_grad(true);
    let out = vocab_parallel_log_probs(
        &local,
        &labels,
        &part,
        Some(&pg),
        TokenStats::default(),
        asked,
        Some(&TopKTargets {
            ids: whole.ids.shallow_clone(),
            log_probs: whole.log_probs.shallow_clone(),
        }),
    )
    .unwrap();
    let kl = TopKKl::from_columns(out.topk.as_ref().expect("top-k")).unwrap();
    for (name, ours, theirs) in [
        ("loss", &kl.loss, &reference.loss),
        ("overlap count", &kl.overlap_count, &reference.overlap_count),
        (
            "overlap advantage",
            &kl.overlap_advantage,
            &reference.overlap_advantage,
        ),
    ] {
        assert!(
            max_diff(ours, theirs) < 1e-5,
            "{name} differs by {}",
            max_diff(ours, theirs)
        );
    }
    assert!(reference.overlap_count.sum(Kind::Float).double_value(&[]) > 0.0);
    // Megatron's masses: the clamped lists' probabilities.
    let log_softmax = student_full.log_softmax(-1, Kind::Float);
    let after = forward_kl_topk(
        &log_softmax.gather(-1, &whole.ids, false),
        &whole.log_probs,
        &whole.ids,
        &log_softmax.topk(k, -1, true, true).1,
        clamp,
        MassAt::AfterClamp,
    )
    .unwrap();
    assert!(max_diff(&kl.student_mass, &after.student_mass) < 1e-5);
    assert!(max_diff(&kl.teacher_mass, &after.teacher_mass) < 1e-5);
    assert!(
        max_diff(&kl.teacher_mass, &reference.teacher_mass) > 1e-4,
        "the clamp must change the teacher's mass for this check to mean anything"
    );
    (&kl.loss * &w).sum(Kind::Float).backward();
    let grad = whole_grad(&local, &part, &pg, [b, t, v]);
    let full_grad = full_leaf.grad();
    assert!(
        max_diff(&grad, &full_grad) < 1e-5,
        "grads differ by {}",
        max_diff(&grad, &full_grad)
    );
    assert!(full_grad.abs().sum(Kind::Float).double_value(&[]) > 0.0);
});

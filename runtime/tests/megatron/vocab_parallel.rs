//! Vocab-parallel log-probs, entropy and cross-entropy equal the full-vocabulary computation,
//! values and gradients, on 2 ranks (vocabulary 37: the last rank's part is padded).
use runtime::rollout::TokenStats;
use runtime::rollout::logprob::{
    entropy_from_logits, log_probs_from_logits, sum_pi_squared_from_logits,
};
use runtime::tp::shard::{ShardSpec, gather_tensor, shard_tensor};
use runtime::tp::{VocabPartition, vocab_parallel_cross_entropy, vocab_parallel_log_probs};
use tch::{Device, Kind, Tensor};

use crate::rank_test;
use crate::support::max_diff;

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
    let out = vocab_parallel_log_probs(&local, &labels, &part, Some(&pg), stats).unwrap();
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
    let cols = local
        .grad()
        .view([-1, part.per_rank])
        .transpose(0, 1)
        .contiguous();
    let grad = gather_tensor(&cols, ShardSpec::Vocab, Some(&pg), v)
        .unwrap()
        .transpose(0, 1)
        .reshape([b, t, v]);
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

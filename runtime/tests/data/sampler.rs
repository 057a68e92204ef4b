//! Seeded epoch shuffling and a resumable sampler state.

use std::collections::BTreeSet;

use verlc_runtime::data::{BatchSampler, SamplerState};

#[test]
fn epochs_are_permutations_that_differ() {
    let mut s = BatchSampler::new(10, 3, true, 7, true).unwrap();
    assert_eq!(s.batches_per_epoch(), 3);
    let e0: Vec<usize> = (0..3).flat_map(|_| s.next_batch()).collect();
    assert_eq!(s.epoch(), 0);
    let e1: Vec<usize> = (0..3).flat_map(|_| s.next_batch()).collect();
    assert_eq!(s.epoch(), 1);
    assert_eq!(e0.len(), 9, "drop_last skips the tail");
    assert_eq!(e0.iter().collect::<BTreeSet<_>>().len(), 9);
    assert_ne!(e0, e1);
    let mut again = BatchSampler::new(10, 3, true, 7, true).unwrap();
    assert_eq!(
        (0..3).flat_map(|_| again.next_batch()).collect::<Vec<_>>(),
        e0,
        "seeded"
    );
}

#[test]
fn without_shuffle_in_order_and_keeps_tail() {
    let mut s = BatchSampler::new(5, 2, false, 0, false).unwrap();
    let got: Vec<Vec<usize>> = (0..4).map(|_| s.next_batch()).collect();
    assert_eq!(got, vec![vec![0, 1], vec![2, 3], vec![4], vec![0, 1]]);
}

#[test]
fn resumes_from_saved_state() {
    let mut s = BatchSampler::new(13, 4, true, 3, true).unwrap();
    for _ in 0..5 {
        s.next_batch();
    }
    let saved = serde_json::to_string(s.state()).unwrap();
    let expected: Vec<Vec<usize>> = (0..7).map(|_| s.next_batch()).collect();
    let state: SamplerState = serde_json::from_str(&saved).unwrap();
    let mut resumed = BatchSampler::resume(state.clone(), 13).unwrap();
    let got: Vec<Vec<usize>> = (0..7).map(|_| resumed.next_batch()).collect();
    assert_eq!(got, expected);
    let e = BatchSampler::resume(state, 12).unwrap_err().to_string();
    assert!(e.contains("13 samples") && e.contains("12"), "{e}");
    assert!(
        BatchSampler::new(3, 4, true, 0, true).is_err(),
        "no full batch"
    );
}

/// Refills (DAPO) take prompts past the step's batch in the same order, into the next epoch's
/// permutation, and the state a checkpoint saves continues from there.
#[test]
fn refills_continue_the_order_across_epochs() {
    let mut a = BatchSampler::new(10, 4, true, 7, true).unwrap();
    let mut b = BatchSampler::new(10, 4, true, 7, true).unwrap();
    // The order of two epochs, prompt by prompt.
    let epoch0: Vec<usize> = {
        let mut s = BatchSampler::new(10, 1, true, 7, false).unwrap();
        (0..20).flat_map(|_| s.next_batch()).collect()
    };
    let first = a.next_batch();
    let extra = a.next_prompts(7);
    assert_eq!(first, epoch0[..4].to_vec());
    assert_eq!(
        extra,
        epoch0[4..11].to_vec(),
        "six of epoch 0, then epoch 1's first"
    );
    assert_eq!(a.epoch(), 1);
    let resumed = BatchSampler::resume(a.state().clone(), 10)
        .unwrap()
        .next_batch();
    assert_eq!(resumed, a.next_batch());
    assert_ne!(
        b.next_batch(),
        b.next_prompts(4),
        "no prompt is drawn twice in an epoch"
    );
}

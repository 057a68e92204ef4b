//! A dead or stuck peer turns into an error within the timeout, never a hang.
use std::time::{Duration, Instant};

use tch::Tensor;
use verlc_runtime::parallel::dist::{DistError, InitOptions, ProcessGroup, ReduceOp};

use crate::common;

/// The parent SIGKILLs rank 1 once both ranks passed a barrier; rank 0's next all-reduce
/// must fail well within its 20 s timeout.
#[test]
fn killed_peer_is_an_error() {
    let filter = common::test_filter(module_path!(), "killed_peer_is_an_error");
    let marker = common::temp_dir("killed_peer").join("ready");
    if common::is_rank(&filter) {
        let opts = InitOptions {
            timeout: Duration::from_secs(20),
            ..InitOptions::default()
        };
        let pg = ProcessGroup::init_from_env(&opts).unwrap();
        let marker = std::path::PathBuf::from(std::env::var("VERLC_TEST_MARKER").unwrap());
        pg.barrier().unwrap();
        if pg.rank() == 1 {
            std::fs::write(&marker, b"1").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            return;
        }
        // Keep issuing collectives: the first may still be in flight when the kill lands.
        let start = Instant::now();
        let err = loop {
            match pg.all_reduce(&Tensor::from_slice(&[1.0f32]), ReduceOp::Sum) {
                Err(e) => break e,
                Ok(()) => assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "collectives kept succeeding"
                ),
            }
        };
        let waited = start.elapsed();
        eprintln!("rank 0 got after {waited:?}: {err}");
        assert!(
            matches!(
                err,
                DistError::Collective {
                    op: "all_reduce",
                    ..
                }
            ),
            "{err}"
        );
        assert!(waited < Duration::from_secs(25), "took {waited:?}");
        return;
    }
    let _ = std::fs::remove_file(&marker);
    let mut ranks = common::spawn_ranks(
        &filter,
        2,
        &[("VERLC_TEST_MARKER", marker.display().to_string())],
    );
    let start = Instant::now();
    while !marker.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 1 never got ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    ranks.kill(1).unwrap();
    // Rank 0 must finish (successfully: it asserts the error itself); rank 1 was killed.
    let t0 = Instant::now();
    loop {
        let done = ranks.try_status(0).unwrap();
        if let Some(s) = done {
            assert!(s.success(), "rank 0: {s}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "rank 0 hung after its peer died"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A peer that is alive but never joins the collective: error after the timeout.
#[test]
fn stuck_peer_times_out() {
    let filter = common::test_filter(module_path!(), "stuck_peer_times_out");
    if common::is_rank(&filter) {
        let opts = InitOptions {
            timeout: Duration::from_secs(3),
            ..InitOptions::default()
        };
        let pg = ProcessGroup::init_from_env(&opts).unwrap();
        pg.barrier().unwrap();
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_secs(5));
            return;
        }
        let start = Instant::now();
        let err = pg
            .all_reduce(&Tensor::from_slice(&[1.0f32]), ReduceOp::Sum)
            .unwrap_err();
        let waited = start.elapsed();
        eprintln!("rank 0 got after {waited:?}: {err}");
        assert!(
            waited >= Duration::from_millis(2500) && waited < Duration::from_secs(7),
            "took {waited:?}"
        );
        return;
    }
    common::spawn_ranks(&filter, 2, &[])
        .wait(Some(Duration::from_secs(60)))
        .unwrap();
}

/// Rendezvous with a missing rank fails after the store timeout.
#[test]
fn missing_rank_rendezvous_times_out() {
    let port = verlc_runtime::parallel::dist::free_port("127.0.0.1").unwrap();
    let env = verlc_runtime::parallel::dist::DistEnv {
        rank: 0,
        world_size: 2,
        local_rank: 0,
        local_world_size: 2,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        agent_store: false,
    };
    let opts = InitOptions {
        timeout: Duration::from_secs(2),
        ..InitOptions::default()
    };
    let start = Instant::now();
    let err = ProcessGroup::init(&env, &opts).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(
        matches!(err, DistError::Store { .. } | DistError::Init { .. }),
        "{err}"
    );
}

/// NCCL is compiled only with the `cuda` feature; without it (or without a GPU) creating an
/// NCCL group is an error, not a crash.
#[test]
fn nccl_unavailable_is_an_error() {
    use verlc_runtime::parallel::dist::Backend;
    assert_eq!(Backend::Nccl.is_available(), cfg!(feature = "cuda"));
    if tch::Cuda::is_available() {
        return; // a GPU machine: the NCCL path is exercised elsewhere
    }
    let env = verlc_runtime::parallel::dist::DistEnv {
        master_port: verlc_runtime::parallel::dist::free_port("127.0.0.1").unwrap(),
        ..verlc_runtime::parallel::dist::DistEnv::single()
    };
    let opts = InitOptions {
        backend: Backend::Nccl,
        timeout: Duration::from_secs(10),
        ..InitOptions::default()
    };
    let err = ProcessGroup::init(&env, &opts).unwrap_err();
    eprintln!("{err}");
    assert!(
        matches!(
            err,
            DistError::Init {
                backend: Backend::Nccl,
                ..
            }
        ),
        "{err}"
    );
}

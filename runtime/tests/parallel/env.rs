use std::collections::HashMap;

use verlc_runtime::parallel::dist::{DistEnv, DistError};

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn no_launcher_means_single_process() {
    assert_eq!(DistEnv::from_lookup(lookup(&[])).unwrap(), None);
}

#[test]
fn torchrun_variables() {
    let env = DistEnv::from_lookup(lookup(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29511"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        env,
        DistEnv {
            rank: 3,
            world_size: 8,
            local_rank: 1,
            local_world_size: 2,
            master_addr: "10.0.0.1".into(),
            master_port: 29511,
            agent_store: true,
        }
    );
}

#[test]
fn slurm_fills_in() {
    let env = DistEnv::from_lookup(lookup(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NTASKS_PER_NODE", "8(x2)"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "1234"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (
            env.rank,
            env.world_size,
            env.local_rank,
            env.local_world_size
        ),
        (5, 16, 1, 8)
    );
}

#[test]
fn errors_name_the_variable() {
    let e = DistEnv::from_lookup(lookup(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_PORT", "1"),
    ]))
    .unwrap_err();
    assert!(
        matches!(
            e,
            DistError::MissingEnv {
                var: "MASTER_ADDR",
                ..
            }
        ),
        "{e}"
    );
    let e = DistEnv::from_lookup(lookup(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
    assert!(matches!(e, DistError::BadEnv { var: "RANK", .. }), "{e}");
    let e = DistEnv::from_lookup(lookup(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
    assert!(matches!(e, DistError::BadEnv { var: "RANK", .. }), "{e}");
    let e = DistEnv::from_lookup(lookup(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "99999"),
    ]))
    .unwrap_err();
    assert!(
        matches!(
            e,
            DistError::BadEnv {
                var: "MASTER_PORT",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn world_of_one_needs_no_master() {
    let env = DistEnv::from_lookup(lookup(&[("RANK", "0"), ("WORLD_SIZE", "1")]))
        .unwrap()
        .unwrap();
    assert_eq!(env.master_addr, "127.0.0.1");
}

//! The test binaries' rank processes, forked by the zygote (tests/common/zygote.rs).

use std::time::Duration;

use crate::common;

const DIR_ENV: &str = "VERLC_ZYGOTE_TEST_DIR";
const FAIL_ENV: &str = "VERLC_ZYGOTE_TEST_FAIL";

/// Each rank runs its test's body with its own rank and world, as a process of its own under
/// the zygote (not a child of the test process); a rank that panics fails the launch.
#[test]
fn forked_ranks_run_their_body_and_a_failing_rank_fails_the_launch() {
    let filter = common::test_filter(
        module_path!(),
        "forked_ranks_run_their_body_and_a_failing_rank_fails_the_launch",
    );
    if common::is_rank(&filter) {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let dir = std::path::PathBuf::from(var(DIR_ENV));
        let (rank, world) = (var("RANK"), var("WORLD_SIZE"));
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        let line = format!("{world} {} {parent}", std::process::id());
        std::fs::write(dir.join(format!("rank{rank}")), line).expect("write");
        assert_ne!(var(FAIL_ENV), rank, "rank {rank} fails on purpose");
        common::rank_passed();
    }
    let entry: fn() = forked_ranks_run_their_body_and_a_failing_rank_fails_the_launch;
    let dir = common::temp_dir("zygote_ranks");
    let env = [(DIR_ENV, dir.display().to_string())];
    common::launch_ranks(entry, &filter, 3, &env, Duration::from_secs(60));
    let mut pids = Vec::new();
    for rank in 0..3 {
        let text = std::fs::read_to_string(dir.join(format!("rank{rank}"))).expect("rank ran");
        let words: Vec<u32> = text
            .split(' ')
            .map(|w| w.parse().expect("number"))
            .collect();
        assert_eq!(words[0], 3, "rank {rank}'s world");
        assert_ne!(
            words[1],
            std::process::id(),
            "rank {rank} is a process of its own"
        );
        if std::env::var_os("VERLC_TEST_ZYGOTE").is_none_or(|v| v != "0") {
            assert_ne!(
                words[2],
                std::process::id(),
                "rank {rank} was forked by the zygote"
            );
        }
        pids.push(words[1]);
    }
    pids.dedup();
    assert_eq!(pids.len(), 3);

    let failing = [
        (DIR_ENV, dir.display().to_string()),
        (FAIL_ENV, "1".to_owned()),
    ];
    let launch = std::panic::catch_unwind(|| {
        common::launch_ranks(entry, &filter, 3, &failing, Duration::from_secs(60))
    });
    assert!(launch.is_err(), "a rank that panics fails the launch");
}

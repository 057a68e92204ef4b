//! The local launcher: torchrun's variables per rank, fail-fast when a rank dies.
use std::time::{Duration, Instant};

use verlc_runtime::parallel::dist::{DistError, LocalLauncher};

#[test]
fn ranks_get_torchrun_environment() {
    let script = r#"test "$WORLD_SIZE" = 3 && test "$LOCAL_WORLD_SIZE" = 3 && test "$LOCAL_RANK" = "$RANK" \
        && test "$MASTER_ADDR" = 127.0.0.1 && test "$MASTER_PORT" = 29999 && test "$EXTRA" = x && test "$RANK" -lt 3"#;
    let ranks = LocalLauncher::new(3)
        .program("sh")
        .args(["-c", script])
        .env("EXTRA", "x")
        .master_port(29999)
        .spawn()
        .unwrap();
    let status = ranks.wait(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(status.len(), 3);
}

#[test]
fn a_failing_rank_stops_the_others() {
    let script = r#"if [ "$RANK" = 1 ]; then exit 3; else sleep 30; fi"#;
    let start = Instant::now();
    let ranks = LocalLauncher::new(3)
        .program("sh")
        .args(["-c", script])
        .spawn()
        .unwrap();
    let err = ranks.wait(Some(Duration::from_secs(60))).unwrap_err();
    assert!(
        matches!(err, DistError::RankFailed { rank: 1, .. }),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn bad_launches_are_errors() {
    assert!(LocalLauncher::new(0).spawn().is_err());
    let err = LocalLauncher::new(1)
        .program("/nonexistent/verlc-binary")
        .spawn()
        .unwrap_err();
    assert!(matches!(err, DistError::Launch { rank: 0, .. }), "{err}");
}

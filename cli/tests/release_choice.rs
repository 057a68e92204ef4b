//! Which verl release `verlc check` judges a config against when no `--config-dir` holds its
//! tree: `--verl-version`, else the verl installed in the active Python (`$VERLC_PYTHON`, else
//! the active virtualenv's, else `python3`), else the newest release verlc carries (0.9.1).
//! Runs the built binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .canonicalize()
        .expect("workspace")
}

/// `verlc check examples/quickstart.yaml ARGS` with `env`: (exit status, stderr).
fn check(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verlc"));
    cmd.current_dir(root())
        .env("NO_COLOR", "1")
        .env_remove("VERLC_PYTHON")
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH")
        .args(["check", "examples/quickstart.yaml"])
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run verlc");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn without_flags_or_a_python_verl_the_newest_release_judges() {
    let (status, err) = check(&[], &[("VERLC_PYTHON", "")]);
    assert_eq!(status, 0, "{err}");
    assert!(
        err.contains("(judged against verl 0.9.1, verlc's built-in tree)"),
        "{err}"
    );
}

#[test]
fn verl_version_selects_a_built_in_tree_and_refuses_one_verlc_lacks() {
    for (flag, want) in [
        ("0.7.0", "0.7.0"),
        ("0.7.1", "0.7.1"),
        ("0.8.0", "0.8.0"),
        ("0.9.0", "0.9.0"),
        ("0.9.1", "0.9.1"),
        ("0.7", "0.7.1"),
        ("0.9", "0.9.1"),
    ] {
        let (status, err) = check(&["--verl-version", flag], &[]);
        assert_eq!(status, 0, "{err}");
        assert!(
            err.contains(&format!(
                "judged against verl {want}, verlc's built-in tree"
            )),
            "{flag}: {err}"
        );
    }
    let (status, err) = check(&["--verl-version", "0.6.1"], &[]);
    assert_eq!(status, 2, "{err}");
    assert!(
        err.contains("no built-in tree of verl 0.6.1")
            && err.contains("0.7.0, 0.7.1, 0.8.0, 0.9.0, 0.9.1"),
        "{err}"
    );
}

/// `python` as a path (`python3` looked up on PATH).
fn python_path(python: &str) -> PathBuf {
    if python.contains('/') {
        return PathBuf::from(python);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(python))
        .find(|p| p.is_file())
        .expect("python3 on PATH")
}

/// A Python whose `verl` package (found on its path, not imported) is a given release.
fn python_with_verl(dir: &Path, version: &str) -> String {
    let pkg = dir.join("verl");
    std::fs::create_dir_all(pkg.join("version")).expect("mkdir");
    std::fs::create_dir_all(pkg.join("trainer/config")).expect("mkdir");
    // Importing it would fail: the probe must only locate it.
    std::fs::write(
        pkg.join("__init__.py"),
        "raise ImportError('not importable')\n",
    )
    .expect("write");
    std::fs::write(pkg.join("version/version"), format!("{version}\n")).expect("write");
    dir.display().to_string()
}

#[test]
fn the_active_pythons_verl_picks_the_tree() {
    let python = if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let scratch = tempfile::tempdir().expect("tempdir");
    // verl 0.7.0 installed: its release's built-in tree.
    let seven = scratch.path().join("seven");
    let path = python_with_verl(&seven, "0.7.0");
    let (status, err) = check(&[], &[("VERLC_PYTHON", python), ("PYTHONPATH", &path)]);
    assert_eq!(status, 0, "{err}");
    assert!(
        err.contains("judged against verl 0.7.0, verlc's built-in tree"),
        "{err}"
    );
    // A flag wins over the environment.
    let (_, err) = check(
        &["--verl-version", "0.9.1"],
        &[("VERLC_PYTHON", python), ("PYTHONPATH", &path)],
    );
    assert!(err.contains("judged against verl 0.9.1"), "{err}");
    // Every carried release is its own tree.
    let nine_zero = scratch.path().join("nine-zero");
    let path = python_with_verl(&nine_zero, "0.9.0");
    let (status, err) = check(&[], &[("VERLC_PYTHON", python), ("PYTHONPATH", &path)]);
    assert_eq!(status, 0, "{err}");
    assert!(
        err.contains("judged against verl 0.9.0, verlc's built-in tree"),
        "{err}"
    );
    // A release verlc carries no tree of: the nearest one, said with where the exact tree is.
    let nine = scratch.path().join("nine");
    let path = python_with_verl(&nine, "0.9.2");
    let (status, err) = check(&[], &[("VERLC_PYTHON", python), ("PYTHONPATH", &path)]);
    assert_eq!(status, 0, "{err}");
    assert!(
        err.contains("the active Python has verl 0.9.2")
            && err.contains(&format!(
                "--config-dir {}",
                nine.join("verl/trainer/config").display()
            ))
            && err.contains("judged against verl 0.9.1, verlc's built-in tree"),
        "{err}"
    );
    // The active virtualenv's Python, when VERLC_PYTHON does not name one.
    let venv = scratch.path().join("venv");
    std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
    std::os::unix::fs::symlink(python_path(python), venv.join("bin/python")).expect("symlink");
    let path = python_with_verl(&scratch.path().join("seven-again"), "0.7.0");
    let (status, err) = check(
        &[],
        &[
            ("VIRTUAL_ENV", &venv.display().to_string()),
            ("PYTHONPATH", &path),
        ],
    );
    assert_eq!(status, 0, "{err}");
    assert!(
        err.contains("judged against verl 0.7.0, verlc's built-in tree"),
        "{err}"
    );
    // A Python that is not there: the newest.
    let (status, err) = check(&[], &[("VERLC_PYTHON", "/nonexistent/python")]);
    assert_eq!(status, 0, "{err}");
    assert!(err.contains("judged against verl 0.9.1"), "{err}");
}

#[test]
fn explain_names_the_release_too() {
    for (args, want) in [
        (
            vec![],
            "verl release               0.9.1, verlc's built-in tree",
        ),
        (
            vec!["--verl-version", "0.7.0"],
            "verl release               0.7.0, verlc's built-in tree",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_verlc"))
            .current_dir(root())
            .env("VERLC_PYTHON", "")
            .args(["explain", "examples/quickstart.yaml"])
            .args(&args)
            .output()
            .expect("run verlc");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().next(), Some(want), "{stdout}");
    }
}

/// verl 0.7.0's own `sglang_multiturn` calls compose their example config dir, which is no
/// verl tree itself: its `hydra.searchpath` (`file://verl/trainer/config`, relative to the
/// working directory, a verl checkout) reaches verl's. They are judged against the release
/// that search path reaches; where it reaches none, against the active Python's verl (whose
/// `pkg://verl.trainer.config` Hydra would read), as verl would run them. Without either,
/// the newest release judges, and 0.7.0's layout fails there.
#[test]
fn an_example_dir_is_judged_by_the_verl_its_search_path_reaches() {
    let site = root().join(".venv/lib");
    let Some(verl) = std::fs::read_dir(&site)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages/verl"))
        .find(|p| p.join("version/version").is_file())
    else {
        verlc_testkit::missing_data("no verl in the venv (scripts/setup installs verl 0.7.0)");
        return;
    };
    let calls: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/verl_examples/skipped.json"))
            .expect("skipped.json"),
    )
    .expect("JSON");
    let call = calls
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["config_dir"].is_string() && c["script"].as_str().is_some_and(|s| s.contains("gsm8k"))
        })
        .expect("a gsm8k sglang_multiturn call");
    let dir = root()
        .join("tests/fixtures/verl_trees/0.7.0-examples")
        .join(call["config_dir"].as_str().expect("dir"));
    let overrides: Vec<&str> = call["overrides"]
        .as_array()
        .expect("overrides")
        .iter()
        .filter_map(|o| o.as_str())
        .collect();
    let run = |cwd: &Path, python: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_verlc"))
            .current_dir(cwd)
            .env("NO_COLOR", "1")
            .env("VERLC_PYTHON", python)
            .env_remove("VIRTUAL_ENV")
            .args(["check", "--config-dir"])
            .arg(&dir)
            .args([
                "--config-name",
                call["config_name"].as_str().expect("config name"),
            ])
            .args(&overrides)
            .output()
            .expect("run verlc");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The search path alone: a checkout whose `verl/` is verl 0.7.0, no Python asked.
    let checkout = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(&verl, checkout.path().join("verl")).expect("symlink");
    let (status, err) = run(checkout.path(), "");
    assert_eq!(status, 0, "{err}");
    assert!(err.contains("(judged against verl 0.7.0"), "{err}");
    // The installed verl alone: the search path reaches nothing.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let python = root().join(".venv/bin/python");
    let (status, err) = run(elsewhere.path(), &python.display().to_string());
    assert_eq!(status, 0, "{err}");
    assert!(err.contains("(judged against verl 0.7.0"), "{err}");
    // Neither: the newest release, where 0.7.0's layout is an error.
    let (status, err) = run(elsewhere.path(), "");
    assert_eq!(status, 1, "{err}");
    assert!(err.contains("(judged against verl 0.9.1"), "{err}");
}

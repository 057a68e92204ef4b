//! `bind_trainer!` (the verlc-macros crate) as rustc compiles it:
//! - every file in `macros/tests/ui/` fails to compile with exactly the errors of its
//!   `.stderr` file: unknown names and unsupported combinations point at the offending token
//!   with the valid choices;
//! - every file in `macros/tests/pass/` compiles and runs: a valid binding expands to `fn main`
//!   calling the runtime's generic entry with the marker types and the build info (against a
//!   stand-in runtime, so no libtorch is needed);
//! - every strategy × precision of the support table (`verlc_spec::binding`) expands, and no
//!   other does.
//!
//! rustc is run here directly, on the proc-macro library cargo built for this test. These
//! are not tests of the verlc-macros package itself: a test target of a proc-macro crate
//! compiles its dependencies (syn, quote) a second time for the target, and trybuild builds
//! the macro crate once more in a target directory of its own, together about a minute and a
//! half of CPU for a fresh clone's test run.
//!
//! After an intended change of a message: `VERLC_UI_OVERWRITE=1 cargo test -p verlc --test
//! bind_trainer_macro` rewrites the `.stderr` files.

use std::path::{Path, PathBuf};
use std::process::Command;

use verlc_spec::binding::{self, Dtype, StrategyKind};

fn macros_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../macros")
}

/// The `verlc_macros` proc-macro library cargo built beside this test (a dev-dependency of
/// this package, so it is rebuilt before the test whenever the macro changes): the newest
/// `libverlc_macros-*.so` in the test's own directory. Asking cargo instead would wait on the
/// target directory's lock while other tests build trainers.
fn macro_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps directory");
    std::fs::read_dir(deps)
        .expect("read deps directory")
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let suffix = format!(".{}", std::env::consts::DLL_EXTENSION);
            if !(name.starts_with("libverlc_macros-") && name.ends_with(&suffix)) {
                return None;
            }
            Some((e.metadata().ok()?.modified().ok()?, e.path()))
        })
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no libverlc_macros-*.so in {}", deps.display()))
}

/// rustc on `source` (a path relative to the macros directory, as messages show it) with the
/// macro library; `emit` is `metadata` (type-check only) or `link`.
fn rustc(lib: &Path, source: &str, emit: &str, out_dir: &Path) -> std::process::Output {
    let name = Path::new(source)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("fixture name");
    Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .current_dir(macros_dir())
        .args([
            "--edition",
            "2024",
            "--crate-type",
            "bin",
            "--color",
            "never",
        ])
        .args(["--crate-name", name, "--emit", emit, "--out-dir"])
        .arg(out_dir)
        .arg("--extern")
        .arg(format!("verlc_macros={}", lib.display()))
        .arg(source)
        .output()
        .expect("run rustc")
}

/// rustc's errors without its closing summary (`aborting due to`, `For more information`),
/// which change with the count, not with what the macro says.
fn errors(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.starts_with("error: aborting due to") && !l.starts_with("For more information")
        })
        .collect();
    kept.join("\n").trim_end().to_owned()
}

fn fixtures(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(macros_dir().join(dir))
        .expect("fixture directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".rs"))
        .map(|f| format!("{dir}/{f}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in macros/{dir}");
    files
}

#[test]
fn bind_trainer_compiles_what_it_should_and_points_at_what_it_refuses() {
    let lib = macro_library();
    let tmp = tempfile::tempdir().expect("temp dir");
    let overwrite = std::env::var_os("VERLC_UI_OVERWRITE").is_some();
    let mut wrong = Vec::new();

    for source in fixtures("tests/ui") {
        let out = rustc(&lib, &source, "metadata", tmp.path());
        let got = errors(&out.stderr);
        let expected_file = macros_dir().join(source.replace(".rs", ".stderr"));
        if out.status.success() {
            wrong.push(format!("{source} compiled; it must not"));
            continue;
        }
        if overwrite {
            std::fs::write(&expected_file, format!("{got}\n")).expect("write .stderr");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_file).unwrap_or_default();
        if expected.trim_end() != got {
            wrong.push(format!(
                "{source}: rustc said\n{got}\n--- but {} holds\n{}",
                expected_file.display(),
                expected.trim_end()
            ));
        }
    }

    for source in fixtures("tests/pass") {
        let out = rustc(&lib, &source, "link", tmp.path());
        if !out.status.success() {
            wrong.push(format!(
                "{source} does not compile:\n{}",
                errors(&out.stderr)
            ));
            continue;
        }
        let stem = Path::new(&source).file_stem().expect("stem");
        let run = Command::new(tmp.path().join(stem))
            .output()
            .expect("run the fixture");
        if !run.status.success() {
            wrong.push(format!(
                "{source} compiled but its main failed:\n{}",
                String::from_utf8_lossy(&run.stderr)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// A stand-in runtime with every marker type, and a binding of `strategy` × `precision`.
fn combination_source(strategy: StrategyKind, precision: Dtype) -> String {
    let markers: String = StrategyKind::ALL
        .iter()
        .map(|s| s.name())
        .chain(Dtype::ALL.iter().map(|p| p.marker()))
        .map(|m| format!("        pub struct {m};\n"))
        .collect();
    format!(
        "mod mock {{\n    pub mod binding {{\n{markers}\
         \x20       pub struct BuildInfo {{ pub verlc_version: &'static str, pub config_hash: &'static str, \
         pub source: &'static str, pub spec: &'static str, pub bound_keys: &'static str, \
         pub verl_release: &'static str, pub verl_tree: &'static str }}\n\
         \x20       pub fn main<S, P>(_: &str, _: BuildInfo) -> std::process::ExitCode {{ std::process::ExitCode::SUCCESS }}\n\
         \x20   }}\n}}\n\
         verlc_macros::bind_trainer! {{ strategy = {}, precision = {}, config = \"\", runtime = crate::mock }}\n",
        strategy.name(),
        precision.marker()
    )
}

#[test]
fn every_supported_combination_expands_and_no_other() {
    let lib = macro_library();
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut wrong = Vec::new();
    for s in StrategyKind::ALL {
        for p in Dtype::ALL {
            let file = tmp.path().join(format!(
                "{}_{}.rs",
                s.name().to_lowercase(),
                p.marker().to_lowercase()
            ));
            std::fs::write(&file, combination_source(s, p)).expect("write source");
            let out = rustc(&lib, &file.display().to_string(), "metadata", tmp.path());
            let supported = binding::validate(s, p).is_ok();
            if out.status.success() != supported {
                wrong.push(format!(
                    "{} × {}: supported {supported}, compiled {}:\n{}",
                    s.name(),
                    p.marker(),
                    out.status.success(),
                    errors(&out.stderr)
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

//! Override semantics of [`super::load`], each pinned to what Hydra 1.3 does on the same
//! input (the parity test cli/tests/hydra_parity.rs checks them against Hydra itself).

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{LoadRequest, load};
use crate::codes;
use crate::diag::Code;

/// A small config dir: a primary with a group, null/`???`/interpolated values and a list.
/// Written once: tests run in parallel and must not see a half-written file.
fn tree() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(write_tree).clone()
}

fn write_tree() -> PathBuf {
    let dir = std::env::temp_dir().join("verlc-compose-tests");
    let files = [
        (
            "main.yaml",
            "defaults:\n  - opt@model.opt: adam\n  - _self_\n\nmodel:\n  name: m\n  nothing: null\n  maybe: ???\n  tags: [a, b]\n  sub:\n    x: 1\n  ref: ${model.nothing}\n",
        ),
        ("opt/adam.yaml", "lr: 0.1\n"),
        ("opt/sgd.yaml", "lr: 0.2\n"),
        ("extra/more/e.yaml", "k: 1\n"),
    ];
    for (name, text) in files {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        // Through a rename: another test process may be reading the same tree.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &p).expect("rename");
    }
    dir
}

fn run(overrides: &[&str]) -> (serde_json::Value, Vec<Code>) {
    run_in(&tree(), overrides)
}

fn run_in(dir: &Path, overrides: &[&str]) -> (serde_json::Value, Vec<Code>) {
    let c = load(&LoadRequest {
        config_dir: Some(dir.to_path_buf()),
        config_name: Some("main".into()),
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        builtin: crate::load::version::BuiltinRelease::V0_7_0,
        ..Default::default()
    });
    let errors = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code)
        .collect();
    (c.root.to_json(), errors)
}

fn errors(overrides: &[&str]) -> Vec<Code> {
    run(overrides).1
}

#[test]
fn add_fills_null_and_missing_values_and_merges_containers() {
    let (v, e) = run(&["+model.nothing=1", "+model.maybe=2", "+model.sub={y: 2}"]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(v["model"]["nothing"], json!(1));
    assert_eq!(v["model"]["maybe"], json!(2));
    assert_eq!(v["model"]["sub"], json!({"x": 1, "y": 2}));
    assert_eq!(errors(&["+model.name=x"]), [codes::OVERRIDE_KEY_EXISTS]);
}

#[test]
fn delete_needs_a_value_other_than_null() {
    for o in [
        "~model.nothing",
        "~model.maybe",
        "~model.ref",
        "~model.absent",
        "~model.name=other",
    ] {
        assert_eq!(errors(&[o]), [codes::DELETE_KEY_ABSENT], "{o}");
    }
    assert!(
        errors(&["~model.name=null"]).is_empty(),
        "`=null` compares nothing"
    );
    // Python's `==`: 1 == 1.0.
    let (v, e) = run(&["~model.sub.x=1.0"]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(v["model"]["sub"], json!({}));
}

#[test]
fn dict_values_merge_in_struct_mode() {
    assert_eq!(errors(&["model.sub={y: 1}"]), [codes::OVERRIDE_KEY_ABSENT]);
    assert_eq!(
        errors(&["model={sub: {y: 1}}"]),
        [codes::OVERRIDE_KEY_ABSENT],
        "nested new keys are absent too"
    );
    assert_eq!(errors(&["model.tags={a: 1}"]), [codes::OVERRIDE_TYPE]);
    assert_eq!(errors(&["model.sub=[1]"]), [codes::OVERRIDE_TYPE]);
    let (v, e) = run(&[
        "model={sub: {x: ???}, name: n}",
        "++model.sub={new: {deep: 1}}",
    ]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(
        v["model"]["sub"],
        json!({"x": 1, "new": {"deep": 1}}),
        "`???` never replaces a value; `++` may add"
    );
    assert_eq!(v["model"]["name"], json!("n"));
}

#[test]
fn list_items_are_addressed_by_index() {
    let (v, e) = run(&["model.tags.1=c"]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(v["model"]["tags"], json!(["a", "c"]));
    assert_eq!(errors(&["model.tags.5=c"]), [codes::OVERRIDE_KEY_ABSENT]);
    // Hydra's delete indexes with a string, which a list refuses.
    assert_eq!(errors(&["~model.tags.0"]), [codes::DELETE_KEY_ABSENT]);
}

#[test]
fn group_overrides_need_option_names_and_can_delete() {
    assert_eq!(
        errors(&["opt@model.opt=null"]),
        [codes::GROUP_OPTION_UNKNOWN]
    );
    assert_eq!(
        errors(&["model@model=x"]),
        [codes::OVERRIDE_KEY_ABSENT],
        "a package on a key that is no group"
    );
    let (v, e) = run(&["~opt@model.opt"]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(v["model"].get("opt"), None);
    assert_eq!(
        errors(&["~opt@model.opt=sgd"]),
        [codes::DELETE_KEY_ABSENT],
        "only the chosen option is deleted"
    );
    let (v, _) = run(&["opt@model.opt=[adam,sgd]"]);
    assert_eq!(v["model"]["opt"], json!({"lr": 0.2}));
}

#[test]
fn hydra_settings_are_accepted_and_searchpath_applies() {
    assert!(
        errors(&[
            "hydra.job.name=x",
            "+hydra.anything=1",
            "hydra/job_logging=disabled"
        ])
        .is_empty()
    );
    assert_eq!(errors(&["hydra.nope=x"]), [codes::OVERRIDE_KEY_ABSENT]);
    let dir = tree();
    let extra = format!("hydra.searchpath=[file://{}]", dir.join("extra").display());
    let (v, e) = run_in(&dir, &[&extra, "+more=e"]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(v["more"], json!({"k": 1}));
}

/// tests/fixtures/hydra_composition/tree, shared with the Hydra parity test.
fn composition_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hydra_composition/tree")
}

fn compose_fixture(name: &str, overrides: &[&str]) -> super::Composed {
    load(&LoadRequest {
        config_dir: Some(composition_tree()),
        config_name: Some(name.into()),
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        builtin: crate::load::version::BuiltinRelease::V0_7_0,
        ..Default::default()
    })
}

#[test]
fn an_explicit_package_beats_the_package_header() {
    // `db@_here_: mysql`, where db/mysql.yaml says `# @package _group_`.
    let v = compose_fixture("here", &[]).root.to_json();
    assert_eq!(v["driver"], json!("mysql"));
    assert_eq!(v.get("_group_"), None);
    // `../../opt@opt2: sgd` inside a site mounted at `web`; opt/sgd.yaml is `_global_`.
    let v = compose_fixture("main", &[]).root.to_json();
    assert_eq!(v["web"]["opt2"], json!({"global_sgd": true, "lr": 0.01}));
    assert_eq!(v.get("global_sgd"), None);
    // Without an explicit package the header applies.
    let v = compose_fixture("main", &["opt=sgd"]).root.to_json();
    assert_eq!(v["global_sgd"], json!(true));
}

#[test]
fn nested_relative_entries_keep_hydras_unnormalized_key() {
    let c = compose_fixture("main", &[]);
    assert_eq!(
        c.choices
            .get("server/site/../../opt@web.opt2")
            .map(String::as_str),
        Some("sgd")
    );
    let c = compose_fixture("main", &["opt@web.opt2=adam"]);
    let codes: Vec<Code> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code)
        .collect();
    assert_eq!(codes, [codes::OVERRIDE_KEY_ABSENT]);
}

#[test]
fn two_entries_for_one_group_must_agree() {
    let c = compose_fixture("dup", &[]);
    let codes: Vec<Code> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code)
        .collect();
    assert_eq!(codes, [codes::DEFAULTS_SYNTAX]);
    assert!(
        !compose_fixture("listopt", &[]).has_errors(),
        "a list of options is not a conflict"
    );
}

//! The editor schemas accept what verl and verlc's own config files contain, reject typos,
//! and carry what editors need (enum arrays, defaults per key path, descriptions).

use std::path::{Path, PathBuf};

use serde_json::Value;
use verlc_front::config::{BUILTIN_FILES, Flavour};
use verlc_front::load::yaml;
use verlc_front::schema;
use verlc_front::source::{Source, SourceId, SourceKind};

fn yaml_json(name: &str, text: &str) -> Value {
    let src = Source::new(name, text, SourceKind::File);
    match yaml::parse(&src, SourceId(0)) {
        Ok(n) => n.to_json(),
        Err(d) => panic!("{name}: {}", d.message),
    }
}

fn validator(s: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(false)
        .build(s)
        .expect("editor schema compiles")
}

fn errors(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Which schema a group file of verl 0.7's layout belongs to. 0.7's `veomni` optim/engine
/// files belong to its SFT engine (PPO runs VeOmni from 0.7.1, with other keys: see
/// `newest_release_group_files_validate_against_their_group_schema`).
fn schema_for_file(rel: &str) -> Option<&'static str> {
    let (dir, file) = rel.split_once('/')?;
    if file.starts_with("veomni") {
        return None;
    }
    Some(match dir {
        "optim" => "optim",
        "engine" => "engine",
        "actor" => "actor",
        "ref" => "ref",
        "critic" => "critic",
        "rollout" => "rollout",
        "model" => "model",
        "data" => "data",
        "reward_model" => "reward_model",
        "algorithm" => "rollout_correction",
        _ => return None,
    })
}

fn group_validator(name: &str) -> jsonschema::Validator {
    validator(
        &schema::group_editor_schema(name).unwrap_or_else(|| panic!("no group schema {name}")),
    )
}

#[test]
fn builtin_group_files_validate_against_their_group_schema() {
    let mut checked = 0;
    for (rel, text) in BUILTIN_FILES {
        let doc = yaml_json(rel, text);
        let v = match schema_for_file(rel) {
            Some(g) => group_validator(g),
            None if rel.starts_with("ppo_") => validator(&schema::root_editor_schema()),
            None => continue, // reward_manager.yaml: a package of its own, not a group file
        };
        let errs = errors(&v, &doc);
        assert!(errs.is_empty(), "{rel}:\n  {}", errs.join("\n  "));
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} built-in files");
}

/// The group files of the newest built-in release (verl 0.9.1) that its PPO trainers compose,
/// VeOmni's and torchtitan's engine and optimizer files, `reward/` and `distillation/`
/// included, validate against their group schemas (automodel's are not composed by any of
/// 0.9.1's trainers, so no key of theirs is known).
#[test]
fn newest_release_group_files_validate_against_their_group_schema() {
    let mut checked = Vec::new();
    for (rel, text) in verlc_front::load::version::BuiltinRelease::default().files() {
        let Some((dir, file)) = rel.split_once('/') else {
            continue;
        };
        let group = match dir {
            "optim" | "engine" if !file.starts_with("automodel") => dir,
            "reward" | "distillation" => dir,
            _ => continue,
        };
        let errs = errors(&group_validator(group), &yaml_json(rel, text));
        assert!(errs.is_empty(), "{rel}:\n  {}", errs.join("\n  "));
        checked.push(*rel);
    }
    for want in [
        "engine/veomni.yaml",
        "optim/veomni.yaml",
        "engine/torchtitan.yaml",
        "reward/reward.yaml",
        "distillation/distillation.yaml",
    ] {
        assert!(checked.contains(&want), "{want} not checked: {checked:?}");
    }
    // A typo in a VeOmni key is flagged; its keys complete.
    let engine = schema::group_editor_schema("engine").expect("engine");
    let props = &engine["properties"];
    assert!(props.get("ulysses_parallel_size").is_some());
    let typo = serde_json::json!({"ulysses_paralel_size": 2});
    assert!(!errors(&validator(&engine), &typo).is_empty());
}

#[test]
fn composed_builtin_trees_validate_against_the_root_schema() {
    let v = validator(&schema::root_editor_schema());
    for flavour in [Flavour::Fsdp, Flavour::Megatron] {
        let tree = schema::builtin_defaults(flavour);
        let errs = errors(&v, &tree);
        assert!(errs.is_empty(), "{flavour:?}:\n  {}", errs.join("\n  "));
    }
}

/// verl's own config tree, when scripts/setup has installed verl into .venv.
fn verl_config_dir() -> Option<PathBuf> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/lib"));
    let py = std::fs::read_dir(root)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("python"))?;
    let dir = py.path().join("site-packages/verl/trainer/config");
    dir.is_dir().then_some(dir)
}

#[test]
fn verls_own_group_files_validate() {
    let Some(dir) = verl_config_dir() else {
        verlc_testkit::missing_data(
            "verl is not installed in .venv (scripts/setup installs it): verl's own group files were not checked",
        );
        return;
    };
    let mut checked = 0;
    let mut failures = Vec::new();
    for group in [
        "optim",
        "engine",
        "actor",
        "ref",
        "critic",
        "rollout",
        "model",
        "data",
        "reward_model",
        "algorithm",
    ] {
        let Ok(entries) = std::fs::read_dir(dir.join(group)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for f in files {
            let rel = format!(
                "{group}/{}",
                f.file_name().unwrap_or_default().to_string_lossy()
            );
            let Some(g) = schema_for_file(&rel) else {
                continue;
            };
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let doc = yaml_json(&rel, &text);
            let errs = errors(&group_validator(g), &doc);
            if !errs.is_empty() {
                failures.push(format!("{rel} ({g}.schema.json):\n  {}", errs.join("\n  ")));
            }
            checked += 1;
        }
    }
    for top in ["ppo_trainer.yaml", "ppo_megatron_trainer.yaml"] {
        let text = std::fs::read_to_string(dir.join(top)).unwrap_or_default();
        let errs = errors(
            &validator(&schema::root_editor_schema()),
            &yaml_json(top, &text),
        );
        if !errs.is_empty() {
            failures.push(format!("{top}:\n  {}", errs.join("\n  ")));
        }
        checked += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 10);
}

fn at<'a>(s: &'a Value, path: &str) -> &'a Value {
    let mut cur = s;
    for seg in path.split('.') {
        let obj = if cur.get("properties").is_some() {
            cur
        } else {
            cur.get("anyOf")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().find(|b| b.get("properties").is_some()))
                .unwrap_or(cur)
        };
        cur = obj
            .get("properties")
            .and_then(|p| p.get(seg))
            .unwrap_or_else(|| panic!("no schema at {path} ({seg})"));
    }
    cur
}

/// The branch of a leaf that holds its constraints (the other one is the interpolation).
fn value_branch(leaf: &Value) -> &Value {
    leaf.get("anyOf")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|b| b.get("$ref").is_none()))
        .unwrap_or(leaf)
}

#[test]
fn editor_schema_content() {
    let root = schema::root_editor_schema();
    // Defaults per key path, from the built-in tree.
    assert_eq!(
        at(&root, "actor_rollout_ref.actor.optim.lr")["default"],
        serde_json::json!(1e-6)
    );
    assert_eq!(
        at(&root, "critic.optim.lr")["default"],
        serde_json::json!(1e-5)
    );
    assert_eq!(
        at(&root, "actor_rollout_ref.actor.ppo_mini_batch_size")["default"],
        serde_json::json!(256)
    );
    // Descriptions from doc comments, unwrapped.
    let d = at(&root, "actor_rollout_ref.actor.ppo_mini_batch_size")["description"]
        .as_str()
        .unwrap_or("");
    assert!(!d.is_empty() && !d.contains('\n'), "{d:?}");
    // Enums are plain `enum` arrays with their descriptions next to them.
    let agg = value_branch(at(&root, "actor_rollout_ref.actor.loss_agg_mode"));
    let values: Vec<&str> = agg["enum"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        values,
        [
            "token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
            "token-sum"
        ]
    );
    let descs = agg
        .get("markdownEnumDescriptions")
        .or_else(|| agg.get("enumDescriptions"))
        .and_then(Value::as_array);
    assert_eq!(descs.map(Vec::len), Some(5));
    // No `oneOf` of consts left anywhere, and `defaults:` is accepted at the root.
    let text = schema::pretty(&root);
    assert!(
        !text.contains("\"oneOf\""),
        "a oneOf survived normalization"
    );
    assert!(root["properties"].get("defaults").is_some());
    // Deprecated keys are documented as such and not suggested.
    let old = at(&root, "actor_rollout_ref.actor.ppo_micro_batch_size");
    assert!(
        old["description"].as_str().is_some_and(
            |m| m.starts_with("Deprecated") && m.contains("ppo_micro_batch_size_per_gpu")
        ),
        "{old}"
    );
    assert_eq!(old["doNotSuggest"], Value::Bool(true));
    let renamed = at(&root, "critic.optim.warmup_style");
    assert!(
        renamed["description"]
            .as_str()
            .is_some_and(|m| m.contains("`critic.optim.lr_scheduler_type`")),
        "{renamed}"
    );

    // Group schemas: optim completes both flavours' keys and takes the group file's values.
    let optim = schema::group_editor_schema("optim").expect("optim");
    for k in [
        "lr",
        "lr_scheduler_type",
        "lr_decay_style",
        "weight_decay",
        "betas",
        "defaults",
    ] {
        assert!(optim["properties"].get(k).is_some(), "optim lacks {k}");
    }
    assert_eq!(
        optim["properties"]["lr"]["default"],
        serde_json::json!(1e-3)
    );
    // A key the group's files set differently has no one default: the description says which
    // file sets what (FSDP's optimizer is constant, VeOmni's cosine).
    let schedule = &optim["properties"]["lr_scheduler_type"];
    assert!(schedule.get("default").is_none(), "{schedule}");
    let said = schedule["description"].as_str().unwrap_or("");
    assert!(
        said.contains("`constant` in optim/fsdp.yaml")
            && said.contains("`cosine` in optim/veomni.yaml"),
        "{said}"
    );
    // In a group file a renamed key points at its replacement by its name in that file.
    let ws = optim["properties"]["warmup_style"]["description"]
        .as_str()
        .unwrap_or("");
    assert!(
        ws.starts_with("Deprecated: use `lr_scheduler_type` instead"),
        "{ws}"
    );
    let engine = schema::group_editor_schema("engine").expect("engine");
    for k in [
        "param_offload",
        "wrap_policy",
        "tensor_model_parallel_size",
        "use_distributed_optimizer",
        "strategy",
    ] {
        assert!(engine["properties"].get(k).is_some(), "engine lacks {k}");
    }
    let strategies = value_branch(&engine["properties"]["strategy"])["enum"].clone();
    for s in ["fsdp", "fsdp2", "megatron"] {
        assert!(
            strategies
                .as_array()
                .is_some_and(|a| a.contains(&Value::from(s))),
            "engine.strategy lacks {s}: {strategies}"
        );
    }
    assert!(schema::group_editor_schema("nope").is_none());
}

#[test]
fn editor_schema_accepts_interpolations_and_rejects_typos() {
    let v = validator(&schema::root_editor_schema());
    let ok = yaml_json(
        "ok.yaml",
        "defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: ${data.train_batch_size}\n    loss_agg_mode: ${oc.select:x,token-mean}\n    strategy: ???\n  rollout:\n    profiler:\n      tool_config: ${actor_rollout_ref.actor.profiler.tool_config}\n",
    );
    let errs = errors(&v, &ok);
    assert!(errs.is_empty(), "{errs:?}");
    for bad in [
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_sise: 8\n",
        "actor_rollout_ref:\n  actor:\n    loss_agg_mode: token_mean\n",
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: many\n",
        "trainer:\n  n_gpus_per_node: -3\n",
    ] {
        assert!(
            !errors(&v, &yaml_json("bad.yaml", bad)).is_empty(),
            "accepted:\n{bad}"
        );
    }
}

/// The default release's tree (verl 0.9.1, both trainers, and with the Megatron engine) is
/// what an editor sees a config of that release as: every key it has validates against the
/// root editor schema, and a typo inside a section only 0.9 has is still refused.
#[test]
fn the_newest_release_tree_validates_against_the_editor_schema() {
    use verlc_front::load::compose::{self, LoadRequest};
    let v = validator(&schema::root_editor_schema());
    for (base, overrides) in [
        (compose::FSDP_BASE, vec![]),
        (compose::MEGATRON_BASE, vec![]),
        (compose::FSDP_BASE, vec!["model_engine=megatron".to_owned()]),
    ] {
        let c = compose::load(&LoadRequest {
            config_name: Some(base.into()),
            overrides: overrides.clone(),
            ..LoadRequest::default()
        });
        assert!(!c.has_errors(), "{base} {overrides:?}: {:?}", c.diagnostics);
        let tree = c.root.to_json();
        let errs = errors(&v, &tree);
        assert!(
            errs.is_empty(),
            "{base} {overrides:?}:\n{}",
            errs.join("\n")
        );
    }
    let typo = serde_json::json!({"distillation": {"enabld": true}});
    assert!(
        !errors(&v, &typo).is_empty(),
        "a typo in `distillation` passes"
    );
    let ok = serde_json::json!({"distillation": {"enabled": true}});
    assert!(errors(&v, &ok).is_empty(), "{:?}", errors(&v, &ok));
}

/// The SFT trainer's editor schema (`schemas/verl-sft.schema.json`): verl's own SFT config
/// validates against it on every carried release's tree with the newest release's keys, a typo
/// is flagged, and keys complete with verl's defaults.
#[test]
fn the_sft_schema_takes_verls_sft_config_and_flags_typos() {
    let s = schema::sft_editor_schema();
    let v = validator(&s);
    for overrides in [vec![], vec!["engine=megatron", "optim=megatron"]] {
        let composed = verlc_front::load::compose::load(&verlc_front::load::compose::LoadRequest {
            config_name: Some("sft_trainer_engine".into()),
            overrides: overrides.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        });
        assert!(!composed.has_errors(), "{overrides:?}");
        let errs = errors(&v, &composed.root.to_json());
        assert!(errs.is_empty(), "{overrides:?}:\n  {}", errs.join("\n  "));
    }
    let typo = serde_json::json!({"data": {"train_batch_sise": 8}});
    assert!(!errors(&v, &typo).is_empty(), "a misspelt key passes");
    let wrong_type = serde_json::json!({"data": {"train_batch_size": "many"}});
    assert!(
        !errors(&v, &wrong_type).is_empty(),
        "a string batch size passes"
    );
    let messages = &s["properties"]["data"]["properties"]["messages_key"];
    assert_eq!(messages["default"], "messages", "{messages}");
}

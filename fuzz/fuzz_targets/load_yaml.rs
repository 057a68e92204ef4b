//! Arbitrary bytes through verlc's check pipeline: YAML parsing with spans, interpolation on
//! the parsed tree, the override parser, then the whole `verlc check` of the text as a
//! config file with the overrides (composition over the built-in defaults, schema, typed
//! model, rules) and both renderings of its diagnostics. None of it may panic, overflow the
//! stack or run away with memory.
//!
//! Input layout: the text (bytes decoded as UTF-8, lossily) up to an optional line
//! `%%overrides`; each line after it is one command-line override.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use verlc_front::check::{CheckOptions, check};
use verlc_front::load::compose::LoadRequest;
use verlc_front::load::overrides::parse_override;
use verlc_front::load::{interp, yaml};
use verlc_front::source::{Source, SourceId, SourceKind};

/// One scratch file per fuzzing process (composition reads the config from disk).
fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("verlc-fuzz-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir.join("config.yaml")
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (yaml_text, overrides) = match text.split_once("\n%%overrides\n") {
        Some((y, o)) => (y, o.lines().map(String::from).collect::<Vec<_>>()),
        None => (&*text, Vec::new()),
    };

    for (i, o) in overrides.iter().enumerate() {
        let _ = parse_override(o, SourceId(i as u32 + 1));
    }

    let src = Source::new("fuzz.yaml", yaml_text, SourceKind::File);
    let Ok(mut node) = yaml::parse(&src, SourceId(0)) else {
        return;
    };
    let _ = interp::resolve_all(&mut node);
    let _ = node.to_json();

    // Only inputs that parse are worth the (slower) composition over the defaults.
    let path = scratch();
    if std::fs::write(path, yaml_text.as_bytes()).is_err() {
        return;
    }
    let req = LoadRequest {
        config_file: Some(path.clone()),
        overrides,
        cwd: std::env::temp_dir(),
        ..Default::default()
    };
    let checked = check(&req, &CheckOptions::default());
    let sources = &checked.composed.sources;
    let _ = verlc_front::render::json(&checked.diagnostics, sources);
    let _ = verlc_front::render::human(&checked.diagnostics, sources, false);
});

//! `verlc migrate`: a config written for verl 0.7.0 rewritten into 0.9.1's layout
//! (`verlc::migrate`). Prints the file's diff, the overrides as they now read and every key
//! that moved or was dropped; `--write` rewrites the file instead of printing its diff.

use std::path::PathBuf;

use verlc::migrate::{self, Change};

use super::args::MigrateArgs;

const TARGETS: [&str; 2] = ["0.9.0", "0.9.1"];

pub fn run(a: MigrateArgs) -> u8 {
    if !TARGETS.contains(&a.to.as_str()) {
        eprintln!(
            "error: verlc migrates configs into verl {}'s layout, not {} (--to)",
            TARGETS.join(" or "),
            a.to
        );
        return 2;
    }
    let mut file: Option<PathBuf> = None;
    let mut overrides = Vec::new();
    for arg in &a.args {
        let looks_like_file = !arg.contains('=') && !arg.starts_with('~') && !arg.starts_with('+');
        if looks_like_file && file.is_none() && overrides.is_empty() {
            file = Some(PathBuf::from(arg));
        } else if looks_like_file {
            eprintln!("error: `{arg}` is a second config file; migrate one config at a time");
            return 2;
        } else {
            overrides.push(arg.clone());
        }
    }
    if file.is_none() && overrides.is_empty() && a.base.is_none() {
        eprintln!("error: nothing to migrate: give a config file and/or overrides");
        return 2;
    }
    let mut changes: Vec<(String, Change)> = Vec::new();
    if let Some(path) = &file {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", path.display());
                return 1;
            }
        };
        let m = match migrate::migrate_file(&text) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                return 1;
            }
        };
        let name = path.display().to_string();
        if m.megatron_shim {
            println!(
                "{name}: extends ppo_trainer with `override /model_engine: megatron` (ppo_megatron_trainer is a shim since verl 0.8.0)"
            );
        }
        changes.extend(m.changes.iter().cloned().map(|c| (name.clone(), c)));
        if m.text == text {
            println!("{name}: nothing to change");
        } else if a.write {
            if let Err(e) = super::output::write_atomic(path, m.text.as_bytes()) {
                eprintln!("error: cannot write {}: {e}", path.display());
                return 1;
            }
            println!("{name}: rewritten");
        } else {
            println!("--- {name}\n+++ {name} (verl {})", a.to);
            print!("{}", migrate::diff(&text, &m.text));
        }
    }
    let (mut new_overrides, override_changes) = migrate::migrate_overrides(&overrides);
    changes.extend(
        override_changes
            .into_iter()
            .map(|c| ("override".to_owned(), c)),
    );
    let megatron_base =
        a.base.as_deref().map(|b| b.trim_end_matches(".yaml")) == Some("ppo_megatron_trainer");
    if megatron_base {
        new_overrides.insert(0, "model_engine=megatron".into());
        println!("base: ppo_trainer (ppo_megatron_trainer is a shim since verl 0.8.0)");
    }
    if !overrides.is_empty() || megatron_base {
        println!("overrides:\n  {}", new_overrides.join(" "));
    }
    for (place, c) in &changes {
        let at = if c.line > 0 {
            format!("{place}:{}", c.line)
        } else {
            place.clone()
        };
        match &c.to {
            Some(to) => println!("moved   {at}: {} -> {to} (verl {})", c.from, c.release),
            None => println!("dropped {at}: {} (verl {}: {})", c.from, c.release, c.note),
        }
    }
    0
}

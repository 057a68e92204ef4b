//! `verlc migrate`: a config written for verl 0.7.0 rewritten into 0.9.1's layout
//! (`verlc_front::migrate`). Prints the file's diff, the overrides as they now read (one per line,
//! shell-quoted, ready to paste after a launch command) and every key that moved or was
//! dropped; `--write` rewrites the file instead of printing its diff; `--format json` gives
//! the same as one object.
//!
//! The file is read as `check` reads configs (regular files within the size limit) and must
//! be YAML: a file that cannot be read is exit status 2, one that does not parse 1.

use std::path::{Path, PathBuf};

use serde_json::json;
use verlc_front::load::compose::read_error_code;
use verlc_front::load::read::{MAX_CONFIG_FILE_BYTES, read_text, strip_bom};
use verlc_front::migrate::{self, Change};
use verlc_front::source::{Source, SourceKind, SourceMap};

use super::args::{Format, MigrateArgs};
use super::output::{EXIT_ERRORS, EXIT_USAGE, rewrite_in_place, stderr_color, usage_error};

const TARGETS: [&str; 2] = ["0.9.0", "0.9.1"];

/// What a migration produced, printed as text or JSON at the end.
#[derive(Default)]
struct Report {
    file: Option<String>,
    diff: Option<String>,
    rewritten: bool,
    base: Option<&'static str>,
    overrides: Option<Vec<String>>,
    changes: Vec<(String, Change)>,
}

pub fn run(a: MigrateArgs) -> u8 {
    let json = a.format == Format::Json;
    if !TARGETS.contains(&a.to.as_str()) {
        return usage_error(
            json,
            &format!(
                "verlc migrates configs into verl {}'s layout, not {} (--to)",
                TARGETS.join(" or "),
                a.to
            ),
        );
    }
    let mut file: Option<PathBuf> = None;
    let mut overrides = Vec::new();
    for arg in &a.args {
        let looks_like_file = !arg.contains('=') && !arg.starts_with('~') && !arg.starts_with('+');
        if looks_like_file && file.is_none() && overrides.is_empty() {
            file = Some(PathBuf::from(arg));
        } else if looks_like_file {
            return usage_error(
                json,
                &format!("`{arg}` is a second config file; migrate one config at a time"),
            );
        } else {
            overrides.push(arg.clone());
        }
    }
    if file.is_none() && overrides.is_empty() && a.base.is_none() {
        return usage_error(
            json,
            "nothing to migrate: give a config file and/or overrides",
        );
    }
    let mut report = Report::default();
    if let Some(path) = &file
        && let Err(status) = migrate_file(path, &a, &mut report)
    {
        return status;
    }
    let (new_overrides, override_changes) = migrate::migrate_overrides(&overrides);
    let mut new_overrides = migrate::fit_to_release(new_overrides, &a.to);
    report.changes.extend(
        override_changes
            .into_iter()
            .map(|c| ("override".to_owned(), c)),
    );
    let megatron_base =
        a.base.as_deref().map(|b| b.trim_end_matches(".yaml")) == Some("ppo_megatron_trainer");
    if megatron_base {
        new_overrides.insert(0, "model_engine=megatron".into());
        report.base = Some("ppo_trainer");
    }
    if !overrides.is_empty() || megatron_base {
        report.overrides = Some(new_overrides);
    }
    if json {
        println!("{}", report_json(&report, &a.to));
    } else {
        print_report(&report, &a.to);
    }
    0
}

/// Reads, parses and migrates the config file into `report` (rewriting it with `--write`);
/// on failure, the exit status after the error is reported.
fn migrate_file(path: &Path, a: &MigrateArgs, report: &mut Report) -> Result<(), u8> {
    let json = a.format == Format::Json;
    let name = path.display().to_string();
    let text = match read_text(path, MAX_CONFIG_FILE_BYTES) {
        Ok(t) => strip_bom(t),
        Err(e) => {
            let d = verlc_front::diag::Diagnostic::error(read_error_code(&e), e.to_string());
            let status = super::output::exit_status(std::slice::from_ref(&d));
            print_diagnostics(&[d], &SourceMap::new(), json);
            return Err(status);
        }
    };
    // The rewrite works on lines; the file must first be the YAML verl would read.
    let mut sources = SourceMap::new();
    let id = sources.add(Source::new(name.clone(), text.as_str(), SourceKind::File));
    if let Err(d) = verlc_front::load::yaml::parse(sources.get(id), id) {
        print_diagnostics(&[d], &sources, json);
        return Err(EXIT_ERRORS);
    }
    let m = match migrate::migrate_file(&text) {
        Ok(m) => m,
        Err(e) => {
            let d = verlc_front::diag::Diagnostic::error(
                verlc_front::codes::USAGE,
                format!("{name}: {e}"),
            );
            print_diagnostics(&[d], &SourceMap::new(), json);
            return Err(EXIT_ERRORS);
        }
    };
    report.file = Some(name.clone());
    if m.megatron_shim {
        report.base = Some("ppo_trainer");
    }
    report
        .changes
        .extend(m.changes.iter().cloned().map(|c| (name.clone(), c)));
    if m.text != text {
        if a.write {
            if let Err(e) = rewrite_in_place(path, m.text.as_bytes()) {
                let d = verlc_front::diag::Diagnostic::error(
                    verlc_front::codes::IO_ERROR,
                    format!("cannot rewrite {name}: {e}"),
                );
                print_diagnostics(&[d], &SourceMap::new(), json);
                return Err(EXIT_USAGE);
            }
            report.rewritten = true;
        } else {
            report.diff = Some(migrate::diff(&text, &m.text));
        }
    }
    Ok(())
}

fn print_diagnostics(diags: &[verlc_front::diag::Diagnostic], sources: &SourceMap, json: bool) {
    if json {
        println!("{}", verlc_front::render::json(diags, sources));
    } else {
        eprint!(
            "{}",
            verlc_front::render::human(diags, sources, stderr_color())
        );
    }
}

/// Where a change was found: `file:line`, or the place alone (an override).
fn place(place: &str, c: &Change) -> String {
    if c.line > 0 {
        format!("{place}:{}", c.line)
    } else {
        place.to_owned()
    }
}

fn print_report(r: &Report, to: &str) {
    if let Some(name) = &r.file {
        if r.rewritten {
            println!("{name}: rewritten");
        } else if let Some(diff) = &r.diff {
            println!("--- {name}\n+++ {name} (verl {to})");
            print!("{diff}");
        } else {
            println!("{name}: nothing to change");
        }
    }
    if let Some(base) = r.base {
        println!("base: {base} (ppo_megatron_trainer is a shim since verl 0.8.0)");
    }
    if let Some(overrides) = &r.overrides {
        println!("overrides:");
        let n = overrides.len();
        for (i, o) in overrides.iter().enumerate() {
            let more = if i + 1 < n { " \\" } else { "" };
            println!("  {}{more}", shell_quote(o));
        }
    }
    for (p, c) in &r.changes {
        let at = place(p, c);
        match &c.to {
            Some(to) => println!("moved   {at}: {} -> {to} (verl {})", c.from, c.release),
            None => println!("dropped {at}: {} (verl {}: {})", c.from, c.release, c.note),
        }
    }
}

fn report_json(r: &Report, to: &str) -> String {
    let changes: Vec<_> = r
        .changes
        .iter()
        .map(|(p, c)| {
            json!({
                "place": p,
                "line": (c.line > 0).then_some(c.line),
                "from": c.from,
                "to": c.to,
                "release": c.release,
                "note": (!c.note.is_empty()).then_some(&c.note),
            })
        })
        .collect();
    json!({
        "to": to,
        "file": r.file,
        "rewritten": r.rewritten,
        "diff": r.diff,
        "base": r.base,
        "overrides": r.overrides,
        "changes": changes,
    })
    .to_string()
}

/// `arg` as one POSIX shell word: as it is where no character is special to the shell,
/// else in single quotes (a quote inside written `'\''`).
pub fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    #[test]
    fn arguments_are_quoted_only_where_the_shell_would_split_or_expand_them() {
        assert_eq!(
            shell_quote("data.train_batch_size=256"),
            "data.train_batch_size=256"
        );
        assert_eq!(
            shell_quote("data.train_files=['/a/x.parquet', '/b/y.parquet']"),
            r#"'data.train_files=['\''/a/x.parquet'\'', '\''/b/y.parquet'\'']'"#
        );
        assert_eq!(shell_quote("~trainer.logger"), "'~trainer.logger'");
        assert_eq!(shell_quote("k=${oc.env:HOME}"), "'k=${oc.env:HOME}'");
        assert_eq!(shell_quote("k=it's"), r"'k=it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}

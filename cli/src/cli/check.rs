//! `verlc check`.

use verlc_front::check::{CheckOptions, check};
use verlc_front::diag::{Severity, did_you_mean};

use super::args::{CheckArgs, Format};
use super::output::{exit_status, usage_error};
use verlc_front::render;

pub fn run(a: CheckArgs) -> u8 {
    let json = a.format == Format::Json;
    let req = match a.config.request() {
        Ok(r) => r,
        Err(msg) => return usage_error(json, &msg),
    };
    // An unknown id would select no rule and report "ok" for any config.
    for code in &a.only {
        if verlc_front::rules::known_code(code).is_none() {
            let ids: Vec<&str> = verlc_front::rules::all_codes().map(|c| c.0).collect();
            let hint = did_you_mean(&code.to_ascii_uppercase(), ids.iter().copied())
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_else(|| "; `verlc rule --list` lists them".into());
            return usage_error(
                json,
                &format!("--only `{code}`: no such diagnostic id{hint}"),
            );
        }
    }
    let opts = CheckOptions {
        model_config: a.model_config.clone(),
        only: a.only.clone(),
    };
    let mut checked = check(&req, &opts);
    if a.deny_warnings {
        for d in &mut checked.diagnostics {
            d.severity = Severity::Error;
        }
    }
    match a.format {
        Format::Json => println!("{}", render::json_checked(&checked)),
        Format::Human => {
            let color = super::output::stderr_color();
            eprint!("{}", render::human_checked(&checked, color));
        }
    }
    if a.print_config {
        let mut tree = checked.composed.root.to_json();
        checked.composed.secrets().redact_json(&mut tree);
        println!(
            "{}",
            serde_json::to_string_pretty(&tree).unwrap_or_default()
        );
    }
    let status = exit_status(&checked.diagnostics);
    if status == 0 && a.format == Format::Human && checked.diagnostics.is_empty() {
        eprintln!(
            "ok: config is valid (judged against verl {})",
            checked.release
        );
    }
    // The process ends here: freeing the trees one node at a time would take a twentieth of
    // the whole check, and the OS reclaims them at once.
    std::mem::forget(checked);
    status
}

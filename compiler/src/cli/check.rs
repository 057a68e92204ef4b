//! `verlc check`.

use std::io::IsTerminal;

use verlc::check::{CheckOptions, check};
use verlc::codes;
use verlc::diag::Severity;

use super::args::{CheckArgs, Format};
use super::{EXIT_ERRORS, EXIT_USAGE};
use verlc::render;

pub fn run(a: CheckArgs) -> u8 {
    let req = a.config.request();
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
    let sources = &checked.composed.sources;
    match a.format {
        Format::Json => println!("{}", render::json(&checked.diagnostics, sources)),
        Format::Human => {
            let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            eprint!("{}", render::human(&checked.diagnostics, sources, color));
        }
    }
    if a.print_config {
        println!(
            "{}",
            serde_json::to_string_pretty(&checked.composed.root.to_json()).unwrap_or_default()
        );
    }
    let io = checked
        .diagnostics
        .iter()
        .any(|d| d.code == codes::IO_ERROR && d.primary.is_none());
    let failed = checked.has_errors();
    let quiet = checked.diagnostics.is_empty();
    // The process ends here: freeing the trees one node at a time would take a twentieth of
    // the whole check, and the OS reclaims them at once.
    std::mem::forget(checked);
    if io {
        EXIT_USAGE
    } else if failed {
        EXIT_ERRORS
    } else {
        if a.format == Format::Human && quiet {
            eprintln!("ok: config is valid");
        }
        0
    }
}

//! `verlc rule`: what a diagnostic id means.

use verlc::{codes, rules};

use super::args::RuleArgs;

pub fn run(a: RuleArgs) -> u8 {
    if a.list || a.code.is_none() {
        for c in codes::ALL_LOAD_CODES {
            println!("{c}");
        }
        for r in rules::RULES {
            println!("{}  {:<40} {}", r.code, r.name, r.summary);
        }
        return 0;
    }
    let code = a.code.unwrap_or_default();
    match rules::find(&code) {
        Some(r) => {
            println!(
                "# {} {}\n\n{}\n\n{}",
                r.code,
                r.name,
                r.summary,
                r.doc_text().trim_end()
            );
            0
        }
        None => {
            eprintln!("error: no rule `{code}`; `verlc rule --list` lists them");
            super::EXIT_USAGE
        }
    }
}

//! `verlc rule`: what a diagnostic id means (`verlc rule V012`, or by name), or the list of
//! every id (`verlc rule --list`).

use std::io::Write;

use verlc::{codes, rules};

use super::args::RuleArgs;

pub fn run(a: RuleArgs) -> u8 {
    // A closed pipe (`verlc rule --list | head`) is not an error worth a panic.
    let mut out = std::io::stdout().lock();
    if a.list || a.code.is_none() {
        for (c, summary) in codes::LOAD_CODES {
            let _ = writeln!(out, "{c}  {:<52} {summary}", "(composition and schema)");
        }
        for r in rules::RULES {
            let _ = writeln!(out, "{}  {:<52} {}", r.code, r.name, r.summary);
        }
        for (c, summary) in codes::BUILD_CODES {
            let _ = writeln!(out, "{c}  {:<52} {summary}", "(verlc build)");
        }
        return 0;
    }
    let code = a.code.unwrap_or_default();
    match rules::find(&code) {
        Some(r) => {
            let _ = writeln!(
                out,
                "# {} {}\n\n{}\n\n{}",
                r.code,
                r.name,
                r.summary,
                r.doc_text().trim_end()
            );
            0
        }
        None if codes::BUILD_CODES
            .iter()
            .any(|(c, _)| c.0.eq_ignore_ascii_case(&code)) =>
        {
            let (c, summary) = codes::BUILD_CODES
                .iter()
                .find(|(c, _)| c.0.eq_ignore_ascii_case(&code))
                .map_or((code.as_str(), ""), |(c, s)| (c.0, *s));
            // B00x: keys a trainer does not read (warnings); B01x: what it cannot bind or honour.
            let how = if c.starts_with("B00") {
                "Reported by `verlc check` and `verlc build` as a warning when you changed the key: the generated trainer does not read it (`verlc build --deny-warnings` stops on it)."
            } else {
                "Reported by `verlc build` as an error (and by `verlc check` as a warning): the generated trainer cannot bind or honour this config."
            };
            let _ = writeln!(out, "# {c}\n\n{summary}\n\n{how}");
            0
        }
        None if codes::LOAD_CODES
            .iter()
            .any(|(c, _)| c.0.eq_ignore_ascii_case(&code)) =>
        {
            let (c, summary) = codes::LOAD_CODES
                .iter()
                .find(|(c, _)| c.0.eq_ignore_ascii_case(&code))
                .map_or((code.as_str(), ""), |(c, s)| (c.0, *s));
            let how = match c.as_bytes().first() {
                Some(b'Y') => {
                    "Reported by every command that reads the config, at the file and line: the YAML itself is the problem (Y005 is a usage error, exit status 2)."
                }
                Some(b'H') => {
                    "Reported by every command that reads the config, at the line: Hydra would refuse to compose this config the same way."
                }
                _ => {
                    "Reported by every command that reads the config, at the line of the value: verl's own config classes would refuse it when the run starts."
                }
            };
            let _ = writeln!(out, "# {c}\n\n{summary}\n\n{how}");
            0
        }
        None => {
            eprintln!("error: no rule `{code}`; `verlc rule --list` lists them");
            super::EXIT_USAGE
        }
    }
}

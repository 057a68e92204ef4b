//! `verlc rule`: what a diagnostic id means (`verlc rule V012`, or by name), or the list of
//! every id (`verlc rule --list`).

use std::io::Write;

use verlc_front::{codes, rules, sft};

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
        for r in sft::rules::SFT_RULES {
            let _ = writeln!(out, "{}  {:<52} {}", r.code, r.name, r.summary);
        }
        for (c, summary) in codes::BUILD_CODES {
            let _ = writeln!(out, "{c}  {:<52} {summary}", "(verlc build)");
        }
        return 0;
    }
    let code = a.code.unwrap_or_default();
    if let Some(r) = sft::rules::find(&code) {
        let _ = writeln!(
            out,
            "# {} {} (verl's SFT trainer)\n\n{}\n\n{}",
            r.code,
            r.name,
            r.summary,
            r.doc_text().trim_end()
        );
        return 0;
    }
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
        None => match codes::LOAD_CODES
            .iter()
            .chain(codes::BUILD_CODES)
            .find(|(c, _)| c.0.eq_ignore_ascii_case(&code))
        {
            Some((c, summary)) => {
                let _ = writeln!(out, "# {c}\n\n{summary}\n\n{}", how_reported(c.0));
                0
            }
            None => {
                eprintln!("error: no rule `{code}`; `verlc rule --list` lists them");
                super::EXIT_USAGE
            }
        },
    }
}

/// Which command reports a non-rule code, and why.
fn how_reported(code: &str) -> &'static str {
    match code.as_bytes() {
        [b'B', b'0', b'0', b'7'] => {
            "Reported by `verlc check` and `verlc build` as a warning for a CPU trainer that binds bf16 on a host without native bf16 (AVX-512 BF16 or AMX)."
        }
        // B00x: keys a trainer does not read (warnings); B01x: what it cannot bind or honour.
        [b'B', b'0', b'0', ..] => {
            "Reported by `verlc check` and `verlc build` as a warning when you changed the key: the generated trainer does not read it (`verlc build --deny-warnings` stops on it)."
        }
        [b'B', ..] => {
            "Reported by `verlc build` as an error (and by `verlc check` as a warning): the generated trainer cannot bind or honour this config."
        }
        [b'Y', ..] => {
            "Reported by every command that reads the config, at the file and line: the YAML itself is the problem (Y005 is a usage error, exit status 2)."
        }
        [b'H', ..] => {
            "Reported by every command that reads the config, at the line: Hydra would refuse to compose this config the same way."
        }
        _ => {
            "Reported by every command that reads the config, at the line of the value: verl's own config classes would refuse it when the run starts."
        }
    }
}

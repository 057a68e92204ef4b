//! `verlc schema`: write, print or check the editor schemas.

use std::path::{Path, PathBuf};

use verlc_front::schema;

use super::args::SchemaArgs;
use super::{EXIT_ERRORS, EXIT_USAGE};

pub fn run(a: SchemaArgs) -> u8 {
    if let Some(name) = &a.print {
        let s = if name == "root" || name == "verl" {
            Some(schema::root_editor_schema())
        } else {
            schema::group_editor_schema(name)
        };
        return match s {
            Some(s) => {
                print!("{}", schema::pretty(&s));
                0
            }
            None => {
                eprintln!(
                    "error: unknown schema `{name}`; choose root or one of: {}",
                    schema::GROUPS
                        .iter()
                        .map(|g| g.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                EXIT_USAGE
            }
        };
    }
    let dir = a.out.unwrap_or_else(|| PathBuf::from("schemas"));
    if a.check {
        return check(&dir);
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return EXIT_USAGE;
    }
    for (name, content) in schema::all_files() {
        let p = dir.join(&name);
        if let Err(e) = super::output::write_atomic(&p, content.as_bytes()) {
            eprintln!("error: cannot write {}: {e}", p.display());
            return EXIT_USAGE;
        }
        eprintln!("wrote {}", p.display());
    }
    0
}

fn check(dir: &Path) -> u8 {
    let mut stale = Vec::new();
    for (name, content) in schema::all_files() {
        let p = dir.join(&name);
        if std::fs::read_to_string(&p).ok().as_deref() != Some(content.as_str()) {
            stale.push(p.display().to_string());
        }
    }
    if stale.is_empty() {
        eprintln!("schemas are up to date");
        0
    } else {
        eprintln!(
            "stale schemas (run `verlc schema -o {}`): {}",
            dir.display(),
            stale.join(", ")
        );
        EXIT_ERRORS
    }
}

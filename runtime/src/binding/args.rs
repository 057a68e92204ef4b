//! The trainer's command line, parsed by hand: six options and Hydra overrides do not need an
//! argument-parsing framework linked into every trainer binary.

use std::ffi::OsString;

/// What the command line asks for.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Args {
    /// Print the build info and exit.
    pub version: bool,
    /// Print the resolved config (after overrides) and exit.
    pub print_config: bool,
    /// Print the trainer spec this run executes (JSON) and exit.
    pub print_spec: bool,
    /// Check the overrides and exit.
    pub check_only: bool,
    /// Spawn N local ranks (sets trainer.n_gpus_per_node=N).
    pub nproc_per_node: Option<u32>,
    /// Config overrides, in order.
    pub overrides: Vec<String>,
}

/// Why parsing stopped: help was asked for, or the command line is wrong (the text to print
/// either way).
#[derive(Debug, PartialEq)]
pub(super) enum Stop {
    Help(String),
    Usage(String),
}

const USAGE: &str = "Usage: trainer [OPTIONS] [KEY=VALUE]...";

/// The `--help` text.
pub(super) fn help() -> String {
    format!(
        "Runs the training this binary was built for (`verlc build`). KEY=VALUE overrides use \
Hydra's grammar (key=value, +key=value, ++key=value, ~key), are checked like `verlc check` and \
lowered like `verlc build`.

{USAGE}

Arguments:
  [KEY=VALUE]...          Config overrides

Options:
  -V, --version           Print the build info and exit
      --print-config      Print the resolved config (after overrides) and exit
      --print-spec        Print the trainer spec this run executes (JSON) and exit
      --check             Check the overrides and exit
      --nproc-per-node N  Spawn N local ranks (sets trainer.n_gpus_per_node=N)
  -h, --help              Print help

ranks: torchrun/SLURM environments (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) are honoured; \
otherwise trainer.n_gpus_per_node local ranks are spawned (CPU processes over Gloo on \
trainer.device=cpu).
"
    )
}

fn usage_error(what: String) -> Stop {
    Stop::Usage(format!(
        "error: {what}\n\n{USAGE}\n\nFor more information, try '--help'.\n"
    ))
}

/// Parse the arguments after the program name.
pub(super) fn parse(raw: &[OsString]) -> Result<Args, Stop> {
    let mut args = Args::default();
    let mut only_overrides = false;
    let mut it = raw.iter();
    while let Some(os) = it.next() {
        let Some(a) = os.to_str() else {
            return Err(usage_error(format!(
                "the argument {os:?} is not valid UTF-8"
            )));
        };
        if only_overrides || !a.starts_with('-') || a == "-" {
            args.overrides.push(override_arg(a).map_err(usage_error)?);
            continue;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (a, None),
        };
        let flag = |set: &mut bool| {
            if let Some(v) = inline {
                return Err(usage_error(format!(
                    "the option `{name}` takes no value (got `{v}`)"
                )));
            }
            *set = true;
            Ok(())
        };
        match name {
            "--" => only_overrides = true,
            "-h" | "--help" => return Err(Stop::Help(help())),
            "-V" | "--version" => flag(&mut args.version)?,
            "--print-config" => flag(&mut args.print_config)?,
            "--print-spec" => flag(&mut args.print_spec)?,
            "--check" => flag(&mut args.check_only)?,
            "--nproc-per-node" => {
                let value = match inline {
                    Some(v) => v.to_owned(),
                    None => it
                        .next()
                        .and_then(|v| v.to_str())
                        .map(str::to_owned)
                        .ok_or_else(|| {
                            usage_error("the option `--nproc-per-node` needs a value N".into())
                        })?,
                };
                let n = value.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    usage_error(format!(
                        "invalid value `{value}` for `--nproc-per-node`: a whole number of ranks, at least 1"
                    ))
                })?;
                args.nproc_per_node = Some(n);
            }
            // A negative-looking override value never starts an argument; a leading `-`
            // is an option.
            _ => return Err(usage_error(format!("unexpected argument `{a}`"))),
        }
    }
    Ok(args)
}

fn override_arg(a: &str) -> Result<String, String> {
    if a.contains('=') || a.starts_with('~') {
        Ok(a.to_owned())
    } else {
        Err(format!(
            "`{a}` is neither an option nor a KEY=VALUE override"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Args, Stop> {
        let raw: Vec<OsString> = a.iter().map(OsString::from).collect();
        parse(&raw)
    }

    fn usage(a: &[&str]) -> String {
        match args(a) {
            Err(Stop::Usage(text)) => text,
            other => panic!("{a:?}: want a usage error, got {other:?}"),
        }
    }

    #[test]
    fn options_and_overrides() {
        assert_eq!(
            args(&[
                "--print-config",
                "--nproc-per-node",
                "2",
                "a.b=1",
                "+c=2",
                "~d",
            ]),
            Ok(Args {
                print_config: true,
                nproc_per_node: Some(2),
                overrides: vec!["a.b=1".into(), "+c=2".into(), "~d".into()],
                ..Args::default()
            })
        );
        assert_eq!(
            args(&["--nproc-per-node=3", "-V", "--check", "--print-spec"]),
            Ok(Args {
                version: true,
                print_spec: true,
                check_only: true,
                nproc_per_node: Some(3),
                ..Args::default()
            })
        );
        // After `--`, everything is an override, even what looks like an option.
        assert_eq!(
            args(&["--", "trainer.test_freq=-1"]).map(|a| a.overrides),
            Ok(vec!["trainer.test_freq=-1".to_owned()])
        );
        assert!(args(&["trainer.test_freq=-1"]).is_ok());
        assert!(
            matches!(args(&["--help"]), Err(Stop::Help(h)) if h.contains("--nproc-per-node N"))
        );
        assert!(matches!(args(&["-h"]), Err(Stop::Help(_))));
    }

    #[test]
    fn mistakes_are_usage_errors_that_say_what_is_wrong() {
        assert!(usage(&["--nproc-per-node", "0"]).contains("at least 1"));
        assert!(usage(&["--nproc-per-node=x"]).contains("invalid value `x`"));
        assert!(usage(&["--nproc-per-node"]).contains("needs a value"));
        assert!(usage(&["--frobnicate"]).contains("unexpected argument `--frobnicate`"));
        assert!(usage(&["--check=yes"]).contains("takes no value"));
        let stray = usage(&["stray"]);
        assert!(
            stray.contains("neither an option nor a KEY=VALUE"),
            "{stray}"
        );
        assert!(stray.contains("Usage: trainer"), "{stray}");
    }
}

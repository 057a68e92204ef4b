//! `verlc run CONFIG [overrides] [-- binary args]`: build the trainer in the cache (a no-op
//! when it is fresh) and run it in place of this process.

use std::process::Command;

use super::EXIT_USAGE;
use super::args::RunArgs;
use super::build::{Compile, compile};

pub fn run(a: RunArgs) -> u8 {
    let compiled = match compile(&a.compile) {
        Ok(Compile::Built(c)) => c,
        Ok(Compile::Planned(_)) => return 0,
        Err(code) => return code,
    };
    eprintln!(
        "running {} {}",
        compiled.binary.display(),
        a.binary_args.join(" ")
    );
    let mut cmd = Command::new(&compiled.binary);
    cmd.args(&a.binary_args);
    if let Some(vllm) = checkout_vllm() {
        cmd.env("VERLC_VLLM_PYTHON", vllm);
    }
    exec(cmd)
}

/// The checkout's vLLM interpreter (`scripts/setup --vllm`), which `rollout.name: vllm` finds
/// without an activated venv; `None` where $VERLC_VLLM_PYTHON is set (it wins) or there is none.
pub(crate) fn checkout_vllm() -> Option<std::path::PathBuf> {
    if std::env::var_os("VERLC_VLLM_PYTHON").is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let checkout = crate::codegen::Paths::from_env(None, None).checkout;
    let vllm = checkout.join(".venv/bin/python-vllm");
    vllm.is_file().then_some(vllm)
}

#[cfg(unix)]
fn exec(mut cmd: Command) -> u8 {
    use std::os::unix::process::CommandExt;
    // Only returns on failure; signals then go straight to the trainer.
    let e = cmd.exec();
    eprintln!("error: cannot run the trainer: {e}");
    EXIT_USAGE
}

#[cfg(not(unix))]
fn exec(mut cmd: Command) -> u8 {
    match cmd.status() {
        Ok(s) => s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1),
        Err(e) => {
            eprintln!("error: cannot run the trainer: {e}");
            EXIT_USAGE
        }
    }
}

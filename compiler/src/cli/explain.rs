//! `verlc explain` (being written).

use super::args::ExplainArgs;

pub fn run(_a: ExplainArgs) -> u8 {
    eprintln!("verlc explain: not implemented yet");
    super::EXIT_USAGE
}

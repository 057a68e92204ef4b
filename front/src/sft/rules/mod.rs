//! verl's SFT trainer's cross-field rules, decided before anything runs: one rule per file,
//! ids `F0xx` in [`SFT_RULES`]. Each file starts with its documentation under the headings
//! of the PPO rules (What it checks, Why, Example, Fix); `verlc rule F001` prints it.

use crate::diag::{Code, Diagnostic};
use crate::load::node::Node;
use crate::source::Origin;

use super::SftConfig;

mod batch_below_data_parallel;
mod batch_not_divisible_by_micro_batch;
mod frequency_zero;
mod legacy_chat_template;
mod legacy_key_not_read;
mod logger_unknown;
mod pad_mode_not_no_padding;
mod profile_interval_invalid;
mod resume_mode_invalid;
mod scheduler_unknown;
mod token_budget_below_max_length;
mod truncation_invalid;
mod ulysses_needs_remove_padding;
mod validation_without_files;
mod world_not_divisible_by_model_parallel;

/// What an SFT rule sees: the values, the composed tree (for where each was written) and the
/// release.
pub struct SftContext<'a> {
    pub config: &'a SftConfig,
    pub root: &'a Node,
    /// The verl release the tree is (`0.9.1`).
    pub release: &'a str,
}

impl SftContext<'_> {
    /// Where `key` (dotted, named as in `sft_trainer_engine`) was written.
    pub fn origin(&self, key: &'static str) -> Option<Origin> {
        let key = self.config.key(key);
        let path: Vec<&str> = key.split('.').collect();
        self.root.get_path(&path).and_then(|n| n.origin.clone())
    }

    /// Whether the release is at least `minor` (`(0, 8)`).
    pub fn at_least(&self, minor: (u32, u32)) -> bool {
        crate::load::version::minor_version(self.release).is_some_and(|v| v >= minor)
    }
}

/// A registered SFT rule (its documentation, id and name as a PPO rule's).
pub type SftRule = crate::rules::Rule<fn(&SftContext, &mut Vec<Diagnostic>)>;

macro_rules! rule {
    ($code:literal, $name:literal, $file:ident, $summary:literal) => {
        crate::rules::Rule {
            code: Code($code),
            name: $name,
            summary: $summary,
            doc: crate::rules::leading_doc(include_str!(concat!(stringify!($file), ".rs"))),
            check: $file::check,
        }
    };
}

/// Every SFT rule, in id order.
pub static SFT_RULES: &[SftRule] = &[
    rule!(
        "F001",
        "BatchBelowDataParallel",
        batch_below_data_parallel,
        "data.train_batch_size gives each data-parallel rank no sample (or leaves some out)"
    ),
    rule!(
        "F002",
        "BatchNotDivisibleByMicroBatch",
        batch_not_divisible_by_micro_batch,
        "without dynamic batching, a rank's batch must split into whole micro-batches"
    ),
    rule!(
        "F003",
        "PadModeNotNoPadding",
        pad_mode_not_no_padding,
        "the engine-based SFT trainer runs only data.pad_mode=no_padding"
    ),
    rule!(
        "F004",
        "TruncationInvalid",
        truncation_invalid,
        "data.truncation is error, left or right (left truncates on the right without padding)"
    ),
    rule!(
        "F005",
        "FrequencyZero",
        frequency_zero,
        "trainer.save_freq/test_freq of 0, or a string other than after_each_epoch, fails at step 1"
    ),
    rule!(
        "F006",
        "ValidationWithoutFiles",
        validation_without_files,
        "trainer.test_freq validates a dataset data.val_files does not name"
    ),
    rule!(
        "F007",
        "UlyssesNeedsRemovePadding",
        ulysses_needs_remove_padding,
        "Ulysses sequence parallelism needs model.use_remove_padding"
    ),
    rule!(
        "F008",
        "WorldNotDivisibleByModelParallel",
        world_not_divisible_by_model_parallel,
        "the world size must be a multiple of the ranks that share a batch"
    ),
    rule!(
        "F009",
        "ResumeModeInvalid",
        resume_mode_invalid,
        "trainer.resume_mode and resume_from_path as verl's checkpoint handler takes them"
    ),
    rule!(
        "F010",
        "TokenBudgetBelowMaxLength",
        token_budget_below_max_length,
        "with dynamic batching, a rank's token budget must hold the longest sample"
    ),
    rule!(
        "F011",
        "LoggerUnknown",
        logger_unknown,
        "trainer.logger names a backend verl's tracking does not have"
    ),
    rule!(
        "F012",
        "SchedulerUnknown",
        scheduler_unknown,
        "optim.lr_scheduler_type is constant or cosine"
    ),
    rule!(
        "F013",
        "ProfileIntervalInvalid",
        profile_interval_invalid,
        "trainer.profile_interval is [start, end] with end >= start"
    ),
    rule!(
        "F014",
        "LegacyKeyNotRead",
        legacy_key_not_read,
        "verl 0.7.0's legacy SFT trainer ignores this key of its config (another key is read)"
    ),
    rule!(
        "F015",
        "LegacyChatTemplate",
        legacy_chat_template,
        "verl 0.7.0's legacy SFT trainer refuses data.chat_template at start-up"
    ),
];

/// Runs every rule.
pub fn run(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    for rule in SFT_RULES {
        (rule.check)(ctx, out);
    }
}

/// The rule with id `code` (`F001`).
pub fn find(code: &str) -> Option<&'static SftRule> {
    SFT_RULES
        .iter()
        .find(|r| r.code.0.eq_ignore_ascii_case(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_in_order_and_documented() {
        let mut last = "";
        for r in SFT_RULES {
            assert!(r.code.0.starts_with('F') && r.code.0 > last, "{}", r.code.0);
            last = r.code.0;
            for heading in ["## What it checks", "## Why", "## Example", "## Fix"] {
                assert!(r.doc.contains(heading), "{} lacks {heading}", r.code.0);
            }
        }
    }
}

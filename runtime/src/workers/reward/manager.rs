//! Reward managers: how a scorer's results become the rewards written at each response's last
//! token (verl's `reward_manager.name`).
//!
//! - `naive`: the score is the reward.
//! - `dapo` (verl's `DAPORewardManager`): a plain-number score is also kept as `acc` (a dict's
//!   `score` as `score`), and with an overlong buffer a response of `L` tokens gains
//!   `min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)`: nothing up to
//!   `max_resp_len - len` tokens, then a linear penalty reaching `-penalty_factor` at
//!   `max_resp_len`. With `log`, `overlong_reward` and `overlong` join the extra info.
//! - `gdpo` (verl 0.9's `GDPORewardManager`): the score is the reward, and a plain-number
//!   score is also kept as `acc`; the trainer hands the scorer `extra_info.experiment_name`.

use serde_json::Value;
use verlc_spec::trainer::RewardManagerSpec;

use super::Score;

/// Turns each row's scorer result into its reward in place; `response_lengths[i]` is row
/// `i`'s response length in tokens (EOS included).
pub fn apply(manager: &RewardManagerSpec, scores: &mut [Score], response_lengths: &[usize]) {
    let overlong_buffer = match manager {
        // A Python manager made its rewards itself.
        RewardManagerSpec::Naive | RewardManagerSpec::Python(_) => return,
        RewardManagerSpec::Gdpo { .. } => {
            for s in scores.iter_mut().filter(|s| !s.from_dict) {
                s.extra.insert("acc".to_owned(), number(s.score));
            }
            return;
        }
        RewardManagerSpec::Dapo { overlong_buffer } => overlong_buffer,
    };
    for (s, &len) in scores.iter_mut().zip(response_lengths) {
        let raw = s.score;
        let key = if s.from_dict { "score" } else { "acc" };
        s.extra.insert(key.to_owned(), number(raw));
        if let Some(b) = overlong_buffer {
            let exceed = len as f64 - (b.max_resp_len - b.len);
            let penalty = (-exceed / b.len * b.penalty_factor).min(0.0);
            s.score = raw + penalty;
            if b.log {
                s.extra
                    .insert("overlong_reward".to_owned(), number(penalty));
                s.extra
                    .insert("overlong".to_owned(), Value::Bool(penalty < 0.0));
            }
        }
    }
}

fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use verlc_spec::trainer::OverlongBufferSpec;

    fn scores(values: &[f64]) -> Vec<Score> {
        values.iter().copied().map(Score::of).collect()
    }

    #[test]
    fn gdpo_keeps_a_plain_score_as_acc() {
        let mut s = scores(&[0.5, 1.0]);
        s[1].from_dict = true;
        let gdpo = RewardManagerSpec::Gdpo {
            experiment_name: "x".into(),
        };
        apply(&gdpo, &mut s, &[3, 4]);
        assert_eq!(s[0].extra["acc"], 0.5);
        assert!(!s[1].extra.contains_key("acc"));
        assert_eq!((s[0].score, s[1].score), (0.5, 1.0));
    }

    #[test]
    fn dapo_penalises_the_overlong_buffer_linearly() {
        // max_resp_len 8, buffer 4, factor 0.5: free up to 4 tokens, -0.5 at 8.
        let m = RewardManagerSpec::Dapo {
            overlong_buffer: Some(OverlongBufferSpec {
                max_resp_len: 8.0,
                len: 4.0,
                penalty_factor: 0.5,
                log: true,
            }),
        };
        let mut s = scores(&[1.0, 1.0, 0.0, 1.0]);
        s[3].from_dict = true;
        apply(&m, &mut s, &[3, 4, 6, 8]);
        let got: Vec<f64> = s.iter().map(|s| s.score).collect();
        assert_eq!(got, [1.0, 1.0, -0.25, 0.5]);
        assert_eq!(s[2].extra["acc"], 0.0);
        assert_eq!(s[3].extra["score"], 1.0);
        assert!(!s[3].extra.contains_key("acc"));
        assert_eq!(s[2].extra["overlong"], true);
        assert_eq!(s[1].extra["overlong"], false);
        assert_eq!(s[2].extra["overlong_reward"], -0.25);
    }

    #[test]
    fn naive_and_dapo_without_a_buffer_keep_the_score() {
        let mut s = scores(&[0.5, 2.0]);
        apply(&RewardManagerSpec::Naive, &mut s, &[100, 1]);
        assert_eq!((s[0].score, s[1].score), (0.5, 2.0));
        assert!(s[0].extra.is_empty());
        let dapo = RewardManagerSpec::Dapo {
            overlong_buffer: None,
        };
        apply(&dapo, &mut s, &[100, 1]);
        assert_eq!((s[0].score, s[1].score), (0.5, 2.0));
        assert_eq!(s[1].extra["acc"], 2.0);
    }
}

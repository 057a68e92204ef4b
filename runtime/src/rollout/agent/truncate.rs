//! `max_tool_response_length` / `tool_response_truncate_side`: a tool's text longer than the
//! limit (in characters) is cut as verl 0.8+ cuts it; the markers are verl's.

/// Which part of a long tool response is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncateSide {
    /// The end (`"(truncated)..."` then the last `limit` characters).
    Left,
    /// The start (the first `limit` characters then `"...(truncated)"`).
    Right,
    /// Half the limit from each end around `"...(truncated)..."` (verl's default).
    #[default]
    Middle,
}

impl TruncateSide {
    /// The config spelling (`left`, `right`; any other value is verl's `middle`).
    pub fn parse(s: &str) -> TruncateSide {
        match s {
            "left" => TruncateSide::Left,
            "right" => TruncateSide::Right,
            _ => TruncateSide::Middle,
        }
    }
}

/// `text` cut to `limit` characters on `side`, with verl's marker; unchanged when it fits.
pub fn truncate(text: &str, limit: usize, side: TruncateSide) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= limit {
        return text.to_owned();
    }
    let head = |n: usize| chars[..n].iter().collect::<String>();
    // Python's `text[-n:]`: with n = 0 that is the whole text (verl's limit 0 or 1 keeps it).
    let tail = |n: usize| {
        if n == 0 {
            text.to_owned()
        } else {
            chars[chars.len() - n..].iter().collect::<String>()
        }
    };
    match side {
        TruncateSide::Left => format!("(truncated)...{}", tail(limit)),
        TruncateSide::Right => format!("{}...(truncated)", head(limit)),
        TruncateSide::Middle => {
            let half = limit / 2;
            format!("{}...(truncated)...{}", head(half), tail(half))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_keeps_its_part() {
        let t = "abcdefghij";
        assert_eq!(truncate(t, 10, TruncateSide::Left), t);
        assert_eq!(truncate(t, 4, TruncateSide::Left), "(truncated)...ghij");
        assert_eq!(truncate(t, 4, TruncateSide::Right), "abcd...(truncated)");
        assert_eq!(
            truncate(t, 5, TruncateSide::Middle),
            "ab...(truncated)...ij"
        );
        assert_eq!(
            truncate("äöüßé", 2, TruncateSide::Right),
            "äö...(truncated)"
        );
        assert_eq!(TruncateSide::parse("sideways"), TruncateSide::Middle);
        assert_eq!(
            truncate("abc", 1, TruncateSide::Middle),
            "...(truncated)...abc"
        );
    }
}

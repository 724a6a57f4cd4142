//! Cutting text to a byte budget, for messages that end up where size is
//! bounded (Kubernetes Events, logs, what a guest said).

/// `s` cut to at most `max` bytes, on a char boundary, silently: for
/// fields with a hard limit (an Event's note).
pub fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        s.truncate(boundary(&s, max));
    }
    s
}

/// Cuts `s` to at most `max` bytes (on a char boundary), saying so: the
/// marker (`… (N bytes truncated)`) comes on top of the `max` bytes kept.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let total = s.len();
    let cut = boundary(&s, max);
    s.truncate(cut);
    s.push_str(&format!("… ({} bytes truncated)", total - cut));
    s
}

/// The largest char boundary of `s` at or below `max` (`max < s.len()`).
fn boundary(s: &str, max: usize) -> usize {
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_short_strings_and_marks_cut_ones() {
        assert_eq!(truncate("short".into(), 10), "short");
        let cut = truncate("x".repeat(5000), 1024);
        assert!(cut.starts_with(&"x".repeat(1024)));
        assert!(cut.ends_with("(3976 bytes truncated)"), "{cut}");
        // Never splits a multi-byte character.
        assert_eq!(truncate("ééé".into(), 3), "é… (4 bytes truncated)");
    }

    #[test]
    fn cut_keeps_at_most_max_bytes_on_a_char_boundary() {
        assert_eq!(cut("short".into(), 10), "short");
        assert_eq!(cut("x".repeat(5000), 1000).len(), 1000);
        assert_eq!(cut("ééé".into(), 3), "é");
    }
}

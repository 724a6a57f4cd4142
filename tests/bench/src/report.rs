//! The results: the table rows, the sections below them, and the Markdown
//! of `docs/benchmarks.md`, whose hand-written analysis (below
//! [`ANALYSIS_MARK`]) a run keeps.

use std::fmt::Write as _;

pub(crate) const ANALYSIS_MARK: &str = "<!-- analysis -->";

/// What a row must reach to be "met".
pub(crate) enum Goal {
    /// A figure without a goal.
    None,
    /// portwise ÷ native at most this.
    RatioAtMost(f64),
    /// A goal of its own, as the row states it, and whether it was met.
    Stated(&'static str, bool),
}

#[derive(Default)]
pub(crate) struct Report {
    /// (row, what, portwise, native, ratio, goal, verdict)
    pub(crate) rows: Vec<[String; 7]>,
    pub(crate) sections: Vec<(String, String)>,
    pub(crate) behind: Vec<String>,
}

impl Report {
    pub(crate) fn row(
        &mut self,
        row: &str,
        what: &str,
        portwise: String,
        native: String,
        ratio: Option<f64>,
        goal: Goal,
    ) {
        self.row_within(row, what, portwise, native, ratio, None, goal);
    }

    /// [`Report::row`] with the ratio's 95 % interval, where the row has
    /// one ([`ratio_interval`]): a ratio past its goal whose interval
    /// reaches the goal is still "behind", and says it is within noise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row_within(
        &mut self,
        row: &str,
        what: &str,
        portwise: String,
        native: String,
        ratio: Option<f64>,
        interval: Option<(f64, f64)>,
        goal: Goal,
    ) {
        let most = match goal {
            Goal::RatioAtMost(most) => Some(most),
            _ => None,
        };
        let (goal, met) = match goal {
            Goal::None => (String::new(), None),
            Goal::RatioAtMost(most) => (format!("≤ {most:.1}×"), ratio.map(|x| x <= most)),
            Goal::Stated(text, met) => (text.to_string(), Some(met)),
        };
        let verdict = match met {
            Some(true) => "met".to_string(),
            Some(false) => {
                self.behind.push(format!("{row} {what}"));
                match (interval, most) {
                    (Some((lo, _)), Some(most)) if lo <= most => {
                        format!("**behind**, within noise (its 95 % interval reaches {most:.1}×)")
                    }
                    _ => "**behind**".to_string(),
                }
            }
            None => String::new(),
        };
        let ratio = match (ratio, interval) {
            (Some(r), Some((lo, hi))) => format!("{r:.2}× (95 %: {lo:.2}–{hi:.2}×)"),
            (Some(r), None) => format!("{r:.2}×"),
            (None, _) => String::new(),
        };
        let r = [
            row.into(),
            what.into(),
            portwise,
            native,
            ratio,
            goal,
            verdict,
        ];
        println!("| {} |", r.join(" | "));
        self.rows.push(r);
    }
    pub(crate) fn not_measured(&mut self, row: &str, what: &str, why: &str) {
        self.row(
            row,
            what,
            format!("not measured: {why}"),
            String::new(),
            None,
            Goal::None,
        );
    }
    pub(crate) fn section(&mut self, title: &str, body: String) {
        println!("\n### {title}\n\n{body}");
        self.sections.push((title.to_string(), body));
    }

    pub(crate) fn markdown(&self, machine: &str, protocol: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# Benchmarks\n\nWritten by `./bench` (tests/bench); do not edit above the \
             analysis mark, the next run rewrites it.\n"
        );
        let _ = writeln!(s, "## Machine\n\n{machine}\n");
        let _ = writeln!(s, "## Protocol\n\n{protocol}\n");
        let _ = writeln!(
            s,
            "## Results\n\nRatios are portwise ÷ native, both measured in this run \
             (lower is better for time, requests, CPU and memory).\n"
        );
        let _ = writeln!(
            s,
            "| row | measure | portwise | native | ratio | goal | |\n|---|---|---|---|---|---|---|"
        );
        // Rows in row order (1b, measured last, belongs after 1).
        let mut rows: Vec<&[String; 7]> = self.rows.iter().collect();
        rows.sort_by_key(|r| r[0].split(' ').next().unwrap_or("").to_string());
        for r in rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        if self.behind.is_empty() {
            let _ = writeln!(s, "\nEvery measured row meets its goal.");
        } else {
            let _ = writeln!(s, "\nBehind goal in this run: {}.", self.behind.join("; "));
        }
        for (title, body) in &self.sections {
            let _ = writeln!(s, "\n### {title}\n\n{body}");
        }
        s
    }
}

/// The results file's new text: `md` (a run's [`Report::markdown`]), then
/// what the old file held from [`ANALYSIS_MARK`] on (hand-written, kept
/// across runs), or an empty analysis under the mark.
pub(crate) fn with_analysis(md: &str, old: Option<&str>) -> String {
    let kept = old
        .and_then(|old| old.find(ANALYSIS_MARK).map(|i| &old[i..]))
        .map_or_else(
            || format!("{ANALYSIS_MARK}\n\n## Analysis\n\n(none yet)\n"),
            str::to_string,
        );
    format!("{md}\n{kept}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_keeps_the_analysis_and_replaces_the_rest() {
        let old = "# Benchmarks\n\nold table\n\n<!-- analysis -->\n\n## Analysis\n\nfound X\n";
        let new = with_analysis("# Benchmarks\n\nnew table\n", Some(old));
        assert_eq!(
            new,
            "# Benchmarks\n\nnew table\n\n<!-- analysis -->\n\n## Analysis\n\nfound X\n"
        );
        // Rewriting its own output changes nothing.
        assert_eq!(
            with_analysis("# Benchmarks\n\nnew table\n", Some(&new)),
            new
        );
    }

    #[test]
    fn a_first_run_or_a_file_without_the_mark_starts_an_empty_analysis() {
        let fresh = "t\n\n<!-- analysis -->\n\n## Analysis\n\n(none yet)\n";
        assert_eq!(with_analysis("t\n", None), fresh);
        assert_eq!(with_analysis("t\n", Some("hand-edited, no mark")), fresh);
    }

    #[test]
    fn a_ratio_past_its_goal_is_behind_and_says_when_noise_reaches_it() {
        let mut r = Report::default();
        r.row(
            "1 convergence",
            "time",
            "2 s".into(),
            "1 s".into(),
            Some(2.0),
            Goal::RatioAtMost(1.5),
        );
        r.row_within(
            "8 flips",
            "p50",
            "a".into(),
            "b".into(),
            Some(1.6),
            Some((1.4, 1.9)),
            Goal::RatioAtMost(1.5),
        );
        r.row(
            "2 steady state",
            "writes",
            "0".into(),
            "3".into(),
            None,
            Goal::Stated("portwise 0", true),
        );
        assert_eq!(r.rows[0][4], "2.00×");
        assert_eq!(r.rows[0][5], "≤ 1.5×");
        assert_eq!(r.rows[0][6], "**behind**");
        assert_eq!(r.rows[1][4], "1.60× (95 %: 1.40–1.90×)");
        assert!(r.rows[1][6].contains("within noise"), "{}", r.rows[1][6]);
        assert_eq!(r.rows[2][6], "met");
        assert_eq!(r.behind, ["1 convergence time", "8 flips p50"]);
    }

    #[test]
    fn the_markdown_lists_rows_by_row_number_and_what_is_behind() {
        let mut r = Report::default();
        r.row(
            "2 steady state",
            "w",
            "0".into(),
            "0".into(),
            None,
            Goal::None,
        );
        r.row(
            "1b native",
            "t",
            "1".into(),
            "1".into(),
            Some(1.0),
            Goal::RatioAtMost(1.5),
        );
        r.row(
            "1 convergence",
            "t",
            "1".into(),
            "1".into(),
            Some(2.0),
            Goal::RatioAtMost(1.5),
        );
        r.section("Row 2: detail", "body".into());
        let md = r.markdown("a machine", "a protocol");
        let rows: Vec<&str> = md
            .lines()
            .filter(|l| l.starts_with("| 1") || l.starts_with("| 2"))
            .collect();
        assert_eq!(rows.len(), 3, "{md}");
        assert!(rows[0].starts_with("| 1 convergence |"), "{md}");
        assert!(rows[1].starts_with("| 1b native |"), "{md}");
        assert!(rows[2].starts_with("| 2 steady state |"), "{md}");
        assert!(
            md.contains("\nBehind goal in this run: 1 convergence t.\n"),
            "{md}"
        );
        assert!(md.contains("## Machine\n\na machine\n"), "{md}");
        assert!(md.ends_with("\n### Row 2: detail\n\nbody\n"), "{md}");
        assert!(!md.contains(ANALYSIS_MARK));
    }
}

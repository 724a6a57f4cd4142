//! Row 7, the Go library portwise replaces: whether the module proxy
//! serves it (./bench tries once per machine), as a third column.

use crate::Bench;
use crate::report::Goal;

impl Bench {
    pub(crate) fn go_library(&mut self) {
        let text = std::env::var("BENCH_GO_LIBRARY").unwrap_or_default();
        let served = !text.is_empty() && !text.contains("\"Error\"");
        let what = if text.is_empty() {
            "not tried (./bench records the one try in $PORTWISE_CACHE/bench/go-library.txt)"
                .to_string()
        } else if served {
            "served; running its example controller is not implemented in this harness yet"
                .to_string()
        } else {
            let when = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("tried: ");
            format!(
                "not served by the Go module proxy (tried once, {when}: `go mod download` of \
                 `github.com/redpanda-data/common-go/portmapper@latest` and of \
                 `github.com/redpanda-data/common-go@latest` both answered 403 \"This module \
                 version is not available\"), so there is no third column"
            )
        };
        self.report.row(
            "7 Go library (portmapper)",
            "third column",
            what,
            String::new(),
            None,
            Goal::None,
        );
        if !text.is_empty() {
            self.report
                .section("Row 7: the one try", format!("```\n{}\n```", text.trim()));
        }
    }
}

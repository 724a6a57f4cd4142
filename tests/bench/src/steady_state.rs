//! Row 2, steady state: what each controller costs while nothing
//! changes (CPU, memory, requests).

use std::time::Duration;

use anyhow::Result;

use crate::process::Controller;
use crate::report::Goal;
use crate::stats::{ratio, secs};
use crate::{Bench, Pair};

impl Bench {
    pub(crate) async fn steady_state(&mut self, pair: &mut Pair) -> Result<()> {
        let window = self.knobs.steady;
        eprintln!("bench: row 2: quiet for {}", secs(window));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let audit = self.bcp.audit();
        let (n0, p0) = (pair.native.usage(), pair.portwise.usage());
        let a0 = audit.offset();
        tokio::time::sleep(window).await;
        let req = audit.between(a0, audit.offset())?;
        pair.native.check_alive()?;
        pair.portwise.check_alive()?;
        let (n1, p1) = (pair.native.usage(), pair.portwise.usage());
        let (pw, nat) = (req.slice_writes("portwise"), req.slice_writes("native"));
        let label = format!("2 steady state ({} quiet)", secs(window));
        self.report.row(
            &label,
            "EndpointSlice writes",
            pw.to_string(),
            nat.to_string(),
            None,
            Goal::Stated("portwise 0", pw == 0),
        );
        self.report.row(
            &label,
            "API requests, all verbs",
            format!("{} ({})", req.all("portwise"), req.by_verb("portwise")),
            format!("{} ({})", req.all("native"), req.by_verb("native")),
            None,
            Goal::None,
        );
        self.report.row(
            &label,
            "CPU seconds in the window / RSS at its end",
            format!("{:.2} s / {:.0} MiB", p1.cpu - p0.cpu, p1.rss_mib),
            format!("{:.2} s / {:.0} MiB", n1.cpu - n0.cpu, n1.rss_mib),
            ratio(p1.cpu - p0.cpu, n1.cpu - n0.cpu),
            Goal::None,
        );
        Ok(())
    }
}

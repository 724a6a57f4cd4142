//! New connections through a ClusterIP, one every millisecond, timed at
//! `connect`: what the data path rows watch. The prober runs in the bench
//! process or as `bench --probe` in a cgroup of its own (Cilium's socket LB
//! translates only its cgroup's processes).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    process::{ExitCode, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use tokio::{io::AsyncReadExt, net::TcpStream, process::Child};

/// What one new connection through a row-8 ClusterIP met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Answered by the flipped pod, the only one on kube-proxy's node.
    Victim,
    /// Answered by another pod: never expected (`internalTrafficPolicy: Local`).
    Other,
    /// Refused: kube-proxy rejects a Service without any endpoint.
    Refused,
    /// The SYN went unanswered for [`DROPPED_AFTER`]: kube-proxy drops
    /// ClusterIP traffic of a `Local` Service without a local endpoint.
    Dropped,
    /// Anything else (a reset, an empty or slow reply).
    Failed,
}

/// A local SYN is answered within microseconds; a dropped one is only
/// retransmitted after 1 s.
pub(crate) const DROPPED_AFTER: Duration = Duration::from_millis(250);
/// One new connection this often while a flip is timed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(1);
/// A flip is routed once this many consecutive probes (by start) meet the
/// new rules.
pub(crate) const SETTLED_RUN: usize = 100;
/// The pause after a routed flip: kube-proxy's sync runner waits
/// `minSyncPeriod` (1 s by default) after a sync before it starts the next,
/// so a flip sooner than that would time kube-proxy's rate limit.
pub(crate) const FLIP_GAP: Duration = Duration::from_millis(1500);

pub(crate) async fn reach(addr: SocketAddr, victim: &str) -> Reach {
    let mut s = match tokio::time::timeout(DROPPED_AFTER, TcpStream::connect(addr)).await {
        Err(_) => return Reach::Dropped,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Reach::Refused,
        Ok(Err(_)) => return Reach::Failed,
        Ok(Ok(s)) => s,
    };
    let mut buf = Vec::new();
    match tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await {
        Ok(Ok(_)) if String::from_utf8_lossy(&buf).trim() == victim => Reach::Victim,
        Ok(Ok(_)) => Reach::Other,
        _ => Reach::Failed,
    }
}

/// Where a row-8 prober runs: in the bench process (kube-proxy translates
/// every process of the namespace), or as a child process moved into a
/// cgroup first (Cilium's socket LB translates only the processes of its
/// cgroup, and a cgroup holds processes, not threads).
#[derive(Clone, Debug)]
pub(crate) enum ProbeFrom {
    Bench,
    Cgroup(PathBuf),
}

/// CLOCK_MONOTONIC in nanoseconds: what `Instant` reads on Linux, and the
/// same clock in every process, so the child prober's times can be put on
/// the bench's own `Instant`s.
pub(crate) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An `Instant` and the monotonic clock read together, to convert between
/// the two.
#[derive(Clone, Copy)]
pub(crate) struct ClockBase {
    pub(crate) at: Instant,
    pub(crate) ns: u64,
}

impl ClockBase {
    pub(crate) fn now() -> Self {
        Self {
            at: Instant::now(),
            ns: mono_ns(),
        }
    }
    pub(crate) fn to_ns(self, t: Instant) -> u64 {
        self.ns + t.saturating_duration_since(self.at).as_nanos() as u64
    }
    pub(crate) fn to_instant(self, ns: u64) -> Instant {
        if ns >= self.ns {
            self.at + Duration::from_nanos(ns - self.ns)
        } else {
            self.at - Duration::from_nanos(self.ns - ns)
        }
    }
}

pub(crate) type Record = Arc<dyn Fn(Instant, Reach) + Send + Sync>;

/// Opens a new connection to `addr` every [`PROBE_EVERY`], each on its own
/// task (a dropped SYN must not hold up the next probe), and records when
/// each called `connect` and what it met, until `stop`.
pub(crate) fn probe_loop(
    addr: SocketAddr,
    victim: Arc<str>,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    record: Record,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            // At most DROPPED_AFTER / PROBE_EVERY wait on dropped
            // SYNs; the bound only guards against a stalled runtime.
            if in_flight.load(Ordering::Relaxed) > 2000 {
                continue;
            }
            in_flight.fetch_add(1, Ordering::Relaxed);
            let (record, in_flight, victim) = (record.clone(), in_flight.clone(), victim.clone());
            tokio::spawn(async move {
                let at = Instant::now();
                let r = reach(addr, &victim).await;
                record(at, r);
                in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
    })
}

/// `bench --probe ADDR VICTIM`: the prober as a process of its own, which
/// the bench starts inside Cilium's cgroup (row 10). Prints one line per
/// probe, `<CLOCK_MONOTONIC ns at connect> <Reach>`, until its stdin
/// closes, then waits for the probes in flight.
pub(crate) fn probe_main(addr: &str, victim: &str) -> ExitCode {
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        eprintln!("bench --probe: not an address: {addr}");
        return ExitCode::from(2);
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let base = ClockBase::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Reach)>();
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let record: Record = Arc::new(move |at, r| {
            let _ = tx.send((base.to_ns(at), r));
        });
        let task = probe_loop(addr, victim.into(), stop.clone(), in_flight.clone(), record);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut out = tokio::io::stdout();
            while let Some((ns, r)) = rx.recv().await {
                if out
                    .write_all(format!("{ns} {r:?}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                let _ = out.flush().await;
            }
        });
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        stop.store(true, Ordering::Relaxed);
        let _ = task.await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Every sender (the loop's tasks) is gone: the writer drains and ends.
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    });
    ExitCode::SUCCESS
}

pub(crate) fn parse_reach(s: &str) -> Option<Reach> {
    Some(match s {
        "Victim" => Reach::Victim,
        "Other" => Reach::Other,
        "Refused" => Reach::Refused,
        "Dropped" => Reach::Dropped,
        "Failed" => Reach::Failed,
        _ => return None,
    })
}

/// New connections to a ClusterIP, one every [`PROBE_EVERY`] (see
/// [`probe_loop`]), from the bench process or from a child in a cgroup
/// ([`ProbeFrom`]), with a log of when each called `connect` and what it met.
pub(crate) struct Prober {
    pub(crate) log: Arc<Mutex<Vec<(Instant, Reach)>>>,
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) task: tokio::task::JoinHandle<()>,
    /// The child prober (cgroup), its stdin kept open until `finish`.
    pub(crate) child: Option<(Child, tokio::process::ChildStdin)>,
}

impl Prober {
    pub(crate) fn start(addr: SocketAddr, victim: &str, from: &ProbeFrom) -> Result<Self> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (task, child) = match from {
            ProbeFrom::Bench => {
                let log = log.clone();
                let record: Record = Arc::new(move |at, r| log.lock().unwrap().push((at, r)));
                let task = probe_loop(addr, victim.into(), stop.clone(), in_flight.clone(), record);
                (task, None)
            }
            ProbeFrom::Cgroup(cgroup) => {
                // `sh` moves itself into the cgroup, then execs the prober,
                // which inherits it (as tests/src/cilium.rs's client does).
                let mut child = tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(r#"echo $$ >"$0" || exit 97; exec "$@""#)
                    .arg(cgroup.join("cgroup.procs"))
                    .arg(std::env::current_exe()?)
                    .args(["--probe", &addr.to_string(), victim])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting the prober in Cilium's cgroup")?;
                let stdin = child.stdin.take().context("the prober's stdin")?;
                let stdout = child.stdout.take().context("the prober's stdout")?;
                let base = ClockBase::now();
                let log = log.clone();
                let task = tokio::spawn(async move {
                    use tokio::io::AsyncBufReadExt;
                    let mut lines = tokio::io::BufReader::new(stdout).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let parsed = line.split_once(' ').and_then(|(ns, r)| {
                            Some((base.to_instant(ns.parse().ok()?), parse_reach(r)?))
                        });
                        match parsed {
                            Some(p) => log.lock().unwrap().push(p),
                            None => eprintln!("bench: the prober printed {line:?}"),
                        }
                    }
                });
                (task, Some((child, stdin)))
            }
        };
        Ok(Self {
            log,
            in_flight,
            stop,
            task,
            child,
        })
    }

    /// The probes finished so far, by start.
    pub(crate) fn completed(&self) -> Vec<(Instant, Reach)> {
        let mut v = self.log.lock().unwrap().clone();
        v.sort_by_key(|p| p.0);
        v
    }

    /// Waits until the last [`SETTLED_RUN`] finished probes (by start) all
    /// started after `since` and met one of `want`.
    pub(crate) async fn settled(
        &self,
        want: &[Reach],
        since: Instant,
        within: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let v = self.completed();
            if v.len() >= SETTLED_RUN
                && v[v.len() - SETTLED_RUN..]
                    .iter()
                    .all(|(at, r)| want.contains(r) && *at >= since)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let mut seen: BTreeMap<String, usize> = BTreeMap::new();
                for (_, r) in v.iter().rev().take(200) {
                    *seen.entry(format!("{r:?}")).or_default() += 1;
                }
                bail!(
                    "probes did not settle to {want:?} within {within:?}; the last 200: {seen:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops probing and returns every probe, once the last has finished.
    pub(crate) async fn finish(mut self) -> Vec<(Instant, Reach)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some((mut child, stdin)) = self.child.take() {
            // EOF on its stdin stops the child; it prints its last probes
            // and exits, which ends the reader.
            drop(stdin);
            let _ = tokio::time::timeout(Duration::from_secs(15), &mut self.task).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            return self.completed();
        }
        let _ = (&mut self.task).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.completed()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        // A flip that failed drops its prober unfinished: stop its loop.
        self.stop.store(true, Ordering::Relaxed);
    }
}

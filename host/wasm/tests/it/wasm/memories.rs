//! Guests with more than one linear memory (issue 45): the memory limit is
//! the instance's, all memories together, and a component holds at most a
//! few memories.
//!
//! No toolchain makes such a guest on purpose, so the tests make one: a
//! real guest with a core module appended, instantiated `count` times by
//! the component itself, each instance with a memory of its own that its
//! start function touches page by page (so it is really resident).

use super::*;

/// `guest` (a component) with `count` more core instances, each defining a
/// memory of `pages` 64 KiB pages and writing a byte to every 4 KiB of it
/// when it starts.
pub(super) fn with_memories(guest: &[u8], count: u32, pages: u32) -> Vec<u8> {
    assert!(pages > 0);
    // A component's top-level sections are (id, size, contents); core
    // modules (id 1) number the core module index space.
    let mut modules = 0;
    let mut at = 8;
    while at < guest.len() {
        let id = guest[at];
        let (size, n) = uleb_read(&guest[at + 1..]);
        if id == 1 {
            modules += 1;
        }
        at += 1 + n + size as usize;
    }
    let mut out = guest.to_vec();
    section(&mut out, 1, &toucher(pages));
    let mut instances = uleb(count);
    for _ in 0..count {
        instances.push(0x00); // instantiate
        instances.extend(uleb(modules));
        instances.push(0x00); // no arguments
    }
    section(&mut out, 2, &instances);
    out
}

/// `(module (memory pages) (start $touch))`, `$touch` storing 1 every
/// 4 KiB (the host's page: all of the memory becomes resident).
fn toucher(pages: u32) -> Vec<u8> {
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    section(&mut m, 1, &[0x01, 0x60, 0x00, 0x00]); // type: [] -> []
    section(&mut m, 3, &[0x01, 0x00]); // function 0: type 0
    let mut memory = vec![0x01, 0x00];
    memory.extend(uleb(pages));
    section(&mut m, 5, &memory);
    section(&mut m, 8, &[0x00]); // start: function 0
    let mut body = vec![0x01, 0x01, 0x7f]; // one i32 local
    body.extend([0x03, 0x40]); // loop
    body.extend([0x20, 0x00, 0x41, 0x01, 0x3a, 0x00, 0x00]); // store8 [p] = 1
    body.extend([0x20, 0x00, 0x41, 0x80, 0x20, 0x6a, 0x22, 0x00]); // p += 4 KiB
    body.push(0x41);
    body.extend(sleb(i64::from(pages) << 16));
    body.extend([0x49, 0x0d, 0x00, 0x0b, 0x0b]); // br_if p < size; end; end
    let mut code = vec![0x01];
    code.extend(uleb(body.len() as u32));
    code.extend(body);
    section(&mut m, 10, &code);
    m
}

fn section(out: &mut Vec<u8>, id: u8, contents: &[u8]) {
    out.push(id);
    out.extend(uleb(contents.len() as u32));
    out.extend_from_slice(contents);
}

fn uleb(mut n: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn uleb_read(bytes: &[u8]) -> (u32, usize) {
    let (mut n, mut shift) = (0u32, 0);
    for (i, b) in bytes.iter().enumerate() {
        n |= u32::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return (n, i + 1);
        }
        shift += 7;
    }
    panic!("truncated LEB128");
}

fn sleb(mut n: i64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if (n == 0 && byte & 0x40 == 0) || (n == -1 && byte & 0x40 != 0) {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// `hostile/alloc.wasm` with `count` more memories of `mib` MiB, written to
/// `dir` as `name`.
pub(super) fn alloc_with_memories(dir: &Path, name: &str, count: u32, mib: u32) -> PathBuf {
    let base = fs::read(guest("hostile/alloc.wasm")).unwrap();
    let path = dir.join(name);
    fs::write(&path, with_memories(&base, count, mib * 16)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_with_many_memories_hits_the_memory_limit() {
    let h = Harness::new(Limits {
        memory_bytes: 64 << 20,
        ..test_limits()
    })
    .await;
    let dir = TempDir::new("memories");
    // Three memories of 24 MiB: each below the 64 MiB limit, 72 MiB
    // together.
    let many = alloc_with_memories(dir.path(), "many.wasm", 3, 24);
    h.rt.load_file(&many).await.unwrap();
    match h
        .rt
        .checker("many.wasm", &json!({"bytes": 1024}), None)
        .await
    {
        Err(WasmError::ConfigRejected { rejection, .. }) => {
            assert!(
                matches!(&rejection, portwise_wasm::Rejection::Failed(f) if f.kind == FailureKind::Memory),
                "{rejection:?}"
            );
            let message = rejection.to_string();
            assert!(
                message.starts_with(
                    "validate-config failed: memory: cannot instantiate: memory limit"
                ),
                "{message}"
            );
            assert!(message.contains("(limit 65536 KiB)"), "{message}");
        }
        other => panic!("expected a memory failure, got {other:?}"),
    }

    // Two of 16 MiB fit, and leave the guest's own memory 32 MiB less.
    let two = alloc_with_memories(dir.path(), "two.wasm", 2, 16);
    h.rt.load_file(&two).await.unwrap();
    let s = subject(LOCAL, 80, &[]);
    let fits =
        h.rt.checker("two.wasm", &json!({"bytes": 16 << 20}), None)
            .await
            .unwrap();
    assert_verdict(
        &fits.check(&s).await,
        Decision::Include,
        "allocated 16777216 bytes",
    );
    let past =
        h.rt.checker("two.wasm", &json!({"bytes": 40 << 20}), None)
            .await
            .unwrap();
    let v = past.check(&s).await;
    assert_verdict(&v, Decision::Abstain, "memory: memory limit");
    assert_eq!(h.failures("two.wasm", FailureKind::Memory), 1);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_with_more_memories_than_its_share_is_refused_at_load() {
    let h = Harness::new(test_limits()).await;
    let dir = TempDir::new("memory-cap");
    let path = alloc_with_memories(dir.path(), "crowd.wasm", 4, 1);
    let message = h.rt.load_file(&path).await.unwrap_err().to_string();
    assert!(
        message.contains("5 Wasm linear memories, which exceeds the configured maximum of 4"),
        "{message}"
    );
    assert!(message.starts_with("module crowd.wasm"), "{message}");
    // Three more (four in all) load and run.
    let path = alloc_with_memories(dir.path(), "four.wasm", 3, 1);
    h.rt.load_file(&path).await.unwrap();
    let c =
        h.rt.checker("four.wasm", &json!({"bytes": 1024}), None)
            .await
            .unwrap();
    assert_verdict(
        &c.check(&subject(LOCAL, 80, &[])).await,
        Decision::Include,
        "allocated 1024 bytes",
    );
    still_serving(&h).await;
}

/// Set in the child that runs [`sixteen_hostile_calls_in_a_512_mib_cgroup_leave_the_host_alive`]
/// inside its cgroup.
const IN_CGROUP: &str = "PORTWISE_TEST_IN_CGROUP";

/// A memory cgroup of its own (v1 or v2), removed on drop. Needs root.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn create(name: &str, limit: u64) -> Result<Cgroup, String> {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), false)
        } else {
            (Path::new("/sys/fs/cgroup").join(name), true)
        };
        let shown = dir.display().to_string();
        let err = |what: &str, e: std::io::Error| format!("{what} {shown}: {e}");
        fs::create_dir(&dir).map_err(|e| err("cannot create", e))?;
        let cg = Cgroup { dir, v2 };
        let (limit_file, swap_file) = if v2 {
            ("memory.max", "memory.swap.max")
        } else {
            ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        };
        fs::write(cg.dir.join(limit_file), limit.to_string())
            .map_err(|e| err("cannot limit", e))?;
        // No swap to escape to, where the kernel has it.
        let _ = fs::write(
            cg.dir.join(swap_file),
            if v2 { "0".into() } else { limit.to_string() },
        );
        Ok(cg)
    }

    fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    fn oom_kills(&self) -> u64 {
        let text = self.read(if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        });
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    fn peak_mib(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(file).trim().parse::<u64>().unwrap_or(0) >> 20
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Issue 45: sixteen calls at once of a guest that holds two memories of
/// 10 MiB from its start and then allocates 20 MiB more in `check`, under
/// a limit of 24 MiB per instance: sixteen such instances fit a 512 MiB
/// container only if the limit holds for each instance as a whole. Before,
/// each memory had the limit to itself (40 MiB an instance, 640 MiB in
/// all) and the kernel killed the process. Here the test binary runs
/// itself again, that test alone, in a 512 MiB cgroup; the other guest
/// keeps answering throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_hostile_calls_in_a_512_mib_cgroup_leave_the_host_alive() {
    if std::env::var_os(IN_CGROUP).is_some() {
        return hostile_calls_in_cgroup().await;
    }
    let name = format!("portwise-test-{}", std::process::id());
    let cg = match Cgroup::create(&name, 512 << 20) {
        Ok(cg) => cg,
        // Not root (an unprivileged user namespace, say): said loudly, and
        // in the run's report of what did not run.
        Err(e) if !is_root() => {
            let line = format!(
                "SKIPPED wasm::memories::sixteen_hostile_calls_in_a_512_mib_cgroup_leave_the_host_alive: \
                 needs root for a memory cgroup ({e})"
            );
            eprintln!("{line}");
            if let Some(report) = std::env::var_os("PORTWISE_DEFERRED_REPORT") {
                use std::io::Write;
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(report)
                    .unwrap();
                writeln!(f, "{line}").unwrap();
            }
            return;
        }
        Err(e) => panic!("this test needs a memory cgroup: {e}"),
    };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "wasm::memories::sixteen_hostile_calls_in_a_512_mib_cgroup_leave_the_host_alive",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IN_CGROUP, &name)
        .spawn()
        .unwrap();
    cg.add(child.id());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let (kills, peak) = (cg.oom_kills(), cg.peak_mib());
    eprintln!("child: {status}, OOM kills {kills}, peak {peak} MiB of 512");
    assert_eq!(
        kills, 0,
        "the kernel killed the host: {status}, peak {peak} MiB"
    );
    assert!(status.success(), "{status}, peak {peak} MiB");
}

/// Whether this process has root's powers over the system (not only in a
/// user namespace of its own): the uid in `/proc/self/uid_map`'s first line
/// that maps to 0 outside.
fn is_root() -> bool {
    let map = fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid_zero = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0");
    let mapped_to_root = map.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 3 && f[0] == "0" && f[1] == "0"
    });
    euid_zero && mapped_to_root
}

/// The child's part: in the cgroup, sixteen hostile calls at once beside a
/// well-behaved guest.
async fn hostile_calls_in_cgroup() {
    let name = std::env::var(IN_CGROUP).unwrap();
    // The parent moves this process into the cgroup right after spawning it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .contains(&name)
    {
        assert!(Instant::now() < deadline, "never moved into {name}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let h = Harness::new(Limits {
        memory_bytes: 24 << 20,
        max_memory_bytes: 24 << 20,
        max_instances: 40,
        // Sixteen guests spinning on two cores: wall clock, not CPU time.
        deadline: Duration::from_secs(20),
        call_timeout: Duration::from_secs(30),
        ..test_limits()
    })
    .await;
    let dir = TempDir::new("cgroup");
    let path = alloc_with_memories(dir.path(), "hog.wasm", 2, 10);
    h.rt.load_file(&path).await.unwrap();
    let hog: Arc<dyn Checker> = Arc::new(
        h.rt.checker(
            "hog.wasm",
            &json!({"bytes": 20 << 20, "holdMs": 5000}),
            None,
        )
        .await
        .unwrap(),
    );
    let calm = h.checker("admin-check.wasm", Value::Null).await;
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (hog, s) = (hog.clone(), s.clone());
            tokio::spawn(async move { hog.check(&s).await })
        })
        .collect();
    let mut answered = 0;
    while !calls.iter().all(|c| c.is_finished()) {
        assert_verdict(&calm.check(&s).await, Decision::Include, "marked");
        answered += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for call in calls {
        assert_verdict(
            &call.await.unwrap(),
            Decision::Abstain,
            "memory: memory limit",
        );
    }
    assert_eq!(h.failures("hog.wasm", FailureKind::Memory), 16);
    eprintln!("the other guest answered {answered} times during the storm");
    still_serving(&h).await;
}

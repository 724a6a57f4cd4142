//! Fuzzing what guests answer (issue 7, item 5; docs/reliability.md): a
//! guest's verdict crosses the component-model boundary as bytes in the
//! guest's own memory (a return area holding the decision, an option tag,
//! and a pointer and length for the reason), and a hostile or broken guest
//! controls every one of them.
//!
//! Each case builds a real component whose `check` returns a return area
//! laid out by the fuzzer: valid and invalid decision and option tags,
//! random padding, reasons that are valid UTF-8 or not, in bounds or not,
//! and return pointers that are misaligned or outside memory. It runs the
//! component through the real runtime (`portwise_wasm::WasmRuntime`) and
//! compares with an oracle of the canonical ABI: a well-formed answer gives
//! exactly that verdict; anything else gives `abstain`, counted as an
//! `invalid_answer` failure; nothing panics, and the runtime keeps serving.
//!
//! The core module is WebAssembly text generated here, made a component by
//! `wasm-tools` (`component embed` with our WIT, then `component new`), the
//! tool `guests/build` installs for the C guest. Raise `PROPTEST_CASES` for
//! a deeper run (each case compiles one component).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicU64, Ordering},
    },
};

use k8s_openapi::{
    api::core::v1::{Pod, PodIP, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use portwise_checkers::Checker;
use portwise_core::membership::{Decision, Subject};
use portwise_supply::Supplier;
use portwise_wasm::{FailureKind, Limits, WasmConfig, WasmRuntime};
use proptest::prelude::*;
use serde_json::json;

/// Where things sit in the guest's memory (two 64 KiB pages; the host's
/// allocations for the call's arguments go to the heap in the second).
const TABLE: u32 = 1024;
const RECORDS: u32 = 2048;
const OK_AREA: u32 = 4000;
const POOL: u32 = 8192;
const HEAP: u32 = 65536;
const MEMORY: u32 = 2 * 65536;
const MAX_ANSWERS: usize = 24;

/// Where `check` says its return area is.
#[derive(Clone, Debug)]
enum Ret {
    /// At this answer's record (aligned).
    Record,
    /// The record's address plus 1..=3: misaligned.
    Misaligned(u32),
    /// Past the end of memory.
    Outside(u32),
    /// Starting 8 bytes before the end: half outside.
    Straddling,
}

/// Where the reason's bytes are.
#[derive(Clone, Debug)]
enum Reason {
    /// `len` bytes of the pool from `offset`.
    Pool(usize, usize),
    /// A pointer and length far outside memory (or overflowing).
    Outside(u32, u32),
}

#[derive(Clone, Debug)]
struct Answer {
    ret: Ret,
    decision: u8,
    option: u8,
    reason: Reason,
    /// Padding bytes of the record (offsets 1-3 and 5-7).
    padding: [u8; 6],
}

/// The verdict a canonical-ABI lift must produce, or `None` when the
/// answer is malformed.
fn oracle(a: &Answer, pool: &[u8]) -> Option<(Decision, Option<String>)> {
    if !matches!(a.ret, Ret::Record) {
        return None;
    }
    let decision = match a.decision {
        0 => Decision::Include,
        1 => Decision::Exclude,
        2 => Decision::Abstain,
        _ => return None,
    };
    match a.option {
        0 => Some((decision, None)),
        1 => match a.reason {
            Reason::Pool(off, len) => std::str::from_utf8(&pool[off..off + len])
                .ok()
                .map(|s| (decision, Some(s.to_string()))),
            Reason::Outside(..) => None,
        },
        _ => None,
    }
}

fn answer(pool_len: usize) -> impl Strategy<Value = Answer> {
    let ret = prop_oneof![
        8 => Just(Ret::Record),
        1 => (1u32..4).prop_map(Ret::Misaligned),
        1 => (MEMORY..=u32::MAX).prop_map(Ret::Outside),
        1 => Just(Ret::Straddling),
    ];
    let tag = |valid: u8| {
        prop_oneof![
            6 => 0..valid,
            1 => any::<u8>(),
        ]
    };
    let reason = prop_oneof![
        6 => (0..=pool_len).prop_flat_map(move |off| (Just(off), 0..=pool_len - off))
            .prop_map(|(o, l)| Reason::Pool(o, l)),
        1 => (0x4000_0000u32.., any::<u32>()).prop_map(|(p, l)| Reason::Outside(p, l)),
        1 => (0u32..MEMORY, (u32::MAX - MEMORY)..).prop_map(|(p, l)| Reason::Outside(p, l)),
    ];
    (ret, tag(3), tag(2), reason, any::<[u8; 6]>()).prop_map(
        |(ret, decision, option, reason, padding)| Answer {
            ret,
            decision,
            option,
            reason,
            padding,
        },
    )
}

/// Reason bytes: valid UTF-8 in several scripts, cut anywhere, plus noise.
fn pool() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            "\\PC{0,16}".prop_map(String::into_bytes),
            Just("é漢🦀".as_bytes().to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
            Just(vec![0xff, 0xfe, 0xc0, 0x80]),
        ],
        1..24,
    )
    .prop_map(|parts| {
        let mut v: Vec<u8> = parts.concat();
        v.truncate(512);
        v
    })
}

fn case() -> impl Strategy<Value = (Vec<u8>, Vec<Answer>)> {
    pool().prop_flat_map(|pool| {
        let len = pool.len();
        (
            Just(pool),
            proptest::collection::vec(answer(len), 1..=MAX_ANSWERS),
        )
    })
}

fn wat_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

/// The core module: `check` picks answer `len(config) - 2` (the config is
/// the JSON string `"aaa…"`), returning the address from its table entry.
fn core_wat(pool: &[u8], answers: &[Answer]) -> String {
    let mut table = Vec::new();
    let mut records = Vec::new();
    for (i, a) in answers.iter().enumerate() {
        let record = RECORDS + 16 * i as u32;
        let ret = match a.ret {
            Ret::Record => record,
            Ret::Misaligned(k) => record + k,
            Ret::Outside(p) => p,
            Ret::Straddling => MEMORY - 8,
        };
        table.extend_from_slice(&ret.to_le_bytes());
        let (ptr, len) = match a.reason {
            Reason::Pool(off, len) => (POOL + off as u32, len as u32),
            Reason::Outside(p, l) => (p, l),
        };
        let p = a.padding;
        records.extend_from_slice(&[a.decision, p[0], p[1], p[2], a.option, p[3], p[4], p[5]]);
        records.extend_from_slice(&ptr.to_le_bytes());
        records.extend_from_slice(&len.to_le_bytes());
    }
    let n = answers.len();
    format!(
        r#"(module
  (import "portwise:membership/types@0.2.1" "[resource-drop]service" (func $drop_service (param i32)))
  (import "portwise:membership/types@0.2.1" "[resource-drop]pod" (func $drop_pod (param i32)))
  (memory (export "memory") 2)
  (global $bump (mut i32) (i32.const {HEAP}))
  (func (export "cabi_realloc") (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
    (local $p i32) (local $end i32)
    (local.set $p (i32.and (i32.add (global.get $bump) (i32.sub (local.get $align) (i32.const 1)))
                           (i32.sub (i32.const 0) (local.get $align))))
    (local.set $end (i32.add (local.get $p) (local.get $size)))
    (block $fits
      (br_if $fits (i32.le_u (local.get $end) (i32.shl (memory.size) (i32.const 16))))
      (drop (memory.grow (i32.add (i32.shr_u (i32.sub (local.get $end) (i32.shl (memory.size) (i32.const 16)))
                                             (i32.const 16))
                                  (i32.const 1)))))
    (global.set $bump (local.get $end))
    (local.get $p))
  (func (export "portwise:membership/checker@0.2.1#validate-config") (param i32 i32) (result i32)
    (global.set $bump (i32.const {HEAP}))
    (i32.const {OK_AREA}))
  ;; 0.2's check flattens to 13 parameters: config (pointer, length), the
  ;; service and pod handles, then the target record's fields.
  (func (export "portwise:membership/checker@0.2.1#check")
    (param $config i32) (param $config_len i32) (param $service i32) (param $pod i32)
    (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    (local $k i32)
    ;; Borrowed handles must be given back before the call returns.
    (call $drop_service (local.get $service))
    (call $drop_pod (local.get $pod))
    (local.set $k (i32.sub (local.get $config_len) (i32.const 2)))
    (global.set $bump (i32.const {HEAP}))
    (i32.load (i32.add (i32.const {TABLE})
                       (i32.shl (i32.rem_u (local.get $k) (i32.const {n})) (i32.const 2)))))
  (data (i32.const {TABLE}) "{table}")
  (data (i32.const {RECORDS}) "{records}")
  (data (i32.const {POOL}) "{pool}")
)
"#,
        table = wat_bytes(&table),
        records = wat_bytes(&records),
        pool = wat_bytes(pool),
    )
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn wasm_tools() -> PathBuf {
    let cache = std::env::var_os("PORTWISE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/portwise"));
    // guests/build-polyglot keeps the pinned version's binary behind this
    // link (PORTWISE_TOOLS_DIR defaults to the cache's tools/).
    let tools = std::env::var_os("PORTWISE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("tools"));
    let tool = tools.join("bin/wasm-tools");
    assert!(
        tool.is_file(),
        "{} is missing: run guests/build (the C guest's toolchain installs it)",
        tool.display()
    );
    tool
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("running wasm-tools");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the component into `dir/name`.
fn component(dir: &Path, name: &str, wat: &str) -> PathBuf {
    let core = dir.join("core.wat");
    let embedded = dir.join("embedded.wasm");
    let out = dir.join(name);
    std::fs::write(&core, wat).unwrap();
    let tool = wasm_tools();
    run(Command::new(&tool)
        .args(["component", "embed"])
        .arg(repo().join("wit"))
        .args(["--world", "membership-checker"])
        .arg(&core)
        .arg("-o")
        .arg(&embedded));
    run(Command::new(&tool)
        .args(["component", "new"])
        .arg(&embedded)
        .arg("-o")
        .arg(&out));
    out
}

fn subject() -> Subject {
    let address: IpAddr = "10.244.0.5".parse().unwrap();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("shop".into()),
            uid: Some("uid".into()),
            ..Default::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ips: Some(vec![PodIP {
                ip: address.to_string(),
            }]),
            ..Default::default()
        }),
    };
    crate::common::subject_for(pod, None, "http", 8080, address)
}

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
});

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs every answer of one case through a fresh runtime; returns how many
/// were malformed.
fn check_case(pool: &[u8], answers: &[Answer]) -> Result<u64, TestCaseError> {
    let n = CASE.fetch_add(1, Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("portwise-fuzz-answers-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("cache")).unwrap();
    let path = component(&dir, "answers.wasm", &core_wat(pool, answers));
    let result = RT.block_on(async {
        let rt = WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            probes: Default::default(),
            modules_dir: None,
            expressions: None,
            cache_dir: Some(dir.join("cache")),
            watch: false,
            // Generous time: this is about answers, not deadlines, and the
            // suite runs on two busy cores (a 100ms deadline can fire there).
            limits: Limits {
                max_instances: 8,
                deadline: std::time::Duration::from_secs(5),
                call_timeout: std::time::Duration::from_secs(20),
                ..Limits::default()
            },
        })
        .await
        .expect("runtime");
        rt.load_file(&path).await.expect("the component loads");
        let s = subject();
        let mut malformed = 0u64;
        // Twice round: a malformed answer must not poison the instance for
        // the calls after it.
        for round in 0..2 {
            for (i, a) in answers.iter().enumerate() {
                let config = json!("a".repeat(i));
                let checker = rt
                    .checker("answers.wasm", &config, None)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("checker: {e}")))?;
                let v = checker.check(&s).await;
                match oracle(a, pool) {
                    Some((decision, reason)) => {
                        prop_assert_eq!(v.decision, decision, "answer {} {:?}: {:?}", i, a, v);
                        prop_assert_eq!(&v.reason, &reason, "answer {} {:?}", i, a);
                    }
                    None => {
                        if round == 0 {
                            malformed += 1;
                        }
                        prop_assert_eq!(
                            v.decision,
                            Decision::Abstain,
                            "answer {} {:?}: {:?}",
                            i,
                            a,
                            v
                        );
                        let why = v.reason.clone().unwrap_or_default();
                        prop_assert!(
                            why.contains("invalid_answer"),
                            "answer {} {:?}: {}",
                            i,
                            a,
                            why
                        );
                    }
                }
            }
        }
        let counted = rt
            .failures()
            .iter()
            .filter(|f| f.module == "answers.wasm" && f.count > 0)
            .map(|f| (f.kind, f.count))
            .collect::<Vec<_>>();
        let invalid: u64 = counted
            .iter()
            .filter(|(k, _)| *k == FailureKind::InvalidAnswer)
            .map(|(_, c)| c)
            .sum();
        prop_assert_eq!(invalid, 2 * malformed, "failure counters: {:?}", counted);
        prop_assert!(
            counted
                .iter()
                .all(|(k, _)| *k == FailureKind::InvalidAnswer),
            "other failures: {:?}",
            counted
        );
        Ok(malformed)
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        ..ProptestConfig::default()
    })]

    #[test]
    fn guest_answers_are_taken_exactly_or_refused((pool, answers) in case()) {
        check_case(&pool, &answers)?;
    }
}

/// The corners, deterministically: every tag value, a reason that ends in
/// the middle of a character, an empty reason at the last byte of memory.
#[test]
fn answer_corners() {
    let pool = "ok é".as_bytes().to_vec();
    let base = Answer {
        ret: Ret::Record,
        decision: 0,
        option: 1,
        reason: Reason::Pool(0, 2),
        padding: [0xaa; 6],
    };
    let mut answers = Vec::new();
    for decision in [0u8, 1, 2, 3, 255] {
        for option in [0u8, 1, 2] {
            answers.push(Answer {
                decision,
                option,
                ..base.clone()
            });
        }
    }
    answers.push(Answer {
        reason: Reason::Pool(0, pool.len() - 1), // cuts "é" in half
        ..base.clone()
    });
    answers.push(Answer {
        reason: Reason::Outside(MEMORY, 1),
        ..base.clone()
    });
    answers.push(Answer {
        ret: Ret::Straddling,
        ..base.clone()
    });
    let malformed = check_case(&pool, &answers).unwrap();
    // decision 3 and 255 (6), option 2 (3 more), the cut reason, the
    // one-byte reason just past the end, the straddling return area.
    assert_eq!(malformed, 6 + 3 + 3);
}

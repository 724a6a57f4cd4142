//! WASI for a guest: linked only because language runtimes import it, so
//! it gives nothing. No preopened directories, no environment, no
//! arguments, no stdin, no sockets, no name lookups; stdout and stderr go to
//! bounded buffers ([`Capture`]) that the caller drains into the log after
//! each call. Random bytes are handed out [`MAX_RANDOM_BYTES`] (or the
//! instance's memory limit, if smaller) at a time: the host builds the whole
//! list in its own memory before the guest can refuse to take it, and
//! wasmtime-wasi's own cap (64 MiB) knows nothing of the limit.

use wasmtime_wasi::WasiCtx;

use crate::capture::Capture;

/// The most random bytes one call of `get-random-bytes` (or the insecure
/// one) gets; a larger request traps. Language runtimes ask for at most
/// 64 KiB (JavaScript's `getRandomValues`), usually 256 bytes or less
/// (`getentropy`); the process budget counts this much per instance.
pub const MAX_RANDOM_BYTES: usize = 1 << 20;

/// A store's WASI context, writing stdout and stderr to these captures,
/// for an instance whose memories may hold `memory_bytes`.
pub(crate) fn context(stdout: &Capture, stderr: &Capture, memory_bytes: usize) -> WasiCtx {
    let mut wasi = WasiCtx::builder();
    // The builder starts empty (no args, env, preopens, stdin); say the
    // network part out loud since it is the part that matters.
    wasi.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        .stdout(stdout.stream())
        .stderr(stderr.stream())
        .max_random_size(memory_bytes.min(MAX_RANDOM_BYTES) as u64);
    wasi.build()
}

/// Whether a call failed on a random-bytes request past the cap. The
/// refusal is wasmtime-wasi's, a plain error without a type of its own:
/// its text is all there is (the test below checks it).
pub(crate) fn is_random_refusal(e: &wasmtime::Error) -> bool {
    let text = format!("{e:#}");
    text.contains("requested len") && text.contains("exceeds limit")
}

#[cfg(test)]
mod tests {
    use wasmtime_wasi::p2::bindings::random::{insecure::Host as _, random::Host as _};

    use super::*;

    #[test]
    fn random_bytes_are_bounded_by_the_memory_limit() {
        let (out, err) = (Capture::new(64), Capture::new(64));
        let mut wasi = context(&out, &err, 64 << 20);
        let r = wasi.random();
        assert_eq!(
            r.get_random_bytes(MAX_RANDOM_BYTES as u64).unwrap().len(),
            MAX_RANDOM_BYTES
        );
        let Err(e) = r.get_random_bytes(MAX_RANDOM_BYTES as u64 + 1) else {
            panic!("{} random bytes were served", MAX_RANDOM_BYTES + 1);
        };
        assert!(is_random_refusal(&e), "{e:#}");
        assert!(r.get_insecure_random_bytes(32 << 20).is_err());
        // Below the cap, the instance's own limit bounds it.
        let mut small = context(&out, &err, 64 << 10);
        assert!(small.random().get_random_bytes(64 << 10).is_ok());
        assert!(small.random().get_random_bytes((64 << 10) + 1).is_err());
    }
}

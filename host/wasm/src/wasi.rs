//! WASI for a guest: linked only because language runtimes import it, so
//! it gives nothing. No preopened directories, no environment, no
//! arguments, no stdin, no sockets, no name lookups; stdout and stderr go to
//! bounded buffers ([`Capture`]) that the caller drains into the log after
//! each call.

use wasmtime_wasi::WasiCtx;

use crate::capture::Capture;

/// A store's WASI context, writing stdout and stderr to these captures.
pub(crate) fn context(stdout: &Capture, stderr: &Capture) -> WasiCtx {
    let mut wasi = WasiCtx::builder();
    // The builder starts empty (no args, env, preopens, stdin); say the
    // network part out loud since it is the part that matters.
    wasi.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        .stdout(stdout.stream())
        .stderr(stderr.stream());
    wasi.build()
}

//! What a module file holds, before the runtime compiles it: a `.wasm.gz`
//! is gunzipped (bounded), and anything that is certainly not a component
//! is refused with a message saying what it is instead. Pure functions of
//! bytes and names, so they are tested without an engine. Gunzipping needs
//! the feature `fetch` (the runtime asks for it through
//! [`crate::Supply::component`]).

use std::borrow::Cow;

pub use crate::error::DecodeError;

/// Whether a directory entry is a module: `*.wasm` or `*.wasm.gz`.
pub fn is_module_file(name: &str) -> bool {
    name.ends_with(".wasm") || is_gzipped(name)
}

/// Whether a module is stored gzip-compressed: by its name only, so what a
/// file is never depends on guessing from its bytes.
pub fn is_gzipped(name: &str) -> bool {
    name.ends_with(".wasm.gz")
}

/// The content of a `.wasm.gz`, refusing to inflate past `max` bytes.
///
/// One pass that stops reading at `max + 1` bytes: a gzip bomb costs at
/// most the time and memory of inflating `max` bytes, then is refused.
/// Concatenated gzip members are read as one stream, as `gunzip` does.
#[cfg(feature = "fetch")]
pub fn gunzip(gz: &[u8], max: usize) -> Result<Vec<u8>, DecodeError> {
    use flate2::read::MultiGzDecoder;
    use std::io::Read;
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut wasm = Vec::new();
    MultiGzDecoder::new(gz)
        .take(limit)
        .read_to_end(&mut wasm)
        .map_err(DecodeError::Gzip)?;
    if wasm.len() > max {
        return Err(DecodeError::TooLarge { max });
    }
    Ok(wasm)
}

/// Refuses what is certainly not a component, with a message that says what
/// it is instead.
pub fn check_header(bytes: &[u8]) -> Result<(), DecodeError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(DecodeError::Gzipped);
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(DecodeError::NotWasm);
    }
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(DecodeError::CoreModule);
    }
    Ok(())
}

/// A component to compile, and its own sha256 (the compiled-code cache's
/// key: `x.wasm` and any `x.wasm.gz` of it share one entry).
#[derive(Debug)]
pub struct Component<'a> {
    pub bytes: Cow<'a, [u8]>,
    pub sha256: String,
}

/// The component module `name` holds: `stored` (whose sha256 is
/// `stored_sha256`) gunzipped when the name says `.wasm.gz` (to at most
/// `max_gunzipped` bytes), then checked to look like a component.
#[cfg(feature = "fetch")]
pub fn component<'a>(
    name: &str,
    stored: &'a [u8],
    stored_sha256: &str,
    max_gunzipped: usize,
) -> Result<Component<'a>, DecodeError> {
    let component = if is_gzipped(name) {
        let gunzipped = gunzip(stored, max_gunzipped)?;
        let sha256 = crate::content::sha256_hex(&gunzipped);
        Component {
            bytes: Cow::Owned(gunzipped),
            sha256,
        }
    } else {
        Component {
            bytes: Cow::Borrowed(stored),
            sha256: stored_sha256.to_string(),
        }
    };
    check_header(&component.bytes)?;
    Ok(component)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "fetch")]
    use std::time::Instant;

    #[test]
    fn header_check_explains_what_the_file_is() {
        let e = check_header(b"hello world").unwrap_err();
        assert!(matches!(e, DecodeError::NotWasm), "{e:?}");
        assert!(e.to_string().contains("not a WebAssembly file"), "{e}");
        let e = check_header(b"\0asm\x01\0\0\0rest").unwrap_err();
        assert!(matches!(e, DecodeError::CoreModule), "{e:?}");
        assert!(e.to_string().contains("core WebAssembly module"), "{e}");
        assert!(check_header(b"\0asm\x0d\0\x01\0rest").is_ok());
    }

    #[cfg(feature = "fetch")]
    fn gzip(parts: &[&[u8]]) -> Vec<u8> {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for part in parts {
            gz.write_all(part).unwrap();
        }
        gz.finish().unwrap()
    }

    #[test]
    fn only_wasm_and_wasm_gz_files_are_modules() {
        for name in ["a.wasm", "a.wasm.gz"] {
            assert!(is_module_file(name), "{name}");
        }
        for name in [
            "a.gz",
            "a.wasm.gz.tmp",
            "a.wasmgz",
            "a.tar.gz",
            "a.wasm.zst",
        ] {
            assert!(!is_module_file(name), "{name}");
        }
        assert!(is_gzipped("a.wasm.gz") && !is_gzipped("a.wasm"));
    }

    #[cfg(feature = "fetch")]
    #[test]
    fn gunzip_returns_the_content_up_to_and_including_the_cap() {
        let wasm = b"\0asm\x0d\0\x01\0component bytes".repeat(1000);
        assert_eq!(gunzip(&gzip(&[&wasm]), 1 << 20).unwrap(), wasm);
        // Exactly at the cap is allowed.
        assert_eq!(gunzip(&gzip(&[&wasm]), wasm.len()).unwrap(), wasm);
        // Concatenated members are one stream, as for `gunzip`.
        let mut two = gzip(&[&wasm[..100]]);
        two.extend(gzip(&[&wasm[100..]]));
        assert_eq!(gunzip(&two, 1 << 20).unwrap(), wasm);
    }

    #[cfg(feature = "fetch")]
    #[test]
    fn gunzip_refuses_content_past_the_cap_naming_it() {
        let wasm = vec![7u8; 4096];
        let e = gunzip(&gzip(&[&wasm]), 4095).unwrap_err();
        assert!(matches!(e, DecodeError::TooLarge { max: 4095 }), "{e:?}");
        assert!(
            e.to_string().contains("gunzips to more than 4095 bytes"),
            "{e}"
        );
        // A bomb: 100 MiB of zeros is about 100 KB gzipped. Refused at the
        // cap, after inflating (not keeping) 64 MiB.
        let zeros = vec![0u8; 1 << 20];
        let bomb = gzip(&vec![&zeros[..]; 100]);
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        let started = Instant::now();
        let e = gunzip(&bomb, 64 << 20).unwrap_err().to_string();
        assert!(e.contains("gunzips to more than 64 MiB, the limit"), "{e}");
        eprintln!(
            "100 MiB bomb ({} KB gzipped) refused in {:.0} ms",
            bomb.len() / 1024,
            started.elapsed().as_secs_f64() * 1e3
        );
    }

    #[cfg(feature = "fetch")]
    #[test]
    fn corrupt_gzip_is_a_clear_error() {
        let good = gzip(&[b"\0asm\x0d\0\x01\0rest of the component"]);
        let mut bad_crc = good.clone();
        let n = bad_crc.len();
        bad_crc[n - 8] ^= 0xff;
        let mut bad_data = good.clone();
        bad_data[12] ^= 0xff;
        for (what, bytes) in [
            ("plain wasm", &b"\0asm\x0d\0\x01\0rest"[..]),
            ("truncated", &good[..good.len() / 2]),
            ("bad checksum", &bad_crc[..]),
            ("bad data", &bad_data[..]),
        ] {
            let e = gunzip(bytes, 1 << 20).unwrap_err();
            assert!(matches!(e, DecodeError::Gzip(_)), "{what}: {e:?}");
            let e = e.to_string();
            assert!(e.starts_with("not a valid gzip file: "), "{what}: {e}");
        }
    }

    #[cfg(feature = "fetch")]
    #[test]
    fn a_gzipped_file_not_named_gz_is_explained() {
        let e = check_header(&gzip(&[b"\0asm\x0d\0\x01\0"])).unwrap_err();
        assert!(matches!(e, DecodeError::Gzipped), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("*.wasm.gz"), "{e}");
    }
}

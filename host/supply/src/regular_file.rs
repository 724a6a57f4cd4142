//! Reading a file of the cache directory, which other writers share (see
//! the crate docs): never through a symlink, never blocking on a FIFO or a
//! device, never more than a limit. Every read of the pull cache and the
//! sealed store goes through here.

use std::{
    fs,
    io::{self, Read},
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::Path,
};

/// Why a file was not read. Every message names the path.
#[derive(Debug, PartialEq, Eq)]
pub enum FileError {
    /// Nothing there: for a cache, a miss.
    Missing,
    /// Something there that is not read, and why.
    Refused(String),
}

impl std::error::Error for FileError {}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::Missing => f.write_str("no such file"),
            FileError::Refused(why) => f.write_str(why),
        }
    }
}

/// Opens `path` for reading if it is a regular file, not a symlink to one,
/// and returns it with its metadata (from the open file, `fstat`).
///
/// `O_NONBLOCK`: opening a FIFO for reading would wait for a writer;
/// `O_NOFOLLOW`: a symlink planted in a shared directory could point
/// anywhere.
pub fn open_regular(path: &Path) -> Result<(fs::File, fs::Metadata), FileError> {
    let refused = |why: String| FileError::Refused(format!("{}: {why}", path.display()));
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(FileError::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused("a symlink, not followed".into()));
        }
        Err(e) => return Err(refused(format!("cannot open it: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| refused(format!("cannot stat it: {e}")))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "not a file"
        };
        return Err(refused(format!("{what}, not a regular file")));
    }
    Ok((file, meta))
}

/// Reads what is left of `file` (opened from `path`) onto `into`, refusing
/// more than `limit` bytes: a file growing while read stops at the limit.
pub fn read_limited(
    path: &Path,
    file: &mut fs::File,
    limit: u64,
    into: &mut Vec<u8>,
) -> Result<(), FileError> {
    let start = into.len();
    file.take(limit.saturating_add(1))
        .read_to_end(into)
        .map_err(|e| FileError::Refused(format!("{}: cannot read it: {e}", path.display())))?;
    if (into.len() - start) as u64 > limit {
        return Err(FileError::Refused(format!(
            "{}: larger than {limit} bytes, the limit for it",
            path.display()
        )));
    }
    Ok(())
}

/// The content of the regular file at `path` ([`open_regular`]), appended
/// to `into`, if it is at most `limit` bytes (refused before reading when
/// its size says it is not).
pub fn read_regular_file_into(
    path: &Path,
    limit: u64,
    into: &mut Vec<u8>,
) -> Result<(), FileError> {
    let (mut file, meta) = open_regular(path)?;
    if meta.len() > limit {
        return Err(FileError::Refused(format!(
            "{}: {} bytes, over the limit of {limit} for it",
            path.display(),
            meta.len()
        )));
    }
    into.reserve_exact(meta.len() as usize);
    read_limited(path, &mut file, limit, into)
}

/// The content of the regular file at `path`, at most `limit` bytes
/// ([`read_regular_file_into`]).
pub fn read_regular_file(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let mut bytes = Vec::new();
    read_regular_file_into(path, limit, &mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::{sync::mpsc, thread, time::Duration};

    /// `f()` on a thread, failing the test if it has not returned within
    /// 5 s (a read blocked on a FIFO).
    pub(crate) fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("still blocked after 5 s (opening a FIFO?)")
    }

    fn read_within_5s(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
        let path = path.to_path_buf();
        within_5s(move || read_regular_file(&path, limit))
    }

    pub(crate) fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    }

    #[test]
    fn a_symlink_a_fifo_and_an_oversized_file_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_within_5s(&file, 10).unwrap(), b"0123456789");
        assert_eq!(
            read_within_5s(&dir.path().join("absent"), 10),
            Err(FileError::Missing)
        );

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        for (path, limit, why) in [
            (&link, 10, "a symlink, not followed"),
            (&fifo, 10, "a FIFO, not a regular file"),
            (&file, 9, "10 bytes, over the limit of 9"),
            (
                &dir.path().to_path_buf(),
                10,
                "a directory, not a regular file",
            ),
        ] {
            let Err(FileError::Refused(e)) = read_within_5s(path, limit) else {
                panic!("{} was read", path.display());
            };
            assert!(
                e.starts_with(&format!("{}: ", path.display())) && e.contains(why),
                "{e}"
            );
        }
    }
}

//! The modules directory (`modulesDir`): which module files it holds, and
//! which of them changed since the last look.
//!
//! A module is a `*.wasm` or `*.wasm.gz` file (the name decides, not the
//! content); the kubelet's `..data` and `..<timestamp>` entries and any
//! hidden file are skipped. Symlinks are followed, so a mounted ConfigMap's
//! `NAME.wasm -> ..data/NAME.wasm` reads the current generation.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::{content::Content, decode::is_module_file, error::ReadError};

/// A file's identity as far as rescans care: where its content lives (the
/// kubelet swaps `..data` to a new directory), its size and mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    target: Option<PathBuf>,
    len: u64,
    modified: Option<SystemTime>,
}

/// A module file's name (the module's name) and content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleFile {
    pub name: String,
    pub content: Content,
}

impl ModuleFile {
    /// Reads one module file, named by its file name, outside any directory.
    pub fn read(path: &Path) -> Result<ModuleFile, ReadError> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| ReadError::NotAFileName {
                path: path.to_path_buf(),
            })?
            .to_string();
        let bytes = fs::read(path).map_err(|source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(ModuleFile {
            name,
            content: Content::new(path.to_path_buf(), bytes),
        })
    }
}

/// A modules directory and what its files looked like at the last scan.
#[derive(Debug)]
pub struct ModulesDir {
    dir: PathBuf,
    stamps: HashMap<String, Stamp>,
    /// The only module files read, when set ([`ModulesDir::only`]).
    only: Option<HashSet<String>>,
    /// Module files skipped for not being in `only`, each logged once.
    ignored: HashSet<String>,
}

impl ModulesDir {
    pub fn new(dir: PathBuf) -> ModulesDir {
        ModulesDir {
            dir,
            stamps: HashMap::new(),
            only: None,
            ignored: HashSet::new(),
        }
    }

    /// Reads only the module files named in `names` (those the
    /// configuration uses): any other file is neither read nor yielded,
    /// whatever it holds, so it costs no memory nor compile.
    pub fn only(mut self, names: HashSet<String>) -> ModulesDir {
        self.only = Some(names);
        self
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Looks at the directory again: the returned [`Scan`] yields, one at a
    /// time, each module file that changed since the last scan (a file
    /// with the same resolved path, size and mtime is not even read; one
    /// that is read is not yielded again until it changes). `None`, logged,
    /// when the directory cannot be read.
    pub fn scan(&mut self) -> Option<Scan<'_>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "cannot read modulesDir: {e}");
                return None;
            }
        };
        Some(Scan {
            dir: self,
            entries,
            present: HashSet::new(),
        })
    }
}

/// One look at a modules directory, file by file: reading a file waits
/// until the one before it has been dealt with.
#[derive(Debug)]
pub struct Scan<'a> {
    dir: &'a mut ModulesDir,
    entries: fs::ReadDir,
    present: HashSet<String>,
}

impl Iterator for Scan<'_> {
    type Item = ModuleFile;

    fn next(&mut self) -> Option<ModuleFile> {
        for entry in self.entries.by_ref().flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // Skip the kubelet's `..data` and `..2026_...` entries and any
            // hidden temporary file.
            if name.starts_with('.') || !is_module_file(&name) {
                continue;
            }
            if let Some(only) = &self.dir.only
                && !only.contains(&name)
            {
                if self.dir.ignored.insert(name.clone()) {
                    tracing::debug!(module = %name, "not named by the configuration: not loaded");
                }
                continue;
            }
            let path = self.dir.dir.join(&name);
            // Follows symlinks: a dangling link in the middle of a swap is
            // skipped now and picked up by the event that completes the swap.
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            self.present.insert(name.clone());
            let stamp = Stamp {
                target: fs::canonicalize(&path).ok(),
                len: meta.len(),
                modified: meta.modified().ok(),
            };
            if self.dir.stamps.get(&name) == Some(&stamp) {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(module = %name, "cannot read {}: {e}", path.display());
                    continue;
                }
            };
            self.dir.stamps.insert(name.clone(), stamp);
            return Some(ModuleFile {
                name,
                content: Content::new(path, bytes),
            });
        }
        None
    }
}

impl Scan<'_> {
    /// Ends the scan (after the last file was yielded): the module files
    /// the directory holds now. Files not yielded because the scan ended
    /// early count as absent, and are read again by the next scan.
    pub fn finish(self) -> HashSet<String> {
        let present = self.present;
        self.dir.stamps.retain(|name, _| present.contains(name));
        present
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_yields_changed_module_files_once() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| fs::write(dir.path().join(name), bytes).unwrap();
        write("a.wasm", b"one");
        write("b.wasm.gz", b"two");
        write("notes.txt", b"skipped");
        write(".hidden.wasm", b"skipped");
        let mut modules = ModulesDir::new(dir.path().to_path_buf());
        let names = |modules: &mut ModulesDir| {
            let mut scan = modules.scan().unwrap();
            let mut changed: Vec<(String, Vec<u8>)> =
                scan.by_ref().map(|m| (m.name, m.content.bytes)).collect();
            changed.sort();
            let mut present: Vec<String> = scan.finish().into_iter().collect();
            present.sort();
            (changed, present)
        };
        let (changed, present) = names(&mut modules);
        assert_eq!(
            changed,
            [
                ("a.wasm".to_string(), b"one".to_vec()),
                ("b.wasm.gz".to_string(), b"two".to_vec())
            ]
        );
        assert_eq!(present, ["a.wasm", "b.wasm.gz"]);
        // Unchanged: not read again, still present.
        let (changed, present) = names(&mut modules);
        assert!(changed.is_empty(), "{changed:?}");
        assert_eq!(present.len(), 2);
        // A change in size is read; a removed file is absent.
        write("a.wasm", b"three");
        fs::remove_file(dir.path().join("b.wasm.gz")).unwrap();
        let (changed, present) = names(&mut modules);
        assert_eq!(changed, [("a.wasm".to_string(), b"three".to_vec())]);
        assert_eq!(present, ["a.wasm"]);
        let file = ModuleFile::read(&dir.path().join("a.wasm")).unwrap();
        assert_eq!(file.content.sha256, crate::content::sha256_hex(b"three"));
    }

    /// Issue 45: files the configuration does not name are not read.
    #[test]
    fn a_scan_limited_to_some_names_reads_no_other_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("used.wasm"), b"one").unwrap();
        fs::write(dir.path().join("other.wasm.gz"), b"two").unwrap();
        let mut modules =
            ModulesDir::new(dir.path().to_path_buf()).only(["used.wasm".to_string()].into());
        let mut scan = modules.scan().unwrap();
        let changed: Vec<String> = scan.by_ref().map(|m| m.name).collect();
        assert_eq!(changed, ["used.wasm"]);
        assert_eq!(scan.finish(), ["used.wasm".to_string()].into());
        assert!(modules.ignored.contains("other.wasm.gz"));
        assert!(!modules.stamps.contains_key("other.wasm.gz"));
    }
}

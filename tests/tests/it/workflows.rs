//! The GitHub workflows (.github/workflows: ci.yml runs ./test and the
//! Rust-only tier, release.yml publishes on a tag) linted by actionlint,
//! built from its Go module by tests/actionlint/build (a `now` row of
//! tests/go-tools/tools: about 25 CPU-s cold, so ./test builds it in every
//! run and nothing is deferred). A typo in a workflow fails here, not on
//! the first push or tag on GitHub, which this machine never reaches.
//!
//! shellcheck and pyflakes, which actionlint runs on `run:` scripts when
//! it finds them on PATH, are turned off (`-shellcheck= -pyflakes=`): the
//! verdict must not depend on what else the machine has installed.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use portwise_tests::built_tool;

fn repo() -> PathBuf {
    portwise_tests::repo_root()
}

/// Every workflow file, sorted.
fn workflows() -> Result<Vec<PathBuf>> {
    let dir = repo().join(".github/workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| dir.display().to_string())?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yml" | "yaml")));
    files.sort();
    Ok(files)
}

/// actionlint's verdict on `files`: whether it passed, and what it said.
fn actionlint(files: &[PathBuf]) -> Result<(bool, String)> {
    let bin = built_tool("tests/actionlint/build")?;
    let out = Command::new(&bin)
        .args(["-no-color", "-oneline", "-shellcheck=", "-pyflakes="])
        .args(files)
        .current_dir(repo())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

#[test]
fn actionlint_passes_the_workflows() -> Result<()> {
    let files = workflows()?;
    let names: Vec<&str> = files
        .iter()
        .filter_map(|p| p.file_name()?.to_str())
        .collect();
    ensure!(
        names == ["ci.yml", "release.yml"],
        "the workflows are ci.yml and release.yml: {names:?}"
    );
    let (ok, text) = actionlint(&files)?;
    ensure!(ok, "actionlint refused the workflows:\n{text}");
    Ok(())
}

/// The lint has teeth: each typo, made in a copy, fails it, and the
/// message names it.
#[test]
fn actionlint_fails_a_typo_in_a_workflow() -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("portwise-workflows-")
        .tempdir()?;
    for (file, from, to, says) in [
        // An unknown key: `step:` for `steps:`.
        (
            "ci.yml",
            "    steps:\n",
            "    step:\n",
            r#"unexpected key "step""#,
        ),
        // An expression naming a step that does not exist.
        (
            "release.yml",
            "${{ steps.release.outputs.digest }}",
            "${{ steps.released.outputs.digest }}",
            r#"property "released" is not defined"#,
        ),
    ] {
        let text = std::fs::read_to_string(repo().join(".github/workflows").join(file))?;
        ensure!(text.contains(from), "{file} no longer has {from:?}");
        let copy = dir.path().join(file);
        std::fs::write(&copy, text.replacen(from, to, 1))?;
        let (ok, said) = actionlint(&[copy])?;
        ensure!(!ok, "actionlint passed {file} with {to:?}:\n{said}");
        ensure!(said.contains(says), "{file} with {to:?}: {said}");
    }
    Ok(())
}

//! Running the commands the orchestration is made of.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use crate::Result;

/// Runs `program args` with this process's stdio; its exit code.
pub fn status(program: impl AsRef<Path>, args: &[&str]) -> Result<i32> {
    let program = program.as_ref();
    let status = Command::new(program)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    // Killed by a signal: 128 + signal, as a shell says it.
    Ok(status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt as _;
        128 + status.signal().unwrap_or(0)
    }))
}

/// Runs `program args`; an error naming the command unless it succeeds.
pub fn run(program: impl AsRef<Path>, args: &[&str]) -> Result<()> {
    let program = program.as_ref();
    match status(program, args)? {
        0 => Ok(()),
        code => Err(format!(
            "{} {} failed (exit {code})",
            program.display(),
            args.join(" ")
        )
        .into()),
    }
}

/// True when `program args` succeeds, its output thrown away (a question,
/// such as `tests/go-tools/build NAME --cached`).
pub fn succeeds(program: impl AsRef<Path>, args: &[&str]) -> Result<bool> {
    let program = program.as_ref();
    Ok(Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?
        .success())
}

/// The lines `program args` prints, which must succeed.
pub fn lines(program: impl AsRef<Path>, args: &[&str]) -> Result<Vec<String>> {
    let program = program.as_ref();
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({})",
            program.display(),
            args.join(" "),
            out.status
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect())
}

/// The run's steps, each announced with the seconds since the start, so
/// that a log shows where a run's time went.
pub struct Steps(Instant);

impl Steps {
    pub fn start() -> Self {
        Self(Instant::now())
    }

    pub fn step(&self, what: &str) {
        println!("\n=== {what} (at {} s)", self.0.elapsed().as_secs());
    }
}

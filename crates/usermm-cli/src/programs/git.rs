//! git on a generated repository: `git-repack` (`git repack -adf`),
//! `git-fsck` (`git fsck --strict`) and `git-log` (`git log -p`).
//!
//! The repository is made once a bench run, without usermm, by `git
//! fast-import` from a stream generated here: `git_mib` MiB of text files
//! of 1 KiB (16 lines of 64 characters) over commits of 32 files each, half
//! of them new files and half an existing file with 4 of its 16 lines
//! rewritten. Content is a function of the file, the line and the line's
//! version: the same repository every run.
//!
//! Checks: `git log -p` prints what it printed without usermm (hashed);
//! `git fsck` prints nothing and ends with status 0; after `git repack`,
//! `git count-objects -v` says every object is in one pack and none loose.
//!
//! `git repack` runs `git pack-objects` as a child process: under `usermm
//! run` each process gets a space and a budget of its own (the budget is
//! computed from the largest process's heap peak), while the kernel's
//! memory group holds the whole tree.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::exec::{plain, Check, Prog};
use super::need;
use crate::params::Params;

const LINES: usize = 16;
const LINE_CHARS: usize = 64;
const FILES_A_COMMIT: usize = 32;

/// A 64-bit mix of `x` (splitmix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Line `j` of file `f` at version `v`: it was last rewritten at the
/// latest version `w` ≤ `v` with `(j + w) % 4 == 0` (4 lines a version).
fn line(out: &mut Vec<u8>, f: u64, j: usize, v: u64) {
    let back = (j as u64 + v) % 4;
    let w = v.saturating_sub(back);
    let mut x = mix((f << 24) ^ ((j as u64) << 16) ^ w);
    for i in 0..LINE_CHARS {
        if i % 16 == 0 {
            x = mix(x);
        }
        out.push(b"abcdefghijklmnopqrstuvwxyz      "[((x >> (4 * (i % 16))) & 31) as usize]);
    }
    out.push(b'\n');
}

fn path(f: u64) -> String {
    format!("d{:02}/e{:02}/f{:05}.txt", f % 32, (f / 32) % 32, f / 1024)
}

/// The fast-import stream of the whole history, written to `w`.
fn history(w: &mut impl Write, files_total: u64) -> std::io::Result<()> {
    let mut versions: Vec<u64> = Vec::new();
    let mut commit = 0u64;
    let mut blob = Vec::with_capacity(LINES * (LINE_CHARS + 1));
    while (versions.len() as u64) < files_total {
        let msg = format!("commit {commit}\n");
        writeln!(w, "commit refs/heads/main")?;
        writeln!(w, "committer Bench <bench@usermm> {} +0000", 1_600_000_000 + commit * 60)?;
        write!(w, "data {}\n{msg}", msg.len())?;
        for i in 0..FILES_A_COMMIT as u64 {
            let f = if i % 2 == 0 || versions.is_empty() {
                versions.push(0);
                versions.len() as u64 - 1
            } else {
                let f = mix((commit << 8) | i) % versions.len() as u64;
                versions[f as usize] += 1;
                f
            };
            blob.clear();
            for j in 0..LINES {
                line(&mut blob, f, j, versions[f as usize]);
            }
            write!(w, "M 100644 inline {}\ndata {}\n", path(f), blob.len())?;
            w.write_all(&blob)?;
            writeln!(w)?;
        }
        commit += 1;
    }
    Ok(())
}

/// Makes the repository in `dir/repo` (once a bench run): `git init` and
/// `git fast-import` of [`history`]. Returns its path and its count of
/// reachable objects.
fn repository(p: &Params, dir: &Path) -> Result<(PathBuf, u64), String> {
    let git = need("git")?;
    let repo = dir.join("repo.git");
    // The reachable objects (fast-import also wrote the first of two
    // versions of a file written twice in one commit).
    let count = |repo: &Path| -> Result<u64, String> {
        let out = Command::new(&git).arg("-C").arg(repo).args(["rev-list", "--objects", "--all"]).output();
        let out = out.map_err(|e| format!("git rev-list: {e}"))?;
        Ok(out.stdout.iter().filter(|&&c| c == b'\n').count() as u64)
    };
    if repo.exists() {
        return Ok((repo.clone(), count(&repo)?));
    }
    let init = Command::new(&git).args(["init", "-q", "--bare", "-b", "main"]).arg(&repo).status();
    if !init.as_ref().is_ok_and(|s| s.success()) {
        return Err(format!("git init {}: {init:?}", repo.display()));
    }
    let mut fi = Command::new(&git)
        .arg("-C")
        .arg(&repo)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("git fast-import: {e}"))?;
    let files = (p.int("git_mib") << 20) / (LINES * (LINE_CHARS + 1)) as u64;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, fi.stdin.take().expect("piped"));
    let wrote = history(&mut w, files).and_then(|()| w.flush());
    drop(w);
    let status = fi.wait().map_err(|e| format!("git fast-import: {e}"))?;
    if wrote.is_err() || !status.success() {
        return Err(format!("git fast-import: {wrote:?}, {status}"));
    }
    Ok((repo.clone(), count(&repo)?))
}

/// The repository's size on disk (its packs), for the notes.
pub fn pack_bytes(dir: &Path) -> u64 {
    let packs = dir.join("repo.git/objects/pack");
    let files = std::fs::read_dir(packs).into_iter().flatten().filter_map(|e| e.ok());
    files.filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
}

/// `git-repack`, `git-fsck` or `git-log`.
pub fn prepare(name: &str, p: &Params, dir: &Path) -> Result<Prog, String> {
    let (repo, objects) = repository(p, dir)?;
    let git: OsString = need("git")?.into();
    let mut argv: Vec<OsString> = vec![git.clone(), "-C".into(), repo.clone().into()];
    let tail: &[&str] = match name {
        "git-repack" => &["repack", "-adfq"],
        "git-fsck" => &["fsck", "--strict", "--no-progress"],
        _ => &["log", "-p", "--no-color", "main"],
    };
    argv.extend(tail.iter().map(OsString::from));
    let check = match name {
        "git-repack" => Check::After {
            argv: vec![git, "-C".into(), repo.into(), "count-objects".into(), "-v".into()],
            lines: vec!["count: 0".into(), format!("in-pack: {objects}"), "packs: 1".into()],
        },
        _ => Check::Stdout(plain(&argv)?),
    };
    Ok(Prog { name: name.into(), argv, check })
}

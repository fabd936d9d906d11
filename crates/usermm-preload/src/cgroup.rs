//! The budget as the program's memory cgroup limit.
//!
//! Programs size themselves by the limit of their memory cgroup: Node.js
//! (libuv's `uv_get_constrained_memory`) gives V8 a young generation of
//! 3 MiB instead of 48 under a limit of 40 MiB, the JVM takes a quarter of
//! the limit as its default heap and picks its collector by it. Under a
//! memory cgroup of the budget's size (`systemd-run -p MemoryMax=`, the
//! `kernel-memcg` rows of `usermm bench programs`) the program sees that
//! limit; under `usermm run --budget` it should see the budget, or it sizes
//! itself for the whole machine and thrashes in the budget.
//!
//! So a read-only open of the calling process's own cgroup's limit file —
//! cgroup v1 `/sys/fs/cgroup/memory<path>/memory.limit_in_bytes`, v2
//! `/sys/fs/cgroup<path>/memory.max`, `<path>` from `/proc/self/cgroup` —
//! gives a copy of the file holding the smaller of the real limit and the
//! space's budget (`view`), when the budget was given (`--budget`,
//! `USERMM_BUDGET_BYTES`: a default budget is no limit the user set, and a
//! JVM seeing a quarter of the machine would take a sixteenth as its
//! heap). Nothing else is changed: other cgroups' files,
//! writes, `memory.high`, the soft limit, the usage (`USERMM_RUN_NO_CGROUP_VIEW=1`
//! turns the view off).

use std::cell::Cell;

/// The files whose view may change, by their name's end.
const V1_LIMIT: &[u8] = b"/memory.limit_in_bytes";
const V2_LIMIT: &[u8] = b"/memory.max";
const ROOT: &[u8] = b"/sys/fs/cgroup/";

std::thread_local! {
    /// Inside `view`: its own reads of the real files pass through.
    static VIEWING: Cell<bool> = const { Cell::new(false) };
}

/// Whether an open of `path` with `flags` might be a limit file's
/// (cheap: every `open` of the program asks).
pub(crate) fn may_view(path: &[u8], flags: i32) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY
        && path.starts_with(ROOT)
        && (path.ends_with(V1_LIMIT) || path.ends_with(V2_LIMIT))
        && !VIEWING.with(Cell::get)
}

/// What the program reads at `path` (one that [`may_view`]) when it is this
/// process's own memory limit file and `budget` is below the real limit:
/// the budget in the file's format. `None`: the real file.
pub(crate) fn view(path: &[u8], budget: u64) -> Option<Vec<u8>> {
    if crate::env_on("USERMM_RUN_NO_CGROUP_VIEW") || !crate::env_on("USERMM_BUDGET_BYTES") || budget == 0 {
        return None;
    }
    VIEWING.with(|v| v.set(true));
    let r = own_limit_file(path).and_then(|_| {
        let real = std::fs::read(std::str::from_utf8(path).ok()?).ok()?;
        limited(&real, budget)
    });
    VIEWING.with(|v| v.set(false));
    r
}

/// Whether `path` names the calling process's own memory limit file.
fn own_limit_file(path: &[u8]) -> Option<()> {
    let cgroups = std::fs::read("/proc/self/cgroup").ok()?;
    let want = squeeze(path);
    own_limit_paths(&cgroups).into_iter().any(|p| p == want).then_some(())
}

/// The limit files of the memory cgroup `/proc/self/cgroup` (`cgroups`)
/// names: v1's under its `memory` controller, v2's of its `0::` line.
fn own_limit_paths(cgroups: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for line in cgroups.split(|&b| b == b'\n') {
        let mut f = line.splitn(3, |&b| b == b':');
        let (Some(id), Some(ctl), Some(p)) = (f.next(), f.next(), f.next()) else { continue };
        if ctl.split(|&b| b == b',').any(|c| c == b"memory") {
            out.push(squeeze(&[b"/sys/fs/cgroup/memory/", p, V1_LIMIT].concat()));
        } else if id == b"0" && ctl.is_empty() {
            out.push(squeeze(&[b"/sys/fs/cgroup/", p, V2_LIMIT].concat()));
        }
    }
    out
}

/// `p` with every run of `/` made one (libuv's `…/memory//memory.max`).
fn squeeze(p: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(p.len());
    for &b in p {
        if !(b == b'/' && out.last() == Some(&b'/')) {
            out.push(b);
        }
    }
    out
}

/// The limit file's content `real` (a number, or v2's `max`) with the
/// limit made `budget` if that is smaller; `None` when it is not.
fn limited(real: &[u8], budget: u64) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(real).ok()?.trim();
    let below = s == "max" || s.parse::<u64>().is_ok_and(|l| budget < l);
    below.then(|| format!("{budget}\n").into_bytes())
}

//! Watching a child in its memory group: its stdout read to the end, its
//! group's counters and the kernel log's word on an OOM kill read when it
//! ended, and a deadline that kills every task of the group.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::SIGKILL;

/// Reads a child's stdout to its end: the first line (the child's
/// `cgroup` line) is returned, everything after it goes to `sink`.
pub(super) fn read_stdout(mut out: impl Read, sink: &mut dyn FnMut(&[u8])) -> Result<String, String> {
    let mut first = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut in_first = true;
    loop {
        let n = match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("child stdout: {e}")),
        };
        let mut b = &buf[..n];
        if in_first {
            let end = b.iter().position(|&c| c == b'\n').map_or(b.len(), |i| i + 1);
            first.extend_from_slice(&b[..end]);
            in_first = end == b.len() && first.last() != Some(&b'\n');
            b = &b[end..];
        }
        if !b.is_empty() {
            sink(b);
        }
    }
    Ok(String::from_utf8_lossy(&first).into_owned())
}

/// A group's counters when its child ended.
pub(super) struct GroupCounters {
    /// `memory.max_usage_in_bytes`.
    pub(super) peak_charge_bytes: u64,
    /// `memory.failcnt`: how often the group hit its limit.
    pub(super) failcnt: u64,
    /// `oom_kill` of `memory.oom_control`.
    pub(super) oom_kills: u64,
    /// `pgmajfault` of `memory.stat`.
    pub(super) pgmajfault: u64,
}

impl GroupCounters {
    pub(super) fn read(cg: &Path) -> GroupCounters {
        let file = |f: &str| std::fs::read_to_string(cg.join(f)).unwrap_or_default();
        let counter = |f: &str| file(f).trim().parse().unwrap_or(0);
        let field = |f: &str, key: &str| {
            file(f).lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0)
        };
        GroupCounters {
            peak_charge_bytes: counter("memory.max_usage_in_bytes"),
            failcnt: counter("memory.failcnt"),
            oom_kills: field("memory.oom_control", "oom_kill"),
            pgmajfault: field("memory.stat", "pgmajfault"),
        }
    }
}

/// The kernel log's lines on an OOM kill in group `name` (`dmesg`): the
/// `oom-kill:` line naming it and the `Killed process` line after it.
pub(super) fn kernel_log_oom(name: &str) -> String {
    let log = Command::new("dmesg").stdin(Stdio::null()).output().map(|o| o.stdout).unwrap_or_default();
    let log = String::from_utf8_lossy(&log);
    let lines: Vec<&str> = log.lines().collect();
    let Some(i) = lines.iter().rposition(|l| l.contains("oom-kill:") && l.contains(&format!("/{name},"))) else {
        return "no oom-kill line for the group in dmesg".into();
    };
    let killed = lines[i..].iter().find(|l| l.contains("Killed process")).copied().unwrap_or("");
    format!("{} {}", lines[i].trim(), killed.trim())
}

/// A watchdog thread that kills every task of a group once its time is up.
pub(super) struct Deadline {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

impl Deadline {
    pub(super) fn start(cg: PathBuf, timeout: Duration) -> Deadline {
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if !matches!(rx.recv_timeout(timeout), Err(std::sync::mpsc::RecvTimeoutError::Timeout)) {
                return false;
            }
            // The tasks' list is read until it is empty: a task forked
            // meanwhile is killed on the next pass.
            for _ in 0..100 {
                let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
                let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = usermm_sys::process::kill(pid, SIGKILL);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            true
        });
        Deadline { stop, thread }
    }

    /// Ends the watchdog; whether it had killed the group.
    pub(super) fn stop(self) -> bool {
        drop(self.stop);
        self.thread.join().unwrap_or(false)
    }
}

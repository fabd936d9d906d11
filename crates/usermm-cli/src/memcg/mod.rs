//! `kernel-memcg`: the host kernel under the same limit as a usermm space
//! (`BENCHMARKS.md`, "Same limit"): a child process in a cgroup v1 memory
//! group whose limit is usermm's budget, with a swap file of usermm's swap
//! size in usermm's swap directory.
//!
//! # Nothing left behind
//! Every piece of system state the benchmark makes — the swap file (created,
//! `mkswap`ed, `swapon`ed), each memory group, each child in a group — is
//! put in a registry *before* it is made, by a [`Guard`]. A guard undoes its
//! piece when dropped (success, error, panic unwinding), under the registry's
//! lock. On SIGINT/SIGTERM the thread started by [`install_signal_teardown`]
//! takes the same lock, undoes every registered piece, newest first (kill
//! and reap the child, `rmdir` the group, `swapoff` and delete the file),
//! and ends the process with the signal. Undoing is idempotent, so a piece
//! registered but not yet (fully) made is undone without harm.
//!
//! A SIGKILL (or a machine restarted under a benchmark) runs no teardown:
//! [`sweep_left_behind`], at every [`KernelLimit::setup`], undoes the
//! pieces whose benchmark pid no longer runs (a swap file left on would
//! take the next kernel-memcg child's swap first).
//!
//! Names: the swap file is `SWAP_PREFIX<pid>` in the swap directory, the
//! groups `CGROUP_PREFIX<pid>-<n>` under [`CGROUP_ROOT`], `<pid>` being the
//! benchmark's process id (the tests look for exactly these).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use usermm_sys::process::{die_by_signal, euid, kill_and_reap, wait_child, wait_termination_signal};
use usermm_sys::thread::ChildExit;

/// The cgroup v1 memory controller's mount point.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup/memory";
/// Memory groups are named `CGROUP_PREFIX<benchmark pid>-<n>`.
pub const CGROUP_PREFIX: &str = "usermm-memcg-";
/// The swap file is `SWAP_PREFIX<benchmark pid>` in the swap directory.
pub const SWAP_PREFIX: &str = "usermm-memcg-swap-";
/// The hidden subcommand the child runs (`usermm __kernel-memcg-child …`).
pub const CHILD_CMD: &str = "__kernel-memcg-child";

/// A piece of system state to undo.
enum Piece {
    Child(i32),
    /// A child leading a process group of its own (`usermm run` and its
    /// program): the whole group is killed, the child reaped.
    ProcessGroup(i32),
    Cgroup(PathBuf),
    Swap(PathBuf),
}

static REGISTRY: Mutex<Vec<(u64, Piece)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_GROUP: AtomicU64 = AtomicU64::new(0);

fn registry() -> std::sync::MutexGuard<'static, Vec<(u64, Piece)>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Undoes one piece; best effort, idempotent. Returns what went wrong.
fn undo(p: &Piece) -> Result<(), String> {
    match p {
        Piece::Child(pid) => kill_and_reap(*pid).map_err(|e| format!("kill child {pid}: {e:?}")),
        Piece::ProcessGroup(pid) => {
            let _ = usermm_sys::process::kill(-*pid, SIGKILL);
            kill_and_reap(*pid).map_err(|e| format!("kill child {pid}: {e:?}"))
        }
        Piece::Cgroup(path) => {
            // The group empties as soon as its last task is reaped; give
            // the kernel a moment in case it is still uncharging.
            let t0 = Instant::now();
            loop {
                match std::fs::remove_dir(path) {
                    Ok(()) => return Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) if t0.elapsed() > Duration::from_secs(10) => {
                        return Err(format!("rmdir {}: {e}", path.display()))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        Piece::Swap(path) => {
            let mut err = None;
            if swap_active(path) {
                if let Err(e) = run("swapoff", &[path.as_os_str()]) {
                    err = Some(e);
                }
            }
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => err = Some(format!("remove {}: {e}", path.display())),
            }
            err.map_or(Ok(()), Err)
        }
    }
}

/// The benchmark pid in a name `prefix<pid>` or `prefix<pid>-<n>`.
fn owner_pid(name: &str, prefix: &str) -> Option<i32> {
    let rest = name.strip_prefix(prefix)?;
    let digits = rest.split('-').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Undoes the pieces that benchmarks now gone left behind (a `kill -9`,
/// a machine restarted under them: no teardown ran): swap files named
/// `SWAP_PREFIX<pid>`, active ones anywhere (`/proc/swaps`) or in
/// `swap_dir`, and memory groups `CGROUP_PREFIX<pid>-<n>`, of a `<pid>`
/// that no longer runs. Each one undone is said on stderr. (A left swap
/// file stays on: the kernel-memcg child would swap to it first.)
pub fn sweep_left_behind(swap_dir: &Path) {
    let gone = |pid: i32| pid != std::process::id() as i32 && !Path::new(&format!("/proc/{pid}")).exists();
    let mut pieces: Vec<Piece> = Vec::new();
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let active = swaps.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(PathBuf::from);
    let in_dir = std::fs::read_dir(swap_dir).into_iter().flatten().filter_map(|e| e.ok()).map(|e| e.path());
    for path in active.chain(in_dir) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if owner_pid(&name, SWAP_PREFIX).is_some_and(gone)
            && !pieces.iter().any(|p| matches!(p, Piece::Swap(q) if *q == path))
        {
            pieces.push(Piece::Swap(path));
        }
    }
    for e in std::fs::read_dir(CGROUP_ROOT).into_iter().flatten().filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(SWAP_PREFIX) && owner_pid(&name, CGROUP_PREFIX).is_some_and(gone) {
            pieces.push(Piece::Cgroup(e.path()));
        }
    }
    for p in &pieces {
        let what = match p {
            Piece::Swap(path) | Piece::Cgroup(path) => path.display().to_string(),
            Piece::Child(pid) | Piece::ProcessGroup(pid) => pid.to_string(),
        };
        match undo(p) {
            Ok(()) => eprintln!("usermm: removed {what}, left behind by a benchmark that is gone"),
            Err(e) => eprintln!("usermm: could not remove {what}, left behind by a benchmark that is gone: {e}"),
        }
    }
}

/// Whether `path` is an active swap area (listed in `/proc/swaps`).
pub fn swap_active(path: &Path) -> bool {
    let want = path.to_string_lossy();
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().next() == Some(&want))
}

/// A registered piece of state, undone when dropped.
struct Guard(u64);

impl Guard {
    fn new(p: Piece) -> Guard {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        registry().push((id, p));
        Guard(id)
    }

    /// Takes the piece out of the registry (under its lock) and hands it to
    /// `f`; `f` runs with the lock held, so that the signal thread never sees
    /// a piece half undone.
    fn finish<T>(self, f: impl FnOnce(&Piece) -> T) -> T {
        let mut reg = registry();
        let i = reg.iter().position(|(id, _)| *id == self.0).expect("a live guard is registered");
        let (_, p) = reg.remove(i);
        std::mem::forget(self);
        f(&p)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut reg = registry();
        if let Some(i) = reg.iter().position(|(id, _)| *id == self.0) {
            let (_, p) = reg.remove(i);
            if let Err(e) = undo(&p) {
                eprintln!("usermm: kernel-memcg teardown: {e}");
            }
        }
    }
}

/// A child leading a process group of its own, killed with its group by
/// the signal teardown (or when this is dropped before [`Self::release`]).
pub struct ProcessGroupGuard(Guard);

impl ProcessGroupGuard {
    /// Registers child `pid`, the leader of process group `pid`.
    pub fn new(pid: i32) -> ProcessGroupGuard {
        ProcessGroupGuard(Guard::new(Piece::ProcessGroup(pid)))
    }

    /// The child was reaped: nothing to undo.
    pub fn release(self) {
        self.0.finish(|_| ());
    }
}

/// Starts the thread that tears everything down on SIGINT/SIGTERM. The
/// caller must have blocked both signals in the main thread before any other
/// thread was started (`usermm_sys::process::block_termination_signals`).
pub fn install_signal_teardown() {
    std::thread::Builder::new()
        .name("teardown".into())
        .spawn(|| {
            let sig = wait_termination_signal();
            // Held until the process ends: nothing new gets registered.
            let mut reg = registry();
            if !reg.is_empty() {
                eprintln!("usermm: signal {sig}: tearing down {} kernel-memcg piece(s)", reg.len());
            }
            while let Some((_, p)) = reg.pop() {
                if let Err(e) = undo(&p) {
                    eprintln!("usermm: kernel-memcg teardown: {e}");
                }
            }
            die_by_signal(sig)
        })
        .expect("spawn the teardown thread");
}

fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let out = Command::new(cmd).args(args).stdin(Stdio::null()).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {:?}: {}: {}", args, out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The swap file and the limit, set up for one experiment: children run
/// under it one by one ([`KernelLimit::run_child`]), each in a fresh memory
/// group. Dropping it turns the swap file off and deletes it.
pub struct KernelLimit {
    swap_path: Option<PathBuf>,
    limit_bytes: usize,
    _swap: Option<Guard>,
}

/// What one child run gave: its stdout, and its group's counters.
pub struct ChildRun {
    /// Its stdout ([`KernelLimit::run_in_group`]: only its `cgroup` line).
    pub stdout: String,
    /// `memory.max_usage_in_bytes` of the group when the child ended.
    pub peak_charge_bytes: u64,
    /// `memory.failcnt`: how often the group hit its limit.
    pub failcnt: u64,
    /// `pgmajfault` of the group's `memory.stat` (swap-ins and file reads).
    pub pgmajfault: u64,
    /// Children the kernel's OOM killer killed in their group before this
    /// one ran to the end (each was run again in a fresh group).
    pub oom_kills: u32,
    /// From the child's spawn to its reaping (the run that ended): one
    /// start of this binary and the program's whole run, as `usermm run`'s
    /// rows of `usermm bench programs` time one start of it (the launcher)
    /// and the program's run.
    pub elapsed_ns: u64,
}

/// How often a child the OOM killer killed is run again before the run is
/// an error. The kernel does OOM-kill at these limits now and then: with
/// the whole charge active anonymous memory and the swap device busy,
/// reclaim in the group can fail its retries (seen in about 1 run in 10 of
/// the 16 MiB set under a 4 MiB and an 8 MiB limit while other tests ran).
pub const OOM_TRIES: u32 = 3;

/// How [`KernelLimit::run_child`]'s error begins when the OOM killer
/// killed the child every time: the kernel could not run the workload at
/// this limit (a result, not a failure of the benchmark).
pub const OOM_FAILURE: &str = "the kernel's OOM killer killed the child";

/// The notes' sentence on the children the OOM killer killed.
pub fn oom_sentence(oom_kills: u32) -> String {
    format!("Children the group's OOM killer killed (each run again in a fresh group, up to {OOM_TRIES} tries a run): {oom_kills}.")
}

/// The page reclaim the kernel uses: MGLRU when `lru_gen` is there and on,
/// the active/inactive lists otherwise.
pub fn kernel_lru() -> &'static str {
    let on = std::fs::read_to_string("/sys/kernel/mm/lru_gen/enabled")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|v| v & 1 != 0);
    if on {
        "MGLRU"
    } else {
        "the active/inactive LRU lists (no MGLRU in this kernel, or it is off)"
    }
}

const SIGKILL: i32 = 9;

/// How one child run in one group ended.
enum Attempt {
    Done(ChildRun),
    /// Killed by the OOM killer of its group (`oom_kill` of
    /// `memory.oom_control` went up): worth running again.
    OomKilled(String),
}

impl KernelLimit {
    /// Checks that the kernel can be limited here, and makes and turns on a
    /// swap file of `swap_bytes` in `swap_dir` (none when `swap_bytes` is 0:
    /// the space compared with has no swap either). `Err` says why it cannot
    /// be.
    pub fn setup(limit_bytes: usize, swap_bytes: usize, swap_dir: &str) -> Result<KernelLimit, String> {
        if euid() != 0 {
            return Err("not root: a memory cgroup and swapon need root".into());
        }
        if !Path::new(CGROUP_ROOT).join("memory.limit_in_bytes").exists() {
            return Err(format!("no cgroup v1 memory controller at {CGROUP_ROOT}"));
        }
        sweep_left_behind(Path::new(swap_dir));
        if swap_bytes == 0 {
            return Ok(KernelLimit { swap_path: None, limit_bytes, _swap: None });
        }
        let swap_path = Path::new(swap_dir).join(format!("{SWAP_PREFIX}{}", std::process::id()));
        let guard = Guard::new(Piece::Swap(swap_path.clone()));
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&swap_path)
                .map_err(|e| format!("create {}: {e}", swap_path.display()))?;
        }
        let p = swap_path.as_os_str();
        run("fallocate", &["-l".as_ref(), swap_bytes.to_string().as_ref(), p])?;
        run("mkswap", &[p])?;
        run("swapon", &[p]).map_err(|e| format!("swapon refused: {e}"))?;
        Ok(KernelLimit { swap_path: Some(swap_path), limit_bytes, _swap: Some(guard) })
    }

    /// Sets the limit of the groups of the runs to come.
    pub fn set_limit(&mut self, limit_bytes: usize) {
        self.limit_bytes = limit_bytes;
    }

    /// The swap file, if there is one.
    pub fn swap_path(&self) -> Option<&Path> {
        self.swap_path.as_deref()
    }

    /// Runs `usermm CHILD_CMD args…` in a fresh memory group limited to the
    /// budget: the child waits for one byte on stdin, which is sent only
    /// after its pid is in the group's `cgroup.procs`, so that everything it
    /// allocates is charged to the group. Returns its stdout once it ended
    /// with status 0; the group is removed afterwards (also on error).
    ///
    /// A child the group's OOM killer killed is run again in a fresh group,
    /// up to [`OOM_TRIES`] times in all; [`ChildRun::oom_kills`] says how
    /// often it was.
    pub fn run_child(&self, args: &[String]) -> Result<ChildRun, String> {
        let mut kills = Vec::new();
        while (kills.len() as u32) < OOM_TRIES {
            match self.attempt(args)? {
                Attempt::Done(mut c) => {
                    c.oom_kills = kills.len() as u32;
                    return Ok(c);
                }
                Attempt::OomKilled(why) => kills.push(why),
            }
        }
        Err(format!("{OOM_FAILURE} {OOM_TRIES} times at this limit: {}", kills.join("; ")))
    }

    fn attempt(&self, args: &[String]) -> Result<Attempt, String> {
        let mut rest = Vec::new();
        let ended = self.run_in_group(args, None, &mut |b: &[u8]| rest.extend_from_slice(b))?;
        match ended {
            Ended::Done(mut c) => {
                c.stdout.push_str(&String::from_utf8_lossy(&rest));
                Ok(Attempt::Done(c))
            }
            Ended::OomKilled(why) => Ok(Attempt::OomKilled(why)),
            Ended::TimedOut => unreachable!("no deadline"),
        }
    }

    /// Runs `usermm CHILD_CMD args…` once in a fresh memory group limited
    /// to the budget, as [`KernelLimit::run_child`] does but never again:
    /// a child the group's OOM killer killed (its exit not 0 and the
    /// group's `oom_kill` count up: the killed task may be one of its
    /// children) is [`Ended::OomKilled`] with the reason, and one still
    /// running after `timeout` is killed with every task in its group,
    /// [`Ended::TimedOut`]. Its stdout after the child's own `cgroup` line
    /// goes to `sink` as it comes (a program's output may be larger than
    /// this process should hold); [`ChildRun::stdout`] is that line.
    pub fn run_in_group(
        &self,
        args: &[String],
        timeout: Option<Duration>,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<Ended, String> {
        let name = format!("{CGROUP_PREFIX}{}-{}", std::process::id(), NEXT_GROUP.fetch_add(1, Ordering::Relaxed));
        let cg = Path::new(CGROUP_ROOT).join(&name);
        let cg_guard = Guard::new(Piece::Cgroup(cg.clone()));
        std::fs::create_dir(&cg).map_err(|e| format!("mkdir {}: {e}", cg.display()))?;
        std::fs::write(cg.join("memory.limit_in_bytes"), self.limit_bytes.to_string())
            .map_err(|e| format!("{name}/memory.limit_in_bytes: {e}"))?;
        // The running binary itself, through `/proc/self/exe`: its path may
        // name another file by now (a rebuild while a report runs replaced
        // it; the path then fails with ENOENT or runs other code).
        let proc_exe = Path::new("/proc/self/exe");
        let exe = if proc_exe.exists() {
            proc_exe.to_path_buf()
        } else {
            std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?
        };
        let t_spawn = Instant::now();
        let mut child = Command::new(exe)
            .arg(CHILD_CMD)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn the child: {e}"))?;
        let pid = child.id() as i32;
        let child_guard = Guard::new(Piece::Child(pid));
        std::fs::write(cg.join("cgroup.procs"), pid.to_string()).map_err(|e| format!("{name}/cgroup.procs: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(b"g").map_err(|e| format!("release the child: {e}"))?;
        drop(stdin);
        let watch = timeout.map(|t| Deadline::start(cg.clone(), t));
        let first_line = read_stdout(child.stdout.take().expect("piped stdout"), sink);
        // The child closed its stdout: it is ending. Reap it under the lock.
        let exit = child_guard.finish(|p| match p {
            Piece::Child(pid) => wait_child(*pid).map_err(|e| format!("wait for the child: {e:?}")),
            _ => unreachable!(),
        })?;
        let elapsed_ns = t_spawn.elapsed().as_nanos() as u64;
        let timed_out = watch.is_some_and(Deadline::stop);
        let first_line = first_line?;
        let g = GroupCounters::read(&cg);
        drop(cg_guard);
        if timed_out {
            return Ok(Ended::TimedOut);
        }
        if exit != ChildExit::Exited(0) && g.oom_kills > 0 {
            return Ok(Ended::OomKilled(format!(
                "child {pid} in {name} ended with {exit:?}: memory.oom_control oom_kill {}, memory.failcnt {} \
                 (limit hits), peak charge {} bytes; kernel log: {}",
                g.oom_kills,
                g.failcnt,
                g.peak_charge_bytes,
                kernel_log_oom(&name)
            )));
        }
        if exit != ChildExit::Exited(0) {
            return Err(format!("the child (pid {pid}) ended with {exit:?}"));
        }
        if !(first_line.starts_with("cgroup ") && first_line.contains(&format!("/{name}"))) {
            return Err(format!("the child was not in memory group {name}: {first_line}"));
        }
        Ok(Ended::Done(ChildRun {
            stdout: first_line,
            peak_charge_bytes: g.peak_charge_bytes,
            failcnt: g.failcnt,
            pgmajfault: g.pgmajfault,
            oom_kills: 0,
            elapsed_ns,
        }))
    }
}

/// How one child run in one group ended ([`KernelLimit::run_in_group`]).
pub enum Ended {
    Done(ChildRun),
    /// Killed by its group's OOM killer: why (`memory.oom_control`, …).
    OomKilled(String),
    /// Still running at the deadline: killed with every task in its group.
    TimedOut,
}

/// In the child: waits for the parent's go byte on stdin (EOF: the parent
/// went away before releasing it) and prints its memory cgroup line.
pub fn child_wait_for_go() -> bool {
    let mut b = [0u8; 1];
    if !matches!(std::io::stdin().read(&mut b), Ok(1)) {
        return false;
    }
    let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let line = cg.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")));
    println!("cgroup {}", line.unwrap_or("?"));
    true
}

/// `(pswpout, pswpin, pgsteal_anon)` of `/proc/vmstat`: pages written to
/// and read from swap, and anonymous pages reclaimed, machine-wide.
pub fn vmstat_reclaim() -> (u64, u64, u64) {
    let s = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("pswpout"), field("pswpin"), field("pgsteal_anon"))
}

mod watch;
use watch::{kernel_log_oom, read_stdout, Deadline, GroupCounters};

#[cfg(test)]
mod tests;

//! One run of one program: under `usermm run`, or in a memory group. Its
//! stdout is hashed as it comes (`git log -p` prints hundreds of MiB) and
//! checked, its misses are counted, and a run still going at the deadline
//! is killed with every process it started and reported as timed out.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::redis_client;
use crate::memcg::{self, Ended, KernelLimit};

/// What a program's stdout was: its length, an FNV-1a hash of it and its
/// first bytes (for messages).
#[derive(Default, Clone)]
pub struct Digest {
    bytes: u64,
    fnv: u64,
    head: Vec<u8>,
}

const HEAD_BYTES: usize = 2048;

impl Digest {
    pub fn of(text: &str) -> Digest {
        let mut d = Digest::default();
        d.feed(text.as_bytes());
        d
    }

    pub fn feed(&mut self, b: &[u8]) {
        if self.bytes == 0 {
            self.fnv = 0xcbf2_9ce4_8422_2325;
        }
        for &c in b {
            self.fnv = (self.fnv ^ c as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.bytes += b.len() as u64;
        let room = HEAD_BYTES.saturating_sub(self.head.len()).min(b.len());
        self.head.extend_from_slice(&b[..room]);
    }

    pub fn same(&self, other: &Digest) -> bool {
        self.bytes == other.bytes && self.fnv == other.fnv
    }

    pub fn head(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }
}

/// How a run's result is checked.
pub enum Check {
    /// Its stdout is exactly what this digest was made of.
    Stdout(Digest),
    /// A Redis server: the bench's client sets `values` values and reads
    /// every one back (and the client's time is the run's).
    Redis { port: u16, values: usize },
    /// Its stdout is empty, and `argv`, run without usermm afterwards,
    /// prints `lines` among its lines (`git repack`: the objects all in one
    /// pack).
    After { argv: Vec<OsString>, lines: Vec<String> },
}

/// One program, ready to run.
pub struct Prog {
    pub name: String,
    pub argv: Vec<OsString>,
    pub check: Check,
}

/// What one finished run measured.
#[derive(Default)]
pub struct Sample {
    pub secs: f64,
    /// usermm's `--stats`, summed over the processes of the run.
    pub swapouts: u64,
    pub swapins: u64,
    pub major_faults: u64,
    /// Touches of parked pages (usermm's `minor_faults`).
    pub parked_faults: u64,
    /// The largest `resident_bytes_max` of the run's processes.
    pub heap_peak_bytes: u64,
    /// From the memory group: its peak charge and `memory.stat` `pgmajfault`.
    pub charge_peak_bytes: u64,
    pub pgmajfault: u64,
    /// The machine's `pswpin` across a kernel run.
    pub pswpin: u64,
}

/// How one run ended.
pub enum Outcome {
    Done(Sample),
    /// The kernel's OOM killer killed it in its group: why.
    OomKilled(String),
    TimedOut,
}

/// The sum of a counter over every `usermm run` stats line of a run (one a
/// process: `git repack` starts `git pack-objects`), or with `max` the
/// largest.
fn stats(stderr: &str, key: &str, max: bool) -> Result<u64, String> {
    let lines: Vec<&str> =
        stderr.lines().filter(|l| l.starts_with("usermm run: pid ") && l.contains("): stats: ")).collect();
    if lines.is_empty() {
        return Err(format!("no stats line on stderr:\n{stderr}"));
    }
    let mut acc = 0u64;
    for line in lines {
        let v: u64 = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {key} in: {line}"))?;
        acc = if max { acc.max(v) } else { acc + v };
    }
    Ok(acc)
}

fn check(prog: &Prog, sys: &str, out: &Digest) -> Result<(), String> {
    let wrong = |want: &str| {
        Err(format!("{sys} {}: wrong output ({} bytes):\n{}\nexpected:\n{want}", prog.name, out.bytes, out.head()))
    };
    match &prog.check {
        Check::Stdout(want) if !out.same(want) => wrong(&want.head()),
        Check::Stdout(_) | Check::Redis { .. } => Ok(()),
        Check::After { .. } if out.bytes > 0 => wrong(""),
        Check::After { argv, lines } => {
            let o = Command::new(&argv[0]).args(&argv[1..]).output().map_err(|e| format!("{argv:?}: {e}"))?;
            let text = String::from_utf8_lossy(&o.stdout);
            match lines.iter().find(|l| !text.lines().any(|t| t == l.as_str())) {
                Some(l) => Err(format!("{sys} {}: after the run, {argv:?} lacks '{l}':\n{text}", prog.name)),
                None => Ok(()),
            }
        }
    }
}

/// Kills process group `pgid` when `timeout` passes before `stop` is
/// dropped; the thread answers whether it did.
fn deadline(pgid: i32, timeout: Duration) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        let up = matches!(rx.recv_timeout(timeout), Err(std::sync::mpsc::RecvTimeoutError::Timeout));
        if up {
            let _ = usermm_sys::process::kill(-pgid, 9);
        }
        up
    });
    (tx, h)
}

/// `usermm run --budget … -- PROGRAM`, with `swap` its swap options.
pub fn run_usermm(
    prog: &Prog,
    sys: &str,
    budget: usize,
    swap: &[String],
    timeout: Duration,
) -> Result<Outcome, String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut c = Command::new(exe);
    c.arg("run").arg(format!("--budget={budget}")).args(swap).arg("--stats").arg("--").args(&prog.argv);
    if sys == super::FITS {
        // Its yardstick, the unlimited kernel, shows the program no limit:
        // neither does this row (see the module's doc).
        c.env("USERMM_RUN_NO_CGROUP_VIEW", "1");
    }
    // Its own process group: at the deadline, every process of the run is
    // killed at once.
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let t0 = Instant::now();
    let mut child = c.spawn().map_err(|e| format!("usermm run: {e}"))?;
    // Not in this process's group: a signal that ends the bench would miss
    // it, so the bench's teardown kills the group.
    let group = memcg::ProcessGroupGuard::new(child.id() as i32);
    let (stop, watchdog) = deadline(child.id() as i32, timeout);
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let (digest, stderr, client) = std::thread::scope(|s| {
        let digest = s.spawn(move || read_digest(&mut out));
        let stderr = s.spawn(move || {
            let mut v = Vec::new();
            let _ = err.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        });
        let client = match prog.check {
            Check::Redis { port, values } => Some(redis_client(port, values)),
            _ => None,
        };
        (digest.join().unwrap_or_default(), stderr.join().unwrap_or_default(), client)
    });
    let status = child.wait().map_err(|e| format!("usermm run: {e}"))?;
    let mut secs = t0.elapsed().as_secs_f64();
    group.release();
    drop(stop);
    if watchdog.join().unwrap_or(false) {
        return Ok(Outcome::TimedOut);
    }
    if !status.success() {
        return Err(format!("{sys} {}: usermm run ended with {status:?}:\n{stderr}", prog.name));
    }
    if let Some(r) = client {
        secs = r.map_err(|e| format!("{sys}: {e}"))?;
    }
    check(prog, sys, &digest)?;
    Ok(Outcome::Done(Sample {
        secs,
        swapouts: stats(&stderr, "swapouts", false)?,
        swapins: stats(&stderr, "swapins", false)?,
        major_faults: stats(&stderr, "major_faults", false)?,
        parked_faults: stats(&stderr, "minor_faults", false)?,
        heap_peak_bytes: stats(&stderr, "resident_bytes_max", true)?,
        ..Sample::default()
    }))
}

fn read_digest(r: &mut impl Read) -> Digest {
    let mut d = Digest::default();
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        d.feed(&buf[..n]);
    }
    d
}

/// The program run plainly (no usermm, no group): its stdout's digest, or
/// why it failed.
pub fn plain(argv: &[OsString]) -> Result<Digest, String> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{:?}: {e}", argv[0]))?;
    let d = read_digest(child.stdout.as_mut().expect("piped"));
    let status = child.wait().map_err(|e| format!("{:?}: {e}", argv[0]))?;
    if !status.success() {
        return Err(format!("{argv:?} without usermm ended with {status:?}: {}", d.head()));
    }
    Ok(d)
}

/// The program in a memory group of `limit` (the child execs it).
pub fn run_kernel(prog: &Prog, sys: &str, limit: &KernelLimit, timeout: Duration) -> Result<Outcome, String> {
    let mut args = vec!["programs".to_string()];
    args.extend(prog.argv.iter().map(|a| a.to_string_lossy().into_owned()));
    let (_, pswpin0, _) = memcg::vmstat_reclaim();
    let mut digest = Digest::default();
    let (ended, client) = std::thread::scope(|s| {
        let client = match prog.check {
            Check::Redis { port, values } => Some(s.spawn(move || redis_client(port, values))),
            _ => None,
        };
        let ended = limit.run_in_group(&args, Some(timeout), &mut |b| digest.feed(b));
        (ended, client.map(|h| h.join().unwrap_or_else(|_| Err("the Redis client panicked".into()))))
    });
    let c = match ended.map_err(|e| format!("{sys} {}: {e}", prog.name))? {
        Ended::Done(c) => c,
        Ended::OomKilled(why) => return Ok(Outcome::OomKilled(why)),
        Ended::TimedOut => return Ok(Outcome::TimedOut),
    };
    let secs = match client {
        Some(r) => r.map_err(|e| format!("{sys}: {e}"))?,
        None => c.elapsed_ns as f64 / 1e9,
    };
    check(prog, sys, &digest)?;
    let (_, pswpin1, _) = memcg::vmstat_reclaim();
    Ok(Outcome::Done(Sample {
        secs,
        charge_peak_bytes: c.peak_charge_bytes,
        pgmajfault: c.pgmajfault,
        pswpin: pswpin1.saturating_sub(pswpin0),
        ..Sample::default()
    }))
}

/// `usermm __kernel-memcg-child programs PROGRAM ARGS…`: waits for the go
/// byte, then becomes the program (in the group the parent put it in).
pub fn kernel_memcg_child(args: &[String]) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let (prog, rest) = args.split_first().ok_or("no program")?;
    if !memcg::child_wait_for_go() {
        return Err("the parent never said go".into());
    }
    let _ = std::io::stdout().flush();
    let e = Command::new(prog).args(rest).exec();
    Err(format!("exec {prog}: {e}"))
}

//! `heap`'s C-allocator workloads: the same program (this binary, as
//! `usermm __heap-malloc-child WORKLOAD THREADS OPS SEED`) with the C
//! library's `malloc` (`kernel`) and under `usermm run` (`usermm`: the
//! preload library's `malloc` on a space), alternated run by run.
//!
//! Every allocation is a `Vec<u8>` of this binary's global allocator,
//! which is the C library's `malloc`, `realloc` and `free` by name: under
//! `usermm run` the preload library's. Each block's first byte is written
//! when it is made and checked before it is freed, so no run can skip
//! work; a wrong byte fails the run.
//!
//! - `malloc-free`: a window of 256 blocks of 16..1024 bytes; each
//!   operation frees a random slot's block and allocates a new one (a
//!   `malloc` and a `free`). `malloc-free-threads`: the same in `THREADS`
//!   threads at once, each its own window.
//! - `larson` (the shape of mimalloc-bench's larson: a server's threads
//!   handing objects to each other): `THREADS` threads each replace random
//!   blocks of 8..1000 bytes in a window of 1000; every 10,000 operations
//!   the threads pass their windows round (thread `i` takes thread
//!   `i - 1`'s), so most frees are of blocks another thread allocated.
//! - `churn` (the shape of cfrac/espresso: one thread, many short-lived
//!   objects of mixed sizes): a stack of live blocks that grows and shrinks
//!   in bursts; sizes mostly 16..128 bytes, one in eight 128 bytes..4 KiB,
//!   one in 64 up to 64 KiB; one in eight grown with `realloc` to twice its
//!   size.

use std::sync::{Barrier, Mutex};

use usermm_sys::now_ns;

use crate::common::Rng;

/// The hidden subcommand.
pub const CHILD_CMD: &str = "__heap-malloc-child";

/// A block (`malloc(len)`: a `Vec` of that capacity, not `vec![0; len]`,
/// which is `calloc`) whose first byte says which it is.
struct Block(Vec<u8>);

impl Block {
    fn new(len: usize, tag: u8) -> Block {
        let mut v = Vec::with_capacity(len);
        v.push(tag);
        Block(v)
    }

    /// 1 if its first byte is no longer what `new` wrote (or it is short).
    fn wrong(&self, tag: u8) -> u64 {
        (self.0[0] != tag) as u64
    }
}

/// `usermm __heap-malloc-child WORKLOAD THREADS OPS SEED`: runs it and
/// prints `result NS_PER_OP WRONG`.
pub fn child_main(args: &[String]) -> Result<(), String> {
    let n = |i: usize| -> Result<u64, String> {
        args.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("argument {i} of {args:?} is no number"))
    };
    let (threads, ops, seed) = (n(1)?.max(1) as usize, n(2)?.max(1), n(3)?);
    let (ns, wrong) = match args.first().map(String::as_str) {
        Some("malloc-free") => window(1, ops, seed),
        Some("malloc-free-threads") => window(threads, ops, seed),
        Some("larson") => larson(threads, ops, seed),
        Some("churn") => churn(ops, seed),
        other => return Err(format!("unknown workload {other:?}")),
    };
    println!("result {ns} {wrong}");
    Ok(())
}

/// The mean of the threads' ns per operation, and the wrong blocks.
fn mean(per: &[(f64, u64)]) -> (f64, u64) {
    (per.iter().map(|p| p.0).sum::<f64>() / per.len().max(1) as f64, per.iter().map(|p| p.1).sum())
}

/// `malloc-free` in `threads` threads.
fn window(threads: usize, ops: u64, seed: u64) -> (f64, u64) {
    let per: Vec<(f64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = Rng::new(seed + 1000 * t as u64);
                    let mut live: Window = (0..256).map(|_| None).collect();
                    let mut wrong = 0;
                    let mut pass = |n: u64| {
                        let t0 = now_ns();
                        for _ in 0..n {
                            let j = rng.below(256) as usize;
                            if let Some((b, tag)) = live[j].take() {
                                wrong += b.wrong(tag);
                            }
                            let tag = rng.next_u64() as u8;
                            live[j] = Some((Block::new(16 + rng.below(1009) as usize, tag), tag));
                        }
                        now_ns() - t0
                    };
                    pass(ops / 4);
                    let ns = pass(ops);
                    wrong += live.iter().flatten().map(|(b, tag)| b.wrong(*tag)).sum::<u64>();
                    (ns as f64 / ops as f64, wrong)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a malloc-free thread panicked")).collect()
    });
    mean(&per)
}

/// A window of blocks, each with its tag.
type Window = Vec<Option<(Block, u8)>>;

/// `larson`.
fn larson(threads: usize, ops: u64, seed: u64) -> (f64, u64) {
    const SLOTS: usize = 1000;
    const ROUND: u64 = 10_000;
    let rounds = ops.div_ceil(ROUND);
    // Thread `i` leaves its window in `boxes[i]` at the end of a round and
    // takes `boxes[i - 1]`'s for the next.
    let boxes: Vec<Mutex<Window>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
    let barrier = Barrier::new(threads);
    let per: Vec<(f64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (boxes, barrier) = (&boxes, &barrier);
                s.spawn(move || {
                    let mut rng = Rng::new(seed + 77 * t as u64);
                    let mut w: Window = (0..SLOTS).map(|_| None).collect();
                    let (mut wrong, mut ns) = (0, 0);
                    for _ in 0..rounds {
                        let t0 = now_ns();
                        for _ in 0..ROUND {
                            let j = rng.below(SLOTS as u64) as usize;
                            if let Some((b, tag)) = w[j].take() {
                                wrong += b.wrong(tag);
                            }
                            let tag = rng.next_u64() as u8;
                            w[j] = Some((Block::new(8 + rng.below(993) as usize, tag), tag));
                        }
                        ns += now_ns() - t0;
                        *boxes[t].lock().expect("a larson thread panicked") = w;
                        barrier.wait();
                        let from = (t + threads - 1) % threads;
                        w = std::mem::take(&mut *boxes[from].lock().expect("a larson thread panicked"));
                        barrier.wait();
                    }
                    wrong += w.iter().flatten().map(|(b, tag)| b.wrong(*tag)).sum::<u64>();
                    (ns as f64 / (rounds * ROUND) as f64, wrong)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a larson thread panicked")).collect()
    });
    mean(&per)
}

/// `churn`: ns per operation (an allocation, a free or a `realloc`).
fn churn(ops: u64, seed: u64) -> (f64, u64) {
    let mut rng = Rng::new(seed);
    let mut live: Vec<(Block, u8)> = Vec::with_capacity(1 << 16);
    let mut wrong = 0u64;
    let size = |rng: &mut Rng| -> usize {
        match rng.below(64) {
            0 => 4096 + rng.below(60 << 10) as usize,
            1..=8 => 128 + rng.below(3969) as usize,
            _ => 16 + rng.below(113) as usize,
        }
    };
    let t0 = now_ns();
    let mut done = 0u64;
    while done < ops {
        // A burst of allocations, then one of frees (mostly the newest
        // blocks, now and then random ones).
        let grow = 1 + rng.below(200);
        for _ in 0..grow {
            let n = size(&mut rng);
            let tag = rng.next_u64() as u8;
            let mut b = Block::new(n, tag);
            if rng.below(8) == 0 {
                // `realloc` to twice the size.
                b.0.reserve_exact(2 * n - 1);
                done += 1;
            }
            live.push((b, tag));
        }
        let shrink = rng.below(grow + 8).min(live.len() as u64);
        for _ in 0..shrink {
            let i = if rng.below(4) == 0 { rng.below(live.len() as u64) as usize } else { live.len() - 1 };
            let (b, tag) = live.swap_remove(i);
            wrong += b.wrong(tag);
        }
        done += grow + shrink;
        if live.len() > 50_000 {
            for (b, tag) in live.drain(..25_000) {
                wrong += b.wrong(tag);
                done += 1;
            }
        }
    }
    for (b, tag) in live.drain(..) {
        wrong += b.wrong(tag);
        done += 1;
    }
    ((now_ns() - t0) as f64 / done as f64, wrong)
}

/// Runs `workload` in a child: this binary under `usermm run` (`preload`)
/// or as it is. ns per operation, or why not.
pub fn run_child(preload: bool, workload: &str, threads: usize, ops: u64, seed: u64) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut cmd = std::process::Command::new(&exe);
    if preload {
        // No memory pressure: the space's budget far above what the
        // workloads hold.
        cmd.args(["run", "--budget", "1g", "--"]).arg(&exe);
    }
    cmd.args([CHILD_CMD, workload, &threads.to_string(), &ops.to_string(), &seed.to_string()]);
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("result ")).ok_or_else(|| {
        format!("{workload}: no result ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim())
    })?;
    let mut w = line.split_whitespace();
    let ns: f64 = w.next().and_then(|x| x.parse().ok()).ok_or_else(|| format!("bad line: {line}"))?;
    let wrong: u64 = w.next().and_then(|x| x.parse().ok()).ok_or_else(|| format!("bad line: {line}"))?;
    if wrong > 0 {
        return Err(format!("{workload}: {wrong} blocks with wrong bytes"));
    }
    Ok(ns)
}

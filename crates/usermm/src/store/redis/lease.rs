//! The store's life on the server: its keys deleted at open and close, its
//! entry in the registry of spaces, its lease (refreshed by the space's
//! background thread), the deletion of a dead space's keys by the next space
//! that opens, and the exit hook that deletes the keys of a store a process
//! never closed (see the module above, `redis.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use usermm_core::Errno;

use super::url::{glob_escape, parse};
use super::{RedisStore, CHUNK, GROUP};
use crate::platform::fork::ChildTie;

impl RedisStore {
    /// Deletes every key under the prefix.
    pub(super) fn delete_all(&self) -> Result<(), Errno> {
        self.delete_prefix(&self.prefix, self.slots)
    }

    /// Deletes every key of the space with prefix `prefix` and `slots`
    /// slots.
    pub(super) fn delete_prefix(&self, prefix: &str, slots: u64) -> Result<(), Errno> {
        if self.cluster() {
            // No cluster-wide SCAN: every key the space can have, a group
            // (one hash slot) per command.
            let chunks = slots.div_ceil(CHUNK);
            for g in 0..slots.div_ceil(GROUP) {
                let per = GROUP / CHUNK;
                let keys: Vec<String> =
                    (g * per..((g + 1) * per).min(chunks)).map(|k| self.key_of(prefix, k)).collect();
                self.with_conn(|c| redis::cmd("UNLINK").arg(&keys).query::<u64>(c.link()))?;
            }
            return Ok(());
        }
        // (A digit after the prefix: a chunk's key. A forked child's keys,
        // `Pf…`, are its own: `fork.rs`.)
        let pattern = format!("{}[0-9]*", glob_escape(prefix));
        self.with_conn(|c| {
            let c = c.link();
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) =
                    redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000).query(c)?;
                if !keys.is_empty() {
                    redis::cmd("UNLINK").arg(&keys).query::<u64>(c)?;
                }
                if next == 0 {
                    return Ok(());
                }
                cursor = next;
            }
        })
    }

    /// Takes the space's lease (`{usermm}lease:P`, expiring after `lease`)
    /// and enters the space in the registry (`{usermm}spaces`: prefix →
    /// slots and space id), in that order, so that a space reaping dead
    /// ones never finds this one registered without its lease. The prefix
    /// is owned: `EBUSY` while another space holds its lease, or is still
    /// connected past a lapsed one (stopped: its pages stay), after
    /// `OWNER_WAIT` for it to go (an exited owner's reaper); a lease held
    /// by a reaper of an earlier space with the prefix is waited for (up to
    /// 10 s), and a dead owner's (lapsed, not connected) is taken over, its
    /// keys then deleted by the open. Best effort otherwise: a server that
    /// refuses (an ACL confined to the prefix) only loses the clean-up
    /// after a crash, said on stderr.
    pub(super) fn register(&self) -> Result<(), Errno> {
        if self.lease.is_zero() {
            return Ok(());
        }
        let ms = self.lease.as_millis() as u64;
        let lease = lease_key(&self.prefix);
        let t0 = std::time::Instant::now();
        let r = self.with_conn(|c| {
            loop {
                let took: Option<String> =
                    redis::cmd("SET").arg(&lease).arg(self.space).arg("PX").arg(ms).arg("NX").query(c.link())?;
                if took.is_some() {
                    break;
                }
                let holder: Option<String> = redis::cmd("GET").arg(&lease).query(c.link())?;
                match holder.as_deref() {
                    // Taken by this very call before a signal interrupted
                    // it (`with_conn` makes it again).
                    Some(id) if id == self.space.to_string() => break,
                    Some(REAPING) if t0.elapsed() <= Duration::from_secs(10) => {}
                    // A reaper that took too long: the prefix is taken.
                    Some(REAPING) => {
                        redis::cmd("SET").arg(&lease).arg(self.space).arg("PX").arg(ms).query::<()>(c.link())?;
                        break;
                    }
                    // Lapsed meanwhile: try again.
                    None => {}
                    // A space of the process this one was forked from
                    // (alive: it forked this one).
                    Some(id) if ancestor_holds(id) => return Ok(Some(id.to_string())),
                    // Another space's: a process that just exited leaves
                    // its lease to its reaper, which gives it up once the
                    // keys are gone (`reap_after_exit`), so it is waited
                    // for a while; a live owner keeps it.
                    Some(_) if t0.elapsed() <= OWNER_WAIT => {}
                    Some(id) => return Ok(Some(id.to_string())),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // A lapsed lease of a space that is still connected (stopped):
            // the prefix is still its own.
            let entry: Option<String> = redis::cmd("HGET").arg(REGISTRY).arg(&self.prefix).query(c.link())?;
            let owner = entry.as_deref().and_then(|v| v.split_once(' ')).map(|(_, id)| id.to_string());
            if let Some(id) = owner.filter(|id| u64::from_str_radix(id, 16).is_ok_and(|id| id != self.space)) {
                if !self.cluster() {
                    let list: String = redis::cmd("CLIENT").arg("LIST").query(c.link())?;
                    let name = format!("name={}", client_name(u64::from_str_radix(&id, 16).unwrap_or(0)));
                    if list.split_whitespace().any(|f| f == name) {
                        redis::cmd("DEL").arg(&lease).query::<u64>(c.link())?;
                        return Ok(Some(id));
                    }
                }
            }
            redis::cmd("HSET")
                .arg(REGISTRY)
                .arg(&self.prefix)
                .arg(format!("{} {:016x}", self.slots, self.space))
                .query::<u64>(c.link())
                .map(|_| None)
        });
        match r {
            Ok(None) => {
                self.lease_next_ns.store(usermm_sys::now_ns() + refresh_ns(self.lease), Ordering::Relaxed);
                Ok(())
            }
            Ok(Some(id)) => {
                eprintln!(
                    "usermm: swap_url {}: prefix {:?} is another space's (id {id}, alive): EBUSY",
                    self.shown, self.prefix
                );
                Err(Errno::EBUSY)
            }
            Err(e) => {
                eprintln!(
                    "usermm: swap_url {}: cannot take the space's lease ({e}); its keys outlive a crash of the process",
                    self.shown
                );
                Ok(())
            }
        }
    }

    /// Leaves the registry and gives the lease up (after the keys are gone:
    /// a process that dies in between leaves its entry to the next reaper).
    pub(super) fn unregister(&self) {
        if self.lease.is_zero() {
            return;
        }
        let _ = self.with_conn(|c| {
            redis::cmd("HDEL").arg(REGISTRY).arg(&self.prefix).query::<u64>(c.link())?;
            redis::cmd("DEL").arg(lease_key(&self.prefix)).query::<u64>(c.link()).map(drop)
        });
    }

    /// Deletes the keys of every registered space that is dead: its lease
    /// lapsed (it was not refreshed for `lease_ms`) and, on one server, no
    /// connection named after it is open (`CLIENT LIST`: a process stopped
    /// longer than its lease still has its connections, and keeps its
    /// pages). A dead space's lease is taken (`NX`, marked as a reaper's)
    /// while its keys are deleted, so that two reapers, or a reaper and a
    /// new space with the same prefix, do not meet. Best effort: a failure
    /// leaves the dead space to the next open.
    pub(super) fn reap_dead(&self) {
        let _ = self.with_conn(|c| {
            let entries: Vec<(String, String)> = redis::cmd("HGETALL").arg(REGISTRY).query(c.link())?;
            if entries.is_empty() {
                return Ok(());
            }
            // (Asked once, and only if a lease has lapsed.)
            let mut connected: Option<Option<String>> = None;
            for (prefix, v) in entries {
                if prefix == self.prefix {
                    continue;
                }
                let (slots, id) = v.split_once(' ').unwrap_or((&v, ""));
                let Ok(slots) = slots.parse::<u64>() else { continue };
                let lease = lease_key(&prefix);
                if redis::cmd("EXISTS").arg(&lease).query::<u64>(c.link())? > 0 {
                    continue;
                }
                let name = format!("name={}", client_name(u64::from_str_radix(id, 16).unwrap_or(0)));
                let connected = connected.get_or_insert_with(|| {
                    if self.cluster() {
                        None
                    } else {
                        redis::cmd("CLIENT").arg("LIST").query(c.link()).ok()
                    }
                });
                if connected.as_deref().is_some_and(|l| l.split_whitespace().any(|f| f == name)) {
                    continue;
                }
                let took: Option<String> =
                    redis::cmd("SET").arg(&lease).arg(REAPING).arg("PX").arg(60_000).arg("NX").query(c.link())?;
                if took.is_none() {
                    continue;
                }
                // (On another connection: this one is held.)
                if self.delete_prefix(&prefix, slots).is_ok() {
                    redis::cmd("HDEL").arg(REGISTRY).arg(&prefix).query::<u64>(c.link())?;
                }
                redis::cmd("DEL").arg(&lease).query::<u64>(c.link())?;
            }
            Ok(())
        });
    }

    /// Whether the lease is due for a refresh (a clock read).
    pub(crate) fn lease_due(&self) -> bool {
        usermm_sys::now_ns() >= self.lease_next_ns.load(Ordering::Relaxed)
    }

    /// Refreshes the lease (every third of `lease_ms`, from the space's
    /// background thread). A lease found lapsed — the process was stopped
    /// or starved for longer than `lease_ms`, or the server lost it — is
    /// said on stderr (once) and taken again; if a reaper deleted the
    /// space's pages meanwhile, they read as errors (SIGBUS).
    pub(crate) fn refresh_lease(&self) {
        self.lease_next_ns.store(usermm_sys::now_ns() + refresh_ns(self.lease), Ordering::Relaxed);
        let ms = self.lease.as_millis() as u64;
        let r = self.with_conn(|c| {
            redis::cmd("SET").arg(lease_key(&self.prefix)).arg(self.space).arg("PX").arg(ms).arg("XX").query(c.link())
        });
        if let Ok(None::<String>) = r {
            if !self.lease_lapsed.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "usermm: swap_url {}: the space's lease had lapsed (not refreshed for lease_ms={ms}); taken again",
                    self.shown
                );
            }
            // (Taken by another space meanwhile: said by `register`; this
            // space's pages then read as errors.)
            let _ = self.register();
        }
    }

    /// Enters this store in the list that the exit hook reaps
    /// ([`at_exit_hook`]), registering the hook once. `waited`: a process
    /// of its own already waits to delete its keys (a forked child's store,
    /// `fork.rs`): the exit hook leaves it alone.
    pub(super) fn track(&self, url: &str, waited: bool) {
        // (Allocated from the system allocator: the reaper, a forked copy
        // of the process, has no space memory.)
        let _system = crate::thread_role::SystemOnly::enter();
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            if let Err(e) = usermm_sys::exit::at_exit(at_exit_hook) {
                eprintln!("usermm: cannot register the page stores' exit hook ({e})");
            }
        });
        let r = Reap { waited, ..self.reap_entry(url) };
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    /// What a process that outlives this one needs to delete the store's
    /// keys.
    pub(super) fn reap_entry(&self, url: &str) -> Reap {
        Reap {
            space: self.space,
            url: url.to_string(),
            prefix: self.prefix.clone(),
            slots: self.slots,
            page: self.page,
            generation: usermm_sys::thread::fork_generation(),
            ties: Vec::new(),
            waited: false,
        }
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if self.child.get().is_some() {
            // A forked child's copy of its parent's store: the keys and the
            // connections are the parent's (`fork.rs`); the child's own
            // store is dropped next.
            std::mem::forget(std::mem::take(self.pool.get_mut().unwrap_or_else(|e| e.into_inner())));
            return;
        }
        if !*self.opened.get_mut() {
            return;
        }
        let _system = crate::thread_role::SystemOnly::enter();
        let mine = {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            let i = live.iter().position(|r| r.space == self.space);
            i.map(|i| live.swap_remove(i))
        };
        // Forked children still reading the keys in place: deleted by a
        // process of its own once they are gone (`fork.rs`).
        if let Some(mut r) = mine {
            r.ties.retain(|t| !t.gone());
            if !r.ties.is_empty() {
                let fds: Vec<_> = r.ties.iter().map(|t| t.read_fd()).collect();
                match usermm_sys::exit::run_after(false, &fds, || reap_after_exit(&r)) {
                    Ok(()) => return,
                    Err(e) => eprintln!(
                        "usermm: swap_url {}: the space's keys are deleted at close under its forked children                          (no process could wait for them: {e})",
                        self.shown
                    ),
                }
            }
        }
        if let Err(e) = self.delete_all() {
            eprintln!("usermm: swap_url {}: could not delete the space's keys at close ({e})", self.shown);
        }
        self.unregister();
    }
}

/// Holds the list of open stores until dropped (a fork holds it across:
/// the child's store enters it, `fork.rs`).
pub(crate) fn fork_guard() -> impl Sized {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The registry of spaces on a server: a hash, prefix → "slots id".
/// (Braces: no prefix has any, so no space's keys can match these names,
/// and in a cluster they share one hash slot.)
pub(super) const REGISTRY: &str = "{usermm}spaces";
/// A lease's value while a reaper deletes the keys of its dead space.
pub(super) const REAPING: &str = "reaping";
/// How long an open waits for another space's lease on its prefix to go
/// (a process that just exited, whose reaper is deleting its keys) before
/// it fails with `EBUSY`.
const OWNER_WAIT: Duration = Duration::from_secs(2);
/// `lease_ms`'s default: the bound on how long the keys of a process killed
/// outright stay before the next space opened on the server deletes them.
pub(super) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The lease key of the space with prefix `prefix`.
pub(super) fn lease_key(prefix: &str) -> String {
    format!("{{usermm}}lease:{prefix}")
}

/// How often a lease of `lease` is refreshed: three times per lease.
pub(super) fn refresh_ns(lease: Duration) -> u64 {
    (lease.as_nanos() / 3).min(u64::MAX as u128) as u64
}

/// The name of space `space`'s connections (`CLIENT SETNAME`).
pub(super) fn client_name(space: u64) -> String {
    format!("usermm-{space:016x}")
}

/// What the exit hook needs of a store that is still open: all of it
/// allocated from the system allocator.
pub(super) struct Reap {
    pub(super) space: u64,
    url: String,
    prefix: String,
    slots: u64,
    page: usize,
    /// The fork generation that opened it: a forked child's exit must not
    /// reap its parent's spaces.
    generation: u64,
    /// The ties of forked children that may read its keys in place
    /// (`fork.rs`): they are deleted once every one is gone.
    pub(super) ties: Vec<Arc<ChildTie>>,
    /// A process of its own waits to delete them (`track`).
    waited: bool,
}

/// The stores open in this process (for the exit hook).
pub(super) static LIVE: Mutex<Vec<Reap>> = Mutex::new(Vec::new());

/// Whether lease holder `id` (a space id, as the lease stores it) is a
/// store of a process this one was forked from.
fn ancestor_holds(id: &str) -> bool {
    let Ok(id) = id.parse::<u64>() else { return false };
    let generation = usermm_sys::thread::fork_generation();
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|r| r.space == id && r.generation < generation)
}

/// At exit (`atexit`): the keys of every store this process opened and
/// never closed — `usermm_compat.h`'s default space, a `GlobalHeap`'s, any
/// space leaked — are deleted by a process of their own once this one has
/// gone (`usermm_sys::exit::run_after`), not now: other exit
/// handlers, thread-local destructors and threads still running may touch
/// pages that are swapped out, and those must still read back. If no such
/// process can be made, the keys go when the lease lapses.
extern "C" fn at_exit_hook() {
    let _ = std::panic::catch_unwind(|| {
        let _system = crate::thread_role::SystemOnly::enter();
        let generation = usermm_sys::thread::fork_generation();
        let mine: Vec<Reap> = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .filter(|r| r.generation == generation && !r.waited)
            .collect();
        if mine.is_empty() {
            return;
        }
        // (And once the forked children that read them in place are gone.)
        let ties: Vec<_> = mine.iter().flat_map(|r| &r.ties).filter(|t| !t.gone()).map(|t| t.read_fd()).collect();
        if let Err(e) = usermm_sys::exit::run_after(true, &ties, || mine.iter().for_each(reap_after_exit)) {
            eprintln!("usermm: cannot delete the page store's keys after exit ({e}): they go when the lease lapses");
        }
    });
}

/// In the process that outlives the one that opened it: deletes the keys of
/// the store `r` and its registry entry, on connections of its own (the
/// pool's lock may have been held by another thread at the fork).
pub(super) fn reap_after_exit(r: &Reap) {
    let Ok(mut u) = parse(&r.url, r.space) else { return };
    u.prefix = r.prefix.clone();
    let Ok(s) = RedisStore::build(&u, r.page, r.slots, false, r.space) else { return };
    if s.delete_all().is_ok() {
        s.unregister();
    }
    // (Not dropped: its `Drop` would delete the keys again and take the
    // list's lock.)
    std::mem::forget(s);
}

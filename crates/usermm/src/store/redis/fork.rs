//! A forked child's copy of the store (`PageStore::fork_child`).
//!
//! The child gets a store of its own — a new space id, the prefix
//! `Pf<id>:` under its parent's `P` (a single server's `delete_prefix`
//! matches `P` followed by a digit, so the parent's deletions never reach
//! it), its own connections, lease and registry entry, taken before its
//! first write (none for a child that never swaps out) — and reads the slots in use at the fork in place, in its
//! parent's keys (and its parent's ancestors'), with a bit a slot saying
//! whose they are: a write here clears the slot's bit. The parent keeps
//! those slots as they are meanwhile (its core's swap holds), and its keys
//! outlive it while any such child lives: its close or exit leaves their
//! deletion to a process of its own that waits for the children's ties
//! (`lease.rs`), and the child refreshes its ancestors' leases, so that a
//! parent killed outright is not reaped under it. The parent's connections
//! are never used here (nor closed: a TLS connection's close would end
//! the parent's session).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use usermm_core::Errno;

use super::lease::{lease_key, reap_after_exit, refresh_ns, LIVE};
use super::url::{parse, random_id};
use super::RedisStore;
use crate::platform::fork::ChildTie;
use crate::store::seal::Sealer;

/// Forks deep a store follows its ancestors' keys.
const MAX_ANCESTORS: usize = 16;

/// The keys of a process this one was forked from, as this process reads
/// them: a bit a slot, set while the slot's bytes are that process's.
pub(super) struct Ancestor {
    pub(super) prefix: String,
    pub(super) space: u64,
    /// Its sealing key (`seal=1`): its pages open with it.
    pub(super) sealer: Option<Arc<Sealer>>,
    here: Box<[AtomicU64]>,
}

impl Ancestor {
    pub(super) fn has(&self, slot: u64) -> bool {
        self.here.get((slot / 64) as usize).is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (slot % 64)) != 0)
    }

    pub(super) fn clear(&self, slot: u64) {
        if let Some(w) = self.here.get((slot / 64) as usize) {
            w.fetch_and(!(1 << (slot % 64)), Ordering::Relaxed);
        }
    }

    fn copy(&self) -> Ancestor {
        let here = self.here.iter().map(|w| AtomicU64::new(w.load(Ordering::Relaxed))).collect();
        Ancestor { prefix: self.prefix.clone(), space: self.space, sealer: self.sealer.clone(), here }
    }
}

impl RedisStore {
    /// In a forked child (its only thread): the child's own store, reading
    /// this one's byte runs `runs` (`(offset, length)`, the slots in use at
    /// the fork) in place. Registered (its lease taken) before it returns,
    /// so that no write of the child's precedes it.
    pub(super) fn for_child(&self, runs: &[(u64, u64)]) -> Result<RedisStore, Errno> {
        // A sealing store's key is the child's too, locked again there
        // (`seal.rs`); the child seals its own writes under a key of its
        // own (a nonce is never used twice under one key).
        for s in self.ancestors.iter().filter_map(|a| a.sealer.as_ref()).chain(self.sealer.as_ref()) {
            s.lock_in_child()?;
        }
        if self.ancestors.len() + 1 >= MAX_ANCESTORS {
            // (EMFILE, as the swap file's layers.)
            return Err(Errno(24));
        }
        // The parent's connections stay its own (a parent thread may have
        // held the pool's lock at the fork: then there is nothing to take).
        if let Ok(mut pool) = self.pool.try_lock() {
            std::mem::forget(std::mem::take(&mut *pool));
        }
        let ps = self.page as u64;
        let slots = runs.iter().map(|&(o, l)| (o + l).div_ceil(ps)).max().unwrap_or(0);
        let here: Box<[AtomicU64]> = (0..slots.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        for &(o, l) in runs {
            for s in o / ps..(o + l).div_ceil(ps) {
                if !self.ancestors.iter().any(|a| a.has(s)) {
                    here[(s / 64) as usize].fetch_or(1 << (s % 64), Ordering::Relaxed);
                }
            }
        }
        let mut ancestors: Vec<Ancestor> = self.ancestors.iter().map(Ancestor::copy).collect();
        ancestors.push(Ancestor { prefix: self.prefix.clone(), space: self.space, sealer: self.sealer.clone(), here });
        let space = random_id();
        let mut u = parse(&self.url, space)?;
        u.prefix = format!("{}f{space:016x}:", self.prefix);
        let mut s = RedisStore::build(&u, self.page, self.slots, self.poll_replies, space)?;
        s.url = self.url.clone();
        s.ancestors = ancestors;
        // Registered before its first write, not now: a child that never
        // swaps out (one that execs, or writes its parent's data out and
        // exits) costs the server nothing.
        *s.unregistered.get_mut() = true;
        if !s.lease.is_zero() {
            // (Its ancestors' leases are refreshed from now on.)
            *s.lease_next_ns.get_mut() = usermm_sys::now_ns() + refresh_ns(s.lease);
        }
        Ok(s)
    }

    /// A forked child's store before its first write: takes its lease and
    /// enters the registry (`RedisStore::open`'s steps; its prefix is new,
    /// nothing is there to delete), and starts the process that deletes its
    /// keys once this process has ended — by `exit`, `_exit` (how most
    /// forked children end, running no exit hook) or a signal — and every
    /// process it forks meanwhile has too (or exec'd): they hold the write
    /// end of a pipe of its own, close-on-exec, as a child holds its tie.
    /// Without such a process, the keys go as a killed process's do (the
    /// lease).
    pub(super) fn register_before_write(&self) -> Result<(), Errno> {
        let _one = self.registering.lock().unwrap_or_else(|e| e.into_inner());
        if !self.unregistered.load(Ordering::Acquire) {
            return Ok(());
        }
        self.register()?;
        self.opened.store(true, Ordering::Relaxed);
        let _system = crate::thread_role::SystemOnly::enter();
        let waited = match ChildTie::new() {
            Ok(tie) => {
                let r = self.reap_entry(&self.url);
                let ok = usermm_sys::exit::run_after(true, &[tie.read_fd()], || reap_after_exit(&r)).is_ok();
                tie.in_child();
                ok
            }
            Err(_) => false,
        };
        self.track(&self.url, waited);
        self.unregistered.store(false, Ordering::Release);
        Ok(())
    }

    /// Refreshes the leases of the ancestors whose keys this store reads
    /// (if they are still held: a lapsed one's keys may be gone already),
    /// so that the keys of a parent killed outright stay while its
    /// children read them.
    pub(super) fn refresh_ancestors(&self) {
        if self.ancestors.is_empty() || self.lease.is_zero() {
            return;
        }
        let ms = self.lease.as_millis() as u64;
        let _ = self.with_conn(|c| {
            for a in &self.ancestors {
                redis::cmd("SET").arg(lease_key(&a.prefix)).arg(a.space).arg("PX").arg(ms).arg("XX").exec(c.link())?;
            }
            Ok(())
        });
    }

    /// In the parent after a fork: the keys stay until `tie` says the
    /// child is gone (`lease.rs`: close and exit wait for it).
    pub(super) fn keep_for(&self, tie: &Arc<ChildTie>) {
        let _system = crate::thread_role::SystemOnly::enter();
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = live.iter_mut().find(|r| r.space == self.space) {
            r.ties.retain(|t| !t.gone());
            if !r.ties.iter().any(|t| Arc::ptr_eq(t, tie)) {
                r.ties.push(tie.clone());
            }
        }
    }
}

//! A reader-writer lock with no state outside itself, so that a forked
//! child can use the locks its parent's threads used.
//!
//! parking_lot's locks queue their waiters in one table for the whole
//! process, each bucket behind a lock of its own: a parent thread inside a
//! bucket at the fork (parking, unparking, or growing the table as a new
//! thread first waits) leaves that bucket locked in the child for good,
//! and the child's first wait or wake through it never returns. std's
//! futex locks have no such table but give a writer no hand-off: a
//! reader that lets go and takes the lock again at once gets it back
//! before the writer it woke (`munmap`'s zap, letting another thread's
//! `mmap` in between two slices, stalled it 113 ms against 4).
//!
//! [`RwLock`] keeps everything in two futex words. A waiting writer blocks
//! new readers (it is counted in the lock word until it gets the lock), so
//! a reader that lets go while a writer waits cannot take it back before
//! that writer has had it: the hand-off is the wait count, not a queue.
//! Writers go before readers; readers that waited are let in together
//! once no writer waits. No system call when there is no contention.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::thread::{futex_wait, futex_wake, futex_wake_n};

/// Readers holding the lock (bits 0..16).
const READERS: u32 = (1 << 16) - 1;
/// A writer holds the lock.
const WRITE_LOCKED: u32 = 1 << 16;
/// One writer waiting (the waiting writers are counted in bits 17..31).
const WRITER_WAITING: u32 = 1 << 17;
const WRITERS_WAITING: u32 = 0x3fff << 17;
/// Readers sleep on the lock word.
const READERS_SLEEP: u32 = 1 << 31;

/// How many times a waiter looks again before it sleeps.
const SPINS: u32 = 64;

/// A reader-writer lock (see the module's documentation).
pub struct RwLock<T: ?Sized> {
    state: AtomicU32,
    /// Bumped on every wake of a writer (writers sleep on it).
    writer_seq: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&T` to several threads only in shared mode
// and `&mut T` to one at a time, as std's RwLock does.
unsafe impl<T: ?Sized + Send> Send for RwLock<T> {}
// SAFETY: as above: `T: Sync` for the shared readers, `T: Send` for the
// writer that may be on another thread.
unsafe impl<T: ?Sized + Send + Sync> Sync for RwLock<T> {}

/// Shared access; lets go when dropped.
#[must_use = "the lock is let go at once if the guard is not kept"]
pub struct RwLockReadGuard<'a, T: ?Sized> {
    lock: &'a RwLock<T>,
    /// Not `Send`: the lock is let go by the thread that took it.
    _not_send: PhantomData<*const ()>,
}

/// Exclusive access; lets go when dropped.
#[must_use = "the lock is let go at once if the guard is not kept"]
pub struct RwLockWriteGuard<'a, T: ?Sized> {
    lock: &'a RwLock<T>,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: a guard gives `&T` only; sharing it between threads is sharing `&T`.
unsafe impl<T: ?Sized + Sync> Sync for RwLockReadGuard<'_, T> {}
// SAFETY: as above for the write guard's `&T`; `&mut T` needs `&mut` guard.
unsafe impl<T: ?Sized + Sync> Sync for RwLockWriteGuard<'_, T> {}

impl<T> RwLock<T> {
    /// A lock nobody holds.
    pub const fn new(value: T) -> RwLock<T> {
        RwLock { state: AtomicU32::new(0), writer_seq: AtomicU32::new(0), data: UnsafeCell::new(value) }
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, waiting while a writer holds the lock or waits for it.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.try_read().unwrap_or_else(|| {
            self.read_contended();
            RwLockReadGuard { lock: self, _not_send: PhantomData }
        })
    }

    /// Shared access if no writer holds the lock or waits for it.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if !read_lockable(s) {
                return None;
            }
            if self.state.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Some(RwLockReadGuard { lock: self, _not_send: PhantomData });
            }
        }
    }

    /// Exclusive access, waiting for the readers and writers before.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        if self.state.compare_exchange(0, WRITE_LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.write_contended();
        }
        RwLockWriteGuard { lock: self, _not_send: PhantomData }
    }

    #[cold]
    fn read_contended(&self) {
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if read_lockable(s) {
                if self.state.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            if spin(&mut spins) {
                continue;
            }
            if s & (WRITE_LOCKED | WRITERS_WAITING) == 0 {
                // (Only the reader count is full: no writer will wake us.)
                std::thread::yield_now();
                continue;
            }
            // Say a reader sleeps, then sleep unless the word changed since.
            let asleep = s | READERS_SLEEP;
            if s & READERS_SLEEP == 0
                && self.state.compare_exchange_weak(s, asleep, Ordering::Relaxed, Ordering::Relaxed).is_err()
            {
                continue;
            }
            futex_wait(&self.state, asleep);
        }
    }

    #[cold]
    fn write_contended(&self) {
        // Counted as waiting: from now on no new reader gets in.
        self.state.fetch_add(WRITER_WAITING, Ordering::Relaxed);
        let mut spins = 0;
        loop {
            let seq = self.writer_seq.load(Ordering::Acquire);
            let s = self.state.load(Ordering::Relaxed);
            if s & (READERS | WRITE_LOCKED) == 0 {
                let taken = (s - WRITER_WAITING) | WRITE_LOCKED;
                if self.state.compare_exchange_weak(s, taken, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            if spin(&mut spins) {
                continue;
            }
            // Whoever makes the lock free to write bumps `writer_seq`
            // after changing the word: a change since `seq` was read
            // makes the wait return at once.
            futex_wait(&self.writer_seq, seq);
        }
    }

    fn wake_writer(&self) {
        self.writer_seq.fetch_add(1, Ordering::Release);
        futex_wake_n(&self.writer_seq, 1);
    }

    fn read_unlock(&self) {
        let s = self.state.fetch_sub(1, Ordering::Release) - 1;
        if s & READERS == 0 && s & WRITERS_WAITING != 0 {
            self.wake_writer();
        }
    }

    fn write_unlock(&self) {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            // A waiting writer goes next (readers stay asleep); with none,
            // the sleeping readers all wake.
            let next = match s & WRITERS_WAITING != 0 {
                true => s & !WRITE_LOCKED,
                false => s & !(WRITE_LOCKED | READERS_SLEEP),
            };
            match self.state.compare_exchange_weak(s, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        if s & WRITERS_WAITING != 0 {
            self.wake_writer();
        } else if s & READERS_SLEEP != 0 {
            futex_wake(&self.state);
        }
    }
}

/// One more look before sleeping, while fewer than [`SPINS`] were taken.
#[inline]
fn spin(spins: &mut u32) -> bool {
    if *spins >= SPINS {
        return false;
    }
    *spins += 1;
    std::hint::spin_loop();
    true
}

/// Whether a reader may take the lock now.
#[inline]
fn read_lockable(s: u32) -> bool {
    s & (WRITE_LOCKED | WRITERS_WAITING) == 0 && s & READERS < READERS
}

impl<'a, T: ?Sized> RwLockReadGuard<'a, T> {
    /// Lets go of the lock. A writer waiting for it gets it before this
    /// thread or any other reader can take it again (the lock always
    /// hands off so; the name is parking_lot's).
    pub fn unlock_fair(guard: Self) {
        drop(guard);
    }
}

impl<T: ?Sized> std::ops::Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock shared: no `&mut T` exists.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> std::ops::Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock exclusively.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> std::ops::DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock exclusively, and `&mut self`
        // makes this the only reference through it.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.read_unlock();
    }
}

impl<T: ?Sized> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.write_unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn readers_share_and_a_writer_excludes() {
        let l = RwLock::new(5);
        let a = l.read();
        let b = l.read();
        assert_eq!(*a + *b, 10);
        assert!(l.try_read().is_some());
        drop((a, b));
        let mut w = l.write();
        *w += 1;
        assert!(l.try_read().is_none(), "a reader got in beside a writer");
        drop(w);
        assert_eq!(*l.read(), 6);
        assert_eq!(l.state.load(Ordering::Relaxed), 0);
    }

    /// Many threads: every increment under the write lock is seen, and a
    /// reader never sees a write half done.
    #[test]
    fn writers_and_readers_never_overlap() {
        let l = Arc::new(RwLock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        if (i + t) % 4 == 0 {
                            let mut w = l.write();
                            w.0 += 1;
                            std::hint::spin_loop();
                            w.1 += 1;
                        } else {
                            let r = l.read();
                            assert_eq!(r.0, r.1, "a reader saw a write half done");
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*l.read(), (20_000, 20_000));
        assert_eq!(l.state.load(Ordering::Relaxed), 0, "the lock word after every thread let go");
    }

    /// The hand-off: a reader that lets go while a writer waits cannot
    /// take the lock back before the writer had it.
    #[test]
    fn a_waiting_writer_gets_the_lock_before_a_reader_takes_it_back() {
        let l = Arc::new(RwLock::new(0u32));
        for _ in 0..50 {
            let g = l.read();
            let writer = {
                let l = l.clone();
                std::thread::spawn(move || *l.write() += 1)
            };
            while l.state.load(Ordering::Relaxed) & WRITERS_WAITING == 0 {
                std::thread::yield_now();
            }
            let before = *g;
            RwLockReadGuard::unlock_fair(g);
            assert!(l.try_read().is_none_or(|r| *r == before + 1), "a reader took the lock back first");
            assert_eq!(*l.read(), before + 1, "the reader got in before the waiting writer");
            writer.join().unwrap();
        }
        assert_eq!(l.state.load(Ordering::Relaxed), 0);
    }

    /// A forked child waits on and wakes through a lock of its own while
    /// its parent's threads wait on and wake through another at the fork
    /// (with parking_lot's locks the child could find the table they share
    /// locked by a thread it does not have).
    #[test]
    fn a_forked_child_uses_a_fresh_lock_while_parent_threads_contend() {
        let l = Arc::new(RwLock::new(0u64));
        let fresh = Arc::new(RwLock::new(0u64));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if t == 0 {
                            *l.write() += 1;
                        } else {
                            let _r = l.read();
                        }
                    }
                })
            })
            .collect();
        for _ in 0..20 {
            let out = crate::thread::fork_run(20, || {
                let f = fresh.clone();
                let helpers: Vec<_> = (0..2)
                    .map(|_| {
                        let f = f.clone();
                        std::thread::spawn(move || {
                            for _ in 0..1000 {
                                *f.write() += 1;
                                drop(f.read());
                            }
                        })
                    })
                    .collect();
                helpers.into_iter().for_each(|h| h.join().unwrap());
                let n = *f.read();
                i32::from(n != 2000)
            })
            .unwrap();
            assert_eq!(out, crate::thread::ChildExit::Exited(0));
        }
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
}

//! The space's file table: the files its regions map, by id, one entry
//! (and one descriptor) per open file however many regions map it.
//!
//! Invariant: ids are never reused (they count up from 1), so a region's id
//! names one file for the space's whole life; an entry leaves only when no
//! region maps its file any more (`FileTable::retain`, given the core's
//! list of the ids in use).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use usermm_core::Errno;
use usermm_sys::file::MappedFile;

use super::lock;

/// The files mapped by the space's regions, and how their pages are kept.
pub(crate) struct FileTable {
    /// Files by id (ids start at 1).
    files: Mutex<HashMap<u32, Arc<MappedFile>>>,
    /// The next id to hand out.
    next_id: AtomicU32,
    /// `UMM_F_KEEP_FILE_CACHE`: file pages stay in the host page cache.
    keep_cache: bool,
    /// Read-only shared file regions, locked or sequential, map the page
    /// cache's pages (not `UMM_F_COPY_LOCKED_FILES`; see `filemap.rs`).
    map_windows: bool,
}

impl FileTable {
    /// Its lock, held across a fork (a leaf: `native/fork.rs`).
    pub(super) fn fork_guard(&self) -> MutexGuard<'_, HashMap<u32, Arc<MappedFile>>> {
        lock(&self.files)
    }

    /// The files mapped now (a fork holds each one's lock too).
    pub(super) fn all(&self) -> Vec<Arc<MappedFile>> {
        lock(&self.files).values().cloned().collect()
    }

    pub(super) fn new(keep_cache: bool, map_windows: bool) -> FileTable {
        FileTable { files: Mutex::new(HashMap::new()), next_id: AtomicU32::new(1), keep_cache, map_windows }
    }

    /// Takes a duplicate of `fd` for a new file region: the entry of the
    /// same open file (device, inode and access) if there is one, else a
    /// new entry. Returns its id and the file.
    pub(super) fn open(&self, fd: i32) -> Result<(u32, Arc<MappedFile>), Errno> {
        let f = MappedFile::from_fd(fd, self.keep_cache)?;
        let mut files = lock(&self.files);
        let same = files
            .iter()
            .find(|(_, e)| e.dev == f.dev && e.ino == f.ino && e.writable == f.writable && e.readable == f.readable);
        Ok(match same {
            Some((id, e)) => (*id, e.clone()),
            None => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let f = Arc::new(f);
                files.insert(id, f.clone());
                (id, f)
            }
        })
    }

    /// The file of id `id`.
    pub(super) fn get(&self, id: u32) -> Option<Arc<MappedFile>> {
        lock(&self.files).get(&id).cloned()
    }

    /// The whole table as it is now (for a pass over many ids without the
    /// table's lock).
    pub(crate) fn snapshot(&self) -> HashMap<u32, Arc<MappedFile>> {
        lock(&self.files).clone()
    }

    /// Forgets the files whose ids are not in `used`.
    pub(super) fn retain(&self, used: &[u32]) {
        lock(&self.files).retain(|id, _| used.contains(id));
    }

    /// Syncs every file (at close; errors are for msync to report).
    pub(super) fn sync_all(&self) {
        for f in lock(&self.files).values() {
            let _ = f.sync();
        }
    }

    /// Whether read-only shared file regions, locked or sequential, map the
    /// page cache.
    pub(super) fn maps_windows(&self) -> bool {
        self.map_windows
    }
}

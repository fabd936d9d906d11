//! The memory calls (`mmap`, `munmap`, `mprotect`, `madvise`, `mlock*`,
//! `mincore`, `msync`, `mremap`, and `syscall` for their numbers): the
//! routing policy, and why each call went where it went. The exported
//! functions are in `boundary/`.

use super::*;

/// Why a memory call of the program went to the kernel, or was refused
/// (indexes of [`MEM_COUNTS`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Why {
    /// Served by the space.
    Space = 0,
    /// Before the space was open, or it could not be opened.
    BeforeOpen,
    /// A call by usermm's own code or threads, or a re-entrant one.
    Usermm,
    /// A forked child (no space there).
    Child,
    /// A file or device mapping.
    File,
    /// `MAP_HUGETLB`.
    Hugetlb,
    /// `MAP_STACK` or `MAP_GROWSDOWN`: thread stacks stay with the kernel.
    Stack,
    /// `MAP_32BIT`: the reservation is not in the low 2 GiB.
    Low32,
    /// `MAP_FIXED`/`MAP_FIXED_NOREPLACE` outside the reservation.
    FixedOutside,
    /// A range call (or the part of one) outside the reservation.
    Outside,
    /// A range call the kernel refuses before looking at the range (an
    /// unaligned address, a zero or overflowing length): the kernel says so.
    Invalid,
    /// An anonymous `mmap` the space refused (`ENOMEM`): the kernel's.
    Refused,
    /// A `MAP_FIXED` or `mremap` that straddles the reservation's edge:
    /// refused (`ENOMEM`/`EINVAL`/`EFAULT`), neither side served.
    Straddling,
    /// `MAP_DROPPABLE` (mapping type `0x08`): memory the kernel may drop
    /// under pressure, which a space does not build; the kernel's mapping
    /// behaves as Linux's (mlock leaves it unlocked, …).
    Droppable,
    /// An anonymous `MAP_SHARED` mapping while a fork copies the space: the
    /// kernel's from the start (on the space, the first fork would hand it
    /// to the host anyway, with a copy of its bytes), shared between parent
    /// and child.
    SharedAnon,
}

pub(super) const WHY_NAMES: [&str; 15] = [
    "space",
    "kernel_before_open",
    "kernel_usermm",
    "kernel_forked_child",
    "kernel_file",
    "kernel_hugetlb",
    "kernel_stack",
    "kernel_map_32bit",
    "kernel_fixed_outside",
    "kernel_outside",
    "kernel_invalid_arguments",
    "kernel_refused_by_space",
    "refused_straddling",
    "kernel_droppable",
    "kernel_shared_anonymous",
];

/// Memory calls by where they went, for `--verbose`.
pub(super) static MEM_COUNTS: [AtomicU64; 15] = [const { AtomicU64::new(0) }; 15];

pub(crate) fn count(why: Why) {
    MEM_COUNTS[why as usize].fetch_add(1, Relaxed);
}

/// Where a range lies against the space's reservation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Place {
    Inside,
    Outside,
    Straddling,
}

/// Where `[addr, addr + len)` lies against `[base, end)`.
pub(super) fn place_in(addr: usize, len: usize, base: usize, end: usize) -> Place {
    let stop = addr.saturating_add(len);
    if stop <= base || addr >= end {
        Place::Outside
    } else if addr >= base && stop <= end {
        Place::Inside
    } else {
        Place::Straddling
    }
}

pub(crate) fn place(addr: usize, len: usize) -> Place {
    let (base, end) = own_range();
    place_in(addr, len.max(1), base, end)
}

/// Whether a memory call of this thread may go to the space at all: the
/// space is open and this is a program thread outside usermm. `Err` names
/// why not (and is not counted yet).
pub(crate) fn program_call() -> Result<(), Why> {
    if !READY.load(Relaxed) {
        return Err(Why::BeforeOpen);
    }
    if usermm::heap::thread_is_system_only() {
        return Err(Why::Usermm);
    }
    if own_range().0 == 0 {
        // The constructor's space could not be opened (generation 0), or a
        // forked child's is opened now.
        if generation() == 0 || space_call(|_| ()).is_none() {
            return Err(if generation() == 0 { Why::BeforeOpen } else { Why::Child });
        }
    }
    Ok(())
}

/// Runs `f` on the space for a memory call; `Err(Why::Child)` when this
/// process has none. The thread is marked re-entrant meanwhile, so usermm's
/// own host calls inside go to the kernel.
pub(crate) fn with_space<R>(f: impl FnOnce(&Space) -> R) -> Result<R, Why> {
    space_call(f).ok_or(Why::Child)
}

/// Where a program's `mmap` goes, when [`program_call`] allows the space.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MapRoute {
    Space,
    /// A file or device mapping whose hint (rounded down to a page) lies
    /// inside the reservation: the space's at the hint when nothing is
    /// mapped there (as Linux uses a free hint), else the kernel's.
    FileAtHint(usize),
    Kernel(Why),
    /// Refused with this errno.
    Fail(i32, Why),
}

pub(crate) fn route_mmap(addr: usize, len: usize, flags: i32) -> MapRoute {
    use usermm::consts::*;
    if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0 {
        match place(addr, len) {
            // Whatever its kind (a file, a stack): the kernel must never map
            // inside the reservation, behind the space's back (its regions
            // and the host mapping would disagree, and the space could map
            // a region of its own over the program's later). The space
            // serves files and stacks (which do not grow), and refuses
            // hugetlb (`EINVAL`).
            Place::Inside => return MapRoute::Space,
            // The kernel would map over part of the reservation; the space
            // cannot map outside it.
            Place::Straddling => return MapRoute::Fail(libc::ENOMEM, Why::Straddling),
            Place::Outside => {}
        }
    }
    if flags & MAP_TYPE == MAP_DROPPABLE {
        return MapRoute::Kernel(Why::Droppable);
    }
    if flags & MAP_ANONYMOUS == 0 {
        // Linux maps at a free hint; the kernel cannot place anything in
        // the reservation, where the space can (as for `MAP_FIXED`).
        let hint = addr & !(boundary::PAGE - 1);
        if hint != 0 && len != 0 && flags & (MAP_32BIT | MAP_HUGETLB) == 0 && place(hint, len) == Place::Inside {
            return MapRoute::FileAtHint(hint);
        }
        return MapRoute::Kernel(Why::File);
    }
    if flags & MAP_HUGETLB != 0 {
        return MapRoute::Kernel(Why::Hugetlb);
    }
    if flags & (MAP_STACK | MAP_GROWSDOWN) != 0 {
        return MapRoute::Kernel(Why::Stack);
    }
    if flags & MAP_32BIT != 0 {
        return MapRoute::Kernel(Why::Low32);
    }
    if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0 {
        return MapRoute::Kernel(Why::FixedOutside);
    }
    if matches!(flags & MAP_TYPE, MAP_SHARED | MAP_SHARED_VALIDATE) && space_call(|sp| sp.fork_copies()) == Some(true) {
        return MapRoute::Kernel(Why::SharedAnon);
    }
    MapRoute::Space
}

/// A piece of a range call: `(start, len, in_space)`.
pub(crate) type Piece = (usize, usize, bool);

/// `[addr, addr + len)` cut at the reservation's edges, in address order
/// (at most three pieces: below, inside, above).
pub(crate) fn pieces(addr: usize, len: usize) -> Vec<Piece> {
    let (base, end) = own_range();
    pieces_in(addr, len, base, end)
}

pub(super) fn pieces_in(addr: usize, len: usize, base: usize, end: usize) -> Vec<Piece> {
    let stop = addr + len;
    let mut out = Vec::with_capacity(3);
    let mut at = addr;
    for (edge, inside) in [(base, false), (end, true), (usize::MAX, false)] {
        let to = edge.clamp(at, stop);
        if to > at {
            out.push((at, to - at, inside));
            at = to;
        }
    }
    out
}

/// The protection and sharing of the space region that holds `addr`, and
/// the region's end, read from the space's smaps (`start-end rwxp …`).
pub(crate) fn region_at(smaps: &str, addr: usize) -> Option<(i32, bool, usize)> {
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
        let p = perms.as_bytes();
        if p.len() != 4 || !(a <= addr && addr < b) {
            continue;
        }
        let mut prot = 0;
        if p[0] == b'r' {
            prot |= libc::PROT_READ;
        }
        if p[1] == b'w' {
            prot |= libc::PROT_WRITE;
        }
        if p[2] == b'x' {
            prot |= libc::PROT_EXEC;
        }
        return Some((prot, p[3] == b's', b));
    }
    None
}

/// Whether the smaps entry holding `addr` is sealed (`sl` in its
/// `VmFlags`).
pub(crate) fn region_sealed(smaps: &str, addr: usize) -> bool {
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if inside {
                return flags.split_whitespace().any(|f| f == "sl");
            }
            continue;
        }
        let mut f = line.split_whitespace();
        if let (Some(range), Some(perms)) = (f.next(), f.next()) {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    if perms.len() == 4 {
                        inside = a <= addr && addr < b;
                    }
                }
            }
        }
    }
    false
}

pub(super) fn mem_report() -> String {
    let mut s = String::new();
    for (name, c) in WHY_NAMES.iter().zip(MEM_COUNTS.iter()) {
        s += &format!(" {name}={}", c.load(Relaxed));
    }
    s
}

//! `/proc/PID/smaps` formatting, in exactly Linux's layout.

use std::fmt::Write;

use crate::consts::*;
use crate::core::Core;
use crate::region::{Kind, LockMode, Region};

/// What smaps shows of a mapped file: `(major, minor, inode, path)`.
pub type FileInfo = (u32, u32, u64, String);

/// One region's smaps entry: `header_line`, the usage lines
/// (`write_usage`), then the `VmFlags` line (`vm_flags`).
///
/// `zero_pages(addr, len)`: how many pages of the range map the shared zero
/// page (the executor asks the host); Linux counts none of them in `Locked:`.
pub fn format_region(
    out: &mut String,
    core: &Core,
    reg: &Region,
    extra_flags: &str,
    file_info: &dyn Fn(u32) -> Option<FileInfo>,
    zero_pages: &dyn Fn(u64, u64) -> u64,
) {
    let shared = matches!(reg.kind(), Kind::AnonShared | Kind::FileShared);
    let file = reg.file().and_then(file_info);
    let header = header_line(core, reg, shared, file.as_ref());
    let _ = writeln!(out, "{header}");
    let volatile = write_usage(out, core, reg, shared, zero_pages);
    let _ = writeln!(out, "THPeligible:    0");
    let _ = writeln!(out, "ProtectionKey:   0");
    let flags = vm_flags(reg, shared, volatile, extra_flags);
    let _ = writeln!(out, "VmFlags: {flags}");
}

/// The entry's first line: range, permissions, offset, device, inode and
/// name, as Linux lays them out.
fn header_line(core: &Core, reg: &Region, shared: bool, file: Option<&FileInfo>) -> String {
    let start = core.addr_of(reg.range().start).0;
    let end = core.addr_of(reg.range().end).0;
    let perms = format!(
        "{}{}{}{}",
        if reg.prot() & PROT_READ != 0 { 'r' } else { '-' },
        if reg.prot() & PROT_WRITE != 0 { 'w' } else { '-' },
        if reg.prot() & PROT_EXEC != 0 { 'x' } else { '-' },
        if shared { 's' } else { 'p' }
    );
    if let Some((maj, min, ino, path)) = file {
        let h =
            format!("{start:08x}-{end:08x} {perms} {:08x} {maj:02x}:{min:02x} {ino} ", reg.pgoff() * core.page_size());
        // Linux pads the name to column 73.
        format!("{h:<73}{path}")
    } else if shared {
        let h = format!("{start:08x}-{end:08x} {perms} {:08x} 00:01 {} ", reg.pgoff() * core.page_size(), reg.object());
        format!("{h:<73}/dev/zero (deleted)")
    } else {
        format!("{start:08x}-{end:08x} {perms} 00000000 00:00 0 ")
    }
}

/// The `Size:` to `Locked:` lines (and usermm's `Volatile:`); returns the
/// region's volatile pages.
fn write_usage(out: &mut String, core: &Core, reg: &Region, shared: bool, zero_pages: &dyn Fn(u64, u64) -> u64) -> u64 {
    let start = core.addr_of(reg.range().start).0;
    let end = core.addr_of(reg.range().end).0;
    let kb = core.page_size() / 1024;
    let (res, swap, lazy, locked_pages) = core.region_usage(reg.range());
    let size = reg.range().pages() * kb;
    let rss = res * kb;
    let locked_pages = if locked_pages > 0 { locked_pages.saturating_sub(zero_pages(start, end - start)) } else { 0 };
    let locked = locked_pages * kb;
    let anon = if shared || reg.kind() == Kind::FilePrivate { 0 } else { rss };
    let mut kv = |k: &str, v: u64| {
        let _ = writeln!(out, "{:<16}{:>8} kB", format!("{k}:"), v);
    };
    kv("Size", size);
    kv("KernelPageSize", kb);
    kv("MMUPageSize", kb);
    kv("Rss", rss);
    kv("Pss", rss);
    kv("Pss_Dirty", rss);
    kv("Shared_Clean", 0);
    kv("Shared_Dirty", 0);
    kv("Private_Clean", 0);
    kv("Private_Dirty", rss);
    kv("Referenced", rss);
    kv("Anonymous", anon);
    kv("KSM", 0);
    kv("LazyFree", lazy * kb);
    kv("AnonHugePages", 0);
    kv("ShmemPmdMapped", 0);
    kv("FilePmdMapped", 0);
    kv("Shared_Hugetlb", 0);
    kv("Private_Hugetlb", 0);
    kv("Swap", swap * kb);
    kv("SwapPss", swap * kb);
    kv("Locked", locked);
    // usermm's own line (Linux has no volatile ranges), only where the
    // region has volatile pages, so that other regions read exactly as
    // Linux's: the pages marked volatile, purged ones included (as
    // `umm_stats.volatile_pages`).
    let volatile = core.volatile_in(reg.range());
    if volatile > 0 {
        kv("Volatile", volatile * kb);
    }
    volatile
}

/// The `VmFlags` line's flags, Linux's order, then usermm's `vo` (volatile
/// pages) and `extra_flags` (whose `dc`, a space a fork does not copy, goes
/// in Linux's place instead).
fn vm_flags(reg: &Region, shared: bool, volatile: u64, extra_flags: &str) -> String {
    let space_dc = extra_flags.contains("dc ");
    let extra_flags = &extra_flags.replace("dc ", "");
    let mut flags = String::new();
    for (on, f) in [
        (reg.prot() & PROT_READ != 0, "rd"),
        (reg.prot() & PROT_WRITE != 0, "wr"),
        (reg.prot() & PROT_EXEC != 0, "ex"),
        (shared, "sh"),
        (true, "mr"),
        (true, "mw"),
        (true, "me"),
        (shared, "ms"),
        (reg.advice() == crate::region::Advice::Sequential, "sr"),
        (reg.advice() == crate::region::Advice::Random, "rr"),
        (reg.lock() != LockMode::None, "lo"),
        (reg.dontfork() || space_dc, "dc"),
        (reg.kind() == Kind::AnonPrivate || reg.kind() == Kind::FilePrivate && reg.writable(), "ac"),
        (reg.noreserve(), "nr"),
        (reg.wipeonfork(), "wf"),
        (true, "nh"),
        (reg.lock() == LockMode::OnFault, "lf"),
        (true, "um"),
        (reg.sealed(), "sl"),
    ] {
        if on {
            flags.push_str(f);
            flags.push(' ');
        }
    }
    if volatile > 0 {
        flags.push_str("vo ");
    }
    flags.push_str(extra_flags);
    if reg.in_thread() && !extra_flags.contains("it ") {
        flags.push_str("it ");
    }
    flags
}

/// The whole space's smaps text. `extra_flags` are appended to every
/// VmFlags line (usermm's own two-letter flags, e.g. `uo` for the
/// user-mode-only fallback).
pub fn format(core: &Core, extra_flags: &str) -> String {
    format_with_files(core, extra_flags, &|_| None, &|_, _| 0)
}

/// `format`, with the executor's description of mapped files and of the
/// pages that map the zero page.
pub fn format_with_files(
    core: &Core,
    extra_flags: &str,
    file_info: &dyn Fn(u32) -> Option<FileInfo>,
    zero_pages: &dyn Fn(u64, u64) -> u64,
) -> String {
    let mut s = String::new();
    for reg in core.regions().iter() {
        format_region(&mut s, core, reg, extra_flags, file_info, zero_pages);
    }
    s
}

//! Distinct newtypes for addresses, page indices and counts: most bugs in this
//! domain are page/byte confusions, so the compiler keeps them apart.

use core::fmt;

/// A virtual address in the program's address space, in bytes.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Addr(pub u64);

/// The index of a page inside a space's reservation (0 is the first page).
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PageIdx(pub u64);

/// A half-open range of pages `[start, end)`.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct PageRange {
    pub start: PageIdx,
    pub end: PageIdx,
}

impl PageRange {
    pub fn new(start: u64, end: u64) -> PageRange {
        debug_assert!(start <= end);
        PageRange { start: PageIdx(start), end: PageIdx(end) }
    }
    pub fn pages(&self) -> u64 {
        self.end.0 - self.start.0
    }
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }
    pub fn contains(&self, p: PageIdx) -> bool {
        self.start <= p && p < self.end
    }
    pub fn overlaps(&self, o: &PageRange) -> bool {
        self.start < o.end && o.start < self.end
    }
    pub fn intersect(&self, o: &PageRange) -> PageRange {
        let s = self.start.max(o.start);
        let e = self.end.min(o.end);
        if s >= e {
            PageRange { start: s, end: s }
        } else {
            PageRange { start: s, end: e }
        }
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
impl fmt::Debug for PageIdx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}
impl fmt::Debug for PageRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[p{}..p{})", self.start.0, self.end.0)
    }
}

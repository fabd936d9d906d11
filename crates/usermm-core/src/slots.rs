//! A slot allocator: swap-file slots and staging-area slots.
//!
//! Next-fit over a bitmap, so that a batch of evictions gets consecutive swap
//! slots (one large write) while the file is not fragmented.
//!
//! Invariant: `used` equals the number of set bits.

/// Allocates slot numbers `0..capacity`.
pub struct SlotAllocator {
    bits: Vec<u64>,
    capacity: u32,
    used: u32,
    cursor: u32,
}

impl SlotAllocator {
    pub fn new(capacity: u32) -> SlotAllocator {
        SlotAllocator { bits: vec![0; (capacity as usize).div_ceil(64)], capacity, used: 0, cursor: 0 }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }
    pub fn used(&self) -> u32 {
        self.used
    }
    pub fn free(&self) -> u32 {
        self.capacity - self.used
    }

    /// The bitmap: slot `s` is used when bit `s % 64` of word `s / 64` is set.
    pub fn words(&self) -> &[u64] {
        &self.bits
    }

    pub fn is_used(&self, s: u32) -> bool {
        self.bits[(s / 64) as usize] & (1 << (s % 64)) != 0
    }

    /// Allocates one slot, preferring the one after the last allocated.
    pub fn alloc(&mut self) -> Option<u32> {
        if self.used == self.capacity {
            return None;
        }
        let words = self.bits.len() as u32;
        let mut w = self.cursor / 64;
        for _ in 0..=words {
            if w >= words {
                w = 0;
            }
            let word = self.bits[w as usize];
            if word != u64::MAX {
                // Within the cursor's own word, prefer bits at or after it.
                let mut cand = !word;
                if w == self.cursor / 64 {
                    let from = self.cursor % 64;
                    let after = cand & (u64::MAX << from);
                    if after != 0 {
                        cand = after;
                    }
                }
                let b = cand.trailing_zeros();
                let s = w * 64 + b;
                if s < self.capacity {
                    self.bits[w as usize] |= 1 << b;
                    self.used += 1;
                    self.cursor = s + 1;
                    if self.cursor >= self.capacity {
                        self.cursor = 0;
                    }
                    return Some(s);
                }
            }
            w += 1;
        }
        None
    }

    /// Allocates slot `s`, which must be free.
    pub fn take(&mut self, s: u32) {
        assert!(!self.is_used(s), "slot {s} taken twice");
        self.bits[(s / 64) as usize] |= 1 << (s % 64);
        self.used += 1;
    }

    pub fn release(&mut self, s: u32) {
        assert!(self.is_used(s), "slot {s} released twice");
        self.bits[(s / 64) as usize] &= !(1 << (s % 64));
        self.used -= 1;
    }

    pub fn validate(&self) {
        let n: u32 = self.bits.iter().map(|w| w.count_ones()).sum();
        assert_eq!(n, self.used, "slot allocator count");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_then_wrap() {
        let mut a = SlotAllocator::new(130);
        let v: Vec<u32> = (0..130).map(|_| a.alloc().unwrap()).collect();
        assert_eq!(v, (0..130).collect::<Vec<_>>());
        assert_eq!(a.alloc(), None);
        a.release(5);
        a.release(100);
        let x = a.alloc().unwrap();
        let y = a.alloc().unwrap();
        assert!(x == 5 || x == 100);
        assert!(y == 5 || y == 100);
        assert_ne!(x, y);
        a.validate();
    }
}

//! A run of pages as the server keeps it: cut into chunks of `CHUNK`
//! consecutive slots (`pieces`), each written as one argument of pages
//! behind their headers (`Chunk`).

use super::CHUNK;
use crate::store::{put_page, Sealer};

/// The pieces of the run `pages` starting at slot `first` that lie in one
/// chunk each: `(first slot, pages)`.
pub(super) fn pieces<'a, 'b>(first: u64, pages: &'b [&'a [u8]]) -> impl Iterator<Item = (u64, &'b [&'a [u8]])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= pages.len() {
            return None;
        }
        let slot = first + i as u64;
        let end = ((slot / CHUNK + 1) * CHUNK - first).min(pages.len() as u64) as usize;
        let piece = (slot, &pages[i..end]);
        i = end;
        Some(piece)
    })
}

/// Consecutive pages, each behind its header, as one argument, written
/// straight into the command's buffer (no sealed copy of the pages first).
pub(super) struct Chunk<'a, 'b> {
    pub(super) sealer: Option<&'b Sealer>,
    pub(super) space: u64,
    pub(super) first: u64,
    pub(super) pages: &'b [&'a [u8]],
}

impl redis::ToRedisArgs for Chunk<'_, '_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        for (j, p) in self.pages.iter().enumerate() {
            put_page(self.sealer, self.space, self.first + j as u64, p, &mut w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_splits_at_chunk_boundaries() {
        let page = [0u8; 8];
        let pages: Vec<&[u8]> = vec![&page; 40];
        assert_eq!(CHUNK, 15);
        let got: Vec<(u64, usize)> = pieces(13, &pages).map(|(s, p)| (s, p.len())).collect();
        assert_eq!(got, [(13, 2), (15, 15), (30, 15), (45, 8)]);
        let got: Vec<(u64, usize)> = pieces(30, &pages[..15]).map(|(s, p)| (s, p.len())).collect();
        assert_eq!(got, [(30, 15)]);
        assert_eq!(pieces(0, &pages[..0]).count(), 0);
    }
}

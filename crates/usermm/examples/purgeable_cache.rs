//! A cache of "decoded items" kept in purgeable buffers.
//!
//! 64 items of 256 KiB each (16 MiB) live in a space whose budget is 8 MiB.
//! An unlocked item is volatile, so reclaim purges its pages instead of
//! writing them to swap (the space has a swap file only for the pinned item;
//! `swapouts` stays near 0). Each lookup pins the item ([`Purgeable::lock`]), regenerates
//! exactly the pages the purge report names, verifies every byte, and unpins
//! it. The program prints how many lookups hit, how many had to regenerate,
//! and the space's purge counter.
//!
//! Run: `cargo run --release -p usermm --example purgeable_cache`

use usermm::{Config, Contents, Purgeable, Space};

const ITEMS: usize = 64;
const ITEM_BYTES: usize = 256 << 10;
const LOOKUPS: usize = 600;

/// The "decoder": a deterministic, deliberately not free function of the
/// item index and the page within the item (so that a single purged page
/// can be regenerated alone).
fn decode_page(item: usize, page: usize, out: &mut [u8]) {
    let mut x =
        (item as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (page as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    for word in out.chunks_mut(8) {
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

/// What one lookup did.
#[derive(Debug, PartialEq, Eq)]
enum Lookup {
    Hit,
    /// Some pages had been purged and were regenerated (how many).
    Regenerated(usize),
}

struct Cache<'a> {
    items: Vec<Purgeable<'a>>,
    page_bytes: usize,
}

impl<'a> Cache<'a> {
    /// Decodes every item once; each item is volatile as soon as it is built.
    fn build(space: &'a Space) -> Cache<'a> {
        let page_bytes = space.page_size();
        let mut items = Vec::with_capacity(ITEMS);
        for i in 0..ITEMS {
            let mut item = Purgeable::new(space, ITEM_BYTES).expect("map an item");
            let (mut bytes, contents) = item.lock().expect("lock a new item");
            assert_eq!(contents, Contents::Intact, "a new item is intact");
            for (p, page) in bytes.chunks_mut(page_bytes).enumerate() {
                decode_page(i, p, page);
            }
            drop(bytes);
            items.push(item);
        }
        Cache { items, page_bytes }
    }

    /// Pins item `i`, regenerates whatever was purged, checks every byte.
    fn lookup(&mut self, i: usize) -> Lookup {
        let ps = self.page_bytes;
        let (mut bytes, contents) = self.items[i].lock().expect("lock an item");
        for p in contents.purged_page_indices() {
            let page = &mut bytes[p * ps..(p + 1) * ps];
            assert!(page.iter().all(|&b| b == 0), "item {i} page {p}: a purged page reads as zeros");
            decode_page(i, p, page);
        }
        let mut want = vec![0u8; ps];
        for (p, page) in bytes.chunks(ps).enumerate() {
            decode_page(i, p, &mut want);
            assert!(page == &want[..], "item {i} page {p}: wrong contents");
        }
        match contents {
            Contents::Intact => Lookup::Hit,
            Contents::Purged { pages, .. } => Lookup::Regenerated(pages),
        }
    }
}

fn main() {
    // With `swap_bytes: 0` (the seed's swapless case) this workload can
    // currently die of a transient SIGBUS: see `docs/purgeable.md`, "What
    // usermm does not do (yet)".
    let space = Space::open(&Config { budget_bytes: 8 << 20, swap_bytes: 64 << 20, ..Config::default() })
        .expect("open a space (needs userfaultfd)");
    let t0 = std::time::Instant::now();
    let mut cache = Cache::build(&space);
    let (mut hits, mut regenerated, mut pages) = (0, 0, 0);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..LOOKUPS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match cache.lookup((x % ITEMS as u64) as usize) {
            Lookup::Hit => hits += 1,
            Lookup::Regenerated(n) => {
                regenerated += 1;
                pages += n;
            }
        }
    }
    let t_lookups = t0.elapsed();
    // A final sweep collects the purge reports of the items that were
    // purged after their last lookup, so that every purge is accounted for.
    // It only pins and unpins (touching nothing, so it purges nothing more,
    // but background reclaim may be finishing a round: sweep until every
    // purge the space counted is accounted for).
    let mut swept = 0;
    for _ in 0..20 {
        swept += cache.items.iter_mut().map(|item| item.lock().expect("lock an item").1.purged_pages()).sum::<usize>();
        if (pages + swept) as u64 >= space.stats().volatile_purges {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let st = space.stats();
    println!(
        "{LOOKUPS} lookups of {ITEMS} items x {} KiB, budget {} MiB: {hits} hits, {regenerated} regenerated ({pages} pages), volatile_purges {} ({swept} pages found in the final sweep), swapouts {}, {:.2} s",
        ITEM_BYTES >> 10,
        (st.budget_pages * space.page_size() as u64) >> 20,
        st.volatile_purges,
        st.swapouts,
        t_lookups.as_secs_f64()
    );
    assert_eq!(hits + regenerated, LOOKUPS);
    assert!(regenerated > 0, "the budget is half the cache: pressure must purge");
    assert_eq!((pages + swept) as u64, st.volatile_purges, "every purged page was reported exactly once");
    drop(cache);
    space.validate();
}

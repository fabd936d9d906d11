//! A `HashMap` four times larger than the memory it may use.
//!
//! A hashbrown `HashMap<u64, Vec<u8>>` lives in a space's heap
//! ([`Space::heap`]): its table and its values (64..2048 bytes each, 256 MiB
//! in all by default) are built, then looked up at random with every byte
//! checked, under a budget of a quarter of the data. The space swaps the
//! cold part to its swap file; the program prints the space's statistics
//! (swap-outs, swap-ins, resident pages) and the heap's.
//!
//! Run: `cargo run --release -p usermm --example hashmap [DATA_MIB]`.
//! `usermm bench heap` runs the same program beside the kernel in a memory
//! cgroup of the same limit.

use std::time::Instant;

use allocator_api2::vec::Vec as AVec;
use usermm::{Config, Space};

fn value_len(k: u64) -> usize {
    64 + (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % 1985
}

fn value_byte(k: u64, i: usize) -> u8 {
    (k as usize).wrapping_mul(131).wrapping_add(i) as u8
}

fn main() {
    let data_mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let data = data_mib << 20;
    let cfg = Config { budget_bytes: data / 4, swap_bytes: 3 * data, ..Config::default() };
    let space = Space::open(&cfg).expect("open a space (needs userfaultfd: root or /dev/userfaultfd)");
    println!("data {data_mib} MiB, budget {} MiB", cfg.budget_bytes >> 20);

    let t = Instant::now();
    let mut map = hashbrown::HashMap::new_in(space.heap());
    let (mut bytes, mut k) = (0, 0u64);
    while bytes < data {
        let n = value_len(k);
        let mut v = AVec::with_capacity_in(n, space.heap());
        v.extend((0..n).map(|i| value_byte(k, i)));
        map.insert(k, v);
        bytes += n;
        k += 1;
    }
    let build = t.elapsed();
    println!("built {k} entries in {:.2} s ({:.0} inserts/s)", build.as_secs_f64(), k as f64 / build.as_secs_f64());

    let t = Instant::now();
    let (lookups, mut wrong, mut x) = (100_000u64, 0u64, 0x2545_f491_4f6c_dd1du64);
    for _ in 0..lookups {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = x % k;
        let v = &map[&key];
        wrong += v.iter().enumerate().filter(|&(i, &b)| b != value_byte(key, i)).count() as u64;
    }
    let query = t.elapsed();
    println!(
        "{lookups} random lookups in {:.2} s ({:.0} lookups/s), {wrong} wrong bytes",
        query.as_secs_f64(),
        lookups as f64 / query.as_secs_f64()
    );

    let st = space.stats();
    println!(
        "space: swapouts {} swapins {} resident {} pages (max {}, budget {}), major faults {}",
        st.swapouts, st.swapins, st.resident_pages, st.resident_pages_max, st.budget_pages, st.major_faults
    );
    println!("heap: {:?}", space.heap().stats());
    assert_eq!(wrong, 0, "corrupted bytes");
}

use allocator_api2::vec::Vec as AVec;
use std::time::Instant;
use usermm::{Config, Space};
fn value_len(k: u64) -> usize {
    64 + (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % 1985
}
fn main() {
    let data_mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let pct: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(25);
    let data = data_mib << 20;
    let flags: u32 = std::env::var("PFLAGS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let cfg = Config { budget_bytes: data * pct / 100, swap_bytes: 3 * data, flags, ..Config::default() };
    let space = Space::open(&cfg).unwrap();
    let mut map = hashbrown::HashMap::new_in(space.heap());
    let (mut bytes, mut k) = (0, 0u64);
    while bytes < data {
        let n = value_len(k);
        let mut v = AVec::with_capacity_in(n, space.heap());
        v.extend((0..n).map(|i| i as u8));
        map.insert(k, v);
        bytes += n;
        k += 1;
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut s = 0u64;
    for _ in 0..40000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = &map[&(x % k)];
        s += v.iter().map(|&b| b as u64).sum::<u64>();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let cpu = || {
        let mut v = vec![];
        for e in std::fs::read_dir("/proc/self/task").unwrap() {
            let e = e.unwrap();
            let st = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let f: Vec<&str> = st.split(' ').collect();
            v.push((comm.trim().to_string(), f[0].parse::<u64>().unwrap() / 1000, f[2].trim().to_string()));
        }
        v
    };
    let c0 = cpu();
    let a = space.stats();
    let ctl = std::env::var("PERF_CTL").ok();
    if let Some(c) = &ctl {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(c).unwrap();
        f.write_all(b"enable\n").unwrap();
    }
    let t = Instant::now();
    drop(map);
    let el = t.elapsed();
    if let Some(c) = &ctl {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(c).unwrap();
        f.write_all(b"disable\n").unwrap();
    }
    let b = space.stats();
    let c1 = cpu();
    for (x, y) in c0.iter().zip(c1.iter()) {
        println!("  cpu {} {} us", x.0, y.1 - x.1);
    }
    println!("free {:.2} ms (s={s})", el.as_secs_f64() * 1e3);
    for ((n, x), (_, y)) in a.fields().into_iter().zip(b.fields()) {
        if x != y {
            println!("  {n}: {x} -> {y} (+{})", y as i64 - x as i64);
        }
    }
}

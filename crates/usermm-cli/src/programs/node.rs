//! Node.js: a `Map` of `node_objects` objects (an id, a name string of 20
//! to 83 characters, an array of four numbers) built, then every one read
//! back in a scattered order (a stride coprime with the count) and a
//! checksum printed. The expected line is computed here ([`check_line`]),
//! the same for the Java program.

use std::path::Path;

use super::exec::{Check, Digest, Prog};
use super::need;
use crate::params::Params;

const SCRIPT: &str = r#"
const n = Number(process.argv[2]);
const m = new Map();
for (let i = 0; i < n; i++) {
  m.set(i, { id: i, name: "object-" + String(i).padStart(12, "0") + "-" + "x".repeat(i % 64), vals: [i, i * 3, i % 1000, (i * 7) % 1013] });
}
// Every key once, in a scattered order: a stride coprime with n.
let step = Math.floor(n * 0.618) | 1;
const gcd = (a, b) => (b === 0 ? a : gcd(b, a % b));
while (gcd(step, n) !== 1) step += 2;
let sum = 0, bad = 0;
for (let j = 0, k = 0; j < n; j++, k = (k + step) % n) {
  const o = m.get(k);
  if (o.id !== k || o.vals[1] !== k * 3 || o.name.length !== 20 + (k % 64)) bad++;
  sum = (sum * 31 + o.vals[3] + o.name.charCodeAt(19) + o.name.length) >>> 0;
}
console.log(bad === 0 ? "ok" : "BAD", m.size, sum);
"#;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The line the Node.js and Java programs print for `n` objects read back
/// right.
pub fn check_line(n: u64) -> String {
    let n = n.max(1);
    let mut step = ((n as f64 * 0.618) as u64) | 1;
    while gcd(step, n) != 1 {
        step += 2;
    }
    let (mut sum, mut k) = (0u64, 0u64);
    for _ in 0..n {
        // vals[3], the name's character 19 ('-') and the name's length.
        sum = (sum * 31 + (k * 7) % 1013 + u64::from(b'-') + 20 + k % 64) & 0xffff_ffff;
        k = (k + step) % n;
    }
    format!("ok {n} {sum}\n")
}

pub fn prepare(p: &Params, dir: &Path) -> Result<Prog, String> {
    let n = p.int("node_objects").max(1);
    let script = dir.join("map.js");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    // About 570 bytes an object live: room for twice that.
    let old_space_mib = ((n * 1200) >> 20) + 512;
    Ok(Prog {
        name: "node".into(),
        argv: vec![
            need("node")?.into(),
            format!("--max-old-space-size={old_space_mib}").into(),
            script.into(),
            n.to_string().into(),
        ],
        check: Check::Stdout(Digest::of(&check_line(n))),
    })
}

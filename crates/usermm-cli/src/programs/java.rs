//! Java: a `HashMap<Long, Rec>` of `java_objects` records (an id, a name
//! string, an `int[4]`) built, then every one read back in the Node.js
//! program's scattered order and the same checksum printed
//! ([`super::node::check_line`]). Two programs: `java-g1`
//! (`-XX:+UseG1GC`) and `java-serial` (`-XX:+UseSerialGC`), both with
//! `-Xms` = `-Xmx` = `java_heap_mib`. The class is compiled once, here,
//! without usermm.

use std::path::Path;
use std::process::Command;

use super::exec::{Check, Digest, Prog};
use super::need;
use crate::params::Params;

const SOURCE: &str = r#"
import java.util.HashMap;

public class MapBench {
    static final class Rec {
        final long id;
        final String name;
        final int[] vals;
        Rec(long id, String name, int[] vals) { this.id = id; this.name = name; this.vals = vals; }
    }

    static long gcd(long a, long b) { return b == 0 ? a : gcd(b, a % b); }

    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]);
        HashMap<Long, Rec> m = new HashMap<>();
        for (int i = 0; i < n; i++) {
            String name = String.format("object-%012d-", i) + "x".repeat(i % 64);
            m.put((long) i, new Rec(i, name, new int[] {i, i * 3, i % 1000, (i * 7) % 1013}));
        }
        // Every key once, in a scattered order: a stride coprime with n.
        long step = ((long) (n * 0.618)) | 1;
        while (gcd(step, n) != 1) step += 2;
        long sum = 0, bad = 0, k = 0;
        for (int j = 0; j < n; j++, k = (k + step) % n) {
            Rec o = m.get(k);
            if (o.id != k || o.vals[1] != (int) k * 3 || o.name.length() != 20 + (int) (k % 64)) bad++;
            sum = (sum * 31 + o.vals[3] + o.name.charAt(19) + o.name.length()) & 0xffffffffL;
        }
        System.out.println((bad == 0 ? "ok" : "BAD") + " " + m.size() + " " + sum);
    }
}
"#;

/// `java-g1` or `java-serial`.
pub fn prepare(name: &str, p: &Params, dir: &Path) -> Result<Prog, String> {
    let gc = match name {
        "java-g1" => "-XX:+UseG1GC",
        _ => "-XX:+UseSerialGC",
    };
    let java = need("java")?;
    let classes = dir.join("java");
    if !classes.join("MapBench.class").exists() {
        std::fs::create_dir_all(&classes).map_err(|e| format!("{}: {e}", classes.display()))?;
        let src = classes.join("MapBench.java");
        std::fs::write(&src, SOURCE).map_err(|e| format!("{}: {e}", src.display()))?;
        let out = Command::new(need("javac")?)
            .arg("-d")
            .arg(&classes)
            .arg(&src)
            .output()
            .map_err(|e| format!("javac: {e}"))?;
        if !out.status.success() {
            return Err(format!("javac: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    let n = p.int("java_objects").max(1);
    let heap = format!("{}m", p.int("java_heap_mib"));
    Ok(Prog {
        name: name.into(),
        argv: vec![
            java.into(),
            gc.into(),
            format!("-Xms{heap}").into(),
            format!("-Xmx{heap}").into(),
            "-cp".into(),
            classes.into(),
            "MapBench".into(),
            n.to_string().into(),
        ],
        check: Check::Stdout(Digest::of(&super::node::check_line(n))),
    })
}

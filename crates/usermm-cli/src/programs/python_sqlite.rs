//! CPython building a dict of `python_kib_values` Ki values of 1 KiB and
//! reading it back (its own check line), and the SQLite shell on a
//! database of `sqlite_rows` rows of about 1.1 KiB with a page cache twice
//! the database (its output equal to a run without usermm).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use super::exec::{plain, Check, Digest, Prog};
use super::need;
use crate::params::Params;

const PY_SCRIPT: &str = r#"
import sys
n = int(sys.argv[1]) * 1024
d = {i: (b"%08d" % i) * 128 for i in range(n)}
lst = [d[i] for i in range(0, n, 2)]
ok = all(d[i][:8] == b"%08d" % i and len(d[i]) == 1024 for i in range(n))
ok = ok and all(v[:8] == b"%08d" % (2 * j) for j, v in enumerate(lst))
print("ok" if ok else "BAD", len(d), len(lst))
"#;

pub fn python(p: &Params, dir: &Path) -> Result<Prog, String> {
    let n = p.int("python_kib_values");
    let script = dir.join("dict.py");
    std::fs::write(&script, PY_SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    Ok(Prog {
        name: "python".into(),
        argv: vec![need("python3")?.into(), script.into(), n.to_string().into()],
        check: Check::Stdout(Digest::of(&format!("ok {} {}\n", n * 1024, n * 512))),
    })
}

/// Makes the database here, without usermm, and the expected output with
/// a run without usermm.
pub fn sqlite(p: &Params, dir: &Path) -> Result<Prog, String> {
    let sqlite = need("sqlite3")?;
    let db = dir.join("t.db");
    let rows = p.int("sqlite_rows").max(10);
    let make = format!(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < {rows})
         INSERT INTO t SELECT i, printf('key%08d', (i*7919) % {rows}), zeroblob(1000) || randomblob(100) FROM c;
         CREATE INDEX tk ON t(k);"
    );
    let out = Command::new(&sqlite).arg(&db).arg(make).output().map_err(|e| format!("sqlite3: {e}"))?;
    if !out.status.success() {
        return Err(format!("sqlite3 could not make the database: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let db_kib = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) / 1024;
    // A page cache twice the database: all of it ends up in the heap.
    let query = format!(
        "PRAGMA cache_size=-{};
         PRAGMA integrity_check;
         SELECT count(*), sum(length(v)), min(k), max(k), hex(md5) FROM t, (SELECT sum(id * length(v)) AS md5 FROM t);
         SELECT k, hex(substr(v, 1001, 4)) FROM t ORDER BY k LIMIT 3 OFFSET {};
         SELECT count(*) FROM t a JOIN t b ON a.k = b.k WHERE a.id % 3 = 0;
         SELECT sum(length(v)) FROM t WHERE id % 2 = 0;",
        2 * db_kib + 1024,
        rows / 2
    );
    let argv: Vec<OsString> = vec![sqlite.into(), db.into(), query.into()];
    let expect = plain(&argv)?;
    if !expect.head().starts_with(&format!("ok\n{rows}|")) {
        return Err(format!("sqlite3 without usermm: {}", expect.head()));
    }
    Ok(Prog { name: "sqlite".into(), argv, check: Check::Stdout(expect) })
}

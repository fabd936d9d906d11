//! The dependency rules of `docs/design.md` ("Architecture"), checked on the
//! sources: which crates each crate may depend on ([`CRATE_RULES`], from
//! their `Cargo.toml`), which parts of this crate each part may refer to
//! ([`RULES`], from the path references in `src/`), and that the executor
//! asks the host for everything through `Platform` (it names nothing of
//! `usermm_sys` but [`EXECUTOR_SYS`]). Every violation is printed as
//! `file:line`.
//!
//! A reference is a path in the code (comments and string literals do not
//! count): `crate::…`, `self::…`, `super::…` (resolved from the file's module and the
//! inline `mod`s around it), every leaf of a `use` group, a glob that brings
//! a forbidden module into scope, and the crate root's re-exports
//! (`crate::Heap` is `crate::heap::Heap`, from `lib.rs`). A name imported
//! once is checked where it is imported, not where it is used.

use std::collections::HashMap;
use std::path::Path;

/// A part of this crate: the modules it is made of and the paths it must
/// never refer to.
struct Rule {
    part: &'static str,
    /// Module paths from the crate root: a file belongs to the part if its
    /// module is one of them or inside one (`store` is `src/store.rs` and
    /// `src/store/**`).
    modules: &'static [&'static str],
    /// Path prefixes the part must not refer to.
    forbidden: &'static [&'static str],
    /// Path prefixes it may refer to all the same (inside a forbidden one).
    allowed: &'static [&'static str],
}

/// What the executor may name of `usermm_sys`: data it holds or reads (a
/// file handle, the eventfd that pokes the handlers, fault messages and
/// their flags, the in-thread resolver's interface), the clock, the
/// calling thread's id and the CPU it runs on (the wake-ahead thread's
/// check, `native/awake.rs`: a read of the thread's rseq area, no host
/// operation). Every host operation goes through `Platform`, which
/// the simulation implements too: a `usermm_sys` function called from the
/// executor would be a host call the simulation never sees.
const EXECUTOR_SYS: &[&str] = &[
    "usermm_sys::file::MappedFile",
    "usermm_sys::thread::EventFd",
    "usermm_sys::uffd::UffdMsg",
    "usermm_sys::uffd::UFFD_EVENT_PAGEFAULT",
    "usermm_sys::uffd::UFFD_PAGEFAULT_FLAG_WP",
    "usermm_sys::uffd::UFFD_PAGEFAULT_FLAG_WRITE",
    "usermm_sys::inthread::Resolve",
    "usermm_sys::inthread::Outcome",
    "usermm_sys::now_ns",
    "usermm_sys::thread::gettid",
    "usermm_sys::thread::current_cpu",
    "usermm_sys::sync::RwLock",
    "usermm_sys::sync::RwLockReadGuard",
];

/// The executor and the page stores know nothing of the API layer (the heap
/// and the C ABI); the stores know nothing of the executor either, and the
/// executor nothing of `usermm_sys` but data ([`EXECUTOR_SYS`]); the heap
/// knows nothing of the C ABI; the thread roles and the configuration,
/// which all of them use, know none of them (but the type of the heap's
/// per-thread cache, which lives in the one thread-local with the thread's
/// marks: a thread-local of the `usermm run` preload is a `__tls_get_addr`
/// call, and a `malloc` reads both). The environment a space is
/// configured from is read in `config/` only (not in the C ABI, the heap,
/// the executor, the platform nor the stores).
const RULES: &[Rule] = &[
    Rule {
        part: "page stores",
        modules: &["store"],
        forbidden: &["crate::native", "crate::heap", "crate::boundary", "std::env"],
        allowed: &[],
    },
    Rule {
        part: "executor",
        modules: &["native"],
        forbidden: &["crate::heap", "crate::boundary", "std::env", "usermm_sys"],
        allowed: EXECUTOR_SYS,
    },
    Rule {
        part: "platform",
        modules: &["platform"],
        forbidden: &["crate::heap", "crate::boundary", "std::env"],
        allowed: &[],
    },
    Rule { part: "heap", modules: &["heap"], forbidden: &["crate::boundary", "std::env"], allowed: &[] },
    Rule { part: "C ABI", modules: &["boundary"], forbidden: &["std::env"], allowed: &[] },
    Rule {
        part: "thread roles and configuration",
        modules: &["thread_role", "config"],
        forbidden: &["crate::store", "crate::native", "crate::platform", "crate::heap", "crate::boundary"],
        allowed: &["crate::heap::small::cache::Cache"],
    },
];

/// Each crate's `[dependencies]` (and `[build-dependencies]`), all that it
/// may have: `usermm-core` knows no one; `usermm-sys` knows the C library,
/// io_uring, and the core for the `Errno` its calls return.
const CRATE_RULES: &[(&str, &[&str])] =
    &[("../usermm-core", &[]), ("../usermm-sys", &["libc", "io-uring", "usermm-core"])];

/// A reference across a wall.
#[derive(Debug, PartialEq)]
struct Violation {
    file: String,
    line: usize,
    part: &'static str,
    forbidden: &'static str,
    /// The path as resolved (`crate::native::Inner`).
    path: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}: the {} must not refer to {}", self.file, self.line, self.path, self.part, self.forbidden)
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `src` that matter for paths, with their lines: comments
/// and the contents of string and character literals are dropped.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    // Skips a string literal whose opening quote is at `i`; `raw` counts
    // its `#`s (`None`: escapes apply).
    let skip_str = |mut i: usize, raw: Option<usize>, line: &mut usize| -> usize {
        i += 1;
        while i < c.len() {
            match c[i] {
                '\n' => *line += 1,
                '\\' if raw.is_none() => i += 1,
                '"' => {
                    let n = raw.unwrap_or(0);
                    if c[i + 1..].iter().take(n).filter(|&&h| h == '#').count() == n {
                        return i + 1 + n;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_str(i, None, &mut line);
        } else if ch == '\'' {
            if c.get(i + 1) == Some(&'\\') {
                // An escaped character (`'\''`, `'\u{..}'`): up to its
                // closing quote.
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                // A lifetime: its name is lexed as an identifier.
                i += 1;
            }
        } else if ident(ch) {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
            if raw_prefix && matches!(c.get(i), Some('"') | Some('#')) {
                let hashes = c[i..].iter().take_while(|&&h| h == '#').count();
                if c.get(i + hashes) == Some(&'"') {
                    i = skip_str(i + hashes, Some(hashes), &mut line);
                    continue;
                }
                // `r#ident`: a raw identifier.
                if word == "r" && hashes == 1 {
                    i += 1;
                    continue;
                }
            }
            if matches!(word.as_str(), "b" | "c") && c.get(i) == Some(&'"') {
                i = skip_str(i, None, &mut line);
                continue;
            }
            if word == "b" && c.get(i) == Some(&'\'') {
                // A byte literal: the quote is lexed next as a character's.
                continue;
            }
            out.push((Tok::Ident(word), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// A path as written (or one leaf of a `use` tree), with the line of its
/// last segment and the module it appears in.
struct Reference {
    segments: Vec<String>,
    glob: bool,
    /// A leaf of a `use` tree.
    in_use: bool,
    line: usize,
    module: Vec<String>,
}

fn ident_at(toks: &[(Tok, usize)], i: usize) -> Option<&str> {
    match toks.get(i) {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// The leaves of the `use` tree at `toks[*i]`, each prefixed by `prefix`.
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String], module: &[String], out: &mut Vec<Reference>) {
    let mut segments = prefix.to_vec();
    loop {
        match toks.get(*i) {
            Some((Tok::Ident(s), line)) => {
                if s != "self" || segments.is_empty() {
                    segments.push(s.clone());
                }
                *i += 1;
                if toks.get(*i).map(|t| &t.0) == Some(&Tok::Sep) {
                    *i += 1;
                    continue;
                }
                if ident_at(toks, *i) == Some("as") {
                    *i += 2;
                }
                out.push(Reference { segments, glob: false, in_use: true, line: *line, module: module.to_vec() });
                return;
            }
            Some((Tok::Punct('*'), line)) => {
                *i += 1;
                out.push(Reference { segments, glob: true, in_use: true, line: *line, module: module.to_vec() });
                return;
            }
            Some((Tok::Punct('{'), _)) => {
                *i += 1;
                while !matches!(toks.get(*i), None | Some((Tok::Punct('}'), _))) {
                    use_tree(toks, i, &segments, module, out);
                    if toks.get(*i).map(|t| &t.0) == Some(&Tok::Punct(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            // A leading `::`.
            Some((Tok::Sep, _)) => *i += 1,
            _ => return,
        }
    }
}

/// Every path reference in `src`, a file of module `module`.
fn references(src: &str, module: &[String]) -> Vec<Reference> {
    let toks = tokens(src);
    let mut out = Vec::new();
    // The inline modules around the current token: name, brace depth inside.
    let (mut inline, mut depth): (Vec<(String, usize)>, usize) = (Vec::new(), 0);
    let here = |inline: &[(String, usize)]| -> Vec<String> {
        module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect()
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            (Tok::Punct('{'), _) => depth += 1,
            (Tok::Punct('}'), _) => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            (Tok::Ident(w), _) if w == "mod" => {
                if let (Some(name), Some((Tok::Punct('{'), _))) = (ident_at(&toks, i + 1), toks.get(i + 2)) {
                    inline.push((name.to_string(), depth + 1));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            // A `use` item (not the `use<..>` of a precise capture).
            (Tok::Ident(w), _) if w == "use" && toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Punct('<')) => {
                i += 1;
                use_tree(&toks, &mut i, &[], &here(&inline), &mut out);
                continue;
            }
            (Tok::Ident(_), _) | (Tok::Sep, _) => {
                let mut segments = Vec::new();
                let mut line = toks[i].1;
                while i < toks.len() {
                    match &toks[i] {
                        (Tok::Ident(s), l) => {
                            segments.push(s.clone());
                            line = *l;
                            i += 1;
                            if toks.get(i).map(|t| &t.0) != Some(&Tok::Sep) {
                                break;
                            }
                        }
                        (Tok::Sep, _) => i += 1,
                        _ => break,
                    }
                }
                if !segments.is_empty() {
                    out.push(Reference { segments, glob: false, in_use: false, line, module: here(&inline) });
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// `reference` from the crate root (`crate::…`) when it is `crate::`,
/// `self::` or `super::` relative; otherwise as written (an external crate,
/// or a name in scope, whose import is a reference of its own). The crate
/// root's re-exports (`aliases`) are followed.
fn resolve(reference: &Reference, aliases: &HashMap<String, Vec<String>>) -> Vec<String> {
    let s = &reference.segments;
    let mut path: Vec<String> = match s.first().map(String::as_str) {
        Some("crate") => s.clone(),
        Some("self") => ["crate".to_string()]
            .into_iter()
            .chain(reference.module.iter().cloned())
            .chain(s[1..].iter().cloned())
            .collect(),
        Some("super") => {
            let ups = s.iter().take_while(|x| *x == "super").count();
            let kept = reference.module.len().saturating_sub(ups);
            ["crate".to_string()]
                .into_iter()
                .chain(reference.module[..kept].iter().cloned())
                .chain(s[ups..].iter().cloned())
                .collect()
        }
        _ => s.clone(),
    };
    if path.len() >= 2 && path[0] == "crate" {
        if let Some(target) = aliases.get(&path[1]) {
            path.splice(0..2, target.iter().cloned());
        }
    }
    path
}

/// The crate root's `use` items: name at the root → the path it stands for.
fn root_aliases(lib: &str) -> HashMap<String, Vec<String>> {
    let toks = tokens(lib);
    let mods: Vec<&str> =
        toks.windows(2).filter(|w| w[0].0 == Tok::Ident("mod".into())).filter_map(|w| ident_at(&w[1..], 0)).collect();
    let root = Vec::new();
    references(lib, &root)
        .into_iter()
        .filter(|r| r.in_use && !r.glob && r.segments.len() >= 2)
        .map(|r| {
            let mut path = resolve(&r, &HashMap::new());
            if mods.contains(&path[0].as_str()) {
                path.insert(0, "crate".to_string());
            }
            (r.segments.last().unwrap().clone(), path)
        })
        .collect()
}

/// A source file's module path from its path under the crate
/// (`src/store/redis.rs` → `store::redis`, `src/sim/mod.rs` → `sim`).
fn module_of(file: &str) -> Vec<String> {
    let rel = file.strip_prefix("src/").unwrap_or(file).strip_suffix(".rs").unwrap_or(file);
    let mut m: Vec<String> = rel.split('/').map(String::from).collect();
    if matches!(m.last().map(String::as_str), Some("mod") | Some("lib")) {
        m.pop();
    }
    m
}

fn starts_with(path: &[String], prefix: &[&str]) -> bool {
    path.len() >= prefix.len() && path.iter().zip(prefix).all(|(a, b)| a == b)
}

/// Every reference of `sources` (`(path under the crate, text)`) that a
/// rule of `rules` forbids, in file and line order.
fn check(sources: &[(String, String)], rules: &'static [Rule]) -> Vec<Violation> {
    let aliases = sources.iter().find(|(f, _)| f == "src/lib.rs").map(|(_, s)| root_aliases(s)).unwrap_or_default();
    let mut out = Vec::new();
    for (file, text) in sources {
        let module = module_of(file);
        for rule in rules {
            if !rule.modules.iter().any(|m| starts_with(&module, &m.split("::").collect::<Vec<_>>())) {
                continue;
            }
            for r in references(text, &module) {
                let path = resolve(&r, &aliases);
                if rule.allowed.iter().any(|a| starts_with(&path, &a.split("::").collect::<Vec<_>>())) {
                    continue;
                }
                for &f in rule.forbidden {
                    let f_segs: Vec<&str> = f.split("::").collect();
                    // A glob of a module that holds the forbidden one brings
                    // it into scope.
                    let hit = starts_with(&path, &f_segs)
                        || (r.glob && path.len() < f_segs.len() && f_segs.iter().zip(&path).all(|(a, b)| a == b));
                    if hit {
                        let shown = path.join("::") + if r.glob { "::*" } else { "" };
                        out.push(Violation {
                            file: file.clone(),
                            line: r.line,
                            part: rule.part,
                            forbidden: f,
                            path: shown,
                        });
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    out
}

/// The names in a manifest's `[dependencies]` and `[build-dependencies]`
/// (also per target), not its `[dev-dependencies]`.
fn manifest_dependencies(toml: &str) -> Vec<String> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in toml.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(h) = line.strip_prefix('[') {
            section = h.trim_end_matches(']').trim().to_string();
            // `[dependencies.name]`
            for table in ["dependencies.", "build-dependencies."] {
                if let Some(name) =
                    section.strip_prefix(table).or_else(|| section.split_once(&format!(".{table}")).map(|(_, n)| n))
                {
                    out.push(name.trim_matches('"').to_string());
                }
            }
            continue;
        }
        let deps = section == "dependencies"
            || section == "build-dependencies"
            || (section.starts_with("target.")
                && (section.ends_with(".dependencies") || section.ends_with(".build-dependencies")));
        if let (true, Some((key, _))) = (deps, line.split_once('=')) {
            out.push(key.trim().trim_matches('"').to_string());
        }
    }
    out
}

/// `src/**.rs` of this crate, as `(path under the crate, text)`.
fn crate_sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    walk(&root.join("src"), root, &mut out);
    out.sort();
    out
}

#[test]
fn parts_refer_to_nothing_their_rules_forbid() {
    let sources = crate_sources();
    // Every part is there (a rule over no file would pass for nothing).
    for rule in RULES {
        for m in rule.modules {
            assert!(sources.iter().any(|(f, _)| module_of(f).first().is_some_and(|x| x == m)), "no file of {m}");
        }
    }
    let found = check(&sources, RULES);
    for v in &found {
        eprintln!("{v}");
    }
    assert!(found.is_empty(), "{} references across the walls of docs/design.md (listed above)", found.len());
}

#[test]
fn crates_depend_only_on_what_their_rules_allow() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for (dir, allowed) in CRATE_RULES {
        let path = root.join(dir).join("Cargo.toml");
        let toml = std::fs::read_to_string(&path).unwrap();
        for dep in manifest_dependencies(&toml) {
            if !allowed.contains(&dep.as_str()) {
                wrong.push(format!("{dir}/Cargo.toml: depends on {dep}"));
            }
        }
    }
    for w in &wrong {
        eprintln!("{w}");
    }
    assert!(wrong.is_empty(), "{} dependencies no rule allows (listed above)", wrong.len());
}

fn fake(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files.iter().map(|(f, s)| (f.to_string(), s.to_string())).collect()
}

#[test]
fn a_reference_across_a_wall_is_reported() {
    let sources = fake(&[("src/store/fake.rs", "use std::sync::Arc;\n\nuse crate::native::Inner;\n")]);
    let found = check(&sources, RULES);
    assert_eq!(
        found,
        [Violation {
            file: "src/store/fake.rs".into(),
            line: 3,
            part: "page stores",
            forbidden: "crate::native",
            path: "crate::native::Inner".into(),
        }]
    );
    assert_eq!(
        found[0].to_string(),
        "src/store/fake.rs:3: crate::native::Inner: the page stores must not refer to crate::native"
    );
}

#[test]
fn a_commented_reference_is_ignored() {
    let src = "//! Unlike crate::heap::Heap, ...\n\
               /// Called by [`crate::native::Inner`].\n\
               // crate::boundary::capi::umm_open is the C side.\n\
               /* crate::native::x */ fn f() -> &'static str { \"crate::native::y\" }\n";
    let found = check(&fake(&[("src/store/fake.rs", src)]), RULES);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn every_way_of_naming_a_forbidden_module_is_reported() {
    let store = "use crate::{config, heap::GlobalHeap};\n\
                 use super::super::super::native;\n\
                 use crate::*;\n\
                 fn f() { crate::boundary::capi::umm_open(); let _ = crate::Heap::new; }\n\
                 mod tests {\n    use super::*;\n    use super::super::Fine;\n}\n\
                 fn g() { let _ = r#\"crate::heap\"#; let _ = '\"'; crate::heap::f(); }\n\
                 fn h() { let _ = std::env::var(\"X\"); }\n";
    let lib = "mod heap;\nmod store;\npub use heap::{GlobalHeap, Heap};\n";
    let found = check(&fake(&[("src/lib.rs", lib), ("src/store/redis/fake.rs", store)]), RULES);
    let lines: Vec<(usize, &str, &str)> =
        found.iter().map(|v| (v.line, v.forbidden, v.path.as_str())).collect::<Vec<_>>();
    assert_eq!(
        lines,
        [
            (1, "crate::heap", "crate::heap::GlobalHeap"),
            (2, "crate::native", "crate::native"),
            (3, "crate::native", "crate::*"),
            (3, "crate::heap", "crate::*"),
            (3, "crate::boundary", "crate::*"),
            (4, "crate::boundary", "crate::boundary::capi::umm_open"),
            (4, "crate::heap", "crate::heap::Heap::new"),
            (9, "crate::heap", "crate::heap::f"),
            (10, "std::env", "std::env::var"),
        ]
    );
    // The environment, from the heap.
    let heap = fake(&[("src/heap/fake.rs", "fn f() { let _ = std::env::var(\"X\"); }\n")]);
    assert_eq!(check(&heap, RULES).iter().map(|v| v.forbidden).collect::<Vec<_>>(), ["std::env"]);
}

#[test]
fn a_host_call_from_the_executor_is_reported() {
    // Data it holds, the clock and the thread id are fine; a host call
    // (here by path, through a `use`, and through a glob) is not.
    let src = "use usermm_sys::uffd::{UffdMsg, UFFD_EVENT_PAGEFAULT};\n\
               use usermm_sys::thread::{gettid, set_idle_priority};\n\
               use usermm_sys::inthread::*;\n\
               impl usermm_sys::inthread::Resolve for X {}\n\
               fn f(m: &usermm_sys::file::MappedFile) { let _ = (usermm_sys::now_ns(), usermm_sys::ncpus()); }\n";
    let found = check(&fake(&[("src/native/fake.rs", src)]), RULES);
    let lines: Vec<(usize, &str)> = found.iter().map(|v| (v.line, v.path.as_str())).collect();
    assert_eq!(
        lines,
        [(2, "usermm_sys::thread::set_idle_priority"), (3, "usermm_sys::inthread::*"), (5, "usermm_sys::ncpus")]
    );
    assert_eq!(
        found[0].to_string(),
        "src/native/fake.rs:2: usermm_sys::thread::set_idle_priority: the executor must not refer to usermm_sys"
    );
    // The platform is where such calls belong.
    assert!(check(&fake(&[("src/platform/fake.rs", src)]), RULES).is_empty());
}

#[test]
fn dev_dependencies_do_not_count() {
    let toml = "[package]\nname = \"x\"\n\n[dependencies]\nlibc = \"0.2\" # the C library\n\
                \"io-uring\" = \"0.7\"\n\n[dependencies.usermm-core]\npath = \"../usermm-core\"\n\n\
                [target.'cfg(unix)'.dependencies]\nnix = \"1\"\n\n[dev-dependencies]\nproptest = \"1\"\n";
    assert_eq!(manifest_dependencies(toml), ["libc", "io-uring", "usermm-core", "nix"]);
}

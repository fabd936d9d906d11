//! `swap_url`: its parsing (the module above, `redis.rs`, lists the
//! options), the cluster's hash slot of a key, and the space's random id.

use std::time::Duration;

use usermm_core::Errno;

use super::lease::DEFAULT_LEASE;

/// A random 64-bit id (from the kernel's entropy; the time and pid if that
/// is unreadable).
pub(super) fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).is_ok() {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ (std::process::id() as u64).rotate_left(40)
}

/// A parsed `swap_url`.
#[derive(Debug, PartialEq)]
pub(super) struct Url {
    /// `redis://…` of the one server, of each seed node of a cluster, or of
    /// each Sentinel.
    pub(super) nodes: Vec<String>,
    pub(super) cluster: bool,
    /// Through Sentinel: the master's name, and the login and database of
    /// the master (`user:password@`, `/db`).
    pub(super) sentinel: Option<Master>,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) replicas: u32,
    pub(super) failover: Duration,
    /// How long the space's lease lasts unless refreshed (`lease_ms`);
    /// zero: no lease (the keys of a process killed outright stay).
    pub(super) lease: Duration,
    /// Pages go out sealed (`seal=1`, `store/seal.rs`).
    pub(super) seal: bool,
    /// TLS (`rediss://`, `rediss+cluster://`): the files of `tls_ca`,
    /// `tls_cert` and `tls_key`, if given.
    pub(super) tls: Option<TlsFiles>,
}

/// The PEM files a TLS connection uses: the certificate authority its
/// server's certificate must chain to (else the system's), and the
/// client's certificate and key (both or neither).
#[derive(Debug, Default, PartialEq)]
pub(super) struct TlsFiles {
    pub(super) ca: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
}

/// The master a `redis+sentinel://` URL names, and how to log in to it.
#[derive(Debug, PartialEq)]
pub(super) struct Master {
    pub(super) name: String,
    pub(super) db: i64,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

/// `redis+sentinel://[[user]:password@]host:port[,host:port…]/MASTER[/db]`
/// (before the options): the Sentinels' URLs and the master.
fn parse_sentinel(rest: &str) -> Result<(Vec<String>, Master), Errno> {
    let (login, rest) = match rest.rsplit_once('@') {
        Some((l, r)) => (Some(l), r),
        None => (None, rest),
    };
    let (hosts, path) = rest.split_once('/').ok_or(Errno::EINVAL)?;
    let mut path = path.trim_end_matches('/').split('/');
    let name = path.next().filter(|n| !n.is_empty()).ok_or(Errno::EINVAL)?.to_string();
    let db = match path.next() {
        Some(d) => d.parse::<i64>().map_err(|_| Errno::EINVAL)?,
        None => 0,
    };
    if path.next().is_some() {
        return Err(Errno::EINVAL);
    }
    let (username, password) = match login.map(|l| l.split_once(':').unwrap_or((l, ""))) {
        Some((u, p)) => ((!u.is_empty()).then(|| u.to_string()), (!p.is_empty()).then(|| p.to_string())),
        None => (None, None),
    };
    let nodes: Vec<String> = hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("redis://{h}/")).collect();
    if nodes.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok((nodes, Master { name, db, username, password }))
}

pub(super) fn parse(url: &str, space: u64) -> Result<Url, Errno> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut sentinel = None;
    let (nodes, cluster) = if let Some(rest) = base.strip_prefix("redis+sentinel://") {
        let (nodes, master) = parse_sentinel(rest)?;
        sentinel = Some(master);
        (nodes, false)
    } else if let Some((rest, scheme)) = base
        .strip_prefix("redis+cluster://")
        .map(|r| (r, "redis"))
        .or_else(|| base.strip_prefix("rediss+cluster://").map(|r| (r, "rediss")))
    {
        let hosts = rest.trim_end_matches('/');
        let nodes: Vec<String> =
            hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{h}/")).collect();
        if nodes.is_empty() {
            return Err(Errno::EINVAL);
        }
        (nodes, true)
    } else if base.starts_with("redis://") || base.starts_with("rediss://") || base.starts_with("redis+unix://") {
        (vec![base.to_string()], false)
    } else {
        return Err(Errno::EINVAL);
    };
    let mut prefix = None;
    let mut timeout = Duration::from_millis(2000);
    let mut replicas = 0;
    let mut failover = Duration::from_millis(10_000);
    let mut lease = DEFAULT_LEASE;
    let mut seal = false;
    let mut tls = TlsFiles::default();
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or(Errno::EINVAL)?;
        match k {
            "prefix" if !v.is_empty() => prefix = Some(v.to_string()),
            "timeout_ms" => timeout = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?.max(1)),
            "replicas" => replicas = v.parse::<u32>().map_err(|_| Errno::EINVAL)?,
            "failover_ms" => failover = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?),
            "lease_ms" => lease = Duration::from_millis(v.parse::<u64>().map_err(|_| Errno::EINVAL)?),
            "tls_ca" if !v.is_empty() => tls.ca = Some(v.to_string()),
            "tls_cert" if !v.is_empty() => tls.cert = Some(v.to_string()),
            "tls_key" if !v.is_empty() => tls.key = Some(v.to_string()),
            "seal" => {
                seal = match v {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    _ => return Err(Errno::EINVAL),
                }
            }
            _ => return Err(Errno::EINVAL),
        }
    }
    let secure = nodes.iter().all(|n| n.starts_with("rediss://"));
    if tls.cert.is_some() != tls.key.is_some() || (!secure && tls != TlsFiles::default()) {
        // A certificate without its key, or TLS files for a plain URL.
        return Err(Errno::EINVAL);
    }
    let tls = secure.then_some(tls);
    let prefix = prefix.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("usermm:{}:{}:{space:016x}:", host.trim(), std::process::id())
    });
    if prefix.contains(['{', '}']) {
        // A brace would change the cluster's hash tag.
        return Err(Errno::EINVAL);
    }
    Ok(Url { nodes, cluster, sentinel, prefix, timeout, replicas, failover, lease, seal, tls })
}

/// The cluster hash slot of `key` (CRC16/XMODEM of its hash tag, mod 16384).
pub(super) fn hash_slot(key: &[u8]) -> u16 {
    let tag = match key.iter().position(|&b| b == b'{') {
        Some(i) => match key[i + 1..].iter().position(|&b| b == b'}') {
            Some(j) if j > 0 => &key[i + 1..i + 1 + j],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

/// `s` with the glob characters of `SCAN MATCH` escaped.
pub(super) fn glob_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            o.push('\\');
        }
        o.push(c);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::super::lease::{lease_key, REGISTRY};
    use super::*;

    #[test]
    fn urls_parse_with_their_options() {
        let u = parse("redis://127.0.0.1:6379/?prefix=abc:&timeout_ms=50&replicas=1", 7).unwrap();
        assert_eq!(u.nodes, ["redis://127.0.0.1:6379/"]);
        assert_eq!(
            (u.cluster, u.prefix.as_str(), u.timeout, u.replicas),
            (false, "abc:", Duration::from_millis(50), 1)
        );
        let u = parse("redis://h:1", 0xab).unwrap();
        assert!(u.prefix.starts_with("usermm:") && u.prefix.ends_with(":00000000000000ab:"), "{}", u.prefix);
        assert_eq!((u.timeout, u.replicas, u.lease), (Duration::from_millis(2000), 0, DEFAULT_LEASE));
        assert_eq!(parse("redis://h:1?lease_ms=250", 0).unwrap().lease, Duration::from_millis(250));
        assert_eq!(parse("redis://h:1?lease_ms=0", 0).unwrap().lease, Duration::ZERO);
        assert_eq!(parse("redis://h:1?lease_ms=soon", 0).err(), Some(Errno::EINVAL));
        assert!(!parse("redis://h:1", 0).unwrap().seal);
        assert!(parse("redis://h:1?seal=1", 0).unwrap().seal);
        assert!(!parse("redis://h:1?seal=0", 0).unwrap().seal);
        assert_eq!(parse("redis://h:1?seal=maybe", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1", 0).unwrap().tls, None);
        let u = parse("rediss://h:1/?tls_ca=/c.pem&tls_cert=/a.pem&tls_key=/k.pem", 0).unwrap();
        let want = TlsFiles { ca: Some("/c.pem".into()), cert: Some("/a.pem".into()), key: Some("/k.pem".into()) };
        assert_eq!(u.tls, Some(want));
        assert_eq!(parse("rediss://h:1", 0).unwrap().tls, Some(TlsFiles::default()));
        assert_eq!(
            parse("rediss://h:1?tls_cert=/a.pem", 0).err(),
            Some(Errno::EINVAL),
            "a certificate without its key"
        );
        assert_eq!(parse("redis://h:1?tls_ca=/c.pem", 0).err(), Some(Errno::EINVAL), "TLS files for a plain URL");
        let u = parse("rediss+cluster://a:1,b:2/?tls_ca=/c.pem", 0).unwrap();
        assert_eq!(
            (u.cluster, u.nodes.as_slice()),
            (true, ["rediss://a:1/".to_string(), "rediss://b:2/".to_string()].as_slice())
        );
        assert_ne!(lease_key("usermm:h:1:ab:"), "usermm:h:1:ab:lease", "a lease must not match its prefix");
        assert!(!lease_key("p:").starts_with("p:") && !REGISTRY.starts_with("usermm:"));
        let u = parse("redis+cluster://a:1,b:2,c:3/?prefix=p:", 0).unwrap();
        assert_eq!(u.nodes, ["redis://a:1/", "redis://b:2/", "redis://c:3/"]);
        assert!(u.cluster);
        assert_eq!(parse("redis+cluster://", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("http://h:1", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?colour=red", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?timeout_ms=x", 0).err(), Some(Errno::EINVAL));
        assert_eq!(parse("redis://h:1?prefix=a{b", 0).err(), Some(Errno::EINVAL));
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }

    #[test]
    fn sentinel_urls_name_their_master() {
        let u = parse("redis+sentinel://a:26379,b:26380/mymaster?prefix=p:&replicas=1", 0).unwrap();
        assert_eq!(u.nodes, ["redis://a:26379/", "redis://b:26380/"]);
        assert!(!u.cluster);
        let m = u.sentinel.unwrap();
        assert_eq!((m.name.as_str(), m.db, m.username, m.password), ("mymaster", 0, None, None));
        let m = parse("redis+sentinel://bob:pw@a:1/m/3", 0).unwrap().sentinel.unwrap();
        assert_eq!((m.name.as_str(), m.db), ("m", 3));
        assert_eq!((m.username.as_deref(), m.password.as_deref()), (Some("bob"), Some("pw")));
        let m = parse("redis+sentinel://:pw@a:1/m", 0).unwrap().sentinel.unwrap();
        assert_eq!((m.username, m.password.as_deref()), (None, Some("pw")));
        for bad in ["redis+sentinel://a:1", "redis+sentinel://a:1/", "redis+sentinel:///m", "redis+sentinel://a:1/m/x"]
        {
            assert_eq!(parse(bad, 0).err(), Some(Errno::EINVAL), "{bad}");
        }
    }

    #[test]
    fn hash_slots_are_the_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(hash_slot(b"123456789"), 0x31c3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_eq!(hash_slot(b"{p:3}17"), hash_slot(b"p:3"));
    }
}

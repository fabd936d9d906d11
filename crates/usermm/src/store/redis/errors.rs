//! What a Redis error means to the store: every failure is an I/O error of
//! the store (`io_error`); some may pass by themselves and are retried
//! (`transient`); a refusal at open has its own errno (`server_errno`).

use usermm_core::Errno;

/// Every failure of the server (unreachable, timed out, refusing the
/// command, out of memory) is an I/O error of the store.
pub(super) fn io_error(_e: &redis::RedisError) -> Errno {
    Errno::EIO
}

/// Whether a command's error may pass by itself: the connection broke, was
/// refused or timed out, or the server said to come back (loading its data
/// after a restart, a failover under way).
pub(super) fn transient(e: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.kind(), K::BusyLoadingError | K::TryAgain | K::ClusterDown | K::MasterDown)
        // (`Link` reports a server's error reply as a response error with
        // the server's words.)
        || {
            let text = e.to_string();
            ["LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN"].iter().any(|w| text.contains(w))
        }
}

/// Times a call a signal interrupted is made again.
pub(super) const INTERRUPTED_TRIES: u32 = 3;

/// Whether a system call of the command was interrupted (`EINTR`): a
/// socket call with a timeout, as the store's are, is never restarted
/// after a signal handler ran (signal(7)). Seen in the fuzzer's pass
/// against a server: now and then the open of a space failed with
/// "Interrupted system call", in a thread that also reads file pages
/// through the space's io_uring rings (whose completions notify the
/// submitting thread as a signal would). Not the server's doing: the call
/// is made again.
pub(super) fn interrupted(e: &redis::RedisError) -> bool {
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if s.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::Interrupted) {
            return true;
        }
        src = s.source();
    }
    e.to_string().contains("(os error 4)")
}

/// The errno for a server's refusal at open: `EACCES` for a login or
/// permission the server refuses (`WRONGPASS`, `NOAUTH`, `NOPERM`),
/// `ENOMEM` for `OOM`, `EROFS` for a read-only replica, `EAGAIN` for a
/// server loading its data or a cluster without a master, `EIO` for
/// anything else (a server that does not answer).
pub(super) fn server_errno(e: &redis::RedisError) -> Errno {
    use redis::ErrorKind as K;
    // (The client reports a `NOAUTH` reply to its own `SELECT` as a
    // response error whose text alone says so.)
    let text = e.to_string();
    if text.contains("NOAUTH") || text.contains("Authentication required") {
        return Errno::EACCES;
    }
    match (e.kind(), e.code()) {
        (K::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH" | "NOPERM")) => Errno::EACCES,
        (_, Some("OOM")) => Errno::ENOMEM,
        (K::ReadOnly, _) => Errno::EROFS,
        (K::BusyLoadingError | K::TryAgain | K::ClusterDown | K::MasterDown, _) => Errno::EAGAIN,
        _ => Errno::EIO,
    }
}

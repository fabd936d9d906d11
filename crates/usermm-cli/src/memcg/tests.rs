//! The memory groups' guards, sweep and naming, tested without a benchmark.

use super::*;

fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("usermm-memcg-unit-{tag}-{}", std::process::id()))
}

#[test]
fn the_owner_of_a_name_is_the_pid_after_the_prefix() {
    assert_eq!(owner_pid("usermm-memcg-swap-5689", SWAP_PREFIX), Some(5689));
    assert_eq!(owner_pid("usermm-memcg-77-3", CGROUP_PREFIX), Some(77));
    assert_eq!(owner_pid("usermm-memcg-swap-5689", CGROUP_PREFIX), None);
    assert_eq!(owner_pid("usermm-memcg-unit-x-1", CGROUP_PREFIX), None);
    assert_eq!(owner_pid("usermm-memcg-swap-", SWAP_PREFIX), None);
    assert_eq!(owner_pid("swapfile", SWAP_PREFIX), None);
}

/// What a benchmark killed with SIGKILL leaves (an active swap file, a
/// memory group) is removed by the next one's sweep; a live benchmark's
/// pieces (this process's) are left alone.
#[test]
fn pieces_of_a_benchmark_that_is_gone_are_swept() {
    if euid() != 0 || !Path::new(CGROUP_ROOT).exists() {
        eprintln!("NOT RUN: sweeping needs root and {CGROUP_ROOT} (swapon, cgroups)");
        assert!(euid() != 0, "root, but no cgroup v1 memory controller at {CGROUP_ROOT}");
        return;
    }
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let dir = scratch("sweep");
    std::fs::create_dir_all(&dir).unwrap();
    let swap = dir.join(format!("{SWAP_PREFIX}{dead}"));
    let mine = dir.join(format!("{SWAP_PREFIX}{}", std::process::id()));
    std::fs::write(&mine, b"").unwrap();
    run("fallocate", &["-l".as_ref(), "1048576".as_ref(), swap.as_os_str()]).unwrap();
    run("chmod", &["600".as_ref(), swap.as_os_str()]).unwrap();
    run("mkswap", &[swap.as_os_str()]).unwrap();
    run("swapon", &[swap.as_os_str()]).unwrap();
    let group = Path::new(CGROUP_ROOT).join(format!("{CGROUP_PREFIX}{dead}-0"));
    std::fs::create_dir(&group).unwrap();
    assert!(swap_active(&swap));
    sweep_left_behind(&dir);
    let (active, exists, group_left) = (swap_active(&swap), swap.exists(), group.exists());
    // (Cleaned up whatever the assertions say.)
    let _ = undo(&Piece::Swap(swap.clone()));
    let _ = std::fs::remove_dir(&group);
    assert!(mine.exists(), "a live benchmark's swap file was swept");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!active && !exists, "the swap file of pid {dead} is still on ({active}) or on disk ({exists})");
    assert!(!group_left, "the memory group of pid {dead} is still there");
}

/// A guard undoes its piece when dropped (on an error path as well): a
/// "group" (here a plain empty directory) is removed, a "swap file" that
/// is not active is deleted, and the registry is empty afterwards.
#[test]
fn guards_undo_their_pieces_when_dropped() {
    let dir = scratch("group");
    let file = scratch("swap");
    let run = || -> Result<(), String> {
        let _g = Guard::new(Piece::Cgroup(dir.clone()));
        std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let _s = Guard::new(Piece::Swap(file.clone()));
        std::fs::write(&file, b"x").map_err(|e| e.to_string())?;
        Err("setup failed half-way".into())
    };
    assert!(run().is_err());
    assert!(!dir.exists() && !file.exists());
    assert!(registry().iter().all(|(_, p)| !matches!(p, Piece::Cgroup(d) if *d == dir)));
    // Undoing what was never made is no error (a signal may come between
    // registering a piece and making it).
    drop(Guard::new(Piece::Cgroup(dir.clone())));
    assert!(undo(&Piece::Swap(file.clone())).is_ok());
}

/// `finish` takes the piece out of the registry without undoing it.
#[test]
fn finish_hands_over_the_piece() {
    let dir = scratch("finish");
    std::fs::create_dir(&dir).unwrap();
    let g = Guard::new(Piece::Cgroup(dir.clone()));
    let kept = g.finish(|p| matches!(p, Piece::Cgroup(d) if *d == dir));
    assert!(kept && dir.exists());
    std::fs::remove_dir(&dir).unwrap();
}

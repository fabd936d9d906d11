//! A `redis-server` process for the far-memory tests (`farmem.rs`,
//! `stress.rs`): started on a free loopback port, stopped on drop.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port, in a directory of its own,
/// with no persistence; killed and removed on drop.
pub struct Server {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("usermm-farmem-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): install it (apt-get install redis-server; scripts/test.sh does)"
                )
            });
        let s = Server { port, child: Some(child), dir };
        let t0 = Instant::now();
        while s.client().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "redis-server on port {port} did not answer in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn url(&self, prefix: &str) -> String {
        format!("redis://127.0.0.1:{}/?prefix={prefix}&timeout_ms=1000", self.port)
    }

    pub fn client(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut c = self.client().unwrap();
        redis::cmd("KEYS").arg(pattern).query(&mut c).unwrap()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

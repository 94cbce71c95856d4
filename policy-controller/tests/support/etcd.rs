//! A real etcd for tests: `/usr/bin/etcd` on free 127.0.0.1 ports with a temporary data dir, killed and
//! removed on drop. Fails loudly if etcd is missing.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct TestEtcd {
    child: Child,
    _dir: tempfile::TempDir,
    pub endpoint: String,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
        .port()
}

impl TestEtcd {
    /// Starts etcd and waits until it answers.
    pub async fn start() -> TestEtcd {
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".to_string());
        assert!(
            std::path::Path::new(&bin).exists(),
            "etcd binary {bin} is missing: install etcd (apt-get install etcd-server)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&bin)
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let etcd = TestEtcd {
            child,
            _dir: dir,
            endpoint,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = etcd_client::Client::connect([&etcd.endpoint], None).await
                && c.get("/", None).await.is_ok()
            {
                return etcd;
            }
            assert!(
                Instant::now() < deadline,
                "etcd at {} did not come up",
                etcd.endpoint
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([&self.endpoint], None)
            .await
            .expect("connect to test etcd")
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

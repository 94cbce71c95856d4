//! A real etcd for tests: `/usr/bin/etcd` on free 127.0.0.1 ports with a temporary data dir, killed and
//! removed on drop. Fails loudly if etcd is missing.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct TestEtcd {
    child: Child,
    dir: tempfile::TempDir,
    pub endpoint: String,
    /// With TLS: the CA, client certificate and key files.
    pub tls: Option<TlsFiles>,
}

/// PEM files for a TLS etcd.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is needed for the TLS test (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A throwaway CA, a server certificate for 127.0.0.1 and a client certificate.
fn make_certs(dir: &std::path::Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509"];
    a.extend(ec);
    a.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=felixrs-test-ca",
    ]);
    openssl(dir, &a);
    for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        let mut a = vec!["req"];
        a.extend(ec);
        a.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
        openssl(dir, &a);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "1",
                "-extfile",
                &ext,
            ],
        );
    }
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
        Self::start_with(false).await
    }

    /// Starts etcd serving only TLS with client-certificate authentication.
    pub async fn start_tls() -> TestEtcd {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> TestEtcd {
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".to_string());
        assert!(
            std::path::Path::new(&bin).exists(),
            "etcd binary {bin} is missing: install etcd (apt-get install etcd-server)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let (client, peer) = (free_port(), free_port());
        let scheme = if tls { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(&bin);
        let tls_files = tls.then(|| {
            make_certs(dir.path());
            let p = |f: &str| dir.path().join(f);
            cmd.arg("--cert-file").arg(p("server.crt"));
            cmd.arg("--key-file").arg(p("server.key"));
            cmd.arg("--trusted-ca-file").arg(p("ca.crt"));
            cmd.arg("--client-cert-auth");
            TlsFiles {
                ca: p("ca.crt"),
                cert: p("client.crt"),
                key: p("client.key"),
            }
        });
        let child = cmd
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
            dir,
            endpoint,
            tls: tls_files,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = etcd_client::Client::connect([&etcd.endpoint], etcd.options()).await
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

    fn options(&self) -> Option<etcd_client::ConnectOptions> {
        let t = self.tls.as_ref()?;
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(
                std::fs::read(&t.ca).unwrap(),
            ))
            .identity(etcd_client::Identity::from_pem(
                std::fs::read(&t.cert).unwrap(),
                std::fs::read(&t.key).unwrap(),
            ));
        Some(etcd_client::ConnectOptions::new().with_tls(tls))
    }

    /// The temporary directory (certificates live here in TLS mode).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([&self.endpoint], self.options())
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

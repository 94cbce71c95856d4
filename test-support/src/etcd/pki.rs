//! Throwaway certificates for a TLS etcd, made with the `openssl` CLI: a CA, a server certificate for
//! the etcd's addresses and a client certificate for client-certificate authentication (EC P-256,
//! valid one day).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PEM files a client needs: the CA that signed the server, and its own certificate and key.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA with one server and one client certificate, all under one directory.
#[derive(Clone, Debug)]
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Pki {
    /// Makes a fresh CA `cn` in `dir` (created if needed), a server certificate valid for 127.0.0.1 and
    /// `server_ips`, and a client certificate. Panics (naming the step) when `openssl` is missing or
    /// fails.
    pub fn generate(dir: &Path, cn: &str, server_ips: &[IpAddr]) -> Pki {
        crate::require_tools(&["openssl"]);
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("create pki dir {}: {e}", dir.display()));
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let subj = format!("/CN={cn}");
        let mut a = vec!["req", "-x509"];
        a.extend(ec);
        a.extend([
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", &subj,
        ]);
        openssl(dir, &a);
        let mut sans = vec!["IP:127.0.0.1".to_string()];
        sans.extend(
            server_ips
                .iter()
                .filter(|ip| ip.to_string() != "127.0.0.1")
                .map(|ip| format!("IP:{ip}")),
        );
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            std::fs::write(
                dir.join(&ext),
                format!(
                    "subjectAltName={}\nextendedKeyUsage={usage}\n",
                    sans.join(",")
                ),
            )
            .unwrap_or_else(|e| panic!("write {}: {e}", dir.join(&ext).display()));
            let mut a = vec!["req"];
            a.extend(ec);
            a.extend([
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                "/CN=felixrs-test-client",
            ]);
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
        Pki {
            dir: dir.to_path_buf(),
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }

    /// What a client of a server using this PKI needs.
    pub fn client_files(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca.clone(),
            cert: self.client_cert.clone(),
            key: self.client_key.clone(),
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run openssl (install openssl): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

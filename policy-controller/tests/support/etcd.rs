//! An etcd-client connected to a test etcd from `felixrs-test-support` (plain or TLS with the
//! etcd's client certificate). The launcher itself lives in the shared crate; only the controller's
//! tests talk to etcd through etcd-client, so this adapter stays here.

use felixrs_test_support::etcd::Etcd;

pub trait EtcdClientExt {
    /// Connect options for this etcd: its CA and client identity when it serves TLS.
    fn options(&self) -> Option<etcd_client::ConnectOptions>;
    /// A connected client (panics when etcd does not answer).
    fn client(&self) -> impl std::future::Future<Output = etcd_client::Client>;
}

impl EtcdClientExt for Etcd {
    fn options(&self) -> Option<etcd_client::ConnectOptions> {
        let t = self.tls_files()?;
        let read = |p: &std::path::Path| {
            std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        };
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&t.ca)))
            .identity(etcd_client::Identity::from_pem(read(&t.cert), read(&t.key)));
        Some(etcd_client::ConnectOptions::new().with_tls(tls))
    }

    async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.client_url()], self.options())
            .await
            .unwrap_or_else(|e| panic!("connect to test etcd {}: {e}", self.client_url()))
    }
}

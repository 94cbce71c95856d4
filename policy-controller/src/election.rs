//! Leader election among replicas with etcd's election API.
//!
//! Each replica grants a lease of `ttl` seconds, keeps it alive every `ttl/3`, and campaigns under
//! [`ELECTION_NAME`]. etcd answers the campaign only once this replica's candidate key is the oldest, so
//! a standby simply blocks in `campaign`. When the leader dies its lease expires within `ttl` and its
//! key disappears; the standby's campaign returns and it becomes leader.
//!
//! The leader's key and creation revision form the writer's [`Fence`]: every write requires that key,
//! so a replica that lost its lease can no longer change the store even before it notices.

use std::time::Duration;

use etcd_client::Client;
use tokio_util::sync::CancellationToken;

use crate::writer::Fence;

/// The election's name (a key prefix in etcd).
pub const ELECTION_NAME: &str = "/felixrs/policy-controller/leader";

/// Errors while campaigning.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// An etcd request failed.
    #[error("etcd {op} failed")]
    Etcd {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    /// The campaign answered without a leader key.
    #[error("campaign returned no leader key")]
    NoLeaderKey,
}

/// Held while this replica leads.
pub struct Leadership {
    /// Pass to [`crate::writer::Writer::set_fence`].
    pub fence: Fence,
    /// Cancelled when the lease can no longer be kept alive.
    pub lost: CancellationToken,
    lease: i64,
    client: Client,
    keepalive: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Gives leadership up at once (revokes the lease, deleting the leader key).
    pub async fn resign(mut self) {
        self.keepalive.abort();
        if let Err(e) = self.client.lease_revoke(self.lease).await {
            tracing::warn!(error = %e, "cannot revoke election lease");
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// Grants a lease and campaigns until elected in the election `name` (one per cluster:
/// `EtcdPrefix::private_key(ELECTION_NAME)`). `value` identifies this replica.
pub async fn campaign_named(
    client: &Client,
    name: &str,
    value: &str,
    ttl: i64,
) -> Result<Leadership, ElectionError> {
    let mut c = client.clone();
    let lease = c
        .lease_grant(ttl, None)
        .await
        .map_err(|source| ElectionError::Etcd {
            op: "lease grant",
            source,
        })?
        .id();
    let lost = CancellationToken::new();
    let keepalive = tokio::spawn(keep_alive(client.clone(), lease, ttl, lost.clone()));
    let mut elections = c.election_client();
    let resp = tokio::select! {
        r = elections.campaign(name, value, lease) => r,
        _ = lost.cancelled() => {
            return Err(ElectionError::Etcd {
                op: "campaign",
                source: etcd_client::Error::LeaseKeepAliveError("lease lost while campaigning".into()),
            })
        }
    };
    let resp = match resp {
        Ok(r) => r,
        Err(source) => {
            keepalive.abort();
            let _ = c.lease_revoke(lease).await;
            return Err(ElectionError::Etcd {
                op: "campaign",
                source,
            });
        }
    };
    let Some(key) = resp.leader() else {
        keepalive.abort();
        return Err(ElectionError::NoLeaderKey);
    };
    Ok(Leadership {
        fence: Fence {
            key: key.key().to_vec(),
            create_revision: key.rev(),
        },
        lost,
        lease,
        client: client.clone(),
        keepalive,
    })
}

/// The current leader's value in the default-prefix election, if any.
pub async fn current_leader(client: &Client) -> Option<String> {
    let resp = client.election_client().leader(ELECTION_NAME).await.ok()?;
    resp.kv()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

/// Why the election lease's keep-alive stopped.
#[derive(Debug, thiserror::Error)]
enum LeaseLost {
    #[error("lease expired")]
    Expired,
    #[error("keep-alive stream closed")]
    StreamClosed,
    #[error("keep-alive timed out")]
    TimedOut,
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
}

async fn keep_alive(mut client: Client, lease: i64, ttl: i64, lost: CancellationToken) {
    let period = Duration::from_millis((ttl.max(1) as u64) * 1000 / 3);
    let result: Result<(), LeaseLost> = async {
        let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
        loop {
            keeper.keep_alive().await?;
            match tokio::time::timeout(period.max(Duration::from_millis(200)), stream.message())
                .await
            {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                Ok(Ok(Some(_))) => return Err(LeaseLost::Expired),
                Ok(Ok(None)) => return Err(LeaseLost::StreamClosed),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err(LeaseLost::TimedOut),
            }
            tokio::time::sleep(period).await;
        }
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(lease, "election lease lost: {e}");
    }
    lost.cancel();
}

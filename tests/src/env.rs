//! A running end-to-end environment: the two-node netns cluster of the standard layout, a server in
//! every pod, a real etcd and one real `felixrs agent` per node, with the real `policy-controller`
//! syncing each step's manifests. Used by the main NetworkPolicy run (`tests/e2e.rs`), the
//! admin-policy phase (`tests/e2e_admin.rs`) and the ICMP and bare-IP-protocol phase
//! (`tests/e2e_icmp.rs`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cases::{Case, Expect, Step};
use crate::cluster::{Cluster, StandardCluster};
use crate::driver::{Agent, Etcd, controller_sync};
use crate::traffic::Servers;
use crate::world::{self, Family, PlacedPod};

pub use crate::cluster::PROBE_TIMEOUT;
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Env {
    pub cluster: Cluster,
    _servers: Vec<Servers>,
    pub agents: Vec<Agent>,
    pub etcd: Etcd,
    pub work: tempfile::TempDir,
    pub latencies: Vec<Duration>,
}

impl Env {
    /// Builds the cluster of [`cases::standard_layout`] and starts etcd, servers and agents.
    pub fn start() -> Result<Env> {
        let s = StandardCluster::start("felixrs-e2e", Agent::start)?;
        Ok(Env {
            cluster: s.cluster,
            _servers: s.servers,
            agents: s.agents,
            etcd: s.etcd,
            work: s.work,
            latencies: Vec::new(),
        })
    }

    pub fn placed(&self) -> Vec<PlacedPod> {
        self.cluster.placed_pods()
    }

    /// The directory the last step's manifests were written to.
    pub fn manifests_dir(&self) -> std::path::PathBuf {
        self.work.path().join("manifests")
    }

    /// Writes the step's manifests, runs the controller, and waits for every agent to apply them.
    pub fn apply_step(&mut self, step: &Step) -> Result<i64> {
        let dir = self.manifests_dir();
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("cluster.yaml"),
            world::manifests(step, &self.placed()),
        )?;
        let rev = controller_sync(&self.cluster.infra, &self.etcd.client_url(), &dir)?;
        let start = Instant::now();
        for a in &mut self.agents {
            a.wait_applied(rev, APPLY_TIMEOUT)?;
        }
        self.latencies.push(start.elapsed());
        Ok(rev)
    }

    /// Probes every cell of `expect` over IPv4; see [`Env::check_over`].
    pub fn check(&self, expect: &Expect) -> Result<Vec<String>> {
        self.check_over(expect, Family::V4)
    }

    /// Probes every cell of `expect` over `family`; see [`Cluster::check`].
    pub fn check_over(&self, expect: &Expect, family: Family) -> Result<Vec<String>> {
        self.cluster.check(expect, family)
    }

    /// Applies and probes every step of a case over `family`; returns the failures.
    pub fn run_case(&mut self, case: &Case, family: Family) -> Result<Vec<String>> {
        let ids: Vec<String> = self.placed().iter().map(PlacedPod::id).collect();
        let mut failures = Vec::new();
        for (i, step) in case.steps.iter().enumerate() {
            self.apply_step(step)
                .with_context(|| format!("step {}", i + 1))?;
            let mut expect = Expect::all_allowed(&ids, &step.probes);
            (step.expect)(&mut expect);
            if family == Family::V6 {
                self.cluster.forget_neighbours()?;
            }
            for f in self.check_over(&expect, family)? {
                failures.push(format!("step {}: {f}", i + 1));
            }
        }
        Ok(failures)
    }
}

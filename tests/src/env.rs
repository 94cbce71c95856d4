//! A running end-to-end environment: the two-node netns cluster of the standard layout, a server in
//! every pod, a real etcd and one real `felixrs agent` per node, with the real `policy-controller`
//! syncing each step's manifests. Used by the main NetworkPolicy run (`tests/e2e.rs`) and the
//! admin-policy phase (`tests/e2e_admin.rs`).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cases::{Case, Expect, Step};
use crate::cluster::{Cluster, StandardCluster};
use crate::driver::{Agent, Etcd, controller_sync};
use crate::traffic::{Probe, Servers, probe_many};
use crate::world::{self, Family, PlacedPod};

const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
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

    /// Writes the step's manifests, runs the controller, and waits for every agent to apply them.
    pub fn apply_step(&mut self, step: &Step) -> Result<i64> {
        let dir = self.work.path().join("manifests");
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

    /// Probes every cell of `expect` to the destinations' `family` addresses; cells that disagree are
    /// probed twice more before they count. Returns the disagreements.
    pub fn check_over(&self, expect: &Expect, family: Family) -> Result<Vec<String>> {
        let ns_of = |id: &str| self.cluster.pod(id).ns.name().to_string();
        let ip_of = |id: &str| {
            let p = self.cluster.pod(id);
            match family {
                Family::V4 => IpAddr::V4(p.ip),
                Family::V6 => IpAddr::V6(p.ip6),
            }
        };
        let jobs: Vec<(String, IpAddr, Probe)> = expect
            .cells
            .iter()
            .map(|(f, t, p, _)| (ns_of(f), ip_of(t), *p))
            .collect();
        expect.disagreements(|idx| {
            let some: Vec<_> = idx.iter().map(|&i| jobs[i].clone()).collect();
            probe_many(&some, PROBE_TIMEOUT)
        })
    }

    /// Empties every pod's and node's IPv6 neighbour cache, so each probe needs neighbour discovery
    /// between pod and node to succeed under the policy in force (NDP must survive policy, as in Felix).
    pub fn forget_neighbours(&self) -> Result<()> {
        let pods = self.cluster.pods.iter().map(|p| &p.ns);
        for ns in pods.chain(self.cluster.nodes.iter().map(|n| &n.ns)) {
            ns.exec(&["ip", "-6", "neigh", "flush", "all"])?;
        }
        Ok(())
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
                self.forget_neighbours()?;
            }
            for f in self.check_over(&expect, family)? {
                failures.push(format!("step {}: {f}", i + 1));
            }
        }
        Ok(failures)
    }
}

//! A test file's own end-to-end phase: the standard two-node cluster of [`crate::cases`] pods with
//! their servers, a real etcd, the real `felixrs agent` on each node, and steps applied through the
//! real `policy-controller`. Probing handles every [`Probe`] kind, including bare-IP-protocol probes,
//! whose conntrack flows are keyed by addresses alone (see [`Probe::is_raw`]): those run in two rounds
//! (no pair in both directions at once) after their flows are deleted on both nodes.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cases::{Case, Expect, Step};
use crate::cluster::{Cluster, StandardCluster};
use crate::driver::{Agent, Etcd, controller_sync};
use crate::traffic::{Probe, Servers, probe_many};
use crate::world::{self, Family, PlacedPod};

pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// One cluster shared by every case of a phase.
pub struct Harness {
    pub cluster: Cluster,
    _servers: Vec<Servers>,
    pub agents: Vec<Agent>,
    pub etcd: Etcd,
    pub work: tempfile::TempDir,
}

impl Harness {
    /// The cluster of [`cases::standard_layout`], its servers, etcd, and an agent per node.
    pub fn start() -> Result<Harness> {
        let s = StandardCluster::start("felixrs-e2e-phase", Agent::start)?;
        Ok(Harness {
            cluster: s.cluster,
            _servers: s.servers,
            agents: s.agents,
            etcd: s.etcd,
            work: s.work,
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
    pub fn apply_step(&mut self, step: &Step) -> Result<Duration> {
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
        Ok(start.elapsed())
    }

    /// Empties every pod's and node's IPv6 neighbour cache, so each probe needs neighbour discovery
    /// between pod and node under the policy in force.
    pub fn forget_neighbours(&self) -> Result<()> {
        let pods = self.cluster.pods.iter().map(|p| &p.ns);
        for ns in pods.chain(self.cluster.nodes.iter().map(|n| &n.ns)) {
            ns.exec(&["ip", "-6", "neigh", "flush", "all"])?;
        }
        Ok(())
    }

    /// Deletes every node's conntrack flows of the bare IP protocols in `probes` (for both families).
    pub fn forget_raw_flows(&self, probes: &[Probe]) -> Result<()> {
        let mut protos: Vec<String> = probes
            .iter()
            .filter(|p| p.is_raw())
            .map(|p| p.port.to_string())
            .collect();
        protos.sort();
        protos.dedup();
        for n in &self.cluster.nodes {
            for proto in &protos {
                for family in ["ipv4", "ipv6"] {
                    // Exit status 1 means "nothing to delete".
                    n.ns.exec_unchecked(&["conntrack", "-D", "-f", family, "-p", proto])?;
                }
            }
        }
        Ok(())
    }

    /// Probes `(from pod, to pod, probe)` to the destinations' `family` addresses.
    pub fn probe(&self, cells: &[(String, String, Probe)], family: Family) -> Result<Vec<bool>> {
        let job = |(f, t, p): &(String, String, Probe)| {
            let to = self.cluster.pod(t);
            let dst = match family {
                Family::V4 => IpAddr::V4(to.ip),
                Family::V6 => IpAddr::V6(to.ip6),
            };
            (self.cluster.pod(f).ns.name().to_string(), dst, *p)
        };
        let mut results = vec![false; cells.len()];
        let plain: Vec<usize> = (0..cells.len()).filter(|&i| !cells[i].2.is_raw()).collect();
        let probes: Vec<Probe> = cells.iter().map(|c| c.2).collect();
        // Raw pairs one way, then the other, each round after the flows are gone.
        let forward: Vec<usize> = (0..cells.len())
            .filter(|&i| cells[i].2.is_raw() && cells[i].0 < cells[i].1)
            .collect();
        let backward: Vec<usize> = (0..cells.len())
            .filter(|&i| cells[i].2.is_raw() && cells[i].0 > cells[i].1)
            .collect();
        for (k, round) in [plain, forward, backward].into_iter().enumerate() {
            if round.is_empty() {
                continue;
            }
            if k > 0 {
                self.forget_raw_flows(&probes)?;
            }
            let jobs: Vec<_> = round.iter().map(|&i| job(&cells[i])).collect();
            for (i, r) in round.iter().zip(probe_many(&jobs, PROBE_TIMEOUT)?) {
                results[*i] = r;
            }
        }
        Ok(results)
    }

    /// Probes every cell of `expect`; cells that disagree are probed twice more before they count.
    pub fn check(&self, expect: &Expect, family: Family) -> Result<Vec<String>> {
        let cells: Vec<(String, String, Probe)> = expect
            .cells
            .iter()
            .map(|(f, t, p, _)| (f.clone(), t.clone(), *p))
            .collect();
        expect.disagreements(|idx| {
            let some: Vec<_> = idx.iter().map(|&i| cells[i].clone()).collect();
            self.probe(&some, family)
        })
    }

    /// Applies each step and probes its expectations over `family` (IPv6 with empty neighbour
    /// caches, so neighbour discovery must survive the policy).
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
            for f in self.check(&expect, family)? {
                failures.push(format!("step {}: {f}", i + 1));
            }
        }
        Ok(failures)
    }
}

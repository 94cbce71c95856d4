//! The felixrs image under test, run by podman the way a cluster runs it: the controller as its
//! image's non-root user, the agent as root with only `NET_ADMIN` and `NET_RAW`, both on a
//! read-only root filesystem, the agent's state on a named volume, each container in a namespace
//! of the netns [`Cluster`] (`--network ns:PATH`). [`ImagePhase`] is the cluster of
//! [`cases::standard_layout`] with such containers in place of the host binaries.
//!
//! podman runs with `scripts/podman-containers.conf` (runc, cgroupfs, no default ulimits) unless
//! `CONTAINERS_CONF` is set. The images are the ones `scripts/build-image.sh` tags: see
//! [`Images::wanted`].

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use felixrs_test_support::netns::{self, Netns};

use crate::cases::{Case, Expect, Step};
use crate::cluster::{Cluster, StandardCluster};
use crate::driver::{Etcd, HEALTH_ADDR, agent_args, http_get, wait_for};
use crate::traffic::Servers;
use crate::world::{self, Family, PlacedPod};

pub const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// `podman ARGS` with the workspace's containers.conf.
pub fn podman(args: &[&str]) -> Command {
    let mut c = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        c.env(
            "CONTAINERS_CONF",
            root.join("scripts/podman-containers.conf"),
        );
    }
    c.args(args);
    c
}

/// Runs `podman ARGS`; an error names the command and carries its stderr.
pub fn podman_ok(args: &[&str]) -> Result<String> {
    let out: Output = podman(args)
        .output()
        .with_context(|| format!("running podman {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "podman {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The image under test and the "newer" one the upgrade moves the agent to.
#[derive(Debug, Clone)]
pub struct Images {
    pub current: String,
    pub next: String,
}

impl Images {
    /// `FELIXRS_E2E_IMAGE` (default `felixrs/felixrs:<version>`, what `scripts/build-image.sh`
    /// tags) and `FELIXRS_E2E_NEXT_IMAGE` (default the same with `-next`: scripts/test.sh builds it
    /// with `FELIXRS_VERSION_EXTRA=next`).
    pub fn wanted() -> Images {
        let current = std::env::var("FELIXRS_E2E_IMAGE")
            .unwrap_or_else(|_| format!("felixrs/felixrs:{}", env!("CARGO_PKG_VERSION")));
        let next =
            std::env::var("FELIXRS_E2E_NEXT_IMAGE").unwrap_or_else(|_| format!("{current}-next"));
        Images { current, next }
    }

    /// What is missing to run the images (podman, or an image), if anything.
    pub fn missing(&self) -> Option<String> {
        if podman(&["version"])
            .output()
            .map_or(true, |o| !o.status.success())
        {
            return Some("podman is not installed or does not work".into());
        }
        for image in [&self.current, &self.next] {
            if podman_ok(&["image", "exists", image]).is_err() {
                return Some(format!(
                    "image {image} is missing: build it with scripts/build-image.sh \
                     (see scripts/test.sh for the -next one)"
                ));
            }
        }
        None
    }
}

/// `IMAGE --version` (the felixrs binary, the entrypoint) or another binary's in the image.
pub fn image_version(image: &str, binary: &str) -> Result<String> {
    let entrypoint = format!("/usr/local/bin/{binary}");
    podman_ok(&[
        "run",
        "--rm",
        "--read-only",
        "--network",
        "none",
        "--entrypoint",
        &entrypoint,
        image,
        "--version",
    ])
}

/// A detached container, force-removed on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `podman run -d --name NAME ARGS`.
    pub fn run(name: &str, args: &[&str]) -> Result<Container> {
        let _ = podman(&["rm", "-f", "-t", "0", name]).output();
        let mut all = vec!["run", "-d", "--name", name];
        all.extend_from_slice(args);
        podman_ok(&all)?;
        Ok(Container {
            name: name.to_string(),
        })
    }

    /// SIGTERM, as the kubelet stops a container; SIGKILL after `grace`. The container stays (its
    /// logs too) until dropped.
    pub fn stop(&self, grace: Duration) -> Result<()> {
        podman_ok(&["stop", "-t", &grace.as_secs().to_string(), &self.name]).map(drop)
    }

    pub fn is_running(&self) -> bool {
        podman_ok(&["inspect", "--format", "{{.State.Running}}", &self.name])
            .is_ok_and(|s| s == "true")
    }

    pub fn exec(&self, argv: &[&str]) -> Result<String> {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(argv);
        podman_ok(&all)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        podman(&["logs", "--tail", &lines.to_string(), &self.name])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]).output();
    }
}

/// A unique container or volume name for this test process.
fn unique(what: &str) -> String {
    netns::unique_name(&format!("felixrs-{what}-"))
}

/// The shared iptables lock, as the DaemonSet mounts it from the node (`FileOrCreate`).
const XTABLES_LOCK: &str = "/run/xtables.lock";

/// `felixrs agent` from an image, in a node's network namespace, its state on a named volume that
/// outlives the container (the snapshot a newer image starts from).
pub struct ContainerAgent {
    pub node_name: String,
    pub netns: String,
    pub image: String,
    pub volume: String,
    args: Vec<String>,
    container: Option<Container>,
    starts: u32,
}

impl ContainerAgent {
    pub fn start(node_ns: &Netns, node_name: &str, endpoint: &str, image: &str) -> Result<Self> {
        let volume = unique("state");
        podman_ok(&["volume", "create", &volume])?;
        // As the host-binary end-to-end runs (driver::Agent).
        let args = agent_args(endpoint, node_name, "/var/lib/felixrs");
        let mut a = ContainerAgent {
            node_name: node_name.to_string(),
            netns: node_ns.name().to_string(),
            image: image.to_string(),
            volume,
            args,
            container: None,
            starts: 0,
        };
        a.run()?;
        Ok(a)
    }

    /// Starts a container of `self.image`: root with only NET_ADMIN and NET_RAW (what
    /// deploy/base/agent-daemonset.yaml grants), read-only root filesystem, no new privileges.
    fn run(&mut self) -> Result<()> {
        self.starts += 1;
        let name = format!("{}-{}", self.volume, self.starts);
        let network = format!("ns:{}", netns::path(&self.netns).display());
        let state = format!("{}:/var/lib/felixrs", self.volume);
        let lock = format!("{XTABLES_LOCK}:{XTABLES_LOCK}");
        if !Path::new(XTABLES_LOCK).exists() {
            std::fs::write(XTABLES_LOCK, b"").context("creating /run/xtables.lock")?;
        }
        let mut argv: Vec<&str> = vec![
            "--network",
            &network,
            "--user",
            "0:0",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "NET_ADMIN,NET_RAW",
            "--security-opt",
            "no-new-privileges",
            "--read-only",
            "-v",
            &state,
            "-v",
            &lock,
            &self.image,
        ];
        argv.extend(self.args.iter().map(String::as_str));
        self.container = Some(Container::run(&name, &argv)?);
        Ok(())
    }

    pub fn container(&self) -> Option<&Container> {
        self.container.as_ref()
    }

    /// A DaemonSet rolling update: SIGTERM this container (10 s grace), then the same agent from
    /// `image` on the same volume. Returns at once: the caller probes the window.
    pub fn upgrade(&mut self, image: &str) -> Result<()> {
        if let Some(c) = self.container.take() {
            c.stop(Duration::from_secs(10))?;
        }
        self.image = image.to_string();
        self.run()
    }

    pub fn status(&self) -> Option<Value> {
        let (code, body) = http_get(&self.netns, HEALTH_ADDR, "/status").ok()?;
        if code != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.container
            .as_ref()
            .map(|c| c.log_tail(lines))
            .unwrap_or_default()
    }

    /// Waits until the agent reports in sync with `applied_revision >= rev`.
    pub fn wait_applied(&self, rev: i64, timeout: Duration) -> Result<()> {
        let got = wait_for(timeout, || {
            self.status().filter(|s| {
                s["in_sync"].as_bool() == Some(true)
                    && s["applied_revision"].as_i64().unwrap_or(-1) >= rev
            })
        });
        if got.is_none() {
            bail!(
                "agent container {} on {} did not reach applied_revision {rev} (last status {:?}, \
                 running {}):\n{}",
                self.image,
                self.node_name,
                self.status(),
                self.container.as_ref().is_some_and(Container::is_running),
                self.log_tail(30)
            );
        }
        Ok(())
    }
}

impl Drop for ContainerAgent {
    fn drop(&mut self) {
        self.container = None;
        let _ = podman(&["volume", "rm", "-f", &self.volume]).output();
    }
}

/// The standard two-node cluster with a server in every pod, etcd in the infra namespace, the
/// agent image on every node, and each step's manifests synced by the controller image.
pub struct ImagePhase {
    /// Dropped first: the containers go before the namespaces they run in.
    pub agents: Vec<ContainerAgent>,
    _servers: Vec<Servers>,
    pub etcd: Etcd,
    pub cluster: Cluster,
    pub images: Images,
    pub work: tempfile::TempDir,
}

impl ImagePhase {
    pub fn start(images: Images) -> Result<ImagePhase> {
        let s = StandardCluster::start("felixrs-e2e-image", |ns, name, url, _| {
            ContainerAgent::start(ns, name, url, &images.current)
        })?;
        Ok(ImagePhase {
            agents: s.agents,
            _servers: s.servers,
            etcd: s.etcd,
            cluster: s.cluster,
            images,
            work: s.work,
        })
    }

    pub fn placed(&self) -> Vec<PlacedPod> {
        self.cluster.placed_pods()
    }

    fn manifests_dir(&self) -> PathBuf {
        self.work.path().join("manifests")
    }

    /// `policy-controller sync --once` from the image, in the infra namespace, as the image's
    /// non-root user on a read-only root filesystem with no capabilities, the manifests mounted
    /// read-only; returns the etcd revision it printed.
    pub fn controller_sync(&self) -> Result<i64> {
        let network = format!("ns:{}", netns::path(self.cluster.infra.name()).display());
        let mount = format!("{}:/manifests:ro", self.manifests_dir().display());
        let name = unique("controller");
        let _ = podman(&["rm", "-f", "-t", "0", &name]).output();
        let out = podman(&[
            "run",
            "--rm",
            "--name",
            &name,
            "--network",
            &network,
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--read-only",
            "-v",
            &mount,
            "--entrypoint",
            "/usr/local/bin/policy-controller",
            &self.images.current,
            "sync",
            "--etcd-endpoints",
            &self.etcd.client_url(),
            "--manifests",
            "/manifests",
            "--once",
        ])
        .output()
        .context("running the policy-controller container")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "policy-controller container failed ({}): {stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let last = stdout
            .lines()
            .last()
            .context("policy-controller printed nothing")?;
        let v: Value = serde_json::from_str(last)
            .with_context(|| format!("last stdout line is not JSON: {last}"))?;
        v["revision"]
            .as_i64()
            .with_context(|| format!("no revision in {v}"))
    }

    /// Writes the step's manifests, syncs them with the controller image, and waits for every
    /// agent container to apply them.
    pub fn apply_step(&mut self, step: &Step) -> Result<i64> {
        let dir = self.manifests_dir();
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("cluster.yaml"),
            world::manifests(step, &self.placed()),
        )?;
        let rev = self.controller_sync()?;
        for a in &self.agents {
            a.wait_applied(rev, APPLY_TIMEOUT)?;
        }
        Ok(rev)
    }

    /// The expectation of `step` over every ordered pod pair.
    pub fn expect_of(&self, step: &Step) -> Expect {
        let ids: Vec<String> = self.placed().iter().map(PlacedPod::id).collect();
        let mut e = Expect::all_allowed(&ids, &step.probes);
        (step.expect)(&mut e);
        e
    }

    /// Probes every cell of `expect` over `family`; see [`Cluster::check`].
    pub fn check(&self, expect: &Expect, family: Family) -> Result<Vec<String>> {
        self.cluster.check(expect, family)
    }

    /// Applies and probes every step of `case` over `family`; returns the failures.
    pub fn run_case(&mut self, case: &Case, family: Family) -> Result<Vec<String>> {
        let mut failures = Vec::new();
        for (i, step) in case.steps.iter().enumerate() {
            self.apply_step(step)
                .with_context(|| format!("step {}", i + 1))?;
            if family == Family::V6 {
                // Neighbour discovery between pod and node must survive the policy.
                self.cluster.forget_neighbours()?;
            }
            for f in self.check(&self.expect_of(step), family)? {
                failures.push(format!("step {}: {f}", i + 1));
            }
        }
        Ok(failures)
    }
}

//! Felix's own metric names (`felix_*`, plus the `process_*` set Felix's Go client serves), so
//! that Calico's Grafana dashboard and alerts work against felixrs unchanged.
//!
//! Each series is derived from a quantity the agent measures once: the `felixrs_*` metric of the
//! same concept is read at scrape time (an alias), or, where Felix counts something the agent did
//! not measure, the one hook that measures it feeds both ([`CountingRunner`] for program calls,
//! [`ClusterCounts`] for the datastore view, [`Summary`] for Felix's summaries). The mapping is
//! listed in ARCHITECTURE.md ("Felix's metric names").
//!
//! The exposition is OpenMetrics, like the rest of `/metrics`. Felix's counters have no `_total`
//! (Felix serves Prometheus text 0.0.4), which OpenMetrics allows only for type `unknown`: they
//! are declared `unknown` so the series names are exactly Felix's (`rate()` and `increase()` work
//! the same). Gauges and summaries keep their types.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iptables::apply::{RunError, Runner};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::agent::apply_loop::ApplyReport;

mod cluster;
mod process;

pub use cluster::ClusterCounts;
use cluster::Counted;
use process::{ProcessStats, process_start_time};

/// Felix's summary objectives (libcalico-go `DefObjectives`).
const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];
/// Observations older than this leave the quantiles (Felix's client default `MaxAge`).
const WINDOW: Duration = Duration::from_secs(600);
/// At most this many observations are kept for the quantiles (the oldest go first).
const WINDOW_CAP: usize = 4096;

/// A Prometheus summary: quantiles over the last ten minutes, `_sum` and `_count` since start.
#[derive(Debug, Default)]
pub struct Summary {
    inner: Mutex<SummaryState>,
}

#[derive(Debug, Default)]
struct SummaryState {
    window: VecDeque<(Instant, f64)>,
    sum: f64,
    count: u64,
}

impl Summary {
    pub fn observe(&self, v: f64) {
        let now = Instant::now();
        let mut s = self.inner.lock().expect("summary lock");
        s.sum += v;
        s.count += 1;
        if s.window.len() == WINDOW_CAP {
            s.window.pop_front();
        }
        s.window.push_back((now, v));
    }

    pub fn count(&self) -> u64 {
        self.inner.lock().expect("summary lock").count
    }

    /// (quantile, value) for each objective (NaN without recent observations), sum, count.
    fn snapshot(&self) -> (Vec<(f64, f64)>, f64, u64) {
        let mut s = self.inner.lock().expect("summary lock");
        let now = Instant::now();
        while s
            .window
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > WINDOW)
        {
            s.window.pop_front();
        }
        let mut values: Vec<f64> = s.window.iter().map(|(_, v)| *v).collect();
        values.sort_by(f64::total_cmp);
        let q = QUANTILES
            .iter()
            .map(|&q| {
                let v = match values.len() {
                    0 => f64::NAN,
                    n => values[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
                };
                (q, v)
            })
            .collect();
        (q, s.sum, s.count)
    }
}

/// Felix's program-call counters, counted where the agent runs the programs.
#[derive(Debug, Default)]
pub struct ExecCounts {
    restore_calls: AtomicU64,
    restore_errors: AtomicU64,
    save_calls: AtomicU64,
    save_errors: AtomicU64,
    ipset_calls: AtomicU64,
    ipset_errors: AtomicU64,
}

impl ExecCounts {
    /// Counts one finished run of `program` (`ok`: it ran and exited 0).
    pub fn record(&self, program: &str, ok: bool) {
        let base = program.rsplit('/').next().unwrap_or(program);
        let tables = base.starts_with("ip") && base.contains("tables");
        let (calls, errors) = if tables && base.ends_with("-restore") {
            (&self.restore_calls, &self.restore_errors)
        } else if tables && base.ends_with("-save") {
            (&self.save_calls, &self.save_errors)
        } else if base == "ipset" {
            (&self.ipset_calls, &self.ipset_errors)
        } else {
            return;
        };
        calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A runner that counts each `iptables-restore`, `iptables-save` and `ipset` it runs (either
/// backend, either family) for Felix's `felix_iptables_*` and `felix_ipset_*` counters.
#[derive(Debug, Clone)]
pub struct CountingRunner<R> {
    inner: R,
    counts: Arc<ExecCounts>,
}

impl<R> CountingRunner<R> {
    pub fn new(inner: R, counts: Arc<ExecCounts>) -> Self {
        CountingRunner { inner, counts }
    }
}

impl<R: Runner> Runner for CountingRunner<R> {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<std::process::Output, RunError> {
        let out = self.inner.run(program, args, stdin);
        let ok = out.as_ref().is_ok_and(|o| o.status.success());
        self.counts.record(program, ok);
        out
    }

    fn netns(&self) -> Option<&str> {
        self.inner.netns()
    }
}

/// One table's programmed state (both appliers report theirs after each apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCount {
    /// 4 or 6.
    pub ip_version: u8,
    pub table: &'static str,
    pub chains: usize,
    pub rules: usize,
}

/// The `felixrs_*` metrics Felix has a name for (read at scrape time).
#[derive(Debug, Clone)]
pub struct Aliases {
    pub local_endpoints: Gauge,
    pub local_host_endpoints: Gauge,
    pub active_policies: Gauge,
    pub ip_sets: Gauge,
    pub apply_errors: Counter,
    pub resyncs: Counter,
}

/// Felix's state the agent measures for Felix's names only.
#[derive(Debug)]
pub struct FelixMetrics {
    pub exec: Arc<ExecCounts>,
    /// Each datastore update given to the calculation graph.
    pub calc_graph_update_seconds: Summary,
    /// Each apply after the first successful one (Felix keeps the first out of the summary).
    pub apply_seconds: Summary,
    initial_resync_seconds: Mutex<Option<f64>>,
    /// 1 waiting for the datastore, 2 resync in progress, 3 in sync (Felix's values).
    resync_state: AtomicU64,
    active_selectors: AtomicU64,
    tables: Mutex<Vec<TableCount>>,
    /// Payload lines written per (family, table) since start.
    iptables_lines: Mutex<BTreeMap<(u8, &'static str), u64>>,
    ipset_lines: AtomicU64,
    cluster: Mutex<ClusterCounts>,
    start_time: f64,
}

impl Default for FelixMetrics {
    fn default() -> Self {
        FelixMetrics {
            exec: Arc::default(),
            calc_graph_update_seconds: Summary::default(),
            apply_seconds: Summary::default(),
            initial_resync_seconds: Mutex::new(None),
            resync_state: AtomicU64::new(RESYNC_WAIT),
            active_selectors: AtomicU64::new(0),
            tables: Mutex::new(Vec::new()),
            iptables_lines: Mutex::default(),
            ipset_lines: AtomicU64::new(0),
            cluster: Mutex::default(),
            start_time: process_start_time().unwrap_or(0.0),
        }
    }
}

/// Felix's `felix_resync_state` values: waiting for the datastore (also after losing it).
pub const RESYNC_WAIT: u64 = 1;
/// In sync with the datastore (its full list is in the view).
pub const RESYNC_IN_SYNC: u64 = 3;

impl FelixMetrics {
    /// The datastore state changed ([`RESYNC_WAIT`], [`RESYNC_IN_SYNC`]).
    pub fn set_resync_state(&self, state: u64) {
        self.resync_state.store(state, Ordering::Relaxed);
    }

    /// `key` is in the agent's datastore view with `value` (the graph took it).
    pub fn cluster_put(&self, key: &Arc<str>, value: &[u8]) {
        self.cluster.lock().expect("felix lock").put(key, value);
    }

    /// `key` left the agent's datastore view.
    pub fn cluster_delete(&self, key: &str) {
        self.cluster.lock().expect("felix lock").delete(key);
    }

    /// A successful apply's duration and report: the first is Felix's initial resync time, the
    /// others go into the apply time summary.
    pub fn applied(&self, seconds: f64, r: &ApplyReport) {
        {
            let mut initial = self.initial_resync_seconds.lock().expect("felix lock");
            if initial.is_none() {
                *initial = Some(seconds);
            } else {
                self.apply_seconds.observe(seconds);
            }
        }
        self.active_selectors
            .store(r.active_selectors as u64, Ordering::Relaxed);
        *self.tables.lock().expect("felix lock") = r.tables.clone();
        let mut lines = self.iptables_lines.lock().expect("felix lock");
        for &(v, table, n) in &r.iptables_lines {
            *lines.entry((v, table)).or_default() += n;
        }
        self.ipset_lines.fetch_add(r.ipset_lines, Ordering::Relaxed);
    }

    /// A failed apply's duration (it took dataplane time as much as a successful one).
    pub fn apply_failed(&self, seconds: f64) {
        self.apply_seconds.observe(seconds);
    }

    /// Appends Felix's families to an OpenMetrics exposition (before its `# EOF`).
    pub fn encode(&self, a: &Aliases, out: &mut String) {
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            family(out, name, help, "gauge");
            sample(out, name, "", v);
        };
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            family(out, name, help, "unknown");
            sample(out, name, "", v as f64);
        };
        gauge(
            out,
            "felix_active_local_endpoints",
            "Number of active endpoints on this host.",
            // Felix's policy resolver counts every local endpoint: workloads and host endpoints.
            (a.local_endpoints.get() + a.local_host_endpoints.get()) as f64,
        );
        gauge(
            out,
            "felix_active_local_policies",
            "Number of active policies on this host.",
            a.active_policies.get() as f64,
        );
        gauge(
            out,
            "felix_active_local_selectors",
            "Number of active selectors on this host.",
            self.active_selectors.load(Ordering::Relaxed) as f64,
        );
        {
            let c = self.cluster.lock().expect("felix lock");
            for (name, help, v) in [
                (
                    "felix_cluster_num_hosts",
                    "Total number of calico hosts in the cluster.",
                    c.hosts(),
                ),
                (
                    "felix_cluster_num_host_endpoints",
                    "Total number of host endpoints cluster-wide.",
                    c.count(Counted::HostEndpoint),
                ),
                (
                    "felix_cluster_num_workload_endpoints",
                    "Total number of workload endpoints cluster-wide.",
                    c.count(Counted::WorkloadEndpoint),
                ),
                (
                    "felix_cluster_num_tiers",
                    "Total number of tiers cluster-wide.",
                    c.count(Counted::Tier),
                ),
                (
                    "felix_cluster_num_policies",
                    "Total number of policies cluster-wide.",
                    c.count(Counted::Policy),
                ),
                (
                    "felix_cluster_num_profiles",
                    "Total number of profiles cluster-wide.",
                    c.count(Counted::Profile),
                ),
            ] {
                gauge(out, name, help, v as f64);
            }
        }
        gauge(
            out,
            "felix_resync_state",
            "Current datastore state.",
            self.resync_state.load(Ordering::Relaxed) as f64,
        );
        counter(
            out,
            "felix_resyncs_started",
            "Current datastore state.",
            a.resyncs.get(),
        );
        summary(
            out,
            "felix_calc_graph_update_time_seconds",
            "Seconds to update calculation graph for each datastore OnUpdate call.",
            &self.calc_graph_update_seconds,
        );
        summary(
            out,
            "felix_int_dataplane_apply_time_seconds",
            "Time in seconds for each incremental update to the dataplane (after the initial resync).",
            &self.apply_seconds,
        );
        counter(
            out,
            "felix_int_dataplane_failures",
            "Number of times dataplane updates failed and will be retried.",
            a.apply_errors.get(),
        );
        // 0 until the first apply, as Felix's.
        let initial = self.initial_resync_seconds.lock().expect("felix lock");
        gauge(
            out,
            "felix_int_dataplane_initial_resync_time_seconds",
            "Time in seconds that it took to do the initial resync with the dataplane and bring the dataplane into sync for the first time.",
            initial.unwrap_or(0.0),
        );
        drop(initial);
        let e = &self.exec;
        for (name, help, v) in [
            (
                "felix_iptables_restore_calls",
                "Number of iptables-restore calls.",
                &e.restore_calls,
            ),
            (
                "felix_iptables_restore_errors",
                "Number of iptables-restore errors.",
                &e.restore_errors,
            ),
            (
                "felix_iptables_save_calls",
                "Number of iptables-save calls.",
                &e.save_calls,
            ),
            (
                "felix_iptables_save_errors",
                "Number of iptables-save errors.",
                &e.save_errors,
            ),
            (
                "felix_ipset_calls",
                "Number of ipset commands executed.",
                &e.ipset_calls,
            ),
            (
                "felix_ipset_errors",
                "Number of ipset command failures.",
                &e.ipset_errors,
            ),
        ] {
            counter(out, name, help, v.load(Ordering::Relaxed));
        }
        {
            let tables = self.tables.lock().expect("felix lock");
            for (name, help, rules) in [
                (
                    "felix_iptables_chains",
                    "Number of active iptables chains.",
                    false,
                ),
                (
                    "felix_iptables_rules",
                    "Number of active iptables rules.",
                    true,
                ),
            ] {
                family(out, name, help, "gauge");
                for t in tables.iter() {
                    let labels =
                        format!("{{ip_version=\"{}\",table=\"{}\"}}", t.ip_version, t.table);
                    let v = if rules { t.rules } else { t.chains };
                    sample(out, name, &labels, v as f64);
                }
            }
        }
        {
            // A table's series exists from its first program (0 until a line is written there).
            let mut lines = self.iptables_lines.lock().expect("felix lock");
            for t in self.tables.lock().expect("felix lock").iter() {
                lines.entry((t.ip_version, t.table)).or_default();
            }
            let name = "felix_iptables_lines_executed";
            family(
                out,
                name,
                "Number of iptables rule updates executed.",
                "unknown",
            );
            for ((v, table), n) in lines.iter() {
                let labels = format!("{{ip_version=\"{v}\",table=\"{table}\"}}");
                sample(out, name, &labels, *n as f64);
            }
        }
        counter(
            out,
            "felix_ipset_lines_executed",
            "Number of ipset operations executed.",
            self.ipset_lines.load(Ordering::Relaxed),
        );
        gauge(
            out,
            "felix_ipsets_calico",
            "Number of active Calico IP sets.",
            a.ip_sets.get() as f64,
        );
        self.encode_process(out);
    }

    /// The process collector's series (as Felix's Go client serves them).
    fn encode_process(&self, out: &mut String) {
        let p = ProcessStats::read();
        if let Some(cpu) = p.cpu_seconds {
            family(
                out,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                "counter",
            );
            sample(out, "process_cpu_seconds_total", "", cpu);
        }
        for (name, help, v) in [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                p.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                p.max_fds,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                p.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                p.virtual_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                Some(self.start_time).filter(|t| *t > 0.0),
            ),
        ] {
            if let Some(v) = v {
                family(out, name, help, "gauge");
                sample(out, name, "", v);
            }
        }
    }
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &str, v: f64) {
    let _ = writeln!(out, "{name}{labels} {v}");
}

fn summary(out: &mut String, name: &str, help: &str, s: &Summary) {
    family(out, name, help, "summary");
    let (quantiles, sum, count) = s.snapshot();
    for (q, v) in quantiles {
        sample(out, name, &format!("{{quantile=\"{q}\"}}"), v);
    }
    sample(out, &format!("{name}_sum"), "", sum);
    sample(out, &format!("{name}_count"), "", count as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_quantiles_over_the_window_and_nan_when_empty() {
        let s = Summary::default();
        let (q, sum, count) = s.snapshot();
        assert!(q.iter().all(|(_, v)| v.is_nan()));
        assert_eq!((sum, count), (0.0, 0));
        for i in 1..=100 {
            s.observe(f64::from(i));
        }
        let (q, sum, count) = s.snapshot();
        assert_eq!(q, vec![(0.5, 50.0), (0.9, 90.0), (0.99, 99.0)]);
        assert_eq!((sum, count), (5050.0, 100));
    }

    #[test]
    fn program_calls_are_counted_by_kind() {
        let e = ExecCounts::default();
        e.record("iptables-nft-restore", true);
        e.record("ip6tables-legacy-restore", false);
        e.record("/usr/sbin/iptables-save", true);
        e.record("ipset", false);
        e.record("conntrack", false);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!((get(&e.restore_calls), get(&e.restore_errors)), (2, 1));
        assert_eq!((get(&e.save_calls), get(&e.save_errors)), (1, 0));
        assert_eq!((get(&e.ipset_calls), get(&e.ipset_errors)), (1, 1));
    }
}

#[cfg(test)]
mod exposition_tests {
    use crate::agent::metrics::Metrics;

    #[test]
    fn felix_series_exist_before_anything_happened_and_share_the_felixrs_quantities() {
        let m = Metrics::new();
        m.local_endpoints.set(4);
        m.local_host_endpoints.set(1);
        m.apply_errors.inc();
        let text = m.render();
        for line in [
            "felix_active_local_endpoints 5",
            "felix_int_dataplane_failures 1",
            "# TYPE felix_iptables_restore_calls unknown",
            "felix_iptables_restore_calls 0",
            "felix_iptables_save_errors 0",
            "felix_ipset_calls 0",
            "felix_cluster_num_hosts 0",
            "felix_cluster_num_host_endpoints 0",
            "felix_resync_state 1",
            "felix_resyncs_started 0",
            "# TYPE felix_int_dataplane_apply_time_seconds summary",
            "felix_int_dataplane_apply_time_seconds{quantile=\"0.99\"} NaN",
            "felix_int_dataplane_apply_time_seconds_count 0",
            "felix_calc_graph_update_time_seconds_sum 0",
            "felix_int_dataplane_initial_resync_time_seconds 0",
            "# TYPE felix_iptables_rules gauge",
            "# TYPE felix_iptables_lines_executed unknown",
            "felix_ipset_lines_executed 0",
            "felixrs_local_endpoints 4",
            "felixrs_local_host_endpoints 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert!(text.contains("\nprocess_cpu_seconds_total "), "{text}");
        assert!(text.contains("\nprocess_start_time_seconds "), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}

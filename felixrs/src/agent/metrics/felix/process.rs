//! The process collector's quantities (as Felix's Go client serves them), from `/proc/self`.

/// What `/proc/self` says about the process (each `None` if it cannot be read).
#[derive(Debug, Default)]
pub(super) struct ProcessStats {
    pub(super) cpu_seconds: Option<f64>,
    pub(super) open_fds: Option<f64>,
    pub(super) max_fds: Option<f64>,
    pub(super) resident_bytes: Option<f64>,
    pub(super) virtual_bytes: Option<f64>,
}

/// `/proc/self/stat`'s fields after the command name (field 3 onwards).
fn proc_stat_fields() -> Option<Vec<String>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    Some(after.split_whitespace().map(String::from).collect())
}

/// `/proc`'s clock ticks (`USER_HZ`, 100 on every architecture Linux runs us on).
const TICKS_PER_SECOND: f64 = 100.0;

/// A `/proc/self/status` size line (`VmRSS:   1234 kB`) in bytes.
fn status_bytes(status: &str, field: &str) -> Option<f64> {
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024.0)
}

impl ProcessStats {
    pub(super) fn read() -> Self {
        let mut p = ProcessStats::default();
        if let Some(f) = proc_stat_fields() {
            // utime (14) and stime (15), counted from 1.
            let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
            if let (Some(u), Some(s)) = (num(14), num(15)) {
                p.cpu_seconds = Some((u + s) / TICKS_PER_SECOND);
            }
        }
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            p.resident_bytes = status_bytes(&status, "VmRSS:");
            p.virtual_bytes = status_bytes(&status, "VmSize:");
        }
        p.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64);
        p.max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))
                    .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
            });
        p
    }
}

/// Seconds since the epoch when this process started (`/proc/self/stat` starttime + boot time).
pub(super) fn process_start_time() -> Option<f64> {
    let f = proc_stat_fields()?;
    let start_ticks: f64 = f.get(22 - 3)?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime + start_ticks / TICKS_PER_SECOND)
}

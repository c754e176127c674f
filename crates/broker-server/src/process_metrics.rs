//! What every Prometheus exporter says about its process, under the names dashboards and alert
//! rules expect (`process_*`, without the broker's prefix): resident and virtual memory, CPU
//! time, open and allowed file descriptors, the start time; and, under the broker's prefix,
//! its build and the bytes of its data directory and free on its disk.
//!
//! Read at each scrape. A figure the system does not give (the memory and file descriptors come
//! from Linux's `/proc`) is left out rather than reported as zero.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use broker_net::RequestMemory;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// The process's figures (registered without a prefix).
#[derive(Debug)]
pub(crate) struct ProcessCollector {
    /// When the server started, in seconds since the Unix epoch.
    started_secs: f64,
}

impl ProcessCollector {
    /// A collector for this process: its start time from Linux's `/proc`, or now where the
    /// system does not say.
    pub(crate) fn new() -> Self {
        let started_secs = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .zip(std::fs::read_to_string("/proc/stat").ok())
            .and_then(|(stat, system)| {
                started_from_proc(&stat, &system, rustix::param::clock_ticks_per_second())
            })
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |since| since.as_secs_f64())
            });
        ProcessCollector { started_secs }
    }
}

/// When a process started, in seconds since the Unix epoch, from its `/proc/<pid>/stat` (its
/// start in clock ticks after boot, the 22nd field) and `/proc/stat` (the boot time, `btime`).
fn started_from_proc(stat: &str, system: &str, ticks_per_second: u64) -> Option<f64> {
    // The command name (the 2nd field) may hold spaces and parentheses: the fields after it
    // start after its last ')'; the 22nd field is the 20th of those.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = system
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    (ticks_per_second > 0).then(|| boot as f64 + ticks as f64 / ticks_per_second as f64)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let cpu_secs = cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9;
        let counter = encoder.encode_descriptor(
            "process_cpu",
            "User and system CPU time the process has used (every thread).",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        ConstCounter::new(cpu_secs).encode(counter)?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        for (name, help, field) in [
            (
                "process_resident_memory",
                "Resident memory of the process.",
                "VmRSS:",
            ),
            (
                "process_virtual_memory",
                "Virtual memory of the process.",
                "VmSize:",
            ),
        ] {
            if let Some(bytes) = status_kib(&status, field).map(|kib| kib.saturating_mul(1024)) {
                single_gauge(&mut encoder, name, help, Some(Unit::Bytes), gauge(bytes))?;
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // (The directory's own descriptor, open while it is read, is counted too, as
            // other exporters count it.)
            let open = entries.count() as u64;
            single_gauge(
                &mut encoder,
                "process_open_fds",
                "File descriptors the process has open (sockets and files).",
                None,
                gauge(open),
            )?;
        }
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if let Some(max) = limit.current {
            single_gauge(
                &mut encoder,
                "process_max_fds",
                "The most file descriptors the process may open (its soft limit).",
                None,
                gauge(max),
            )?;
        }
        let family = encoder.encode_descriptor(
            "process_start_time",
            "When the process started, since the Unix epoch.",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.started_secs).encode(family)
    }
}

/// The value in KiB of `field` (such as `VmRSS:`) of `/proc/self/status`.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Writes one gauge without labels.
pub(crate) fn single_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    ConstGauge::new(value).encode(family)
}

/// A count as a gauge value (saturating: no count reaches `i64::MAX`).
pub(crate) fn gauge(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The broker's build, its request memory and, with a data directory, the bytes it holds and
/// those free on its disk (registered under the broker's prefix).
#[derive(Debug)]
pub(crate) struct ResourcesCollector {
    /// The request memory of both listeners.
    request_memory: RequestMemory,
    /// The data directory, if the server has one.
    data_dir: Option<PathBuf>,
}

impl ResourcesCollector {
    /// A collector for a server whose request memory is `request_memory` and data directory
    /// `data_dir`.
    pub(crate) fn new(request_memory: RequestMemory, data_dir: Option<PathBuf>) -> Self {
        ResourcesCollector {
            request_memory,
            data_dir,
        }
    }
}

impl Collector for ResourcesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "build_info",
            "Always 1; its label names the broker-server release.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1_i64)
            .encode(family.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)?;
        single_gauge(
            &mut encoder,
            "request_memory",
            "Bytes held by requests larger than 64 KiB read and not yet answered (both listeners) \
             and by answers with records being built or written (the native listener).",
            Some(Unit::Bytes),
            gauge(self.request_memory.held()),
        )?;
        single_gauge(
            &mut encoder,
            "request_memory_limit",
            "The most bytes of requests read and not yet answered, and of answers with records \
             (--max-request-memory).",
            Some(Unit::Bytes),
            gauge(self.request_memory.limit()),
        )?;
        let waits = encoder.encode_descriptor(
            "request_memory_waits",
            "Times a connection waited to read a frame, or to build an answer with records, until \
             requests answered gave back room.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(self.request_memory.waits()).encode(waits)?;
        let Some(dir) = &self.data_dir else {
            return Ok(());
        };
        single_gauge(
            &mut encoder,
            "data_dir",
            "Bytes of the files in the data directory (records, logs, snapshots).",
            Some(Unit::Bytes),
            gauge(bytes_under(dir)),
        )?;
        if let Ok(disk) = rustix::fs::statvfs(dir) {
            single_gauge(
                &mut encoder,
                "data_dir_free",
                "Bytes free for the server on the data directory's file system.",
                Some(Unit::Bytes),
                gauge(disk.f_bavail.saturating_mul(disk.f_frsize)),
            )?;
        }
        Ok(())
    }
}

/// The bytes of the files under `dir`, its subdirectories included; a file removed while it is
/// walked (a checkpoint's cleanup) counts as gone.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => bytes_under(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |meta| meta.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_field_is_read_in_kib() {
        let status = "Name:\tbroker-server\nVmSize:\t  123456 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(2048));
        assert_eq!(status_kib(status, "VmSize:"), Some(123_456));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn the_start_time_is_the_boot_time_plus_the_ticks_after_it() {
        let stat = "4242 (broker (server)) S 1 4242 4242 0 -1 4194560 3000 0 0 0 12 5 0 0 20 0 \
                    7 0 150050 123456789 2000";
        let system = "cpu  1 2 3\nbtime 1700000000\nprocesses 99\n";
        assert_eq!(
            started_from_proc(stat, system, 100),
            Some(1_700_000_000.0 + 1500.5)
        );
        assert_eq!(started_from_proc(stat, "cpu 1\n", 100), None);
        assert_eq!(started_from_proc("4242 (short) S 1", system, 100), None);
    }

    #[test]
    fn the_bytes_under_a_directory_count_every_file_below_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), [0; 100]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub").join("b"), [0; 28]).unwrap();
        assert_eq!(bytes_under(dir.path()), 128);
        assert_eq!(bytes_under(&dir.path().join("missing")), 0);
    }
}

//! The standard `process_*` metrics every Prometheus client library exports, read from
//! /proc/self with the `procfs` crate at scrape time.
//!
//! Why not a collector crate: the maintained one for prometheus-client
//! (`kubert-prometheus-process`) is built against prometheus-client 0.23, whose `Registry`
//! is another type than this crate's 0.26 one, and `metrics-process` serves the `metrics`
//! crate. The names, types and help texts follow the Prometheus "process metrics" standard
//! (client_golang's collector), so dashboards made for any exporter work.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::{family, Sample};

/// Every process metric this process can read; one that cannot be read is left out, not
/// written as 0.
pub(super) fn encode(enc: &mut DescriptorEncoder) -> fmt::Result {
    let Ok(me) = procfs::process::Process::myself() else {
        return Ok(());
    };
    let ticks = procfs::ticks_per_second() as f64;
    if let Ok(stat) = me.stat() {
        let cpu = (stat.utime + stat.stime) as f64 / ticks;
        let page = procfs::page_size();
        let gauges: [(&str, &str, Sample); 3] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                Sample::Int((stat.rss * page) as i64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                Sample::Int(stat.vsize as i64),
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                Sample::Int(stat.num_threads),
            ),
        ];
        family::<0>(
            enc,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            MetricType::Counter,
            [([], Sample::CounterF(cpu))],
        )?;
        for (name, help, sample) in gauges {
            family::<0>(enc, name, help, MetricType::Gauge, [([], sample)])?;
        }
        if let Ok(boot) = procfs::boot_time_secs() {
            let start = boot as f64 + stat.starttime as f64 / ticks;
            family::<0>(
                enc,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                MetricType::Gauge,
                [([], Sample::Gauge(start))],
            )?;
        }
    }
    if let Ok(fds) = me.fd_count() {
        family::<0>(
            enc,
            "process_open_fds",
            "Number of open file descriptors.",
            MetricType::Gauge,
            [([], Sample::Int(fds as i64))],
        )?;
    }
    if let Ok(limits) = me.limits() {
        if let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit {
            family::<0>(
                enc,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                MetricType::Gauge,
                [([], Sample::Int(max as i64))],
            )?;
        }
    }
    Ok(())
}

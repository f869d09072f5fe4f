//! The agent's `/metrics`: the latest GPU readings with dcgm-exporter's
//! metric names and labels (`gpu`, `UUID`, `modelName`, `Hostname`) so that
//! existing dashboards work, plus the agent's own `gpuctl_agent_*` gauges,
//! served by the shared endpoint ([`gpuctl_core::metrics_http`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpuctl_core::metrics_http::{self, write_family, Labels};
use gpuctl_core::shutdown::Shutdown;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType::{self, Counter, Gauge};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::telemetry::{GpuReading, Telemetry};
use crate::workers::Workers;

/// Next to dcgm-exporter's 9400, which operators' scrape configs already know;
/// on loopback, since `/metrics` is not authenticated (`--metrics-listen
/// 0.0.0.0:9401` opens it to a Prometheus elsewhere).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9401";

/// What `/metrics` shows besides the GPUs.
#[derive(Debug, Clone)]
pub struct AgentGauges {
    pub node: String,
    pub gpus: u32,
    /// CPU ranks offered (0 when the node runs ranks on GPUs).
    pub cpu_ranks: u32,
    pub workers_running: u64,
    pub coordinator_connected: bool,
}

/// Everything the server reads on each scrape.
pub struct MetricsSource {
    pub node: String,
    /// The node's host name (dcgm-exporter's `Hostname` label).
    pub hostname: String,
    pub gpus: u32,
    pub cpu_ranks: u32,
    pub telemetry: Arc<Telemetry>,
    pub workers: Option<Arc<Workers>>,
    /// Set by the session while it is open.
    pub connected: Arc<AtomicBool>,
}

impl MetricsSource {
    /// The registry of one scrape: a snapshot of the live values.
    pub fn registry(&self) -> Registry {
        let gauges = AgentGauges {
            node: self.node.clone(),
            gpus: self.gpus,
            cpu_ranks: self.cpu_ranks,
            workers_running: self
                .workers
                .as_ref()
                .map(|w| w.live_workers() as u64)
                .unwrap_or(0),
            coordinator_connected: self.connected.load(Ordering::Relaxed),
        };
        registry(&self.hostname, &self.telemetry.latest(), &gauges)
    }
}

type Getter = fn(&GpuReading) -> Option<f64>;

/// (name, type, help, value) of every GPU series, in dcgm-exporter's names,
/// types and units. A GPU without a value (unsupported query) gets no line.
const GPU_METRICS: &[(&str, MetricType, &str, Getter)] = &[
    (
        "DCGM_FI_DEV_GPU_UTIL",
        Gauge,
        "GPU utilization (in %).",
        |r| r.util_gpu.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        Gauge,
        "Memory utilization (in %).",
        |r| r.util_mem.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        Gauge,
        "Framebuffer memory used (in MiB).",
        |r| r.mem_used_bytes.map(mib),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        Gauge,
        "Framebuffer memory free (in MiB).",
        |r| r.mem_free_bytes.map(mib),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        Gauge,
        "GPU temperature (in C).",
        |r| r.temperature_c.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        Gauge,
        "Power draw (in W).",
        |r| r.power_mw.map(|p| p as f64 / 1000.0),
    ),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        Gauge,
        "Enforced power limit (in W).",
        |r| r.power_limit_mw.map(|p| p as f64 / 1000.0),
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        Gauge,
        "SM clock frequency (in MHz).",
        |r| r.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        Gauge,
        "Memory clock frequency (in MHz).",
        |r| r.mem_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        Gauge,
        "Current clock throttle reasons (NVML bitmask).",
        |r| r.throttle_reasons.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        Gauge,
        "Value of the last XID error encountered.",
        |r| Some(r.last_xid.unwrap_or(0) as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        Counter,
        "Total number of single-bit volatile ECC errors.",
        |r| r.ecc_corrected.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        Counter,
        "Total number of double-bit volatile ECC errors.",
        |r| r.ecc_uncorrected.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        Counter,
        "Total number of retired pages due to single-bit errors.",
        |r| r.retired_sbe.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        Counter,
        "Total number of retired pages due to double-bit errors.",
        |r| r.retired_dbe.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        Counter,
        "Number of remapped rows for correctable errors.",
        |r| r.remapped_correctable.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Counter,
        "Number of remapped rows for uncorrectable errors.",
        |r| r.remapped_uncorrectable.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Gauge,
        "Whether remapping of rows has failed (1 = failed).",
        |r| r.remap_failed.map(|b| f64::from(u8::from(b))),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        Counter,
        "Total number of PCIe retries.",
        |r| r.pcie_replays.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        Gauge,
        "Current PCIe link generation.",
        |r| r.pcie_gen.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        Gauge,
        "Current PCIe link width (lanes).",
        |r| r.pcie_width.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        Gauge,
        "Maximum PCIe link generation.",
        |r| r.pcie_gen_max.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        Gauge,
        "Maximum PCIe link width (lanes).",
        |r| r.pcie_width_max.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        Counter,
        "NVLink flow-control CRC errors since the agent started, summed link by link.",
        |r| r.nvlink_crc_flit.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        Counter,
        "NVLink data CRC errors since the agent started, summed link by link.",
        |r| r.nvlink_crc_data.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        Counter,
        "NVLink replay errors since the agent started, summed link by link.",
        |r| r.nvlink_replay.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        Counter,
        "NVLink recovery errors since the agent started, summed link by link.",
        |r| r.nvlink_recovery.map(|v| v as f64),
    ),
    (
        "gpuctl_gpu_nvlinks_active",
        Gauge,
        "Active NVLinks of the GPU.",
        |r| (r.nvlinks_expected > 0).then_some(r.nvlinks_active as f64),
    ),
    (
        "gpuctl_gpu_nvlinks_down",
        Gauge,
        "NVLinks seen active since the agent started that now answer inactive.",
        |r| (r.nvlinks_expected > 0).then_some(r.nvlinks_down as f64),
    ),
    (
        "gpuctl_gpu_nvlinks_unknown",
        Gauge,
        "Known NVLinks whose state NVML did not answer in the last reading.",
        |r| (r.nvlinks_expected > 0).then_some(r.nvlinks_unknown as f64),
    ),
    (
        "gpuctl_gpu_xid_errors_total",
        Counter,
        "XID errors seen since the agent started.",
        |r| Some(r.xid_count as f64),
    ),
];

fn mib(bytes: u64) -> f64 {
    (bytes / (1024 * 1024)) as f64
}

/// One scrape's values, written family by family.
#[derive(Debug)]
struct Exposition {
    hostname: String,
    readings: Vec<GpuReading>,
    agent: AgentGauges,
}

impl Collector for Exposition {
    /// Series of one metric are grouped under one HELP/TYPE pair, GPUs in
    /// NVML index order.
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        for (name, kind, help, get) in GPU_METRICS {
            let series: Vec<(Labels, f64)> = self
                .readings
                .iter()
                .filter_map(|r| get(r).map(|v| (self.gpu_labels(r), v)))
                .collect();
            write_family(&mut e, name, help, *kind, &series)?;
        }
        let a = &self.agent;
        for (name, help, v) in [
            ("gpuctl_agent_up", "1 while the agent runs.", 1.0),
            (
                "gpuctl_agent_workers_running",
                "Worker processes the agent supervises.",
                a.workers_running as f64,
            ),
            (
                "gpuctl_agent_gpus",
                "GPUs NVML lists on this node.",
                a.gpus as f64,
            ),
            (
                "gpuctl_agent_cpu_ranks",
                "CPU ranks offered (0 when ranks run on GPUs).",
                a.cpu_ranks as f64,
            ),
            (
                "gpuctl_agent_coordinator_connected",
                "1 while the session with the coordinator is open.",
                f64::from(u8::from(a.coordinator_connected)),
            ),
        ] {
            write_family(
                &mut e,
                name,
                help,
                Gauge,
                &[(vec![("node", a.node.clone())], v)],
            )?;
        }
        Ok(())
    }
}

impl Exposition {
    fn gpu_labels(&self, r: &GpuReading) -> Labels {
        vec![
            ("gpu", r.index.to_string()),
            ("UUID", r.uuid.clone()),
            ("modelName", r.name.clone()),
            ("Hostname", self.hostname.clone()),
        ]
    }
}

/// The registry of one scrape of `readings` and `agent`.
pub fn registry(hostname: &str, readings: &[GpuReading], agent: &AgentGauges) -> Registry {
    let mut readings = readings.to_vec();
    readings.sort_by_key(|r| r.index);
    let mut r = Registry::default();
    r.register_collector(Box::new(Exposition {
        hostname: hostname.to_string(),
        readings,
        agent: agent.clone(),
    }));
    r
}

/// The whole exposition, as a scrape gets it.
pub fn render(hostname: &str, readings: &[GpuReading], agent: &AgentGauges) -> String {
    metrics_http::encode(&registry(hostname, readings, agent))
}

/// Binds `listen` and serves until `shutdown`; returns the bound address
/// (which the caller logs: `127.0.0.1:0` picks a free port).
pub async fn serve(
    listen: &str,
    source: Arc<MetricsSource>,
    shutdown: Shutdown,
    tls: Option<gpuctl_core::metrics_tls::TlsConfig>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let scrape = move || {
        let registry = source.registry();
        async move { Ok(registry) }
    };
    tokio::spawn(async move {
        if let Err(e) = metrics_http::serve(listener, scrape, shutdown, tls).await {
            tracing::warn!("metrics server stopped: {e}");
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn h200(index: u32) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-0000{index}"),
            name: "NVIDIA H200".into(),
            util_gpu: Some(97),
            util_mem: Some(40),
            mem_used_bytes: Some(80 * 1024 * 1024 * 1024),
            mem_free_bytes: Some(63 * 1024 * 1024 * 1024 + 512 * 1024 * 1024),
            mem_total_bytes: Some(144 * 1024 * 1024 * 1024),
            temperature_c: Some(61),
            power_mw: Some(612_345),
            power_limit_mw: Some(700_000),
            sm_clock_mhz: Some(1980),
            mem_clock_mhz: Some(3201),
            throttle_reasons: Some(0x4),
            ecc_corrected: Some(3),
            ecc_uncorrected: Some(0),
            remapped_correctable: Some(1),
            remapped_uncorrectable: Some(0),
            remap_failed: Some(false),
            pcie_gen: Some(5),
            pcie_width: Some(16),
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            pcie_replays: Some(2),
            nvlinks_active: 18,
            nvlinks_expected: 18,
            nvlink_crc_flit: Some(7),
            nvlink_crc_data: Some(0),
            last_xid: if index == 1 { Some(79) } else { None },
            xid_count: if index == 1 { 2 } else { 0 },
            ..Default::default()
        }
    }

    fn gauges() -> AgentGauges {
        AgentGauges {
            node: "gpu-07".into(),
            gpus: 2,
            cpu_ranks: 0,
            workers_running: 2,
            coordinator_connected: true,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix} in\n{text}"))
    }

    #[test]
    fn dcgm_names_labels_and_units() {
        let text = render("host-a", &[h200(1), h200(0)], &gauges());
        let l = r#"{gpu="0",UUID="GPU-00000",modelName="NVIDIA H200",Hostname="host-a"}"#;
        assert_eq!(
            line(&text, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\""),
            format!("DCGM_FI_DEV_GPU_UTIL{l} 97")
        );
        assert_eq!(
            line(&text, "DCGM_FI_DEV_FB_USED{gpu=\"0\""),
            format!("DCGM_FI_DEV_FB_USED{l} 81920")
        );
        assert_eq!(
            line(&text, "DCGM_FI_DEV_FB_FREE{gpu=\"0\""),
            format!("DCGM_FI_DEV_FB_FREE{l} 65024")
        );
        assert_eq!(
            line(&text, "DCGM_FI_DEV_POWER_USAGE{gpu=\"0\""),
            format!("DCGM_FI_DEV_POWER_USAGE{l} 612.345")
        );
        assert!(line(&text, "DCGM_FI_DEV_XID_ERRORS{gpu=\"1\"").ends_with(" 79"));
        assert!(line(&text, "DCGM_FI_DEV_XID_ERRORS{gpu=\"0\"").ends_with(" 0"));
        assert!(line(
            &text,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu=\"0\""
        )
        .ends_with(" 7"));
        assert!(line(&text, "DCGM_FI_DEV_PCIE_LINK_GEN{gpu=\"1\"").ends_with(" 5"));
        assert!(line(&text, "DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=\"0\"").ends_with(" 0"));
        // One HELP and TYPE per metric, before its series, GPUs in order.
        assert_eq!(text.matches("# TYPE DCGM_FI_DEV_GPU_TEMP gauge").count(), 1);
        assert!(text.contains("# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter\n"));
        let help = text.find("# HELP DCGM_FI_DEV_GPU_TEMP").unwrap();
        let g0 = text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"").unwrap();
        let g1 = text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\"").unwrap();
        assert!(help < g0 && g0 < g1);
        // Unsupported queries give no series at all.
        assert!(!text.contains("DCGM_FI_DEV_RETIRED_SBE"), "{text}");
        for (name, v) in [
            ("gpuctl_agent_up", "1"),
            ("gpuctl_agent_workers_running", "2"),
            ("gpuctl_agent_gpus", "2"),
            ("gpuctl_agent_cpu_ranks", "0"),
            ("gpuctl_agent_coordinator_connected", "1"),
        ] {
            assert_eq!(
                line(&text, &format!("{name}{{")),
                format!("{name}{{node=\"gpu-07\"}} {v}")
            );
            assert!(text.contains(&format!("# TYPE {name} gauge\n")));
        }
        // Every non-comment line is `name{labels} number`.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = l.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
    }

    #[test]
    fn cpu_host_has_only_agent_gauges_and_labels_are_escaped() {
        let mut g = gauges();
        g.node = "we\"ird\\node".into();
        g.gpus = 0;
        g.cpu_ranks = 4;
        g.coordinator_connected = false;
        let text = render("h", &[], &g);
        assert!(!text.contains("DCGM_"));
        assert_eq!(
            line(&text, "gpuctl_agent_cpu_ranks{"),
            r#"gpuctl_agent_cpu_ranks{node="we\"ird\\node"} 4"#
        );
        assert!(line(&text, "gpuctl_agent_coordinator_connected{").ends_with(" 0"));
    }

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .expect("no answer in 5 s")
            .unwrap();
        out
    }

    #[tokio::test]
    async fn server_answers_a_scrape() {
        let telemetry = Telemetry::new(None, Vec::new());
        telemetry.store(&[h200(0)]);
        let connected = Arc::new(AtomicBool::new(false));
        let source = Arc::new(MetricsSource {
            node: "n1".into(),
            hostname: "host-a".into(),
            gpus: 1,
            cpu_ranks: 0,
            telemetry,
            workers: None,
            connected: connected.clone(),
        });
        let stop = Shutdown::new();
        let addr = serve("127.0.0.1:0", source, stop.clone(), None)
            .await
            .unwrap();
        assert_ne!(addr.port(), 0);

        // `Connection: close`: the server keeps HTTP/1.1 connections open otherwise.
        let resp = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        )
        .await;
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        // prometheus-client writes OpenMetrics text; hyper writes header names in lower case.
        assert!(
            head.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(body.contains("gpuctl_agent_up{node=\"n1\"} 1\n"), "{body}");
        assert!(body.contains("gpuctl_agent_coordinator_connected{node=\"n1\"} 0\n"));
        assert!(body.contains(
            "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-00000\",modelName=\"NVIDIA H200\",Hostname=\"host-a\"} 61\n"
        ));

        connected.store(true, Ordering::Relaxed);
        let resp = get(addr, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert!(resp.contains("gpuctl_agent_coordinator_connected{node=\"n1\"} 1\n"));

        let resp = get(addr, "GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
        let resp = get(
            addr,
            "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");

        stop.cancel();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener closes on shutdown"
        );
    }
}

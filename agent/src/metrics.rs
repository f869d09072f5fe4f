//! The agent's HTTP `/metrics` endpoint: Prometheus text exposition (format
//! 0.0.4) of the latest GPU readings, with dcgm-exporter's metric names and
//! labels (`gpu`, `UUID`, `modelName`, `Hostname`) so that existing
//! dashboards work, plus the agent's own `gpuctl_agent_*` gauges.
//!
//! A deliberately tiny HTTP/1.1 server on a tokio `TcpListener`: one request
//! per connection, `GET /metrics` (and `/` pointing to it), nothing else.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::telemetry::{GpuReading, Telemetry};
use crate::workers::Workers;

/// The dcgm-exporter port, which operators' scrape configs already know.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9401";
/// Requests larger than this are refused (a scrape is a few hundred bytes).
const MAX_REQUEST_BYTES: usize = 16 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What `/metrics` shows besides the GPUs.
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
    pub fn render(&self) -> String {
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
        render(&self.hostname, &self.telemetry.latest(), &gauges)
    }
}

type Getter = fn(&GpuReading) -> Option<f64>;

/// (name, type, help, value) of every GPU series, in dcgm-exporter's names
/// and units. A GPU without a value (unsupported query) gets no line.
const GPU_METRICS: &[(&str, &str, &str, Getter)] = &[
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        |r| r.util_gpu.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        |r| r.util_mem.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        |r| r.mem_used_bytes.map(mib),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        |r| r.mem_free_bytes.map(mib),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        |r| r.temperature_c.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "Power draw (in W).",
        |r| r.power_mw.map(|p| p as f64 / 1000.0),
    ),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Enforced power limit (in W).",
        |r| r.power_limit_mw.map(|p| p as f64 / 1000.0),
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        |r| r.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        |r| r.mem_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (NVML bitmask).",
        |r| r.throttle_reasons.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        |r| Some(r.last_xid.unwrap_or(0) as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        |r| r.ecc_corrected.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        |r| r.ecc_uncorrected.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        "counter",
        "Total number of retired pages due to single-bit errors.",
        |r| r.retired_sbe.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        "counter",
        "Total number of retired pages due to double-bit errors.",
        |r| r.retired_dbe.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors.",
        |r| r.remapped_correctable.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors.",
        |r| r.remapped_uncorrectable.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed (1 = failed).",
        |r| r.remap_failed.map(|b| f64::from(u8::from(b))),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        |r| r.pcie_replays.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "gauge",
        "Current PCIe link generation.",
        |r| r.pcie_gen.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gauge",
        "Current PCIe link width (lanes).",
        |r| r.pcie_width.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "gauge",
        "Maximum PCIe link generation.",
        |r| r.pcie_gen_max.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "gauge",
        "Maximum PCIe link width (lanes).",
        |r| r.pcie_width_max.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        |r| r.nvlink_crc_flit.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
        |r| r.nvlink_crc_data.map(|v| v as f64),
    ),
    (
        "gpuctl_gpu_nvlinks_active",
        "gauge",
        "Active NVLinks of the GPU.",
        |r| (r.nvlinks_expected > 0).then_some(r.nvlinks_active as f64),
    ),
    (
        "gpuctl_gpu_xid_errors_total",
        "counter",
        "XID errors seen since the agent started.",
        |r| Some(r.xid_count as f64),
    ),
];

fn mib(bytes: u64) -> f64 {
    (bytes / (1024 * 1024)) as f64
}

/// Prometheus label value escaping: backslash, double quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Integers without a fraction, the rest as Rust prints them.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The whole exposition. Series of one metric are grouped under one
/// HELP/TYPE pair, GPUs in NVML index order.
pub fn render(hostname: &str, readings: &[GpuReading], agent: &AgentGauges) -> String {
    let mut out = String::with_capacity(4096);
    let mut readings: Vec<&GpuReading> = readings.iter().collect();
    readings.sort_by_key(|r| r.index);
    for (name, kind, help, get) in GPU_METRICS {
        let values: Vec<(&GpuReading, f64)> = readings
            .iter()
            .filter_map(|r| get(r).map(|v| (*r, v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (r, v) in values {
            let _ = writeln!(
                out,
                "{name}{{gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",Hostname=\"{}\"}} {}",
                r.index,
                escape(&r.uuid),
                escape(&r.name),
                escape(hostname),
                num(v)
            );
        }
    }
    let node = escape(&agent.node);
    let gauges: [(&str, &str, f64); 5] = [
        ("gpuctl_agent_up", "1 while the agent runs.", 1.0),
        (
            "gpuctl_agent_workers_running",
            "Worker processes the agent supervises.",
            agent.workers_running as f64,
        ),
        (
            "gpuctl_agent_gpus",
            "GPUs NVML lists on this node.",
            agent.gpus as f64,
        ),
        (
            "gpuctl_agent_cpu_ranks",
            "CPU ranks offered (0 when ranks run on GPUs).",
            agent.cpu_ranks as f64,
        ),
        (
            "gpuctl_agent_coordinator_connected",
            "1 while the session with the coordinator is open.",
            if agent.coordinator_connected {
                1.0
            } else {
                0.0
            },
        ),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{node=\"{node}\"}} {}", num(v));
    }
    out
}

/// Binds `listen` and serves until `shutdown`; returns the bound address
/// (which the caller logs: `127.0.0.1:0` picks a free port).
pub async fn serve(
    listen: &str,
    source: Arc<MetricsSource>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => break,
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!("metrics accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let source = source.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, &source)).await;
            });
        }
    });
    Ok(addr)
}

async fn handle(mut stream: TcpStream, source: &MetricsSource) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST_BYTES {
            return respond(
                &mut stream,
                "413 Payload Too Large",
                "text/plain",
                "request too large\n",
                true,
            )
            .await;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let mut parts = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head = method == "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = source.render();
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
                head,
            )
            .await
        }
        ("GET" | "HEAD", "/") => {
            respond(
                &mut stream,
                "200 OK",
                "text/plain; charset=utf-8",
                "gpuctl-agent: metrics at /metrics\n",
                head,
            )
            .await
        }
        ("GET" | "HEAD", _) => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "not found; try /metrics\n",
                head,
            )
            .await
        }
        _ => {
            respond(
                &mut stream,
                "405 Method Not Allowed",
                "text/plain",
                "only GET\n",
                false,
            )
            .await
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let stop = CancellationToken::new();
        let addr = serve("127.0.0.1:0", source, stop.clone()).await.unwrap();
        assert_ne!(addr.port(), 0);

        let resp = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
        )
        .await;
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
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

        let resp = get(addr, "GET /nope HTTP/1.1\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
        let resp = get(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");

        stop.cancel();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener closes on shutdown"
        );
    }
}

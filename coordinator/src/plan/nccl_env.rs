//! The NCCL side of a plan, from every chosen node's facts: which variables
//! the workers get and why (`NCCL_IB_DISABLE`, `NCCL_SOCKET_IFNAME`), whether
//! the nodes agree on what must match across a job (NCCL, libtorch, driver),
//! and whether the user's `--env` overrides can work on these nodes. One
//! environment goes to every node, so a setting that suits only some of them
//! is refused here rather than hanging NCCL at start.

use std::collections::{BTreeMap, HashMap};

use gpuctl_proto::pb::{EnvVar, Node, PreflightCheck, Verdict};

use super::check;

/// Interfaces other hosts cannot reach: never proposed to NCCL.
const LOCAL_ONLY_IFACES: &[&str] = &["lo", "docker", "veth", "virbr", "br-"];

/// Variables that NCCL documents (2.2x); others named `NCCL_*` get a warning,
/// since NCCL ignores a misspelt one without a word.
const KNOWN_NCCL: &[&str] = &[
    "NCCL_ALGO",
    "NCCL_BUFFSIZE",
    "NCCL_CGA_CLUSTER_SIZE",
    "NCCL_CHECK_POINTERS",
    "NCCL_CHECKS_DISABLE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_COLLNET_NODE_THRESHOLD",
    "NCCL_COMM_BLOCKING",
    "NCCL_COMM_ID",
    "NCCL_CONF_FILE",
    "NCCL_CREATE_THREAD_CONTEXT",
    "NCCL_CROSS_NIC",
    "NCCL_CTA_POLICY",
    "NCCL_CUMEM_ENABLE",
    "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_TIMESTAMP_FORMAT",
    "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_DMABUF_ENABLE",
    "NCCL_ENV_PLUGIN",
    "NCCL_GDRCOPY_ENABLE",
    "NCCL_GDRCOPY_FLUSH_ENABLE",
    "NCCL_GDRCOPY_SYNC_ENABLE",
    "NCCL_GRAPH_MIXING_SUPPORT",
    "NCCL_GRAPH_REGISTER",
    "NCCL_HOSTID",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_AR_THRESHOLD",
    "NCCL_IB_CUDA_SUPPORT",
    "NCCL_IB_DISABLE",
    "NCCL_IB_ECE_ENABLE",
    "NCCL_IB_FIFO_TC",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_HCA",
    "NCCL_IB_MERGE_NICS",
    "NCCL_IB_MERGE_VFS",
    "NCCL_IB_MQP_RETRY_ALL",
    "NCCL_IB_MQP_RETRY_CNT",
    "NCCL_IB_MQP_RETRY_SLEEP_MSEC",
    "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_IB_PKEY",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_RETURN_ASYNC_EVENTS",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_SL",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_TC",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_USE_INLINE",
    "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_LAUNCH_MODE",
    "NCCL_LEGACY_CUDA_REGISTER",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_LL128_NTHREADS",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL_THRESHOLD",
    "NCCL_LOCAL_REGISTER",
    "NCCL_MAX_CTAS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MAX_P2P_NCHANNELS",
    "NCCL_MAX_RINGS",
    "NCCL_MIN_CTAS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MIN_P2P_NCHANNELS",
    "NCCL_MIN_RINGS",
    "NCCL_MNNVL_CLIQUE_ID",
    "NCCL_MNNVL_ENABLE",
    "NCCL_MNNVL_UUID",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_NCHANNELS_PER_PEER",
    "NCCL_NET",
    "NCCL_NET_DISABLE_INTRA",
    "NCCL_NET_FORCE_FLUSH",
    "NCCL_NET_GDR_C2C",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_NET_MERGE_LEVEL",
    "NCCL_NET_OVERHEAD",
    "NCCL_NET_PLUGIN",
    "NCCL_NET_SHARED_BUFFERS",
    "NCCL_NET_SHARED_COMMS",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_NTHREADS",
    "NCCL_NVB_DISABLE",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_NVLS_ENABLE",
    "NCCL_NVLS_NCHANNELS",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE",
    "NCCL_OOB_NET_ENABLE",
    "NCCL_OOB_NET_IFNAME",
    "NCCL_P2P_DIRECT_DISABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_LL_THRESHOLD",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_READ_ENABLE",
    "NCCL_P2P_USE_CUDA_MEMCPY",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_PROTO",
    "NCCL_PROXY_APPEND_BATCH_SIZE",
    "NCCL_PXN_C2C",
    "NCCL_PXN_DISABLE",
    "NCCL_RAS_ADDR",
    "NCCL_RAS_ENABLE",
    "NCCL_RAS_TIMEOUT_FACTOR",
    "NCCL_RUNTIME_CONNECT",
    "NCCL_SET_THREAD_NAME",
    "NCCL_SHM_DISABLE",
    "NCCL_SHM_LOCALITY",
    "NCCL_SHM_MEMCPY_MODE",
    "NCCL_SHM_USE_CUDA_MEMCPY",
    "NCCL_SINGLE_RING_THRESHOLD",
    "NCCL_SOCKET_FAMILY",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_TOPO_FILE",
    "NCCL_TREE_THRESHOLD",
    "NCCL_TUNER_PLUGIN",
    "NCCL_UID_STAGGER_RATE",
    "NCCL_UID_STAGGER_THRESHOLD",
    "NCCL_WIN_ENABLE",
    "NCCL_WORK_FIFO_BYTES",
    "NCCL_WORK_FIFO_DEPTH",
];

/// Check names this module produces; `env`, `nccl-version` and
/// `torch-version` failures stop a job from starting.
pub const ENV_CHECK: &str = "env";
pub const NCCL_VERSION_CHECK: &str = "nccl-version";
pub const TORCH_VERSION_CHECK: &str = "torch-version";
pub const SOCKET_IFNAME_CHECK: &str = "socket-ifname";

fn list(names: &[&str]) -> String {
    gpuctl_core::listing::names(names)
}

/// Nodes without an InfiniBand device that has an ACTIVE port (the agent
/// lists only those in `ib_devices`).
fn without_ib<'a>(nodes: &[&'a Node]) -> Vec<&'a str> {
    nodes
        .iter()
        .filter(|n| n.facts.as_ref().is_none_or(|f| f.ib_devices.is_empty()))
        .map(|n| n.name.as_str())
        .collect()
}

fn reachable_ifaces(n: &Node) -> Vec<&str> {
    n.facts
        .as_ref()
        .map(|f| {
            f.interfaces
                .iter()
                .map(|i| i.name.as_str())
                .filter(|name| !LOCAL_ONLY_IFACES.iter().any(|p| name.starts_with(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// The planned NCCL variables, with a reason each, and notes about what could
/// not be planned.
pub fn planned(nodes: &[&Node]) -> (Vec<EnvVar>, Vec<PreflightCheck>) {
    let mut env = Vec::new();
    let mut notes = Vec::new();
    let no_ib = without_ib(nodes);
    if !no_ib.is_empty() {
        env.push(EnvVar {
            name: "NCCL_IB_DISABLE".into(),
            value: "1".into(),
            reason: format!(
                "{} {} no InfiniBand device with an ACTIVE port; NCCL must not try IB on any node",
                list(&no_ib),
                if no_ib.len() == 1 { "has" } else { "have" }
            ),
        });
    }
    if nodes.is_empty() {
        return (env, notes);
    }
    let per_node: Vec<(&str, Vec<&str>)> = nodes
        .iter()
        .map(|n| (n.name.as_str(), reachable_ifaces(n)))
        .collect();
    let unknown: Vec<&str> = per_node
        .iter()
        .filter(|(_, i)| i.is_empty())
        .map(|(n, _)| *n)
        .collect();
    // In the first node's order: the agent lists the best interface first.
    let common: Vec<&str> = per_node[0]
        .1
        .iter()
        .copied()
        .filter(|i| per_node.iter().all(|(_, ifs)| ifs.contains(i)))
        .collect();
    if !common.is_empty() {
        env.push(EnvVar {
            name: "NCCL_SOCKET_IFNAME".into(),
            // `=`: exact names, so `eth0` does not also match `eth0.100`.
            value: format!("={}", common.join(",")),
            reason: format!(
                "{} on every chosen node; keeps NCCL's bootstrap and socket traffic off container bridges and interfaces other nodes cannot reach",
                if common.len() == 1 { format!("interface {}", common[0]) } else { format!("interfaces {}", common.join(", ")) }
            ),
        });
    } else if nodes.len() > 1 {
        let detail = if !unknown.is_empty() {
            format!(
                "NCCL_SOCKET_IFNAME not set: {} reported no network interface",
                list(&unknown)
            )
        } else {
            let shown: Vec<String> = per_node
                .iter()
                .take(4)
                .map(|(n, i)| format!("{n}: {}", i.join(", ")))
                .collect();
            format!(
                "NCCL_SOCKET_IFNAME not set: no interface name is common to every node ({}); NCCL picks one on each node",
                shown.join("; ")
            )
        };
        notes.push(check(
            "",
            SOCKET_IFNAME_CHECK,
            Verdict::Warn,
            detail,
            "name interfaces alike on every node, or pass --env NCCL_SOCKET_IFNAME=^docker,lo to exclude the bad ones",
        ));
    }
    (env, notes)
}

/// Names of nodes grouped by a fact's value (empty values are unknown, skipped).
fn by_value<'a>(nodes: &[&'a Node], f: impl Fn(&Node) -> String) -> BTreeMap<String, Vec<&'a str>> {
    let mut m: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for n in nodes {
        let v = f(n);
        if !v.is_empty() {
            m.entry(v).or_default().push(n.name.as_str());
        }
    }
    m
}

fn groups(m: &BTreeMap<String, Vec<&str>>) -> String {
    m.iter()
        .map(|(v, ns)| format!("{v} ({})", list(ns)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Facts that must agree across a job's nodes. NCCL and libtorch differences
/// break collectives (protocol changes between NCCL releases hang them) and
/// make results incomparable: fail. Drivers may differ within a branch: warn.
pub fn consistency(nodes: &[&Node]) -> Vec<PreflightCheck> {
    let fact = |f: fn(&gpuctl_proto::pb::HostFacts) -> &String| {
        move |n: &Node| n.facts.as_ref().map(|x| f(x).clone()).unwrap_or_default()
    };
    let mut out = Vec::new();
    for (name, verdict, what, get, fix) in [
        (
            NCCL_VERSION_CHECK,
            Verdict::Fail,
            "NCCL versions",
            fact(|f| &f.nccl_version),
            "install the same NCCL on every node (the one PyTorch ships), or select matching nodes with --selector",
        ),
        (
            TORCH_VERSION_CHECK,
            Verdict::Fail,
            "libtorch versions",
            fact(|f| &f.torch_version),
            "install the same PyTorch/libtorch on every node, or select matching nodes with --selector",
        ),
        (
            "driver",
            Verdict::Warn,
            "NVIDIA drivers",
            fact(|f| &f.driver_version),
            "install the same driver on every node",
        ),
    ] {
        let m = by_value(nodes, get);
        if m.len() > 1 {
            out.push(check(
                "",
                name,
                verdict,
                format!("different {what}: {}", groups(&m)),
                fix,
            ));
        }
    }
    out
}

/// The user's `--env` values checked against the nodes, like the planned ones.
pub fn check_overrides(user: &HashMap<String, String>, nodes: &[&Node]) -> Vec<PreflightCheck> {
    let mut out = Vec::new();
    let mut names: Vec<&String> = user.keys().collect();
    names.sort();
    for name in names {
        let value = user[name].trim();
        match name.as_str() {
            "NCCL_IB_DISABLE" if value != "1" => {
                let no_ib = without_ib(nodes);
                if !no_ib.is_empty() {
                    out.push(check(
                        "",
                        ENV_CHECK,
                        Verdict::Fail,
                        format!(
                            "--env NCCL_IB_DISABLE={value} lets NCCL try InfiniBand, but {} {} no InfiniBand device with an ACTIVE port",
                            list(&no_ib),
                            if no_ib.len() == 1 { "has" } else { "have" }
                        ),
                        "drop --env NCCL_IB_DISABLE, or select nodes with InfiniBand (--selector)",
                    ));
                }
            }
            "NCCL_SOCKET_IFNAME" => out.extend(check_ifname(value, nodes)),
            "NCCL_DEBUG"
                if !["VERSION", "WARN", "INFO", "TRACE", "ABORT"]
                    .contains(&value.to_ascii_uppercase().as_str()) =>
            {
                out.push(check(
                    "",
                    ENV_CHECK,
                    Verdict::Warn,
                    format!("--env NCCL_DEBUG={value} is not a level NCCL knows"),
                    "use VERSION, WARN, INFO or TRACE",
                ))
            }
            n if n.starts_with("NCCL_") && !KNOWN_NCCL.contains(&n) => out.push(check(
                "",
                ENV_CHECK,
                Verdict::Warn,
                format!("--env {n} is not a variable NCCL documents; NCCL ignores unknown names without a word"),
                "check the spelling against NCCL's environment variable list",
            )),
            _ => {}
        }
    }
    out
}

/// `NCCL_SOCKET_IFNAME` from the user: each node must have an interface it
/// selects (names are prefixes, `=` makes them exact, `^` excludes).
fn check_ifname(value: &str, nodes: &[&Node]) -> Vec<PreflightCheck> {
    if value.starts_with('^') || value.is_empty() {
        return Vec::new();
    }
    let (exact, body) = match value.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let wanted: Vec<&str> = body
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = Vec::new();
    for n in nodes {
        let have: Vec<&str> = n
            .facts
            .as_ref()
            .map(|f| f.interfaces.iter().map(|i| i.name.as_str()).collect())
            .unwrap_or_default();
        if have.is_empty() {
            continue; // the agent did not report interfaces: nothing to check against
        }
        let ok = have.iter().any(|h| {
            wanted
                .iter()
                .any(|w| if exact { h == w } else { h.starts_with(w) })
        });
        if !ok {
            out.push(check(
                &n.name,
                ENV_CHECK,
                Verdict::Fail,
                format!(
                    "--env NCCL_SOCKET_IFNAME={value} selects no interface on {} (it has {})",
                    n.name,
                    have.join(", ")
                ),
                "name an interface every node has (`gpuctl nodes -o json` lists them), or leave NCCL_SOCKET_IFNAME to the plan",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{HostFacts, NetInterface};

    fn node(name: &str, ib: bool, ifaces: &[&str], nccl: &str, torch: &str, driver: &str) -> Node {
        Node {
            name: name.into(),
            facts: Some(HostFacts {
                ib_devices: if ib { vec!["mlx5_0".into()] } else { vec![] },
                interfaces: ifaces
                    .iter()
                    .map(|i| NetInterface {
                        name: (*i).into(),
                        ipv4: "10.0.0.1".into(),
                        ..Default::default()
                    })
                    .collect(),
                nccl_version: nccl.into(),
                torch_version: torch.into(),
                driver_version: driver.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn env_of(env: &[EnvVar], name: &str) -> Option<(String, String)> {
        env.iter()
            .find(|e| e.name == name)
            .map(|e| (e.value.clone(), e.reason.clone()))
    }

    #[test]
    fn ib_and_socket_ifname_come_from_every_node() {
        let a = node("a", true, &["eth0", "ib0", "docker0"], "", "", "");
        let b = node("b", false, &["eth0", "docker0", "eth1"], "", "", "");
        let (env, notes) = planned(&[&a, &b]);
        let (v, why) = env_of(&env, "NCCL_IB_DISABLE").unwrap();
        assert_eq!(v, "1");
        assert!(why.starts_with("b has no InfiniBand"), "{why}");
        let (v, why) = env_of(&env, "NCCL_SOCKET_IFNAME").unwrap();
        assert_eq!(v, "=eth0", "docker0 is on both but reaches no other host");
        assert!(why.contains("eth0"), "{why}");
        assert!(notes.is_empty());

        let c = node("c", true, &["eth0", "ens5"], "", "", "");
        let d = node("d", true, &["ens5", "eth0"], "", "", "");
        let (env, _) = planned(&[&c, &d]);
        assert!(env_of(&env, "NCCL_IB_DISABLE").is_none());
        assert_eq!(env_of(&env, "NCCL_SOCKET_IFNAME").unwrap().0, "=eth0,ens5");

        // Nothing in common: omitted, with a note naming each node's interfaces.
        let e = node("e", true, &["enp1s0"], "", "", "");
        let (env, notes) = planned(&[&c, &e]);
        assert!(env_of(&env, "NCCL_SOCKET_IFNAME").is_none());
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].verdict(), Verdict::Warn);
        assert!(notes[0].detail.contains("e: enp1s0"), "{}", notes[0].detail);
        let silent = node("s", true, &[], "", "", "");
        let (_, notes) = planned(&[&c, &silent]);
        assert!(notes[0].detail.contains("s reported no network interface"));
    }

    #[test]
    fn versions_must_agree_drivers_may_differ() {
        let a = node("a", true, &[], "2.28.9", "2.11.0", "580.1");
        let b = node("b", true, &[], "2.28.9", "2.11.0", "580.2");
        let c = node("c", true, &[], "2.27.3", "2.10.0", "580.1");
        let x = consistency(&[&a, &b]);
        assert_eq!(x.len(), 1);
        assert_eq!(
            (x[0].name.as_str(), x[0].verdict()),
            ("driver", Verdict::Warn)
        );
        let x = consistency(&[&a, &b, &c]);
        let got: Vec<(&str, Verdict)> = x.iter().map(|c| (c.name.as_str(), c.verdict())).collect();
        assert_eq!(
            got,
            vec![
                (NCCL_VERSION_CHECK, Verdict::Fail),
                (TORCH_VERSION_CHECK, Verdict::Fail),
                ("driver", Verdict::Warn)
            ]
        );
        assert!(x[0].detail.contains("2.27.3 (c)") && x[0].detail.contains("2.28.9 (a, b)"));
        // Unknown (empty) versions do not count as different.
        let d = node("d", true, &[], "", "", "");
        assert!(consistency(&[&a, &d]).is_empty());
    }

    #[test]
    fn overrides_are_checked_like_the_plan() {
        let a = node("a", true, &["eth0"], "", "", "");
        let b = node("b", false, &["ens5"], "", "", "");
        let user = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let x = check_overrides(&user(&[("NCCL_IB_DISABLE", "0")]), &[&a, &b]);
        assert_eq!(x.len(), 1);
        assert_eq!(x[0].verdict(), Verdict::Fail);
        assert!(
            x[0].detail.contains("b has no InfiniBand"),
            "{}",
            x[0].detail
        );
        assert!(check_overrides(&user(&[("NCCL_IB_DISABLE", "0")]), &[&a]).is_empty());
        assert!(check_overrides(&user(&[("NCCL_IB_DISABLE", "1")]), &[&a, &b]).is_empty());

        let x = check_overrides(&user(&[("NCCL_SOCKET_IFNAME", "eth")]), &[&a, &b]);
        assert_eq!(x.len(), 1);
        assert_eq!((x[0].node.as_str(), x[0].verdict()), ("b", Verdict::Fail));
        assert!(x[0].detail.contains("it has ens5"), "{}", x[0].detail);
        assert!(check_overrides(&user(&[("NCCL_SOCKET_IFNAME", "eth,ens")]), &[&a, &b]).is_empty());
        assert_eq!(
            check_overrides(&user(&[("NCCL_SOCKET_IFNAME", "=eth")]), &[&a]).len(),
            1,
            "= means exact names"
        );
        assert!(check_overrides(&user(&[("NCCL_SOCKET_IFNAME", "^docker")]), &[&a, &b]).is_empty());

        let x = check_overrides(
            &user(&[
                ("NCCL_DEBUGG", "INFO"),
                ("NCCL_DEBUG", "info"),
                ("OMP_NUM_THREADS", "4"),
            ]),
            &[&a],
        );
        assert_eq!(x.len(), 1);
        assert_eq!(x[0].verdict(), Verdict::Warn);
        assert!(x[0].detail.contains("NCCL_DEBUGG"));
    }
}

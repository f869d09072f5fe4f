//! `gpuctl local up --netns`: one network namespace per agent on one bridge, so
//! that a fleet on one box talks over real interfaces. Agent `local-i` lives in
//! namespace `gpl-local-i` behind a veth pair: the host end is `gpl-local-i`
//! (on bridge `gpl-br0`, where an operator can `tc` it), the namespace end is
//! `eth0` in every namespace (so the planner finds one interface name common to
//! all nodes). The subnet 10.213.0.0/24 exists only on this bridge: the
//! coordinator listens on 10.213.0.1, agent i is 10.213.0.(10+i), and the
//! namespaces get no default route, so nothing leaves the machine.
//!
//! Everything is done with iproute2's `ip`, and everything it creates is named
//! `gpl-…`: leftovers of a crashed run are found by that prefix and removed at
//! the next start. A lock file keeps two runs from tearing down each other's.

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

/// Prefix of every name this module creates (links and namespaces).
pub const PREFIX: &str = "gpl-";
pub const BRIDGE: &str = "gpl-br0";
/// Inside each namespace, the agent's end of its veth pair.
pub const INNER_IF: &str = "eth0";
/// Agent addresses are .10 .. .73 of one /24, and `gpl-local-63` fits the
/// kernel's 15-character interface names.
pub const MAX_AGENTS: u32 = 64;
const HOST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
const PREFIX_LEN: u8 = 24;
const LOCK_FILE: &str = "gpuctl-local-netns.lock";

const NEEDS: &str = "local up --netns needs root and iproute2 (`ip`) on a kernel with network namespaces, veth and bridge support";

/// The coordinator's address: the bridge's, reachable from the host and from
/// every namespace.
pub fn host_addr() -> Ipv4Addr {
    HOST_ADDR
}

pub fn agent_addr(i: u32) -> Ipv4Addr {
    let [a, b, c, _] = HOST_ADDR.octets();
    Ipv4Addr::new(a, b, c, 10 + i as u8)
}

/// The namespace of agent `name`, also the name of its host-side link.
pub fn namespace_of(agent: &str) -> String {
    format!("{PREFIX}{agent}")
}

/// Runs `ip ARGS`; the error names the command and what `--netns` needs.
fn ip(args: &[&str]) -> Result<String> {
    let shown = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| anyhow!("cannot run `{shown}`: {e}; {NEEDS}"))?;
    if !out.status.success() {
        bail!(
            "`{shown}` failed ({}): {}; {NEEDS}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Link names from `ip -o link show` (`5: gpl-local-0@if2: <...>` → `gpl-local-0`).
fn parse_links(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect()
}

/// Namespace names from `ip netns list` (`gpl-local-0 (id: 0)` → `gpl-local-0`).
fn parse_namespaces(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn ours(names: Vec<String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| n.starts_with(PREFIX))
        .collect()
}

/// Removes every link and namespace named `gpl-…`; returns what it removed.
/// Links go first: a namespace whose processes still run (a crashed run's
/// agents) outlives `ip netns del`, and so would its veth pair.
pub fn remove_leftovers() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let links = ours(parse_links(&ip(&["-o", "link", "show"])?));
    // Veth host ends before the bridge, so the bridge is not busy.
    let bridge_last = links
        .iter()
        .filter(|l| *l != BRIDGE)
        .chain(links.iter().filter(|l| *l == BRIDGE));
    for l in bridge_last {
        // Removing one end of a pair removes the other; a failure here shows
        // again, with its cause, when the same name is created.
        if ip(&["link", "del", l]).is_ok() {
            removed.push(format!("link {l}"));
        }
    }
    for ns in ours(parse_namespaces(&ip(&["netns", "list"])?)) {
        ip(&["netns", "del", &ns])?;
        removed.push(format!("namespace {ns}"));
    }
    Ok(removed)
}

/// The namespaces, links and bridge of one `local up --netns`; removed on
/// [`Network::teardown`] or drop.
pub struct Network {
    agents: Vec<String>,
    up: bool,
    // Held (flock) while this run owns the `gpl-` names; the kernel drops it
    // when the process dies, so a crash never leaves it taken.
    _lock: File,
}

impl Network {
    /// Takes the lock, removes leftovers of earlier runs, then builds the
    /// bridge and one namespace per agent name.
    pub fn create(agents: &[String]) -> Result<Network> {
        if agents.len() > MAX_AGENTS as usize {
            bail!(
                "--netns takes at most {MAX_AGENTS} agents (interface names and addresses run out)"
            );
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("{NEEDS}; run it as root (e.g. with sudo)");
        }
        let lock = take_lock()?;
        let removed = remove_leftovers()?;
        if !removed.is_empty() {
            eprintln!(
                "removed leftovers of an earlier `local up --netns`: {}",
                removed.join(", ")
            );
        }
        let mut net = Network {
            agents: Vec::new(),
            up: true,
            _lock: lock,
        };
        let host = format!("{HOST_ADDR}/{PREFIX_LEN}");
        // forward_delay 0: ports forward at once instead of after 15 s of listening.
        ip(&[
            "link",
            "add",
            BRIDGE,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        ip(&["addr", "add", &host, "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for (i, name) in agents.iter().enumerate() {
            let ns = namespace_of(name);
            net.agents.push(ns.clone());
            let addr = format!("{}/{PREFIX_LEN}", agent_addr(i as u32));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &ns, "type", "veth", "peer", "name", INNER_IF, "netns", &ns,
            ])?;
            ip(&["link", "set", &ns, "master", BRIDGE])?;
            ip(&["link", "set", &ns, "up"])?;
            ip(&["-n", &ns, "addr", "add", &addr, "dev", INNER_IF])?;
            ip(&["-n", &ns, "link", "set", INNER_IF, "up"])?;
            // Agents serve /metrics on loopback inside their namespace.
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// `ip netns exec NS PROGRAM`: the command that runs `program` as agent
    /// `name`, inside its namespace. `ip` execs the program, so the process
    /// started is the agent itself and signals reach it.
    pub fn command(&self, name: &str, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &namespace_of(name)]).arg(program);
        c
    }

    /// Removes links, namespaces and the bridge; call after the agents have
    /// stopped. Reports what it could not remove and goes on.
    pub fn teardown(&mut self) {
        if !self.up {
            return;
        }
        self.up = false;
        for ns in &self.agents {
            for args in [["link", "del", ns.as_str()], ["netns", "del", ns.as_str()]] {
                if let Err(e) = ip(&args) {
                    eprintln!("warning: {e:#}");
                }
            }
        }
        if let Err(e) = ip(&["link", "del", BRIDGE]) {
            eprintln!("warning: {e:#}");
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn take_lock() -> Result<File> {
    let dir = std::path::Path::new("/run");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(LOCK_FILE);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening lock file {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "another `gpuctl local up --netns` is running (it holds {}); stop it first, one fleet owns the {PREFIX} names",
            path.display()
        );
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_fit() {
        let last = namespace_of(&format!("local-{}", MAX_AGENTS - 1));
        assert!(
            last.len() <= 15,
            "{last} is longer than an interface name may be"
        );
        assert_eq!(agent_addr(0), Ipv4Addr::new(10, 213, 0, 10));
        assert_eq!(agent_addr(MAX_AGENTS - 1), Ipv4Addr::new(10, 213, 0, 73));
        assert_eq!(host_addr().to_string(), "10.213.0.1");
    }

    #[test]
    fn parses_ip_listings() {
        let links = "1: lo: <LOOPBACK,UP> mtu 65536\n5: gpl-br0: <BROADCAST> mtu 1500\n6: gpl-local-0@if2: <BROADCAST> mtu 1500\n";
        assert_eq!(ours(parse_links(links)), vec!["gpl-br0", "gpl-local-0"]);
        let ns = "gpl-local-7\nother (id: 3)\ngpl-local-0 (id: 0)\n";
        assert_eq!(
            ours(parse_namespaces(ns)),
            vec!["gpl-local-7", "gpl-local-0"]
        );
    }
}

//! Collectives over TCP between the ranks, on host memory ("tcp-ring").
//!
//! Every rank listens on `0.0.0.0:0` and publishes `host:port` under the
//! rendezvous key `tcp/addr/{rank}`; it connects to every lower rank and accepts
//! every higher one, so each pair of ranks shares one socket (full duplex).
//! Sends always run on their own thread while the caller receives, so no two
//! ranks can wait on each other's send.
//!
//! * all_reduce: ring reduce-scatter, then ring all-gather (2(n−1)/n of the
//!   buffer over each link, like NCCL's ring);
//! * all_gather / reduce_scatter: the two halves of that ring;
//! * broadcast: scatter from the root, then ring all-gather;
//! * reduce: ring reduce-scatter, then every rank sends its part to the root;
//! * alltoall / sendrecv: direct pairs.
//!
//! Tensors not on the CPU are staged through host memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tch::{Device, Tensor};

use super::{add_into, check_sizes, Collectives, Elem, Op};
use crate::rendezvous::Rendezvous;

const HELLO_MAGIC: &[u8; 8] = b"GPUCTLT1";

/// How long one receive may wait for a peer before the op fails.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(600);

pub struct TcpComm {
    rank: usize,
    world: usize,
    /// `peers[j]`: the socket to rank j (`None` for this rank).
    peers: Vec<Option<TcpStream>>,
}

impl TcpComm {
    /// Listens, publishes `host:port` under `tcp/addr/{rank}`, and connects to
    /// every other rank (waiting up to `timeout` for them).
    pub fn connect(
        rank: usize,
        world: usize,
        rdzv: &dyn Rendezvous,
        host: &str,
        timeout: Duration,
    ) -> Result<Self> {
        super::abort::watch_sigterm();
        let listener = TcpListener::bind("0.0.0.0:0").context("binding the TCP listener")?;
        let port = listener.local_addr()?.port();
        let me = format!("{host}:{port}");
        rdzv.put(&format!("tcp/addr/{rank}"), me.as_bytes())?;
        tracing::info!(rank, world, addr = %me, "tcp-ring listening");
        let mut addrs = vec![String::new(); world];
        addrs[rank] = me;
        for (j, slot) in addrs.iter_mut().enumerate().take(rank) {
            let v = rdzv
                .get(&format!("tcp/addr/{j}"), timeout)
                .with_context(|| format!("waiting for rank {j}'s TCP address"))?;
            *slot =
                String::from_utf8(v).map_err(|_| anyhow!("rank {j} published a bad address"))?;
        }
        Self::establish(rank, world, listener, &addrs, timeout)
    }

    /// Builds the mesh from a listener and the addresses of (at least) every
    /// lower rank: connects to them, accepts the higher ones.
    pub fn establish(
        rank: usize,
        world: usize,
        listener: TcpListener,
        addrs: &[String],
        timeout: Duration,
    ) -> Result<Self> {
        if world == 0 || rank >= world {
            bail!("rank {rank} is not in a world of {world}");
        }
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for (j, addr) in addrs.iter().enumerate().take(rank) {
            let s = connect_retry(addr, deadline)
                .with_context(|| format!("connecting to rank {j} at {addr}"))?;
            let mut hello = HELLO_MAGIC.to_vec();
            hello.extend_from_slice(&(rank as u32).to_le_bytes());
            hello.extend_from_slice(&(world as u32).to_le_bytes());
            (&s).write_all(&hello)
                .with_context(|| format!("greeting rank {j} at {addr}"))?;
            peers[j] = Some(s);
        }
        listener.set_nonblocking(true)?;
        let mut missing = world - 1 - rank;
        while missing > 0 {
            match listener.accept() {
                Ok((s, from)) => {
                    s.set_nonblocking(false)?;
                    s.set_read_timeout(Some(Duration::from_secs(30)))?;
                    let mut hello = [0u8; 16];
                    if let Err(e) = (&s).read_exact(&mut hello) {
                        tracing::warn!(%from, "dropping a connection without a greeting: {e}");
                        continue;
                    }
                    let j = u32::from_le_bytes(hello[8..12].try_into().unwrap()) as usize;
                    let w = u32::from_le_bytes(hello[12..16].try_into().unwrap()) as usize;
                    if &hello[..8] != HELLO_MAGIC || w != world || j <= rank || j >= world {
                        tracing::warn!(%from, "dropping a connection that is not a rank of this job");
                        continue;
                    }
                    if peers[j].is_some() {
                        bail!("rank {j} connected twice (from {from})");
                    }
                    peers[j] = Some(s);
                    missing -= 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let absent: Vec<_> =
                            (rank + 1..world).filter(|j| peers[*j].is_none()).collect();
                        bail!(
                            "ranks {absent:?} did not connect within {:.0}s",
                            timeout.as_secs_f64()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e).context("accepting a peer connection"),
            }
        }
        for s in peers.iter().flatten() {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(DEFAULT_IO_TIMEOUT))?;
            s.set_write_timeout(Some(DEFAULT_IO_TIMEOUT))?;
        }
        tracing::debug!(rank, world, "tcp-ring mesh ready");
        Ok(Self { rank, world, peers })
    }

    fn peer(&self, j: usize) -> Result<&TcpStream> {
        self.peers
            .get(j)
            .and_then(|p| p.as_ref())
            .ok_or_else(|| anyhow!("internal: no socket to rank {j}"))
    }

    /// Sends to `to` (on a thread) while receiving from `from`.
    fn exchange(&self, to: usize, send: &[u8], from: usize, recv: &mut [u8]) -> Result<()> {
        let (ts, fs) = (self.peer(to)?, self.peer(from)?);
        std::thread::scope(|sc| {
            let h = sc.spawn(move || {
                let mut w = ts;
                w.write_all(send)
            });
            let mut r = fs;
            let got = r.read_exact(recv);
            let sent = h.join().map_err(|_| anyhow!("sender thread panicked"))?;
            sent.with_context(|| format!("sending {} bytes to rank {to}", send.len()))?;
            got.with_context(|| format!("receiving {} bytes from rank {from}", recv.len()))?;
            Ok(())
        })
    }

    fn chunk(&self, total_elems: usize, k: usize, es: usize) -> Range<usize> {
        let n = self.world;
        (k * total_elems / n) * es..((k + 1) * total_elems / n) * es
    }

    /// Ring reduce-scatter over `buf` split in `world` chunks. With `shift` = 0
    /// rank r ends owning the sum of chunk (r+1) mod n; with `shift` = n−1, chunk r.
    fn ring_reduce_scatter(&self, buf: &mut [u8], elem: Elem, shift: usize) -> Result<()> {
        let (r, n, es) = (self.rank, self.world, elem.size());
        if n == 1 {
            return Ok(());
        }
        let total = buf.len() / es;
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let max_chunk = (0..n)
            .map(|k| self.chunk(total, k, es).len())
            .max()
            .unwrap_or(0);
        let mut tmp = vec![0u8; max_chunk];
        for s in 0..n - 1 {
            let send_k = (r + shift + 2 * n - s) % n;
            let recv_k = (r + shift + 2 * n - s - 1) % n;
            let (sr, rr) = (self.chunk(total, send_k, es), self.chunk(total, recv_k, es));
            let tmp = &mut tmp[..rr.len()];
            self.exchange(right, &buf[sr], left, tmp)?;
            add_into(&mut buf[rr], tmp, elem)?;
        }
        Ok(())
    }

    /// Ring all-gather over `buf` split in `world` chunks, rank r starting with
    /// chunk (r + owned_shift) mod n.
    fn ring_all_gather(&self, buf: &mut [u8], es: usize, owned_shift: usize) -> Result<()> {
        let (r, n) = (self.rank, self.world);
        if n == 1 {
            return Ok(());
        }
        let total = buf.len() / es;
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        for s in 0..n - 1 {
            let send_k = (r + owned_shift + 2 * n - s) % n;
            let recv_k = (r + owned_shift + 2 * n - s - 1) % n;
            let (sr, rr) = (self.chunk(total, send_k, es), self.chunk(total, recv_k, es));
            let (send, recv) = split2(buf, sr, rr);
            self.exchange(right, send, left, recv)?;
        }
        Ok(())
    }
}

/// A shared and a mutable view of two disjoint ranges of one buffer.
fn split2(buf: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    if a.end <= b.start {
        let (l, r) = buf.split_at_mut(b.start);
        (&l[a], &mut r[..b.len()])
    } else {
        assert!(b.end <= a.start, "internal: overlapping chunks");
        let (l, r) = buf.split_at_mut(a.start);
        (&r[..a.len()], &mut l[b])
    }
}

fn connect_retry(addr: &str, deadline: Instant) -> Result<TcpStream> {
    let mut last = None;
    loop {
        let addrs: Vec<SocketAddr> = match addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last = Some(anyhow!(e).context(format!("resolving {addr}")));
                Vec::new()
            }
        };
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(anyhow!(e)),
            }
        }
        if Instant::now() >= deadline {
            return Err(last.unwrap_or_else(|| anyhow!("no address"))).context("gave up");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Host copy of a tensor's bytes (staged through the CPU when needed).
fn host_bytes(t: &Tensor) -> Vec<u8> {
    let n = t.numel() * t.kind().elt_size_in_bytes();
    let mut v = vec![0u8; n];
    if n > 0 {
        let h = if t.device() == Device::Cpu {
            t.contiguous()
        } else {
            t.to_device(Device::Cpu).contiguous()
        };
        h.copy_data_u8(&mut v, t.numel());
    }
    v
}

/// A writable host buffer for `recv`: its own memory when it is a contiguous CPU
/// tensor, else a staging tensor copied back by [`OutBuf::finish`].
struct OutBuf {
    host: Tensor,
    target: Option<Tensor>,
}

impl OutBuf {
    fn new(recv: &Tensor) -> Self {
        if recv.device() == Device::Cpu && recv.is_contiguous() {
            OutBuf {
                host: recv.shallow_clone(),
                target: None,
            }
        } else {
            OutBuf {
                host: recv.to_device(Device::Cpu).contiguous(),
                target: Some(recv.shallow_clone()),
            }
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        let n = self.host.numel() * self.host.kind().elt_size_in_bytes();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: a contiguous CPU tensor of n bytes that lives as long as self;
        // no other Rust reference to its memory exists while this one is used
        // (inputs are copied out with host_bytes first).
        unsafe { std::slice::from_raw_parts_mut(self.host.data_ptr() as *mut u8, n) }
    }

    fn finish(self) -> Result<()> {
        if let Some(mut t) = self.target {
            t.f_copy_(&self.host)?;
        }
        Ok(())
    }
}

impl Collectives for TcpComm {
    fn backend(&self) -> &'static str {
        "tcp-ring"
    }

    fn version(&self) -> String {
        "tcp-ring".into()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::AllReduce, send, recv, self.world)?;
        let elem = Elem::of(send.kind());
        let input = host_bytes(send);
        let mut out = OutBuf::new(recv);
        let buf = out.bytes();
        buf.copy_from_slice(&input);
        drop(input);
        self.ring_reduce_scatter(buf, elem, 0)?;
        self.ring_all_gather(buf, elem.size(), 1)?;
        out.finish()
    }

    fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::AllGather, send, recv, self.world)?;
        let es = send.kind().elt_size_in_bytes();
        let input = host_bytes(send);
        let mut out = OutBuf::new(recv);
        let buf = out.bytes();
        let mine = self.chunk(buf.len() / es, self.rank, es);
        buf[mine].copy_from_slice(&input);
        self.ring_all_gather(buf, es, 0)?;
        out.finish()
    }

    fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::ReduceScatter, send, recv, self.world)?;
        let elem = Elem::of(send.kind());
        let mut work = host_bytes(send);
        self.ring_reduce_scatter(&mut work, elem, self.world - 1)?;
        let mine = self.chunk(work.len() / elem.size(), self.rank, elem.size());
        let mut out = OutBuf::new(recv);
        out.bytes().copy_from_slice(&work[mine]);
        out.finish()
    }

    fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        check_sizes(Op::Broadcast, send, recv, self.world)?;
        let (r, n, es) = (self.rank, self.world, send.kind().elt_size_in_bytes());
        if root >= n {
            bail!("broadcast: root {root} is not a rank of {n}");
        }
        let mut out = OutBuf::new(recv);
        let total = recv.numel();
        if r == root {
            let input = host_bytes(send);
            out.bytes().copy_from_slice(&input);
        }
        let buf = out.bytes();
        // Scatter: the root sends chunk k to rank k.
        if r == root {
            let buf_ro: &[u8] = buf;
            std::thread::scope(|sc| -> Result<()> {
                let mut hs = Vec::new();
                for k in (0..n).filter(|k| *k != root) {
                    let s = self.peer(k)?;
                    let part = &buf_ro[self.chunk(total, k, es)];
                    hs.push((k, sc.spawn(move || (&*s).write_all(part))));
                }
                for (k, h) in hs {
                    h.join()
                        .map_err(|_| anyhow!("sender thread panicked"))?
                        .with_context(|| format!("broadcast: sending to rank {k}"))?;
                }
                Ok(())
            })?;
        } else {
            let range = self.chunk(total, r, es);
            self.peer(root)?
                .read_exact(&mut buf[range])
                .with_context(|| format!("broadcast: receiving from root {root}"))?;
        }
        self.ring_all_gather(buf, es, 0)?;
        out.finish()
    }

    fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        check_sizes(Op::Reduce, send, recv, self.world)?;
        let (r, n) = (self.rank, self.world);
        if root >= n {
            bail!("reduce: root {root} is not a rank of {n}");
        }
        let elem = Elem::of(send.kind());
        let es = elem.size();
        let mut work = host_bytes(send);
        self.ring_reduce_scatter(&mut work, elem, n - 1)?;
        let total = work.len() / es;
        if r == root {
            let mut out = OutBuf::new(recv);
            let buf = out.bytes();
            for k in 0..n {
                let range = self.chunk(total, k, es);
                if k == r {
                    buf[range.clone()].copy_from_slice(&work[range]);
                } else {
                    self.peer(k)?
                        .read_exact(&mut buf[range])
                        .with_context(|| format!("reduce: receiving from rank {k}"))?;
                }
            }
            out.finish()
        } else {
            let range = self.chunk(total, r, es);
            self.peer(root)?
                .write_all(&work[range])
                .with_context(|| format!("reduce: sending to root {root}"))
        }
    }

    fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::AllToAll, send, recv, self.world)?;
        let (r, n, es) = (self.rank, self.world, send.kind().elt_size_in_bytes());
        let c = send.numel() / n * es;
        let input = host_bytes(send);
        let mut out = OutBuf::new(recv);
        let buf = out.bytes();
        buf[r * c..(r + 1) * c].copy_from_slice(&input[r * c..(r + 1) * c]);
        std::thread::scope(|sc| -> Result<()> {
            let mut hs = Vec::new();
            for k in (0..n).filter(|k| *k != r) {
                let s = self.peer(k)?;
                let part = &input[k * c..(k + 1) * c];
                hs.push((k, sc.spawn(move || (&*s).write_all(part))));
            }
            let mut got = Ok(());
            for k in (0..n).filter(|k| *k != r) {
                if let Err(e) = self.peer(k).and_then(|s| {
                    (&*s)
                        .read_exact(&mut buf[k * c..(k + 1) * c])
                        .with_context(|| format!("alltoall: receiving from rank {k}"))
                }) {
                    got = Err(e);
                    break;
                }
            }
            for (k, h) in hs {
                h.join()
                    .map_err(|_| anyhow!("sender thread panicked"))?
                    .with_context(|| format!("alltoall: sending to rank {k}"))?;
            }
            got
        })?;
        out.finish()
    }

    fn sendrecv(&mut self, send: &Tensor, to: usize, recv: &Tensor, from: usize) -> Result<()> {
        check_sizes(Op::SendRecv, send, recv, self.world)?;
        let n = self.world;
        if to >= n || from >= n {
            bail!("sendrecv: peers {to} and {from} must be ranks of {n}");
        }
        let input = host_bytes(send);
        let mut out = OutBuf::new(recv);
        let buf = out.bytes();
        match (to == self.rank, from == self.rank) {
            (true, true) => buf.copy_from_slice(&input),
            (false, false) => self.exchange(to, &input, from, buf)?,
            _ => bail!("sendrecv: a rank cannot send to itself while receiving from another"),
        }
        out.finish()
    }

    fn send(&mut self, t: &Tensor, to: usize) -> Result<()> {
        check_sizes(Op::SendRecv, t, t, self.world)?;
        if to >= self.world || to == self.rank {
            bail!("send: peer {to} is not another rank of {}", self.world);
        }
        self.peer(to)?
            .write_all(&host_bytes(t))
            .with_context(|| format!("send: writing to rank {to}"))
    }

    fn recv(&mut self, t: &Tensor, from: usize) -> Result<()> {
        check_sizes(Op::SendRecv, t, t, self.world)?;
        if from >= self.world || from == self.rank {
            bail!("recv: peer {from} is not another rank of {}", self.world);
        }
        let mut out = OutBuf::new(t);
        self.peer(from)?
            .read_exact(out.bytes())
            .with_context(|| format!("recv: reading from rank {from}"))?;
        out.finish()
    }

    fn barrier(&mut self) -> Result<()> {
        let (r, n) = (self.rank, self.world);
        std::thread::scope(|sc| -> Result<()> {
            let mut hs = Vec::new();
            for k in (0..n).filter(|k| *k != r) {
                let s = self.peer(k)?;
                hs.push(sc.spawn(move || (&*s).write_all(&[0xB7])));
            }
            for k in (0..n).filter(|k| *k != r) {
                let mut b = [0u8; 1];
                self.peer(k)?
                    .read_exact(&mut b)
                    .with_context(|| format!("barrier: waiting for rank {k}"))?;
                if b[0] != 0xB7 {
                    bail!("barrier: rank {k} is out of step (got byte {:#x})", b[0]);
                }
            }
            for h in hs {
                h.join().map_err(|_| anyhow!("sender thread panicked"))??;
            }
            Ok(())
        })
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
}

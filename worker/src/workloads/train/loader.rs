//! The input pipeline of the loader sweep (`ddp --loader-workers 0,2,4,8`):
//! batches made on the host as a data loader makes them, so that a host whose
//! CPUs or host-to-device path cannot keep its GPU fed shows it.
//!
//! Each sample is "decoded" (a seeded image of bytes, 8/7 of the model's side
//! as a JPEG decoder would hand over before a crop) and augmented `work`
//! times (random crop, random horizontal flip, normalisation into fp32 CHW):
//! the host work per sample is the parameter, and no data set is downloaded.
//! Worker threads each make whole batches, as PyTorch's DataLoader workers
//! do, into a queue of two batches per worker; on a GPU host each batch is
//! written straight into pinned memory ([`Maker`]) so that its copy to the
//! device does not block the host. With 0
//! workers the training thread makes every batch itself, between steps, and
//! the GPU idles meanwhile: the reference the other settings are read against.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Result};
use gpuctl_core::cpu_time::thread_cpu_us;
use gpuctl_core::stats::median;
use gpuctl_proto::pb::LoaderSetting;
use tch::{Device, Kind, Tensor};

use super::super::models::{channels_last, Batch, Model, SplitMix64};
use super::{rank_seed, LoaderSweep, Reporter, TrainConfig, Trainer};

/// What every batch of one loader looks like.
#[derive(Clone, Debug)]
pub struct Shape {
    pub batch: i64,
    /// Image side after the crop (the model's input).
    pub side: i64,
    pub classes: i64,
    /// Augment passes per sample.
    pub work: u32,
    /// CPU time each sample costs at least, µs of the making thread's own
    /// (0: the passes alone): passes go on, into scratch, until it is spent.
    pub cpu_us: u64,
    pub seed: u64,
    pub device: Device,
    /// The compute type and layout the model takes.
    pub kind: Kind,
    pub channels_last: bool,
}

/// A batch as the host made it: fp32 images and labels (pinned on a GPU host).
pub struct HostBatch {
    x: Tensor,
    y: Tensor,
}

// SAFETY: a host tensor made by one thread and handed whole to another, never
// shared: libtorch tensors may move between threads.
unsafe impl Send for HostBatch {}

/// ImageNet's per-channel mean and standard deviation, as torchvision normalises.
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Makes batches on the host, one at a time, reusing its own scratch: a
/// loader worker holds one for its life. Nothing of batch size is allocated
/// from the heap per batch: on a GPU host each batch is written straight
/// into pinned memory from the CUDA caching host allocator, which hands the
/// same blocks round again (a fresh pageable batch, mmapped, faulted in,
/// pinned by a copy and unmapped, made more worker threads slower).
pub struct Maker {
    shape: Shape,
    /// One decoded image, HWC bytes.
    decoded: Vec<u8>,
    /// Where the passes past `work` that `cpu_us` asks for write, so that a
    /// batch's content does not depend on how fast its host is.
    scratch: Vec<f32>,
    labels: Vec<i64>,
}

impl Maker {
    pub fn new(shape: Shape) -> Maker {
        let full = shape.side as usize * 8 / 7;
        Maker {
            decoded: vec![0u8; full * full * 3],
            scratch: if shape.cpu_us > 0 {
                vec![0f32; 3 * (shape.side * shape.side) as usize]
            } else {
                Vec::new()
            },
            labels: Vec::with_capacity(shape.batch as usize),
            shape,
        }
    }

    /// Makes batch `index`: decode and augment every sample.
    pub fn make(&mut self, index: u64) -> Result<HostBatch> {
        let s = &self.shape;
        let side = s.side as usize;
        let plane = side * side;
        let dims = [s.batch, 3, s.side, s.side];
        let x = if s.device.is_cuda() {
            crate::shim::empty_pinned(&dims)?
        } else {
            Tensor::f_empty(dims, (Kind::Float, Device::Cpu))?
        };
        let len = s.batch as usize * 3 * plane;
        // SAFETY: `x` is a new contiguous float32 tensor of `len` elements that
        // nothing else sees until this batch is handed over.
        let images = unsafe { std::slice::from_raw_parts_mut(x.data_ptr() as *mut f32, len) };
        let mut rng = SplitMix64::new(s.seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d));
        self.labels.clear();
        for out in images.chunks_mut(3 * plane) {
            let started = (s.cpu_us > 0).then(thread_cpu_us);
            // The decode: bytes in HWC order, 8 at a time from the generator.
            for c in self.decoded.chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            for _ in 0..s.work.max(1) {
                augment(&self.decoded, side, &mut rng, out);
            }
            if let Some(t0) = started {
                // Passes of their own generator into scratch, so that a
                // batch is the same on a fast host and a slow one; the
                // last stops half a pass short on average, not past it.
                let mut extra = SplitMix64::new(rng.next_u64());
                let mut pass_us = 0;
                loop {
                    let spent = thread_cpu_us().saturating_sub(t0);
                    if spent + pass_us / 2 >= s.cpu_us {
                        break;
                    }
                    augment(&self.decoded, side, &mut extra, &mut self.scratch);
                    pass_us = thread_cpu_us().saturating_sub(t0) - spent;
                }
            }
            self.labels
                .push((rng.next_u64() % s.classes.max(1) as u64) as i64);
        }
        let mut y = Tensor::f_from_slice(&self.labels)?;
        if s.device.is_cuda() {
            y = y.f_pin_memory(s.device)?;
        }
        Ok(HostBatch { x, y })
    }
}

/// One augment pass of a decoded image (HWC bytes, 8/7 of `side`): a random
/// crop, a random horizontal flip and normalisation into fp32 CHW `out`.
fn augment(decoded: &[u8], side: usize, rng: &mut SplitMix64, out: &mut [f32]) {
    let full = side * 8 / 7;
    let plane = side * side;
    let slack = (full - side + 1) as u64;
    let (top, left) = (
        (rng.next_u64() % slack) as usize,
        (rng.next_u64() % slack) as usize,
    );
    let flip = rng.next_u64() & 1 == 1;
    for y in 0..side {
        let row = &decoded[((top + y) * full + left) * 3..][..side * 3];
        for x in 0..side {
            let sx = if flip { side - 1 - x } else { x };
            for c in 0..3 {
                let v = row[sx * 3 + c] as f32 / 255.0;
                out[c * plane + y * side + x] = (v - MEAN[c]) / STD[c];
            }
        }
    }
}

/// Copies a host batch to the device without blocking the host (from pinned
/// memory the copy engine reads it while the host goes on), then casts it to
/// the model's type and layout there, where that is cheap.
pub fn to_device(s: &Shape, b: HostBatch) -> Result<Batch> {
    let non_blocking = s.device.is_cuda();
    let mut x =
        b.x.f_to_device_(s.device, Kind::Float, non_blocking, false)?;
    if s.kind != Kind::Float {
        x = x.f_to_kind(s.kind)?;
    }
    if s.channels_last {
        x = channels_last(&x)?;
    }
    let y =
        b.y.f_to_device_(s.device, Kind::Int64, non_blocking, false)?;
    Ok(Batch {
        x,
        y,
        size: s.batch,
    })
}

/// A loader of `workers` threads (0: none, [`Loader::next_batch`] makes the batch).
pub struct Loader {
    /// The training thread's own, with 0 workers; its shape is every batch's.
    maker: Maker,
    next_index: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    rx: Option<Receiver<Result<HostBatch>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Loader {
    pub fn start(shape: Shape, workers: usize) -> Loader {
        let next_index = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        if workers == 0 {
            return Loader {
                maker: Maker::new(shape),
                next_index,
                stop,
                rx: None,
                threads: Vec::new(),
            };
        }
        // DataLoader's default prefetch: two batches per worker.
        let (tx, rx) = sync_channel(2 * workers);
        let threads = (0..workers)
            .map(|_| {
                let (tx, s, next, stop) =
                    (tx.clone(), shape.clone(), next_index.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut maker = Maker::new(s);
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if tx.send(maker.make(i)).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        Loader {
            maker: Maker::new(shape),
            next_index,
            stop,
            rx: Some(rx),
            threads,
        }
    }

    /// The next batch on the device.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let host = match &self.rx {
            None => self
                .maker
                .make(self.next_index.fetch_add(1, Ordering::Relaxed))?,
            Some(rx) => rx
                .recv()
                .map_err(|_| anyhow!("the loader's workers stopped"))??,
        };
        to_device(&self.maker.shape, host)
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver wakes every worker blocked on a full queue.
        self.rx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// CPU time of this process and of the whole host, read from /proc, so that a
/// setting's CPU use can be told from its wall time.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuClock {
    /// This process's user + system seconds.
    pub process_s: f64,
    /// The host's busy and total jiffies over every core.
    pub host_busy: u64,
    pub host_total: u64,
}

impl CpuClock {
    pub fn now() -> CpuClock {
        let tick = clock_ticks();
        let process_s = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                // Fields after the command name, which may hold spaces.
                let rest = &s[s.rfind(')')? + 2..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                let (u, k): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
                Some((u + k) as f64 / tick)
            })
            .unwrap_or(0.0);
        let (host_busy, host_total) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let line = s.lines().next()?;
                let v: Vec<u64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                let total: u64 = v.iter().take(8).sum();
                // idle and iowait are the not-busy part.
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                Some((total.saturating_sub(idle), total))
            })
            .unwrap_or((0, 0));
        CpuClock {
            process_s,
            host_busy,
            host_total,
        }
    }

    /// (cores this process kept busy, the host's busy share) since `start`,
    /// over `wall_s` seconds.
    pub fn since(&self, start: &CpuClock, wall_s: f64) -> (f64, f64) {
        let cores = (self.process_s - start.process_s) / wall_s.max(1e-9);
        let total = self.host_total.saturating_sub(start.host_total);
        let host = if total > 0 {
            self.host_busy.saturating_sub(start.host_busy) as f64 / total as f64
        } else {
            0.0
        };
        (cores.max(0.0), host.clamp(0.0, 1.0))
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The loader sweep: for each worker count, a warmup step and `l.steps`
/// timed steps on batches the loader makes, with no communication, so each
/// rank's figures are its own host's.
pub(super) fn sweep(
    cfg: &TrainConfig,
    l: &LoaderSweep,
    tr: &mut Trainer,
    model: &Model,
    rank: usize,
    progress: &dyn Reporter,
) -> Result<Vec<LoaderSetting>> {
    let dev = model.device;
    let shape = Shape {
        batch: cfg.batch_size,
        side: model.side(),
        classes: model.classes(),
        work: l.work,
        cpu_us: l.cpu_us,
        seed: rank_seed(cfg.seed ^ 0x10ad, rank),
        device: dev,
        kind: cfg.model.precision.kind(),
        channels_last: model.uses_channels_last(),
    };
    let mut rows = Vec::with_capacity(l.workers.len());
    for (k, &workers) in l.workers.iter().enumerate() {
        let mut ld = Loader::start(shape.clone(), workers as usize);
        let b = ld.next_batch()?;
        tr.step(&b, None)?;
        let (c0, t0, ms0) = (CpuClock::now(), Instant::now(), unix_ms());
        let (mut wait, mut times) = (0.0, Vec::with_capacity(l.steps as usize));
        for i in 0..l.steps {
            let w = Instant::now();
            let b = ld.next_batch()?;
            wait += w.elapsed().as_secs_f64();
            let s = tr.step(&b, None)?;
            times.push(w.elapsed().as_secs_f64());
            progress.update(
                &format!("loader {workers} workers {}/{}", i + 1, l.steps),
                1.0,
                &[("samples_per_s", cfg.batch_size as f64 / s.seconds.max(1e-9))],
            );
        }
        let wall = t0.elapsed().as_secs_f64();
        let (cores, host) = CpuClock::now().since(&c0, wall);
        drop(ld);
        let row = LoaderSetting {
            workers,
            work: l.work,
            sample_cpu_us: l.cpu_us,
            steps: l.steps,
            samples_per_s: (cfg.batch_size as f64 * l.steps as f64) / wall.max(1e-9),
            data_wait_share: (wait / wall.max(1e-9)).clamp(0.0, 1.0),
            step_ms_p50: median(times).unwrap_or(0.0) * 1e3,
            cpu_cores: cores,
            host_cpu_share: host,
            start_unix_ms: ms0,
            end_unix_ms: unix_ms(),
        };
        tracing::info!(
            setting = k,
            workers,
            per_s = row.samples_per_s,
            data_wait = row.data_wait_share,
            cpu_cores = row.cpu_cores,
            host_cpu = row.host_cpu_share,
            "loader setting"
        );
        rows.push(row);
    }
    Ok(rows)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(work: u32) -> Shape {
        Shape {
            batch: 4,
            side: 32,
            classes: 10,
            work,
            cpu_us: 0,
            seed: 7,
            device: Device::Cpu,
            kind: Kind::Float,
            channels_last: false,
        }
    }

    #[test]
    fn a_batch_is_normalised_images_and_labels_in_range() {
        let b = to_device(&shape(2), Maker::new(shape(2)).make(3).unwrap()).unwrap();
        assert_eq!(b.x.size(), vec![4, 3, 32, 32]);
        assert_eq!(b.y.size(), vec![4]);
        let max = b.x.abs().max().double_value(&[]);
        assert!(max > 1.0 && max < 3.0, "{max}");
        let ymax = b.y.max().int64_value(&[]);
        assert!((0..10).contains(&ymax));
    }

    #[test]
    fn a_cpu_target_is_spent_on_every_sample_and_leaves_the_batch_as_it_is() {
        let at = |cpu_us| {
            let mut m = Maker::new(Shape { cpu_us, ..shape(1) });
            let t0 = thread_cpu_us();
            let b = m.make(3).unwrap();
            (b, thread_cpu_us() - t0)
        };
        let (a, spent) = at(3_000);
        // Each of the 4 samples stops at most half a pass (a few µs at this
        // size) short of its 3 ms.
        assert!(spent >= 4 * 2_900, "{spent} µs for 4 samples");
        let (b, _) = at(1_000);
        assert!(
            a.x.equal(&b.x) && a.y.equal(&b.y),
            "the batch depends on its cost"
        );
    }

    #[test]
    fn workers_deliver_batches_and_stop_when_dropped() {
        for workers in [0, 1, 3] {
            let mut l = Loader::start(shape(1), workers);
            for _ in 0..5 {
                assert_eq!(l.next_batch().unwrap().x.size()[0], 4);
            }
        }
    }

    #[test]
    fn the_cpu_clock_counts_busy_time() {
        let a = CpuClock::now();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 200 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let (cores, host) = CpuClock::now().since(&a, t.elapsed().as_secs_f64());
        assert!(cores > 0.3, "{cores} ({x})");
        assert!(host > 0.0);
    }
}

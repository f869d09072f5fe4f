//! Models for the training workloads (ddp, fsdp, maxbatch), on synthetic data.
//!
//! * `resnet18|50|101|152`: torchvision's ResNets ([`resnet::resnet`], as
//!   tch's), 1000 classes, 3×224×224.
//! * `mobilenet_v2`: torchvision's MobileNetV2 ([`mobilenet::v2`], 3,504,872
//!   parameters), 1000 classes, 3×224×224.
//! * `cnn`: a small CNN (3 conv+BN+ReLU layers, 10 classes, 3×32×32) that
//!   trains in milliseconds on a CPU: the default on CPU ranks.
//! * `gpt`: a GPT-2 style decoder ([`gpt::Gpt`]) of a size of
//!   `GPT_SIZES`, throughput in tokens.
//!
//! Every model is in stages (stem → blocks → head + loss; the vision models
//! through [`staged::Staged`]), so that training can run backward block by
//! block and shard or bucket the variables by block (`Model::units`).
//!
//! A model is built in fp32 from one seed (under a process-wide lock, so ranks
//! that are threads of one process get the same initial values), optionally
//! turned to channels_last (4-d weights; DESIGN.md), and then handed to the
//! training loop, which moves its trainable variables into flat buffers of the
//! compute precision (`train.rs`). Data are made on the host from a seed with
//! a small PRNG of our own (not libtorch's global generator), so every rank's
//! batch is reproducible, and differs between ranks.

pub mod cnn;
pub mod gpt;
pub mod mobilenet;
pub mod resnet;
pub mod staged;
#[cfg(test)]
mod tests;

use std::sync::Mutex;

use anyhow::{bail, Result};
use tch::{nn, Device, Kind, Tensor};

/// Training precision. bf16 and fp16 compute in that type with fp32 master
/// weights kept by the training loop; fp16 uses dynamic loss scaling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

impl Precision {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "fp32" => Precision::Fp32,
            "bf16" => Precision::Bf16,
            "fp16" => Precision::Fp16,
            p => bail!("precision `{p}` is not one of fp32, bf16, fp16"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    /// The element type the model computes in.
    pub fn kind(self) -> Kind {
        match self {
            Precision::Fp32 => Kind::Float,
            Precision::Bf16 => Kind::BFloat16,
            Precision::Fp16 => Kind::Half,
        }
    }
}

/// Which model, and how to lay it out.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// One of `gpuctl_core::spec::MODELS` (default and batch: `gpuctl_core::catalogue`).
    pub name: String,
    pub precision: Precision,
    /// channels_last layout for the CNNs (input and every 4-d weight).
    pub channels_last: bool,
    /// GPT size (ignored by the other models).
    pub gpt: gpt::GptConfig,
}

enum Net {
    Vision(staged::Staged),
    Gpt(gpt::Gpt),
}

/// A model with its variables, ready to compute a loss on a batch.
pub struct Model {
    pub vs: nn::VarStore,
    net: Net,
    pub cfg: ModelConfig,
    pub device: Device,
    /// Classes (vision) or vocabulary size (gpt).
    classes: i64,
    /// Image side (vision) or sequence length (gpt).
    side: i64,
}

/// One batch of synthetic data: images and labels, or tokens and next tokens.
pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
    pub size: i64,
}

/// Distinct synthetic images per batch; larger batches repeat them.
const POOL: i64 = 64;

/// Model building draws from libtorch's global generator: one at a time
/// (and anything else that seeds it, tests included, takes this lock too).
pub(crate) static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Convolutions take cuDNN's heuristic choice rather than autotuning each
/// shape on first use. On an H200 (docs/benchmarks.md, `bench/cudnn_warmup.py`)
/// autotuning made ResNet-50's first step 12-16 s instead of 0.7 s and
/// MobileNetV2's 20-24 s instead of 4-9 s, most of a short job, and bought at
/// most 2 % of steady speed (0 % on ResNet-50): an acceptance job's time goes
/// to what it measures. Every rank does the same, so peers stay comparable.
pub fn use_cudnn_heuristics(device: Device) {
    if device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(false);
    }
}

/// `t.permute([0,2,3,1]).contiguous().permute([0,3,1,2])`: same shape, NHWC memory.
pub fn channels_last(t: &Tensor) -> Result<Tensor> {
    Ok(t.f_permute([0, 2, 3, 1])?
        .f_contiguous()?
        .f_permute([0, 3, 1, 2])?)
}

impl Model {
    /// Builds the model in fp32 on `device` from `seed`.
    pub fn build(cfg: &ModelConfig, device: Device, seed: u64) -> Result<Model> {
        let _lock = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(seed as i64);
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let (net, classes, side) = match cfg.name.as_str() {
            "resnet18" => (Net::Vision(resnet::resnet(&root, 18, 1000)?), 1000, 224),
            "resnet50" => (Net::Vision(resnet::resnet(&root, 50, 1000)?), 1000, 224),
            "resnet101" => (Net::Vision(resnet::resnet(&root, 101, 1000)?), 1000, 224),
            "resnet152" => (Net::Vision(resnet::resnet(&root, 152, 1000)?), 1000, 224),
            "mobilenet_v2" => (Net::Vision(mobilenet::v2(&root, 1000)), 1000, 224),
            "cnn" => (
                Net::Vision(cnn::cnn(&root, cnn::CLASSES)),
                cnn::CLASSES,
                cnn::SIDE,
            ),
            "gpt" => {
                let g = gpt::Gpt::new(&root, cfg.gpt)?;
                (Net::Gpt(g), cfg.gpt.vocab, cfg.gpt.seq_len)
            }
            m => bail!(
                "model `{m}` is not one of {}",
                gpuctl_core::spec::MODELS.join(", ")
            ),
        };
        let model = Model {
            vs,
            net,
            cfg: cfg.clone(),
            device,
            classes,
            side,
        };
        if model.uses_channels_last() {
            tch::no_grad(|| -> Result<()> {
                for (_, mut v) in model.vs.variables() {
                    if v.dim() == 4 {
                        let cl = channels_last(&v)?;
                        v.set_data(&cl);
                    }
                }
                Ok(())
            })?;
        }
        Ok(model)
    }

    pub fn is_gpt(&self) -> bool {
        matches!(self.net, Net::Gpt(_))
    }

    pub fn uses_channels_last(&self) -> bool {
        self.cfg.channels_last && !self.is_gpt()
    }

    /// "img" or "tok": what the throughput counts.
    pub fn unit(&self) -> &'static str {
        if self.is_gpt() {
            "tok"
        } else {
            "img"
        }
    }

    /// Units (images or tokens) in one sample.
    pub fn units_per_sample(&self) -> i64 {
        if self.is_gpt() {
            self.side
        } else {
            1
        }
    }

    /// Classes (vision) or vocabulary size (gpt).
    pub fn classes(&self) -> i64 {
        self.classes
    }

    /// Image side (vision) or sequence length (gpt).
    pub fn side(&self) -> i64 {
        self.side
    }

    /// Number of trainable parameters.
    pub fn parameter_count(&self) -> i64 {
        self.vs
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum()
    }

    /// A seeded synthetic batch of `size` samples on the model's device, in the
    /// compute precision and layout.
    pub fn batch(&self, size: i64, seed: u64) -> Result<Batch> {
        let mut rng = SplitMix64::new(seed);
        let dev = self.device;
        if self.is_gpt() {
            let t = self.side;
            let toks: Vec<i64> = (0..size * (t + 1))
                .map(|_| (rng.next_u64() % self.classes as u64) as i64)
                .collect();
            let all = Tensor::f_from_slice(&toks)?
                .f_view([size, t + 1])?
                .f_to_device(dev)?;
            let x = all.f_narrow(1, 0, t)?.f_contiguous()?;
            let y = all.f_narrow(1, 1, t)?.f_contiguous()?;
            return Ok(Batch { x, y, size });
        }
        // Distinct images for up to POOL samples, repeated on the device
        // beyond that: making 300M normals on the host would take seconds.
        let pool = size.min(POOL);
        let n = (pool * 3 * self.side * self.side) as usize;
        let mut v = Vec::with_capacity(n + 1);
        while v.len() < n {
            let (a, b) = rng.normal_pair();
            v.push(a);
            v.push(b);
        }
        v.truncate(n);
        let mut x = Tensor::f_from_slice(&v)?
            .f_view([pool, 3, self.side, self.side])?
            .f_to_device(dev)?
            .f_to_kind(self.cfg.precision.kind())?;
        drop(v);
        if pool < size {
            let reps = (size + pool - 1) / pool;
            x = x.f_repeat([reps, 1, 1, 1])?.f_narrow(0, 0, size)?;
        }
        if self.uses_channels_last() {
            x = channels_last(&x)?;
        }
        let labels: Vec<i64> = (0..size)
            .map(|_| (rng.next_u64() % self.classes as u64) as i64)
            .collect();
        let y = Tensor::f_from_slice(&labels)?.f_to_device(dev)?;
        Ok(Batch { x, y, size })
    }

    /// Forward pass and mean cross-entropy, as an fp32 scalar: the stages in
    /// order (an out-of-memory comes back as an `Err`).
    pub fn loss(&self, b: &Batch) -> Result<Tensor> {
        let mut x = self.stem(b)?;
        for k in 0..self.blocks() {
            x = self.block(k, &x)?;
        }
        self.head_loss(&x, b)
    }

    // The model in stages, so that training can run backward block by block
    // (tch has no autograd hooks): stem → block 0 … block n−1 → head + loss.
    // The stem and the head use the root unit's variables, block k only unit
    // k+1's. The stem may be the identity (cnn): its output is then the
    // batch's input itself, with no autograd graph behind it.

    /// Blocks between the stem and the head.
    pub fn blocks(&self) -> usize {
        match &self.net {
            Net::Vision(v) => v.blocks(),
            Net::Gpt(g) => g.blocks(),
        }
    }

    /// The first stage: the batch's input to the first block's input.
    pub fn stem(&self, b: &Batch) -> Result<Tensor> {
        match &self.net {
            Net::Vision(v) => v.stem(&b.x),
            Net::Gpt(g) => g.embed(&b.x),
        }
    }

    /// Block `k` (0-based) on `x`, the previous stage's output.
    pub fn block(&self, k: usize, x: &Tensor) -> Result<Tensor> {
        match &self.net {
            Net::Vision(v) => v.block(k, x),
            Net::Gpt(g) => g.block(k, x),
        }
    }

    /// The last stage: the last block's output to the mean cross-entropy
    /// against the batch's targets, as an fp32 scalar.
    pub fn head_loss(&self, x: &Tensor, b: &Batch) -> Result<Tensor> {
        let logits = match &self.net {
            Net::Vision(v) => v.head(x)?,
            Net::Gpt(g) => g.head(x)?.f_view([-1, self.classes])?,
        };
        Ok(logits
            .f_to_kind(Kind::Float)?
            .f_cross_entropy_loss::<Tensor>(
                &b.y.f_view([-1])?,
                None,
                tch::Reduction::Mean,
                -100,
                0.0,
            )?)
    }

    /// The trainable variables by unit, the grain of sharding and of gradient
    /// buckets: `[0]` the root (every variable not in a block: used by the
    /// stem and the head), `[k+1]` block k's. Every trainable variable once,
    /// in an order fixed by the model (by name within a unit).
    pub fn units(&self) -> Vec<Vec<Tensor>> {
        let mut named: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .filter(|(_, v)| v.requires_grad())
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let n = self.blocks();
        let mut units: Vec<Vec<Tensor>> = (0..=n).map(|_| Vec::new()).collect();
        for (name, v) in named {
            let unit = match &self.net {
                Net::Vision(s) => s.unit_of(&name),
                Net::Gpt(g) => g.unit_of(&name),
            };
            units[unit].push(v);
        }
        units
    }
}

/// A small, fast, seeded generator (splitmix64) for synthetic data.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Two standard normal numbers (Box–Muller).
    pub fn normal_pair(&mut self) -> (f32, f32) {
        let (u, v) = (self.unit(), self.unit());
        let r = (-2.0 * u.ln()).sqrt();
        let th = std::f64::consts::TAU * v;
        ((r * th.cos()) as f32, (r * th.sin()) as f32)
    }
}

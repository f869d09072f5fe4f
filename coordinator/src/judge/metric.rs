//! What a figure measures: the one vocabulary of metrics (names in rules
//! files and baselines, units, which way is better, whether one rank's figure
//! blames that rank). Kept apart so that the rules, the figures and the
//! verdicts all import it from here and none of them from each other.

/// What a figure measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// Median GEMM TFLOP/s over the run.
    StressTflops,
    /// The same with an all_reduce running beside the GEMMs (`stress
    /// --with-comm`): how the two interleave moves it far more from rank to
    /// rank, so it is judged by its own ratios.
    StressTflopsComm,
    /// The slowest sampling interval's TFLOP/s.
    StressTflopsWorst,
    /// nccl-tests' bus bandwidth of one op at one size.
    Busbw,
    /// Training samples (or tokens) per second with communication.
    SamplesPerS,
    /// One rank's training rate with no communication, measured in the same job.
    SoloSamplesPerS,
    /// 99th percentile of the training step time.
    StepMsP99,
    /// Samples per second against the no-communication rate.
    ScalingEfficiency,
    /// Largest batch that fits in memory.
    MaxBatch,
    /// `p2p`: copies from pinned host memory to the rank's GPU (a CPU
    /// rank's: between two host buffers), the better of two passes.
    H2dGbps,
    /// `p2p`: copies from the GPU to pinned host memory.
    D2hGbps,
    /// `p2p`: the median of the rank's GPU pairs (as sender and receiver),
    /// each the better of two passes. The pairs themselves are judged
    /// against each other by `judge::checks::p2p`.
    P2pGbps,
    /// `ddp --loader-workers`: the rank's best samples/s over the loader
    /// sweep's worker counts, batches made on its own host with no
    /// communication: whether the host's CPUs and host-to-device path keep
    /// its GPU fed.
    LoaderSamplesPerS,
}

impl Metric {
    pub const ALL: [Metric; 13] = [
        Metric::StressTflops,
        Metric::StressTflopsComm,
        Metric::StressTflopsWorst,
        Metric::Busbw,
        Metric::SamplesPerS,
        Metric::SoloSamplesPerS,
        Metric::StepMsP99,
        Metric::ScalingEfficiency,
        Metric::MaxBatch,
        Metric::H2dGbps,
        Metric::D2hGbps,
        Metric::P2pGbps,
        Metric::LoaderSamplesPerS,
    ];

    /// A stress run's median TFLOP/s, by whether an all_reduce ran beside it.
    pub fn stress(with_comm: bool) -> Metric {
        if with_comm {
            Metric::StressTflopsComm
        } else {
            Metric::StressTflops
        }
    }

    /// Both: what `gpuctl fleet` shows as a GPU's TFLOP/s.
    pub fn is_stress_median(self) -> bool {
        matches!(self, Metric::StressTflops | Metric::StressTflopsComm)
    }

    /// The name in rules files, findings and baselines.
    pub fn name(self) -> &'static str {
        match self {
            Metric::StressTflops => "stress_tflops",
            Metric::StressTflopsComm => "stress_tflops_comm",
            Metric::StressTflopsWorst => "stress_tflops_worst",
            Metric::Busbw => "busbw",
            Metric::SamplesPerS => "samples_per_s",
            Metric::SoloSamplesPerS => "solo_samples_per_s",
            Metric::StepMsP99 => "step_ms_p99",
            Metric::ScalingEfficiency => "scaling_efficiency",
            Metric::MaxBatch => "max_batch",
            Metric::H2dGbps => "h2d_gbps",
            Metric::D2hGbps => "d2h_gbps",
            Metric::P2pGbps => "p2p_gbps",
            Metric::LoaderSamplesPerS => "loader_samples_per_s",
        }
    }

    pub fn from_name(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::StressTflops | Metric::StressTflopsComm | Metric::StressTflopsWorst => {
                "TFLOP/s"
            }
            Metric::Busbw | Metric::H2dGbps | Metric::D2hGbps | Metric::P2pGbps => "GB/s",
            Metric::SamplesPerS | Metric::SoloSamplesPerS | Metric::LoaderSamplesPerS => {
                "samples/s"
            }
            Metric::StepMsP99 => "ms",
            Metric::ScalingEfficiency | Metric::MaxBatch => "",
        }
    }

    /// Step times are better low; every other figure is better high.
    pub fn higher_is_better(self) -> bool {
        self != Metric::StepMsP99
    }

    /// Whether one rank's figure says something about that rank alone.
    pub fn per_rank(self) -> bool {
        matches!(
            self,
            Metric::StressTflops
                | Metric::StressTflopsComm
                | Metric::StressTflopsWorst
                | Metric::SoloSamplesPerS
                | Metric::MaxBatch
                | Metric::H2dGbps
                | Metric::D2hGbps
                | Metric::P2pGbps
                | Metric::LoaderSamplesPerS
        )
    }
}

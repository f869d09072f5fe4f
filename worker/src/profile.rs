//! An operator-level profile of a few training steps (`--profile`): libtorch's
//! Kineto profiler through the C++ shim (`csrc/profiler.cpp`), its events
//! ranked here as torch.profiler's `key_averages()` ranks them, and its
//! Chrome trace (CPU operators and GPU kernels on one timeline) kept in the
//! rank's working folder, which the agent keeps per job.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

use anyhow::Result;
use gpuctl_proto::pb::ProfileOp;

use crate::shim::check;

/// Rows per table, as the tools printed them.
pub const TOP: usize = 10;

type EventFn = extern "C" fn(*mut c_void, *const c_char, c_int, u64, u64, i64, u64);

extern "C" {
    fn gpuctl_profiler_start(cuda: c_int, err: *mut *mut c_char) -> c_int;
    fn gpuctl_profiler_stop(
        trace_path: *const c_char,
        f: EventFn,
        ctx: *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
}

/// Where an event ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// A CPU operator (or runtime call such as cudaLaunchKernel).
    Cpu,
    /// On the GPU: a kernel, a copy or a set.
    Gpu,
    /// An allocation (bytes > 0) or a free (bytes < 0).
    Memory,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: String,
    pub at: Where,
    pub start_ns: u64,
    pub dur_ns: u64,
    pub bytes: i64,
    pub thread: u64,
}

/// Starts profiling this process (CPU operators; CUDA kernels too on a GPU).
pub fn start(cuda: bool) -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: plain arguments; the shim catches every C++ exception.
    let rc = unsafe { gpuctl_profiler_start(cuda as c_int, &mut err) };
    check("starting the profiler", rc, err)
}

extern "C" fn collect(
    ctx: *mut c_void,
    name: *const c_char,
    at: c_int,
    start_ns: u64,
    dur_ns: u64,
    bytes: i64,
    thread: u64,
) {
    // SAFETY: `ctx` is the `Vec<Event>` that `stop` lent for the call, and
    // `name` a NUL-terminated string that lives for this callback.
    let (events, name) = unsafe {
        (
            &mut *(ctx as *mut Vec<Event>),
            CStr::from_ptr(name).to_string_lossy().into_owned(),
        )
    };
    events.push(Event {
        name,
        at: match at {
            1 => Where::Gpu,
            2 => Where::Memory,
            _ => Where::Cpu,
        },
        start_ns,
        dur_ns,
        bytes,
        thread,
    });
}

/// Stops profiling; saves the Chrome trace at `trace` (when given) and
/// returns every event.
pub fn stop(trace: Option<&Path>) -> Result<Vec<Event>> {
    let path = match trace {
        Some(p) => CString::new(p.to_string_lossy().as_bytes())?,
        None => CString::default(),
    };
    let mut events: Vec<Event> = Vec::new();
    let mut err = std::ptr::null_mut();
    // SAFETY: `events` outlives the call; `collect` is the only user of it.
    let rc = unsafe {
        gpuctl_profiler_stop(
            path.as_ptr(),
            collect,
            &mut events as *mut Vec<Event> as *mut c_void,
            &mut err,
        )
    };
    check("stopping the profiler", rc, err)?;
    Ok(events)
}

/// The three top-10 tables: by self CPU time, by GPU time, by memory
/// allocated within the operator itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tops {
    pub cpu: Vec<ProfileOp>,
    pub cuda: Vec<ProfileOp>,
    pub memory: Vec<ProfileOp>,
}

/// Ranks `events` as `key_averages()` does: CPU operators by self time (its
/// own duration less its children's on the same thread), GPU work by name,
/// and every allocation charged to the innermost operator open on its thread
/// when it happened.
pub fn rank(events: &[Event]) -> Tops {
    let mut ops: HashMap<String, ProfileOp> = HashMap::new();
    let mut by_thread: HashMap<u64, Vec<&Event>> = HashMap::new();
    let mut allocs: HashMap<u64, Vec<&Event>> = HashMap::new();
    for e in events {
        match e.at {
            Where::Cpu => by_thread.entry(e.thread).or_default().push(e),
            Where::Memory if e.bytes > 0 => allocs.entry(e.thread).or_default().push(e),
            Where::Memory => {}
            Where::Gpu => {
                let op = entry(&mut ops, &e.name);
                op.calls += 1;
                op.cuda_ms += e.dur_ns as f64 / 1e6;
            }
        }
    }
    for (thread, mut evs) in by_thread {
        // Parents first: earlier start, and the longer of two that start together.
        evs.sort_by(|a, b| a.start_ns.cmp(&b.start_ns).then(b.dur_ns.cmp(&a.dur_ns)));
        let mut allocs = allocs.remove(&thread).unwrap_or_default();
        allocs.sort_by_key(|a| a.start_ns);
        let mut allocs = allocs.into_iter().peekable();
        // (index into evs, end) of the open operators, innermost last; self
        // time is kept per index and charged to names at the end.
        let mut open: Vec<(usize, u64)> = Vec::new();
        let mut self_ns: Vec<i64> = evs.iter().map(|e| e.dur_ns as i64).collect();
        let mut mem: Vec<i64> = vec![0; evs.len()];
        let charge =
            |open: &Vec<(usize, u64)>,
             mem: &mut Vec<i64>,
             upto: u64,
             allocs: &mut std::iter::Peekable<std::vec::IntoIter<&Event>>| {
                while let Some(a) = allocs.peek() {
                    if a.start_ns > upto {
                        break;
                    }
                    if let Some(&(i, _)) = open.iter().rev().find(|(_, end)| *end >= a.start_ns) {
                        mem[i] += a.bytes;
                    }
                    allocs.next();
                }
            };
        for (i, e) in evs.iter().enumerate() {
            charge(&open, &mut mem, e.start_ns, &mut allocs);
            while open.last().is_some_and(|&(_, end)| end <= e.start_ns) {
                open.pop();
            }
            if let Some(&(p, _)) = open.last() {
                self_ns[p] -= e.dur_ns as i64;
            }
            open.push((i, e.start_ns + e.dur_ns));
        }
        charge(&open, &mut mem, u64::MAX, &mut allocs);
        for (i, e) in evs.iter().enumerate() {
            let op = entry(&mut ops, &e.name);
            op.calls += 1;
            op.cpu_ms += self_ns[i].max(0) as f64 / 1e6;
            op.memory_bytes += mem[i];
        }
    }
    let all: Vec<ProfileOp> = ops.into_values().collect();
    let top = |key: &dyn Fn(&ProfileOp) -> f64| {
        let mut v: Vec<ProfileOp> = all.iter().filter(|o| key(o) > 0.0).cloned().collect();
        v.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.name.cmp(&b.name)));
        v.truncate(TOP);
        v
    };
    Tops {
        cpu: top(&|o| o.cpu_ms),
        cuda: top(&|o| o.cuda_ms),
        memory: top(&|o| o.memory_bytes as f64),
    }
}

fn entry<'a>(ops: &'a mut HashMap<String, ProfileOp>, name: &str) -> &'a mut ProfileOp {
    ops.entry(name.to_string()).or_insert_with(|| ProfileOp {
        name: name.to_string(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, at: Where, start: u64, dur: u64, bytes: i64) -> Event {
        Event {
            name: name.into(),
            at,
            start_ns: start,
            dur_ns: dur,
            bytes,
            thread: 1,
        }
    }

    #[test]
    fn self_time_leaves_out_children_and_memory_goes_to_the_innermost() {
        let evs = vec![
            ev("aten::linear", Where::Cpu, 0, 100, 0),
            ev("aten::addmm", Where::Cpu, 10, 60, 0),
            ev("[memory]", Where::Memory, 20, 0, 4096),
            ev("[memory]", Where::Memory, 80, 0, 512),
            ev("[memory]", Where::Memory, 85, 0, -4096),
            ev("gemm_kernel", Where::Gpu, 30, 500, 0),
        ];
        let t = rank(&evs);
        assert_eq!(t.cpu[0].name, "aten::addmm");
        assert!((t.cpu[0].cpu_ms - 60e-6).abs() < 1e-12);
        assert!((t.cpu[1].cpu_ms - 40e-6).abs() < 1e-12);
        assert_eq!(t.memory[0].name, "aten::addmm");
        assert_eq!(t.memory[0].memory_bytes, 4096);
        assert_eq!(t.memory[1].memory_bytes, 512);
        assert_eq!(t.cuda.len(), 1);
        assert_eq!(t.cuda[0].name, "gemm_kernel");
    }

    #[test]
    fn a_real_profile_names_aten_operators_and_writes_a_chrome_trace() {
        let dir = std::env::temp_dir().join(format!("gpuctl-prof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.json");
        start(false).unwrap();
        let a = tch::Tensor::randn([64, 64], (tch::Kind::Float, tch::Device::Cpu));
        let w = tch::Tensor::randn([64, 64], (tch::Kind::Float, tch::Device::Cpu));
        for _ in 0..3 {
            let _ = a.matmul(&w).relu();
        }
        let events = stop(Some(&path)).unwrap();
        let t = rank(&events);
        assert!(t.cpu.iter().any(|o| o.name == "aten::mm"), "{:?}", t.cpu);
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(v["traceEvents"].as_array().is_some_and(|a| !a.is_empty()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The TCP backend with 1–4 ranks as threads on loopback, meeting through the
//! in-process rendezvous (no coordinator): every op, out-of-place and in-place,
//! float/bfloat16/half, sizes that do and do not divide by the world size, each
//! result checked element by element against values computed here on the host.

mod common;

use std::thread;
use std::time::Duration;

use common::with_ranks;
use gpuctl_worker::comm::Op;
use gpuctl_worker::workloads::nccl::{sweep, SweepConfig};
use tch::{Device, Kind, Tensor};

/// Distinct small integers per rank and element, exact in every dtype (sums of
/// 4 ranks stay below 256).
fn val(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 3) % 13) as f32 + rank as f32 * 16.0
}

fn input(rank: usize, len: usize, kind: Kind) -> Tensor {
    let v: Vec<f32> = (0..len).map(|i| val(rank, i)).collect();
    Tensor::from_slice(&v).to_kind(kind)
}

fn host(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).contiguous()).unwrap()
}

/// The expected result of `op` on `rank` (None: not defined there).
fn expect(op: Op, rank: usize, world: usize, c: usize) -> Option<Vec<f32>> {
    let n = world;
    Some(match op {
        Op::AllReduce => (0..c).map(|i| (0..n).map(|r| val(r, i)).sum()).collect(),
        Op::Reduce if rank == 0 => (0..c).map(|i| (0..n).map(|r| val(r, i)).sum()).collect(),
        Op::Reduce => return None,
        Op::Broadcast => (0..c).map(|i| val(0, i)).collect(),
        Op::AllGather => (0..n * c).map(|j| val(j / c, j % c)).collect(),
        Op::ReduceScatter => (0..c)
            .map(|i| (0..n).map(|r| val(r, rank * c + i)).sum())
            .collect(),
        Op::AllToAll => (0..n * c).map(|j| val(j / c, rank * c + j % c)).collect(),
        Op::SendRecv => (0..c).map(|i| val((rank + n - 1) % n, i)).collect(),
    })
}

/// (send, recv) for `op` with per-rank count `c`; in-place shares memory the
/// nccl-tests way.
fn buffers(
    op: Op,
    rank: usize,
    n: usize,
    c: usize,
    kind: Kind,
    in_place: bool,
) -> (Tensor, Tensor) {
    let (send_len, recv_len) = match op {
        Op::AllGather => (c, n * c),
        Op::ReduceScatter => (n * c, c),
        Op::AllToAll => (n * c, n * c),
        _ => (c, c),
    };
    let inp = input(rank, send_len, kind);
    if !in_place {
        return (
            inp,
            Tensor::full([recv_len as i64], -7.0, (kind, Device::Cpu)),
        );
    }
    match op {
        Op::AllGather => {
            let buf = Tensor::full([recv_len as i64], -7.0, (kind, Device::Cpu));
            let mut send = buf.narrow(0, (rank * c) as i64, c as i64);
            send.copy_(&inp);
            (send, buf)
        }
        Op::ReduceScatter => {
            let recv = inp.narrow(0, (rank * c) as i64, c as i64);
            (inp, recv)
        }
        _ => {
            let recv = inp.shallow_clone();
            (inp, recv)
        }
    }
}

fn check_all_ops(world: usize, kind: Kind, counts: &'static [usize]) {
    let failures = with_ranks(world, move |comm| {
        let (r, n) = (comm.rank(), comm.world_size());
        let mut bad = Vec::new();
        for &c in counts {
            for op in Op::ALL {
                for in_place in [false, true] {
                    let (send, recv) = buffers(op, r, n, c, kind, in_place);
                    comm.run(op, &send, &recv)
                        .unwrap_or_else(|e| panic!("rank {r} {op:?} c={c}: {e:#}"));
                    if let Some(want) = expect(op, r, n, c) {
                        let got = host(&recv);
                        if got != want {
                            let first = got.iter().zip(&want).position(|(a, b)| a != b);
                            bad.push(format!(
                                "rank {r} {} c={c} in_place={in_place} {kind:?}: first difference at {first:?}",
                                op.name()
                            ));
                        }
                    }
                }
            }
            comm.barrier().unwrap();
        }
        bad
    });
    let bad: Vec<_> = failures.into_iter().flatten().collect();
    assert!(bad.is_empty(), "wrong results:\n{}", bad.join("\n"));
}

#[test]
fn every_op_is_exact_on_four_ranks_float() {
    check_all_ops(4, Kind::Float, &[1, 5, 64, 1000, 65_537]);
}

#[test]
fn every_op_is_exact_on_three_ranks_bf16_and_half() {
    check_all_ops(3, Kind::BFloat16, &[1, 7, 4099]);
    check_all_ops(3, Kind::Half, &[2, 333]);
}

#[test]
fn two_ranks_and_one_rank_work() {
    check_all_ops(2, Kind::Float, &[3, 4096]);
    check_all_ops(1, Kind::Float, &[3, 100]);
}

#[test]
fn rooted_ops_work_for_every_root() {
    let out = with_ranks(3, |comm| {
        let (r, n) = (comm.rank(), comm.world_size());
        let mut bad = Vec::new();
        for root in 0..n {
            let send = input(r, 10, Kind::Float);
            let recv = Tensor::zeros([10], (Kind::Float, Device::Cpu));
            comm.broadcast(&send, &recv, root).unwrap();
            let want: Vec<f32> = (0..10).map(|i| val(root, i)).collect();
            if host(&recv) != want {
                bad.push(format!("broadcast root {root} on rank {r}"));
            }
            let recv = Tensor::zeros([10], (Kind::Float, Device::Cpu));
            comm.reduce(&send, &recv, root).unwrap();
            if r == root {
                let want: Vec<f32> = (0..10).map(|i| (0..n).map(|k| val(k, i)).sum()).collect();
                if host(&recv) != want {
                    bad.push(format!("reduce root {root}"));
                }
            } else if host(&recv) != vec![0.0; 10] {
                bad.push(format!("reduce root {root} wrote rank {r}'s recv"));
            }
        }
        bad
    });
    let bad: Vec<_> = out.into_iter().flatten().collect();
    assert!(bad.is_empty(), "{bad:?}");
}

#[test]
fn bad_shapes_are_refused_with_the_op_named() {
    let out = with_ranks(2, |comm| {
        let send = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let recv = Tensor::zeros([5], (Kind::Float, Device::Cpu));
        let e = comm.all_gather(&send, &recv).unwrap_err().to_string();
        let ints = Tensor::zeros([4], (Kind::Bool, Device::Cpu));
        let e2 = comm.all_reduce(&ints, &ints).unwrap_err().to_string();
        // Still in step afterwards: nothing was sent.
        comm.barrier().unwrap();
        (e, e2)
    });
    for (e, e2) in out {
        assert!(e.contains("all_gather"), "{e}");
        assert!(
            e2.contains("all_reduce") && e2.contains("cannot sum"),
            "{e2}"
        );
    }
}

#[test]
fn background_all_reduce_loop_stops_together() {
    let out = with_ranks(3, |comm| {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let buf = Tensor::zeros([1024], (Kind::Float, Device::Cpu));
        let r = comm.rank();
        thread::scope(|sc| {
            let stop = &stop;
            let h = sc.spawn(move || comm.all_reduce_loop(&buf, stop).unwrap());
            // Ranks stop at different times; all must end after the same op.
            thread::sleep(Duration::from_millis(50 + 40 * r as u64));
            if r == 1 {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            h.join().unwrap()
        })
    });
    let ops: Vec<u64> = out.iter().map(|s| s.ops).collect();
    assert!(ops[0] > 0 && ops.iter().all(|o| *o == ops[0]), "{ops:?}");
}

#[test]
fn nccl_tests_sweep_over_tcp_has_no_wrong_elements() {
    for (kind, dtype) in [
        (Kind::Float, "float"),
        (Kind::BFloat16, "bfloat16"),
        (Kind::Half, "half"),
    ] {
        let rows = with_ranks(4, move |comm| {
            let cfg = SweepConfig {
                ops: Op::ALL.to_vec(),
                min_bytes: 1000,
                max_bytes: 64 << 10,
                factor: 4,
                kind,
                dtype: dtype.into(),
                iters: 2,
                warmup: 1,
                floor_gbps: 0.0,
            };
            sweep(comm, &cfg, Device::Cpu, &|_, _, _| {}).unwrap()
        });
        for res in &rows {
            assert_eq!((res.backend.as_str(), res.world_size), ("tcp-ring", 4));
            // 7 ops × sizes 1000, 4000, 16000, 64000 bytes.
            assert_eq!(res.rows.len(), 28, "{dtype}");
            for row in &res.rows {
                assert_eq!((row.wrong, row.wrong_ip), (0, 0), "{dtype} {row:?}");
                assert!(row.time_us > 0.0 && row.busbw_gbps >= 0.0, "{row:?}");
                assert_eq!(row.dtype, dtype);
            }
        }
        // Sizes are the same on every rank and follow nccl-tests.
        let ag: Vec<_> = rows[0]
            .rows
            .iter()
            .filter(|r| r.op == "all_gather")
            .map(|r| (r.bytes, r.count))
            .collect();
        let es = kind.elt_size_in_bytes() as u64;
        let want: Vec<_> = [1000u64, 4000, 16000, 64000]
            .iter()
            .map(|b| {
                let base = b / es / 16 * 4;
                (base * 4 * es, base)
            })
            .collect();
        assert_eq!(ag, want, "{dtype}");
    }
}

//! The operator profile of a ddp/fsdp job (`--profile`): per rank, the top 10
//! operators by self CPU time, by GPU time and by memory allocated, as
//! torch.profiler's `key_averages().table()` ranks them, and where the rank's
//! Chrome trace is (on its node, in the agent's folder of the job).

use serde_json::{json, Value};

use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb;

use super::models::{label, train_results};
use super::table::Table;

/// Every profiled rank and model: (node, rank, model, profile).
pub fn profiles(r: &pb::Report) -> Vec<(&str, u32, String, &pb::OperatorProfile)> {
    let mut out = Vec::new();
    for n in &r.nodes {
        for rk in &n.ranks {
            let Some(res) = &rk.result else { continue };
            for t in train_results(res) {
                if let Some(p) = &t.profile {
                    out.push((n.name.as_str(), rk.rank, label(t), p.as_ref()));
                }
            }
        }
    }
    out
}

fn ops_table(ops: &[pb::ProfileOp], by: &str) -> Table {
    let mut t = Table::new(&["OPERATOR", "CALLS", by]).right(&[1, 2]);
    for o in ops {
        let v = match by {
            "SELF CPU MS" => format!("{:.3}", o.cpu_ms),
            "GPU MS" => format!("{:.3}", o.cuda_ms),
            _ => format_bytes(o.memory_bytes.max(0) as u64),
        };
        t.row([short_name(&o.name), o.calls.to_string(), v]);
    }
    t
}

/// A kernel's name as a person scans a table: CUDA kernels are named by their
/// whole C++ signature (an elementwise kernel's ran past 1,000 characters on
/// an H100), so the parameters go, template arguments become `<…>` and what
/// is left is cut at [`NAME_WIDTH`]. JSON and CSV keep the whole name.
pub fn short_name(name: &str) -> String {
    let name = name.strip_prefix("void ").unwrap_or(name);
    let mut out = String::new();
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '<' => {
                if depth == 0 {
                    out.push_str("<…>");
                }
                depth += 1;
            }
            '>' if depth > 0 => depth -= 1,
            // The parameter list starts at the first `(` outside templates.
            '(' if depth == 0 && !out.is_empty() => break,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if out.chars().count() > NAME_WIDTH {
        out = out.chars().take(NAME_WIDTH - 1).collect::<String>() + "…";
    }
    out
}

/// The widest operator name a table shows.
const NAME_WIDTH: usize = 72;

/// One rank's profile as text: its trace and three tables.
pub fn rank_text(node: &str, rank: u32, model: &str, p: &pb::OperatorProfile) -> String {
    let mut s = format!(
        "\nPROFILE rank {rank} on {node}, {model}: {} steps, {:.1} ms a step while profiled\n",
        p.steps, p.step_ms
    );
    if !p.error.is_empty() {
        s.push_str(&format!("error: {}\n", p.error));
    }
    if !p.trace_path.is_empty() {
        s.push_str(&format!(
            "trace: {node}:{} ({}; `gpuctl profile JOB --trace DIR` fetches it; open in https://ui.perfetto.dev)\n",
            p.trace_path,
            format_bytes(p.trace_bytes)
        ));
    }
    for (title, ops, by) in [
        ("top 10 by self CPU time", &p.top_cpu, "SELF CPU MS"),
        ("top 10 by GPU time", &p.top_cuda, "GPU MS"),
        ("top 10 by memory allocated", &p.top_memory, "MEMORY"),
    ] {
        if ops.is_empty() {
            if by == "GPU MS" {
                s.push_str(&format!("{title}: none (a CPU rank)\n"));
            }
            continue;
        }
        s.push_str(&format!("{title}\n{}", ops_table(ops, by).render()));
    }
    s
}

/// The PROFILE sections of the table report.
pub fn section(r: &pb::Report) -> Option<String> {
    let all = profiles(r);
    if all.is_empty() {
        return None;
    }
    Some(
        all.into_iter()
            .map(|(node, rank, model, p)| rank_text(node, rank, &model, p))
            .collect(),
    )
}

/// One grid of every rank's top operators, for CSV and Markdown.
pub fn grid(r: &pb::Report) -> Option<Table> {
    let all = profiles(r);
    if all.is_empty() {
        return None;
    }
    let mut t = Table::new(&[
        "NODE",
        "RANK",
        "MODEL",
        "BY",
        "OPERATOR",
        "CALLS",
        "SELF CPU MS",
        "GPU MS",
        "MEMORY BYTES",
    ]);
    for (node, rank, model, p) in all {
        for (by, ops) in [
            ("cpu", &p.top_cpu),
            ("gpu", &p.top_cuda),
            ("memory", &p.top_memory),
        ] {
            for o in ops {
                t.row([
                    node.to_string(),
                    rank.to_string(),
                    model.clone(),
                    by.to_string(),
                    o.name.clone(),
                    o.calls.to_string(),
                    format!("{:.3}", o.cpu_ms),
                    format!("{:.3}", o.cuda_ms),
                    o.memory_bytes.to_string(),
                ]);
            }
        }
    }
    Some(t)
}

fn op_json(o: &pb::ProfileOp) -> Value {
    json!({
        "name": o.name,
        "calls": o.calls,
        "cpu_ms": o.cpu_ms,
        "cuda_ms": o.cuda_ms,
        "memory_bytes": o.memory_bytes,
    })
}

/// A rank's profile for `-o json` (null without one).
pub fn json(t: &pb::TrainResult) -> Value {
    match &t.profile {
        None => Value::Null,
        Some(p) => json!({
            "steps": p.steps,
            "step_ms": p.step_ms,
            "error": p.error,
            "trace_path": p.trace_path,
            "trace_bytes": p.trace_bytes,
            "top_cpu": p.top_cpu.iter().map(op_json).collect::<Vec<_>>(),
            "top_cuda": p.top_cuda.iter().map(op_json).collect::<Vec<_>>(),
            "top_memory": p.top_memory.iter().map(op_json).collect::<Vec<_>>(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn kernel_signatures_shrink_to_their_names() {
        assert_eq!(
            short_name(
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
            ),
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
        );
        assert_eq!(
            short_name("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, c10::BFloat16, float, 4>(c10::BFloat16 const*, float*, int)"),
            "at::native::batch_norm_collect_statistics_channels_last_kernel<…>"
        );
        assert_eq!(
            short_name("void at::native::vectorized_elementwise_kernel<8, at::native::BinaryFunctor<float, float, float, at::native::(anonymous namespace)::f<float>(at::TensorIteratorBase&)::{lambda(float, float)#1}>, std::array<char*, 3ul> >(int, float)"),
            "at::native::vectorized_elementwise_kernel<…>"
        );
        assert_eq!(
            short_name("aten::convolution_backward"),
            "aten::convolution_backward"
        );
        let long = "k".repeat(100);
        assert_eq!(short_name(&long).chars().count(), 72);
    }
}

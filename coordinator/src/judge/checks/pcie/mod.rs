//! The GPU's PCIe link: a link trained under what the GPU supports while it
//! was loaded (an idle GPU drops its link speed by design, so only loaded
//! samples count), and replays, the link resending what it got wrong.

pub mod defaults;

use super::health::rules::HealthRules;
use super::health::run::{Run, Sink};

pub(super) fn check(r: &HealthRules, run: &Run, out: &mut Sink) {
    link(r, run, out);
    let replays = run.delta(|c| c.pcie_replays);
    if replays as f64 / run.minutes > r.pcie_replays_per_min {
        out.fire(
            r.pcie_replays,
            "pcie_replay",
            format!(
                "{replays} PCIe replays during the run ({:.1}/min, rule: {}/min): check the riser and slot",
                replays as f64 / run.minutes,
                r.pcie_replays_per_min
            ),
        );
    }
}

fn link(r: &HealthRules, run: &Run, out: &mut Sink) {
    let t = run.t;
    if t.loaded == 0 {
        return;
    }
    let share = |n: u32| n as f64 / t.loaded as f64;
    let gen_low =
        t.pcie_gen_low_loaded > 0 && share(t.pcie_gen_low_loaded) >= r.pcie_link_min_share;
    let width_low =
        t.pcie_width_low_loaded > 0 && share(t.pcie_width_low_loaded) >= r.pcie_link_min_share;
    if !width_low && !gen_low {
        // Formatted only when it fires: every GPU of a job comes here.
        return;
    }
    let seen = format!(
        "PCIe link at Gen{} x{} under load at worst; the GPU supports Gen{} x{}",
        t.pcie_gen_loaded_min, t.pcie_width_loaded_min, t.pcie_gen_max, t.pcie_width_max
    );
    if width_low {
        out.fire(
            r.pcie_width_below_max,
            "pcie_link",
            format!(
                "{seen} ({:.0} % of loaded samples under x{}): reseat the GPU or check the riser",
                share(t.pcie_width_low_loaded) * 100.0,
                t.pcie_width_max
            ),
        );
    }
    if gen_low {
        out.fire(
            r.pcie_gen_below_max,
            "pcie_link",
            format!(
                "{seen} ({:.0} % of loaded samples under Gen{}): check BIOS PCIe settings and the slot",
                share(t.pcie_gen_low_loaded) * 100.0,
                t.pcie_gen_max
            ),
        );
    }
}

#[cfg(test)]
mod tests;

//! The store's writes since the kept answer's build, folded into it: a
//! job's runs, acceptances, nodes joining the inventory (their runs read).
//! A deleted run or node, or a run written at or before a node's last,
//! makes the answer be built again, since folding them in would not give
//! what a fresh build gives.

use gpuctl_proto::pb::{Acceptance, NodeRun};
use prost::Message as _;

use crate::error::CoordinatorError;
use crate::history;
use crate::judge::fleet::{FleetFold, Rebuild};
use crate::store::keys::{self, HistoryInput};
use crate::store::{HistoryWrite, StateStore};

/// Nodes joining the inventory whose runs are read in one fold; more, and
/// the answer is built afresh (a fleet coming up, node by node).
const JOINING_AT_MOST: usize = 1024;

/// `writes` folded into `fold`; `Err(Rebuild)` inside when they cannot be.
pub async fn fold_in(
    store: &StateStore,
    fold: &mut FleetFold,
    writes: Vec<HistoryWrite>,
) -> Result<Result<(), Rebuild>, CoordinatorError> {
    let mut joining: Vec<String> = Vec::new();
    for w in writes {
        let Some(input) = keys::history_input(&w.key) else {
            continue;
        };
        let step = match (input, &w.value) {
            (HistoryInput::Run(_), Some(v)) => match NodeRun::decode(v.as_slice()) {
                Ok(run) => fold.add_run(&run),
                Err(e) => Err(Rebuild(format!("{}: {e}", w.key))),
            },
            (HistoryInput::Run(node), None) if fold.lists(node) => {
                Err(Rebuild(format!("a run of {node} deleted")))
            }
            (HistoryInput::Acceptance(node), Some(v)) => match Acceptance::decode(v.as_slice()) {
                Ok(a) => {
                    fold.set_acceptance(node, Some(a));
                    Ok(())
                }
                Err(e) => Err(Rebuild(format!("{}: {e}", w.key))),
            },
            (HistoryInput::Acceptance(node), None) => {
                fold.set_acceptance(node, None);
                Ok(())
            }
            (HistoryInput::Node(name), Some(_)) if !fold.lists(name) => {
                joining.push(name.to_string());
                Ok(())
            }
            (HistoryInput::Node(name), None) if fold.lists(name) => {
                Err(Rebuild(format!("node {name} removed")))
            }
            (HistoryInput::Node(name), None) => {
                joining.retain(|n| n != name);
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(r) = step {
            return Ok(Err(r));
        }
    }
    joining.sort();
    joining.dedup();
    if joining.len() > JOINING_AT_MOST {
        return Ok(Err(Rebuild(format!("{} nodes joined", joining.len()))));
    }
    for names in joining.chunks(history::READ_NODES) {
        for (name, runs) in names.iter().zip(history::runs_of(store, names).await?) {
            fold.add_node(name, &runs);
        }
    }
    Ok(Ok(()))
}

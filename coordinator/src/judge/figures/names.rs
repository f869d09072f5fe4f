//! The strings every rank's figures repeat (its node, device model and
//! class, the figures' keys), held once and shared. A 131,072-rank job has
//! 16,384 nodes, one class and two keys: as a `String` each, its figures
//! held ~53 MB of them at the judge's busiest moment (heap profile,
//! 2026-12-03), which was then the coordinator's highest.

use std::collections::HashSet;
use std::sync::Arc;

use gpuctl_proto::pb::RankResult;

use super::{class_of, Figure};

/// A string shared by every figure that says it.
pub type Name = Arc<str>;

/// The names handed out while one job's figures are made.
#[derive(Default)]
pub struct Names {
    seen: HashSet<Name>,
    /// (model, torch, nccl) → class, for the first [`FEW_CLASSES`]: a job
    /// has one or a few, and each rank's would otherwise be made to be
    /// looked up.
    classes: Vec<(Name, Name, Name, Name)>,
}

/// Past this many classes (what ranks report is not trusted to be few),
/// a rank's class is made and looked up by hash, as before it was shared.
const FEW_CLASSES: usize = 16;

impl Names {
    /// `s`, shared with every earlier caller that asked for the same.
    pub fn name(&mut self, s: &str) -> Name {
        if let Some(n) = self.seen.get(s) {
            return n.clone();
        }
        let n: Name = Arc::from(s);
        self.seen.insert(n.clone());
        n
    }

    /// The device class of `r` (see [`super::device_class`]).
    pub fn class(&mut self, r: &RankResult) -> Name {
        let (model, torch, nccl) = (&*r.device_name, &*r.torch_version, &*r.nccl_version);
        let known = self
            .classes
            .iter()
            .find(|(m, t, n, _)| **m == *model && **t == *torch && **n == *nccl);
        if let Some((.., class)) = known {
            return class.clone();
        }
        let class = self.name(&class_of(model, torch, nccl));
        if self.classes.len() < FEW_CLASSES {
            let parts = (self.name(model), self.name(torch), self.name(nccl));
            self.classes
                .push((parts.0, parts.1, parts.2, class.clone()));
        }
        class
    }

    /// `figures` with their keys shared.
    pub fn figures(&mut self, mut figures: Vec<Figure>) -> Vec<Figure> {
        for f in &mut figures {
            f.key = self.name(&f.key);
        }
        figures.shrink_to_fit();
        figures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::figures::{device_class, Metric};

    #[test]
    fn equal_strings_are_one_allocation() {
        let mut names = Names::default();
        let a = names.name("node-0001");
        let b = names.name(&String::from("node-0001"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &names.name("node-0002")));
    }

    #[test]
    fn a_class_is_made_once_and_reads_as_device_class() {
        let r = RankResult {
            device_name: "NVIDIA H200".into(),
            torch_version: "2.11.0".into(),
            nccl_version: "2.28.9".into(),
            ..Default::default()
        };
        let mut other = r.clone();
        other.nccl_version = "2.27.3".into();
        let mut names = Names::default();
        let first = names.class(&r);
        assert_eq!(*first, *device_class(&r));
        assert!(Arc::ptr_eq(&first, &names.class(&r.clone())));
        let second = names.class(&other);
        assert_eq!(*second, *device_class(&other));
        assert!(!Arc::ptr_eq(&first, &second));
    }

    #[test]
    fn past_a_few_classes_each_is_still_its_own_and_shared() {
        let mut names = Names::default();
        let rank = |i: usize| RankResult {
            device_name: "NVIDIA H200".into(),
            torch_version: format!("2.{i}"),
            ..Default::default()
        };
        let first: Vec<Name> = (0..FEW_CLASSES * 2)
            .map(|i| names.class(&rank(i)))
            .collect();
        assert_eq!(names.classes.len(), FEW_CLASSES);
        for (i, class) in first.iter().enumerate() {
            assert_eq!(**class, *device_class(&rank(i)));
            assert!(Arc::ptr_eq(class, &names.class(&rank(i))));
        }
    }

    #[test]
    fn figure_keys_are_shared_across_ranks() {
        let fig = |key: &str| Figure {
            metric: Metric::StressTflops,
            key: Arc::from(key),
            value: 1.0,
        };
        let mut names = Names::default();
        let a = names.figures(vec![fig("bf16 8192")]);
        let b = names.figures(vec![fig("bf16 8192"), fig("fp8 8192")]);
        assert!(Arc::ptr_eq(&a[0].key, &b[0].key));
        assert_eq!(&*b[1].key, "fp8 8192");
    }
}

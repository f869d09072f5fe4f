//! Flat parameter buffers, unit by unit: a model's trainable variables become
//! views (same shape and strides, so channels_last stays channels_last) into a
//! flat buffer of the compute precision, and their gradients views into a
//! second one, so that a unit's gradients are one contiguous slice for a
//! collective and autograd accumulates straight into it (its in-place
//! `grad += new` path). Each variable starts at a multiple of [`ALIGN`]
//! elements; each unit is padded to a multiple of the world size so that it
//! shards evenly. The flat parameters of a model are its units' padded
//! buffers end to end, root first ([`Layout`]).

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

use crate::comm::Collectives;
use crate::workloads::models::Model;

/// Element alignment of every variable inside the flat buffers.
pub const ALIGN: i64 = 64;

/// Where each variable of one unit sits in the unit's flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitLayout {
    /// (offset, elements) per variable, in the unit's variable order.
    pub entries: Vec<(i64, i64)>,
    /// End of the last variable.
    pub len: i64,
    /// `len` rounded up to a multiple of the world size (at least the world size).
    pub padded: i64,
}

impl UnitLayout {
    pub fn new(numels: &[i64], world: usize) -> UnitLayout {
        let mut off = 0;
        let mut entries = Vec::with_capacity(numels.len());
        for &n in numels {
            entries.push((off, n));
            off += (n + ALIGN - 1) / ALIGN * ALIGN;
        }
        let len = entries.last().map(|(o, n)| o + n).unwrap_or(0);
        let w = world.max(1) as i64;
        let padded = (len.max(1) + w - 1) / w * w;
        UnitLayout {
            entries,
            len,
            padded,
        }
    }

    /// Elements of one rank's shard of this unit.
    pub fn shard(&self, world: usize) -> i64 {
        self.padded / world.max(1) as i64
    }
}

/// Every unit's layout and where it starts, whole and in one rank's shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub units: Vec<UnitLayout>,
    /// Start of each unit in the whole flat buffer.
    pub offsets: Vec<i64>,
    /// Start of each unit's shard in one rank's flat shard.
    pub shard_offsets: Vec<i64>,
    /// Elements of the whole flat buffer (every unit padded).
    pub total: i64,
    /// Elements of one rank's flat shard.
    pub shard_total: i64,
    pub world: usize,
}

impl Layout {
    pub fn new(units: &[Vec<Tensor>], world: usize) -> Layout {
        let units: Vec<UnitLayout> = units
            .iter()
            .map(|vars| {
                let numels: Vec<i64> = vars.iter().map(|v| v.numel() as i64).collect();
                UnitLayout::new(&numels, world)
            })
            .collect();
        let (mut offsets, mut shard_offsets) = (Vec::new(), Vec::new());
        let (mut total, mut shard_total) = (0, 0);
        for u in &units {
            offsets.push(total);
            shard_offsets.push(shard_total);
            total += u.padded;
            shard_total += u.shard(world);
        }
        Layout {
            units,
            offsets,
            shard_offsets,
            total,
            shard_total,
            world,
        }
    }

    /// Where the units before `end` stop: the start of unit `end`, or the total.
    pub fn end_of(&self, end: usize) -> i64 {
        self.offsets.get(end).copied().unwrap_or(self.total)
    }

    /// The largest unit other than the root (0 when there is none).
    pub fn largest_block(&self) -> i64 {
        self.units
            .iter()
            .skip(1)
            .map(|u| u.padded)
            .max()
            .unwrap_or(0)
    }
}

/// A view of `flat[off .. off + t.numel()]` with `t`'s shape and strides
/// (`t` dense: a permutation of a contiguous tensor, e.g. channels_last).
pub fn view_like(flat: &Tensor, off: i64, t: &Tensor) -> Result<Tensor> {
    let sizes = t.size();
    let strides = t.stride();
    let n = sizes.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| strides[b].cmp(&strides[a]).then(a.cmp(&b)));
    let shape: Vec<i64> = order.iter().map(|&d| sizes[d]).collect();
    let mut inv = vec![0i64; n];
    for (pos, &d) in order.iter().enumerate() {
        inv[d] = pos as i64;
    }
    let numel = sizes.iter().product::<i64>();
    Ok(flat
        .f_narrow(0, off, numel)?
        .f_view(shape.as_slice())?
        .f_permute(inv.as_slice())?)
}

/// The fp32 values of a unit's variables laid out flat (`padded` elements,
/// zeros between), each in its own memory order (as its view will read them).
pub fn gather_values(vars: &[Tensor], lay: &UnitLayout, dev: Device) -> Result<Tensor> {
    let flat = Tensor::f_zeros([lay.padded], (Kind::Float, dev))?;
    tch::no_grad(|| -> Result<()> {
        for (v, &(off, _)) in vars.iter().zip(&lay.entries) {
            view_like(&flat, off, v)?.f_copy_(v)?;
        }
        Ok(())
    })?;
    Ok(flat)
}

/// A unit's initial fp32 values, rank 0's on every rank when there is a
/// communicator ([`gather_values`], then a broadcast).
pub fn initial_values(
    vars: &[Tensor],
    lay: &UnitLayout,
    dev: Device,
    comm: Option<&mut (dyn Collectives + '_)>,
) -> Result<Tensor> {
    let values = gather_values(vars, lay, dev)?;
    if let Some(c) = comm {
        c.broadcast(&values, &values, 0)
            .context("broadcast of rank 0's initial parameters")?;
    }
    Ok(values)
}

/// Casts the model's other floating variables (BatchNorm running
/// statistics: not trained, not in any unit) to `kind`.
pub fn cast_buffers(model: &Model, kind: Kind) -> Result<()> {
    tch::no_grad(|| -> Result<()> {
        for (_, mut v) in model.vs.variables() {
            if v.kind() != kind && v.is_floating_point() && !v.requires_grad() {
                let c = v.f_to_kind(kind)?;
                v.set_data(&c);
            }
        }
        Ok(())
    })
}

/// Makes each variable a view into `params` and its gradient a view into
/// `grads` (both flat, the unit's layout from `base`), the values copied
/// over (cast to the buffer's kind).
pub fn install(
    vars: &mut [Tensor],
    lay: &UnitLayout,
    params: &Tensor,
    grads: &Tensor,
    copy_values: bool,
) -> Result<()> {
    tch::no_grad(|| -> Result<()> {
        for (v, &(off, _)) in vars.iter_mut().zip(&lay.entries) {
            let view = view_like(params, off, v)?;
            if copy_values {
                view.shallow_clone().f_copy_(v)?;
            }
            v.set_data(&view);
        }
        Ok(())
    })?;
    // Define every variable's gradient (one backward of Σ 0·v), then make
    // each gradient a view of the flat gradient buffer.
    let mut zero: Option<Tensor> = None;
    for v in vars.iter() {
        let s = v.f_sum(Kind::Float)?.f_mul_scalar(0.0)?;
        zero = Some(match zero {
            None => s,
            Some(z) => z.f_add(&s)?,
        });
    }
    if let Some(z) = zero {
        z.f_backward()?;
    }
    tch::no_grad(|| -> Result<()> {
        for (v, &(off, _)) in vars.iter().zip(&lay.entries) {
            let mut g = v.f_grad()?;
            if !g.defined() {
                bail!("internal: a trainable variable got no gradient");
            }
            let view = view_like(grads, off, v)?;
            g.set_data(&view);
        }
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_and_pads_each_unit() {
        let l = UnitLayout::new(&[3, 64, 65, 1], 3);
        assert_eq!(l.entries, vec![(0, 3), (64, 64), (128, 65), (256, 1)]);
        assert_eq!(l.len, 257);
        assert_eq!(l.padded, 258);
        assert_eq!(l.shard(3), 86);
        let units = vec![
            vec![Tensor::zeros([3], (Kind::Float, Device::Cpu))],
            vec![Tensor::zeros([130], (Kind::Float, Device::Cpu))],
        ];
        let l = Layout::new(&units, 2);
        assert_eq!(l.offsets, vec![0, 4]);
        assert_eq!(l.shard_offsets, vec![0, 2]);
        assert_eq!((l.total, l.shard_total, l.largest_block()), (134, 67, 130));
    }
}

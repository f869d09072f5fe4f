//! Flat parameter buffers of the training loop ([`super::train`]): the
//! model's trainable variables become views (same shape and strides, so
//! channels_last stays channels_last) into one flat buffer of the compute
//! precision, and their gradients views into a second one, so a bucket of
//! gradients is one contiguous slice for a collective. Each variable starts at
//! a multiple of [`ALIGN`] elements; the buffers are padded to a multiple of
//! the world size so that they shard evenly.

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

use super::models::Model;
use crate::device::fnv1a64;

/// Element alignment of every variable inside the flat buffers.
pub const ALIGN: i64 = 64;

/// Where each variable sits in the flat buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// (offset, elements) per variable, in the model's variable order.
    pub entries: Vec<(i64, i64)>,
    /// End of the last variable.
    pub len: i64,
    /// `len` rounded up to a multiple of the world size.
    pub padded: i64,
}

impl Layout {
    pub fn new(numels: &[i64], world: usize) -> Layout {
        let mut off = 0;
        let mut entries = Vec::with_capacity(numels.len());
        for &n in numels {
            entries.push((off, n));
            off += (n + ALIGN - 1) / ALIGN * ALIGN;
        }
        let len = entries.last().map(|(o, n)| o + n).unwrap_or(0);
        let w = world.max(1) as i64;
        let padded = (len.max(1) + w - 1) / w * w;
        Layout {
            entries,
            len,
            padded,
        }
    }

    pub fn shard(&self, world: usize) -> i64 {
        self.padded / world.max(1) as i64
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

/// The model's trainable variables moved into flat compute buffers.
pub struct FlatModel {
    pub layout: Layout,
    /// Flat parameters in the compute precision; the variables are views of it.
    pub compute: Tensor,
    /// Flat gradients in the compute precision; the variables' grads are views of it.
    pub grad: Tensor,
}

impl FlatModel {
    /// Moves the model's trainable variables into flat buffers (cast to
    /// `kind`) and casts its other floating variables (BatchNorm statistics)
    /// to `kind`. Returns it with the flat fp32 values the variables had.
    pub fn install(model: &Model, kind: Kind, world: usize) -> Result<(FlatModel, Tensor)> {
        let dev = model.device;
        let mut vars = model.vs.trainable_variables();
        let numels: Vec<i64> = vars.iter().map(|v| v.numel() as i64).collect();
        let layout = Layout::new(&numels, world);
        let master = Tensor::f_zeros([layout.padded], (Kind::Float, dev))?;
        let compute = Tensor::f_zeros([layout.padded], (kind, dev))?;
        let grad = Tensor::f_zeros([layout.padded], (kind, dev))?;
        tch::no_grad(|| -> Result<()> {
            for (v, &(off, n)) in vars.iter_mut().zip(&layout.entries) {
                master
                    .f_narrow(0, off, n)?
                    .f_copy_(&v.f_detach()?.f_reshape([-1])?)?;
                let view = view_like(&compute, off, v)?;
                let mut view_mut = view.shallow_clone();
                view_mut.f_copy_(v)?;
                v.set_data(&view);
            }
            // Everything else floating (BatchNorm running statistics) to `kind`.
            for (_, mut v) in model.vs.variables() {
                if v.kind() != kind && v.is_floating_point() {
                    let c = v.f_to_kind(kind)?;
                    v.set_data(&c);
                }
            }
            Ok(())
        })?;
        // Define every variable's gradient (one backward of Σ 0·v), then make
        // each gradient a view of the flat gradient buffer.
        let mut zero: Option<Tensor> = None;
        for v in &vars {
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
            for (v, &(off, _)) in vars.iter().zip(&layout.entries) {
                let mut g = v.f_grad()?;
                if !g.defined() {
                    bail!("internal: a trainable variable got no gradient");
                }
                let view = view_like(&grad, off, v)?;
                g.set_data(&view);
            }
            Ok(())
        })?;
        let _ = grad.shallow_clone().f_zero_()?;
        Ok((
            FlatModel {
                layout,
                compute,
                grad,
            },
            master,
        ))
    }
}

/// FNV-1a 64 of a float tensor's bytes, as 16 hex digits.
pub fn digest(t: &Tensor) -> Result<String> {
    let c = t.f_to_device(Device::Cpu)?.f_contiguous()?;
    let n = c.numel() * c.kind().elt_size_in_bytes();
    let mut bytes = vec![0u8; n];
    c.f_copy_data_u8(&mut bytes, c.numel())?;
    Ok(format!("{:016x}", fnv1a64(&bytes)))
}

//! MobileNetV2 as torchvision lays it out (3,504,872 parameters with 1000
//! classes), after tch's `vision::mobilenet::v2` (same names, same
//! initialisation in the same order) with one difference: tch pools the
//! features into fp32 (`mean_dim(.., Kind::Float)`), so in bf16 or fp16 the
//! classifier met fp32 activations and bf16 weights ("mat1 and mat2 must have
//! the same dtype", seen on H200s). Here the pooled features keep the compute
//! type.
//!
//! In stages: the stem is `features.0`, the blocks are the inverted residual
//! blocks `features.1` … `features.17`, the head is `features.18`, the pooling
//! and the classifier (dropout 0.2, train mode, and `classifier.1`).

use tch::nn;
use tch::Kind;

use super::staged::{bn, conv, lin, Bn, Conv, Geom, Stage, Staged};

/// Conv2d + BatchNorm2d + ReLU6.
struct Cbr(Conv, Bn);

fn cbr(p: nn::Path, c_in: i64, c_out: i64, ks: i64, stride: i64, groups: i64) -> Cbr {
    let g = Geom {
        k: ks,
        stride,
        padding: (ks - 1) / 2,
        groups,
    };
    Cbr(conv(&p / 0, c_in, c_out, g, false), bn(&p / 1, c_out))
}

impl Cbr {
    fn f(&self, x: &tch::Tensor) -> anyhow::Result<tch::Tensor> {
        Ok(self.1.f(&self.0.f(x)?)?.f_relu()?.f_clamp_max(6.)?)
    }
}

/// Inverted residual block with expansion ratio `er`.
fn inverted(p: nn::Path, c_in: i64, c_out: i64, stride: i64, er: i64) -> Stage {
    let hidden = er * c_in;
    let mut id = 0;
    let expand = (er != 1).then(|| {
        id += 1;
        cbr(&p / 0, c_in, hidden, 1, 1, 1)
    });
    let dw = cbr(&p / id, hidden, hidden, 3, stride, hidden);
    let project = conv(&p / (id + 1), hidden, c_out, Geom::new(1, 1, 0), false);
    let project_bn = bn(&p / (id + 2), c_out);
    Box::new(move |xs| {
        let h = match &expand {
            Some(e) => dw.f(&e.f(xs)?)?,
            None => dw.f(xs)?,
        };
        let ys = project_bn.f(&project.f(&h)?)?;
        Ok(if stride == 1 && c_in == c_out {
            xs.f_add(&ys)?
        } else {
            ys
        })
    })
}

/// (expansion, channels, repeats, first stride) per stage.
const STAGES: [(i64, i64, i64, i64); 7] = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
];

pub fn v2(p: &nn::Path, classes: i64) -> Staged {
    let f = p / "features";
    let c = p / "classifier";
    let mut c_in = 32;
    let first = cbr(&f / "0", 3, c_in, 3, 2, 1);
    let stem: Stage = Box::new(move |x| first.f(x));
    let mut blocks = Vec::new();
    let mut layer = 1;
    for (er, c_out, n, stride) in STAGES {
        for i in 0..n {
            let stride = if i == 0 { stride } else { 1 };
            let block = inverted(&f / layer / "conv", c_in, c_out, stride, er);
            blocks.push((format!("features.{layer}"), block));
            c_in = c_out;
            layer += 1;
        }
    }
    let last = cbr(&f / layer, c_in, 1280, 1, 1, 1);
    let fc = lin(&c / 1, 1280, classes);
    let head: Stage = Box::new(move |x| {
        let pooled = last
            .f(x)?
            .f_mean_dim(Some([2i64, 3].as_slice()), false, None::<Kind>)?;
        fc.f(&pooled.f_dropout(0.2, true)?)
    });
    Staged::new(Some(stem), blocks, head)
}

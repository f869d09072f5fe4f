//! A small CNN that trains in milliseconds on a CPU: three 3×3 conv + BN + ReLU
//! layers (32, 64, 128 channels; the first two followed by 2×2 max-pooling),
//! global average pooling and a linear classifier, on 3×32×32 images.
//!
//! In stages: the stem is the identity (the blocks see the batch's images
//! themselves), the blocks are `l1` + pool, `l2` + pool and `l3`, the head is
//! the pooling and `fc`.

use tch::nn;

use super::staged::{bn, conv, lin, pool_flat, Geom, Stage, Staged};

pub const CLASSES: i64 = 10;
pub const SIDE: i64 = 32;

/// Conv + BN + ReLU, then a 2×2 max-pool if `pool`.
fn conv_bn(p: nn::Path, c_in: i64, c_out: i64, pool: bool) -> Stage {
    let c = conv(&p / "conv", c_in, c_out, Geom::new(3, 1, 1), false);
    let b = bn(&p / "bn", c_out);
    Box::new(move |x| {
        let y = b.f(&c.f(x)?)?.f_relu()?;
        Ok(if pool {
            y.f_max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)?
        } else {
            y
        })
    })
}

pub fn cnn(p: &nn::Path, classes: i64) -> Staged {
    let blocks = vec![
        ("l1".to_string(), conv_bn(p / "l1", 3, 32, true)),
        ("l2".to_string(), conv_bn(p / "l2", 32, 64, true)),
        ("l3".to_string(), conv_bn(p / "l3", 64, 128, false)),
    ];
    let fc = lin(p / "fc", 128, classes);
    Staged::new(None, blocks, Box::new(move |x| fc.f(&pool_flat(x)?)))
}

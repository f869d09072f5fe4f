//! ResNet-18/50/101/152 as torchvision and tch lay them out (same variable
//! names, `conv1.weight`, `layer1.0.downsample.0.weight`, `fc.bias`, …; same
//! parameter counts; same initialisation, drawn in tch's order, so a seed
//! gives tch's `vision::resnet` values), in stages: the stem is conv1 + bn1 +
//! ReLU + max-pool, each residual block (`layer1.0` … `layer4.N`) is a block,
//! the head is average pooling + flatten + fc. The ops are tch's, one for one.

use anyhow::{bail, Result};
use tch::{nn, Tensor};

use super::staged::{bn, conv, lin, pool_flat, Bn, Conv, Geom, Stage, Staged};

/// The shortcut: a strided 1×1 conv + BN where the shape changes, else the
/// identity.
fn downsample(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> Option<(Conv, Bn)> {
    (stride != 1 || c_in != c_out).then(|| {
        (
            conv(&p / "0", c_in, c_out, Geom::new(1, stride, 0), false),
            bn(&p / "1", c_out),
        )
    })
}

/// `relu(shortcut(x) + ys)`.
fn residual(ds: &Option<(Conv, Bn)>, x: &Tensor, ys: &Tensor) -> Result<Tensor> {
    let short = match ds {
        Some((c, b)) => b.f(&c.f(x)?)?,
        None => x.shallow_clone(),
    };
    Ok(short.f_add(ys)?.f_relu()?)
}

/// Two 3×3 convs (ResNet-18/34).
fn basic(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> Stage {
    let conv1 = conv(&p / "conv1", c_in, c_out, Geom::new(3, stride, 1), false);
    let bn1 = bn(&p / "bn1", c_out);
    let conv2 = conv(&p / "conv2", c_out, c_out, Geom::new(3, 1, 1), false);
    let bn2 = bn(&p / "bn2", c_out);
    let ds = downsample(&p / "downsample", c_in, c_out, stride);
    Box::new(move |x| {
        let ys = bn1.f(&conv1.f(x)?)?.f_relu()?;
        let ys = bn2.f(&conv2.f(&ys)?)?;
        residual(&ds, x, &ys)
    })
}

/// 1×1, 3×3 (strided), 1×1 ×4 (ResNet-50/101/152, stride on the 3×3 as
/// torchvision's v1.5 and tch).
fn bottleneck(p: nn::Path, c_in: i64, width: i64, stride: i64) -> Stage {
    let c_out = 4 * width;
    let conv1 = conv(&p / "conv1", c_in, width, Geom::new(1, 1, 0), false);
    let bn1 = bn(&p / "bn1", width);
    let conv2 = conv(&p / "conv2", width, width, Geom::new(3, stride, 1), false);
    let bn2 = bn(&p / "bn2", width);
    let conv3 = conv(&p / "conv3", width, c_out, Geom::new(1, 1, 0), false);
    let bn3 = bn(&p / "bn3", c_out);
    let ds = downsample(&p / "downsample", c_in, c_out, stride);
    Box::new(move |x| {
        let ys = bn1.f(&conv1.f(x)?)?.f_relu()?;
        let ys = bn2.f(&conv2.f(&ys)?)?.f_relu()?;
        let ys = bn3.f(&conv3.f(&ys)?)?;
        residual(&ds, x, &ys)
    })
}

/// ResNet of `depth` 18, 50, 101 or 152 with `classes` outputs.
pub fn resnet(p: &nn::Path, depth: u32, classes: i64) -> Result<Staged> {
    let (bottlenecked, counts) = match depth {
        18 => (false, [2, 2, 2, 2]),
        50 => (true, [3, 4, 6, 3]),
        101 => (true, [3, 4, 23, 3]),
        152 => (true, [3, 8, 36, 3]),
        d => bail!("resnet{d}: depth not one of 18, 50, 101, 152"),
    };
    let expansion = if bottlenecked { 4 } else { 1 };
    let conv1 = conv(p / "conv1", 3, 64, Geom::new(7, 2, 3), false);
    let bn1 = bn(p / "bn1", 64);
    let stem: Stage = Box::new(move |x| {
        Ok(bn1
            .f(&conv1.f(x)?)?
            .f_relu()?
            .f_max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)?)
    });
    let mut blocks = Vec::new();
    let mut c_in = 64;
    for (i, (n, width)) in counts.into_iter().zip([64, 128, 256, 512]).enumerate() {
        let layer = format!("layer{}", i + 1);
        for j in 0..n {
            let stride = if i > 0 && j == 0 { 2 } else { 1 };
            let bp = p / layer.as_str() / j;
            let block = if bottlenecked {
                bottleneck(bp, c_in, width, stride)
            } else {
                basic(bp, c_in, width, stride)
            };
            blocks.push((format!("{layer}.{j}"), block));
            c_in = width * expansion;
        }
    }
    let fc = lin(p / "fc", 512 * expansion, classes);
    let head: Stage = Box::new(move |x| fc.f(&pool_flat(x)?));
    Ok(Staged::new(Some(stem), blocks, head))
}

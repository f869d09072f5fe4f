//! MobileNetV2 as torchvision lays it out (3,504,872 parameters with 1000
//! classes), after tch's `vision::mobilenet::v2` with one difference: tch
//! pools the features into fp32 (`mean_dim(.., Kind::Float)`), so in bf16 or
//! fp16 the classifier met fp32 activations and bf16 weights ("mat1 and mat2
//! must have the same dtype", seen on H200s). Here the pooled features keep
//! the compute type.

use tch::nn::{self, ModuleT};
use tch::Kind;

/// Conv2d + BatchNorm2d + ReLU6.
fn cbr(p: nn::Path, c_in: i64, c_out: i64, ks: i64, stride: i64, groups: i64) -> impl ModuleT {
    let conv = nn::ConvConfig {
        stride,
        padding: (ks - 1) / 2,
        groups,
        bias: false,
        ..Default::default()
    };
    nn::seq_t()
        .add(nn::conv2d(&p / 0, c_in, c_out, ks, conv))
        .add(nn::batch_norm2d(&p / 1, c_out, Default::default()))
        .add_fn(|xs| xs.relu().clamp_max(6.))
}

/// Inverted residual block with expansion ratio `er`.
fn inverted(p: nn::Path, c_in: i64, c_out: i64, stride: i64, er: i64) -> impl ModuleT {
    let hidden = er * c_in;
    let mut conv = nn::seq_t();
    let mut id = 0;
    if er != 1 {
        conv = conv.add(cbr(&p / id, c_in, hidden, 1, 1, 1));
        id += 1;
    }
    conv = conv
        .add(cbr(&p / id, hidden, hidden, 3, stride, hidden))
        .add(nn::conv2d(&p / (id + 1), hidden, c_out, 1, nn::no_bias()))
        .add(nn::batch_norm2d(&p / (id + 2), c_out, Default::default()));
    nn::func_t(move |xs, train| {
        let ys = xs.apply_t(&conv, train);
        if stride == 1 && c_in == c_out {
            xs + ys
        } else {
            ys
        }
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

pub fn v2(p: &nn::Path, classes: i64) -> impl ModuleT {
    let f = p / "features";
    let c = p / "classifier";
    let mut c_in = 32;
    let mut features = nn::seq_t().add(cbr(&f / "0", 3, c_in, 3, 2, 1));
    let mut layer = 1;
    for (er, c_out, n, stride) in STAGES {
        for i in 0..n {
            let stride = if i == 0 { stride } else { 1 };
            features = features.add(inverted(&f / layer / "conv", c_in, c_out, stride, er));
            c_in = c_out;
            layer += 1;
        }
    }
    features = features.add(cbr(&f / layer, c_in, 1280, 1, 1, 1));
    let classifier = nn::seq_t()
        .add_fn_t(|xs, train| xs.dropout(0.2, train))
        .add(nn::linear(&c / 1, 1280, classes, Default::default()));
    nn::func_t(move |xs, train| {
        xs.apply_t(&features, train)
            .mean_dim(Some([2i64, 3].as_slice()), false, None::<Kind>)
            .apply_t(&classifier, train)
    })
}

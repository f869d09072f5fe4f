//! A small CNN that trains in milliseconds on a CPU: three 3×3 conv + BN + ReLU
//! layers (32, 64, 128 channels; the first two followed by 2×2 max-pooling),
//! global average pooling and a linear classifier, on 3×32×32 images.

use tch::{nn, nn::ModuleT};

pub const CLASSES: i64 = 10;
pub const SIDE: i64 = 32;

fn conv_bn(p: nn::Path, c_in: i64, c_out: i64) -> impl ModuleT {
    let cfg = nn::ConvConfig {
        padding: 1,
        bias: false,
        ..Default::default()
    };
    let conv = nn::conv2d(&p / "conv", c_in, c_out, 3, cfg);
    let bn = nn::batch_norm2d(&p / "bn", c_out, Default::default());
    nn::func_t(move |xs, train| xs.apply(&conv).apply_t(&bn, train).relu())
}

pub fn cnn(p: &nn::Path, classes: i64) -> nn::FuncT<'static> {
    let l1 = conv_bn(p / "l1", 3, 32);
    let l2 = conv_bn(p / "l2", 32, 64);
    let l3 = conv_bn(p / "l3", 64, 128);
    let fc = nn::linear(p / "fc", 128, classes, Default::default());
    nn::func_t(move |xs, train| {
        xs.apply_t(&l1, train)
            .max_pool2d_default(2)
            .apply_t(&l2, train)
            .max_pool2d_default(2)
            .apply_t(&l3, train)
            .adaptive_avg_pool2d([1, 1])
            .flat_view()
            .apply(&fc)
    })
}

// SGD with momentum in one pass over the parameters: PyTorch's fused kernel
// (`torch.optim.SGD(fused=True)`), which tch cannot call (it takes lists of
// tensors). Unfused, the update read and wrote every fp32 parameter six
// times (unscale, momentum scale, momentum add, lr scale, subtract): about
// 20 ms of a 95 ms GPT-1.3B step on an H200 went to it (docs/benchmarks.md).
// The gradient is divided by `divisor` (ranks x loss scale) inside the kernel.
#include <ATen/ATen.h>

#include <cstring>
#include <optional>
#include <vector>

extern "C" {

// 0 on success; otherwise 1 and a malloc'd message in *err. master, momentum
// and grad are at::Tensor* of one float kind and shape; momentum may be null
// when mom is 0.
int gpuctl_fused_sgd(void *master, void *momentum, void *grad, double lr,
                     double mom, double divisor, char **err) {
  try {
    auto &p = *static_cast<at::Tensor *>(master);
    auto &g = *static_cast<at::Tensor *>(grad);
    std::vector<at::Tensor> bufs;
    if (mom != 0.0) {
      bufs.push_back(*static_cast<at::Tensor *>(momentum));
    }
    std::optional<at::Tensor> scale;
    if (divisor != 1.0) {
      scale = at::full({}, divisor, p.options().dtype(at::kFloat));
    }
    at::_fused_sgd_({p}, {g}, bufs, /*weight_decay=*/0.0, mom, lr,
                    /*dampening=*/0.0, /*nesterov=*/false, /*maximize=*/false,
                    /*is_first_step=*/false, scale, std::nullopt);
    return 0;
  } catch (const std::exception &e) {
    *err = strdup(e.what());
    return 1;
  } catch (...) {
    *err = strdup("unknown C++ exception in the fused SGD step");
    return 1;
  }
}
}

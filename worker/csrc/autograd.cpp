// Backward from a tensor with a given gradient (torch.autograd.backward(t, g)),
// which tch does not expose: the training loop runs backward block by block,
// each block's output with the gradient that reached it from the next block.
#include <torch/csrc/autograd/autograd.h>

#include <cstring>

extern "C" {

// 0 on success; otherwise 1 and a malloc'd message in *err (free it).
int gpuctl_backward_with(void *output, void *grad, char **err) {
  try {
    const auto &o = *static_cast<at::Tensor *>(output);
    const auto &g = *static_cast<at::Tensor *>(grad);
    torch::autograd::backward({o}, {g}, /*retain_graph=*/false,
                              /*create_graph=*/false);
    return 0;
  } catch (const std::exception &e) {
    *err = strdup(e.what());
    return 1;
  } catch (...) {
    *err = strdup("unknown C++ exception in backward");
    return 1;
  }
}
}

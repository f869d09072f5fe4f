// An empty tensor in pinned host memory, from the CUDA caching host
// allocator, which tch cannot ask for (its options are a kind and a device).
// The loader's workers write each batch straight into one: a batch made in
// pageable memory and then pinned cost a fresh 38 MB allocation (mmap, page
// faults, munmap with its TLB shootdowns across every thread of the process)
// and a copy per batch, and more worker threads made the process slower.
// A pinned block freed after its non-blocking copy goes back to the cache
// once the copy is done, and the next batch takes it again.
#include <ATen/ATen.h>

#include <cstring>

extern "C" {

// 0 and a new at::Tensor* in *out (tch owns it); otherwise 1 and a malloc'd
// message in *err. kind: 0 float32, 1 int64.
int gpuctl_empty_pinned(const int64_t *sizes, int ndim, int kind, void **out,
                        char **err) {
  try {
    auto dtype = kind == 0 ? at::kFloat : at::kLong;
    auto t = at::empty(c10::IntArrayRef(sizes, static_cast<size_t>(ndim)),
                       at::TensorOptions().dtype(dtype).pinned_memory(true));
    *out = new at::Tensor(std::move(t));
    return 0;
  } catch (const std::exception &e) {
    *err = strdup(e.what());
    return 1;
  } catch (...) {
    *err = strdup("unknown C++ exception allocating pinned memory");
    return 1;
  }
}
}

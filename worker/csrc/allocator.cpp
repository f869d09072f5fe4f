// The CUDA caching allocator's figures (torch.cuda.max_memory_allocated,
// reset_peak_memory_stats, empty_cache), which libtorch has only as inline
// C++ over c10::DeviceAllocator: compiled here against the same headers, so
// the calls and the DeviceStats layout are the compiler's, not ours, and any
// C++ exception stops here instead of crossing into Rust.
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <cstring>

namespace {

// The allocator, or null with *err set; *ready says whether it has been
// initialised (before the first CUDA allocation it holds nothing).
c10::DeviceAllocator *cuda_allocator(bool *ready, char **err) {
  auto *a = c10::GetAllocator(c10::DeviceType::CUDA);
  auto *d = dynamic_cast<c10::DeviceAllocator *>(a);
  if (d == nullptr) {
    *err = strdup("the CUDA allocator is not a c10::DeviceAllocator");
    return nullptr;
  }
  *ready = d->initialized();
  return d;
}

int fail(char **err, const char *what) {
  *err = strdup(what);
  return 1;
}

} // namespace

extern "C" {

// out: allocated current, allocated peak, reserved current, reserved peak.
int gpuctl_alloc_stats(int device, int64_t *out, char **err) {
  try {
    bool ready = false;
    auto *d = cuda_allocator(&ready, err);
    if (d == nullptr) return 1;
    if (!ready) {
      for (int i = 0; i < 4; i++) out[i] = 0;
      return 0;
    }
    auto s = d->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg =
        static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = s.allocated_bytes[agg].current;
    out[1] = s.allocated_bytes[agg].peak;
    out[2] = s.reserved_bytes[agg].current;
    out[3] = s.reserved_bytes[agg].peak;
    return 0;
  } catch (const std::exception &e) {
    return fail(err, e.what());
  } catch (...) {
    return fail(err, "unknown C++ exception in getDeviceStats");
  }
}

int gpuctl_alloc_reset_peak(int device, char **err) {
  try {
    bool ready = false;
    auto *d = cuda_allocator(&ready, err);
    if (d == nullptr) return 1;
    if (ready) d->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return 0;
  } catch (const std::exception &e) {
    return fail(err, e.what());
  } catch (...) {
    return fail(err, "unknown C++ exception in resetPeakStats");
  }
}

int gpuctl_alloc_empty_cache(char **err) {
  try {
    bool ready = false;
    auto *d = cuda_allocator(&ready, err);
    if (d == nullptr) return 1;
    if (ready) d->emptyCache();
    return 0;
  } catch (const std::exception &e) {
    return fail(err, e.what());
  } catch (...) {
    return fail(err, "unknown C++ exception in emptyCache");
  }
}
}

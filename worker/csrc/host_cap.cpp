// A cap on the host memory libtorch's CPU tensors may hold in this process:
// the CPU allocator wrapped, so that an allocation past the cap throws
// c10::OutOfMemoryError, which tch hands back as an error and maxbatch counts
// as "does not fit", instead of the process growing until the kernel's OOM
// killer ends it (or, worse, another process of the host). Only tensors
// allocated after the wrapper is installed are counted; they are freed
// through it and the count goes down by the same usable size it went up by.
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

c10::Allocator *inner = nullptr;
c10::DeleterFnPtr inner_delete = nullptr;
std::atomic<int64_t> live{0};
std::atomic<int64_t> peak{0};
std::atomic<int64_t> cap{0}; // 0: no cap

int64_t usable(void *p) {
  return p == nullptr ? 0 : static_cast<int64_t>(malloc_usable_size(p));
}

void raise_peak(int64_t now) {
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

void capped_delete(void *p) {
  live.fetch_sub(usable(p));
  inner_delete(p);
}

std::string bytes_text(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30))
    snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else
    snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  return buf;
}

struct Capped final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const int64_t want = static_cast<int64_t>(n);
    const int64_t limit = cap.load();
    // Reserved before the allocation, so that threads allocating at once
    // cannot each pass the check with the same room.
    const int64_t before = live.fetch_add(want);
    if (limit > 0 && before + want > limit) {
      live.fetch_sub(want);
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       "out of memory: the rank's host-memory budget of ",
                       bytes_text(limit), " is reached (", bytes_text(before),
                       " of CPU tensors held, ", bytes_text(want), " more asked)");
    }
    c10::DataPtr d;
    try {
      d = inner->allocate(n);
    } catch (...) {
      live.fetch_sub(want);
      throw;
    }
    void *p = d.get();
    // Only a plain allocation (data is its own context, freed by the inner
    // allocator's raw deleter) can be freed through capped_delete.
    if (p == nullptr || p != d.get_context() ||
        d.get_deleter() != inner_delete) {
      live.fetch_sub(want);
      return d;
    }
    const int64_t size = usable(p);
    raise_peak(live.fetch_add(size - want) + size - want);
    const auto device = d.device();
    d.release_context();
    return {p, p, &capped_delete, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &capped_delete; }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    inner->copy_data(dest, src, count);
  }
};

Capped capped;

int fail(char **err, const char *what) {
  *err = strdup(what);
  return 1;
}

} // namespace

extern "C" {

// Wraps the CPU allocator once; later calls do nothing.
int gpuctl_cpu_cap_install(char **err) {
  try {
    if (inner != nullptr) return 0;
    auto *a = c10::GetCPUAllocator();
    if (a == nullptr || a->raw_deleter() == nullptr)
      return fail(err, "the CPU allocator has no plain deleter to wrap");
    inner = a;
    inner_delete = a->raw_deleter();
    // The highest priority, so that nothing registered later replaces it.
    c10::SetCPUAllocator(&capped, UINT8_MAX);
    if (c10::GetCPUAllocator() != &capped)
      return fail(err, "libtorch kept its own CPU allocator");
    return 0;
  } catch (const std::exception &e) {
    return fail(err, e.what());
  } catch (...) {
    return fail(err, "unknown C++ exception installing the CPU cap");
  }
}

// bytes 0: no cap.
void gpuctl_cpu_cap_set(int64_t bytes) { cap.store(bytes < 0 ? 0 : bytes); }

// out: bytes held now, highest since the last reset.
void gpuctl_cpu_cap_stats(int64_t *out) {
  out[0] = live.load();
  out[1] = peak.load();
}

void gpuctl_cpu_cap_reset_peak() { peak.store(live.load()); }
}

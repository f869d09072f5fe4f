// libtorch's Kineto profiler (what torch.profiler drives from Python), which
// tch does not expose: started around a few training steps, stopped with its
// events handed to Rust one by one (the worker ranks the operators itself)
// and its Chrome trace written where the agent keeps the job's files.
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdint>
#include <cstring>
#include <set>

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

namespace {

std::set<impl::ActivityType> activities(int cuda) {
  std::set<impl::ActivityType> a{impl::ActivityType::CPU};
  if (cuda) {
    a.insert(impl::ActivityType::CUDA);
  }
  return a;
}

impl::ProfilerConfig config() {
  return impl::ProfilerConfig(impl::ProfilerState::KINETO,
                              /*report_input_shapes=*/false,
                              /*profile_memory=*/true,
                              /*with_stack=*/false,
                              /*with_flops=*/false,
                              /*with_modules=*/false);
}

} // namespace

extern "C" {

// One event: its name, where it ran (0: a CPU operator or runtime call, 1: the
// GPU: a kernel, copy or set; 2: an allocation (bytes > 0) or free (bytes < 0)),
// its start and duration in ns, and the thread it began on.
typedef void (*gpuctl_prof_event_fn)(void *ctx, const char *name, int where,
                                     uint64_t start_ns, uint64_t dur_ns,
                                     int64_t bytes, uint64_t thread);

// 0 on success; otherwise 1 and a malloc'd message in *err (free it).
int gpuctl_profiler_start(int cuda, char **err) {
  try {
    auto acts = activities(cuda);
    prof::prepareProfiler(config(), acts);
    prof::enableProfiler(config(), acts);
    return 0;
  } catch (const std::exception &e) {
    *err = strdup(e.what());
    return 1;
  } catch (...) {
    *err = strdup("unknown C++ exception starting the profiler");
    return 1;
  }
}

// Stops the profiler, calls `fn` once per event and saves the Chrome trace to
// `trace_path` (none when it is NULL or empty).
int gpuctl_profiler_stop(const char *trace_path, gpuctl_prof_event_fn fn,
                         void *ctx, char **err) {
  try {
    auto result = prof::disableProfiler();
    if (!result) {
      *err = strdup("the profiler was not running");
      return 1;
    }
    for (const auto &ev : result->events()) {
      auto name = ev.name();
      int where = 0;
      if (name == "[memory]") {
        where = 2;
      } else if (ev.deviceType() != c10::DeviceType::CPU) {
        where = 1;
      }
      fn(ctx, name.c_str(), where, ev.startNs(), ev.durationNs(), ev.nBytes(),
         ev.startThreadId());
    }
    if (trace_path != nullptr && trace_path[0] != '\0') {
      result->save(trace_path);
    }
    return 0;
  } catch (const std::exception &e) {
    *err = strdup(e.what());
    return 1;
  } catch (...) {
    *err = strdup("unknown C++ exception stopping the profiler");
    return 1;
  }
}
}

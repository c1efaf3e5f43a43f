// A profiler trace of what libtorch runs, through libtorch's Kineto profiler (the one
// torch.profiler drives): every operator on the CPU and, with `cuda` set, every CUDA kernel
// and copy with its time on the device (kernels replayed from a CUDA graph included, where
// CUPTI reports them). Saved as a Chrome trace (JSON) that Perfetto or chrome://tracing
// open, and that python/trace_summary.py sums up.
//
// A C interface, built by runtime/build.rs into the runtime's static library; every entry
// point catches C++ exceptions and returns the message. One trace at a time per process.
// Kineto reads its settings (KINETO_LOG_LEVEL, TEARDOWN_CUPTI) from the environment; the
// `headcount` program sets them at start, before any thread runs (runtime/src/main.rs).

#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#include <string>

#include "c_api.h"

namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activities(int cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}

}  // namespace

extern "C" {

// Starts a trace. 0 on success, 1 with a message in `err`.
int headcount_trace_begin(int cuda, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        ProfilerConfig config(ProfilerState::KINETO);
        prof::prepareProfiler(config, activities(cuda));
        prof::enableProfiler(config, activities(cuda));
      },
      err, len);
}

// Stops the trace and saves it to `path` (empty: discarded). 0 on success, 1 with a message.
int headcount_trace_end(const char* path, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto result = prof::disableProfiler();
        if (path != nullptr && path[0] != '\0' && result) result->save(path);
      },
      err, len);
}

}  // extern "C"

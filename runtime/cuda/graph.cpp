// headcount's CUDA graph shim: a C interface over libtorch's at::cuda::CUDAGraph, so that a
// decode step issued through tch can be captured once and replayed. Built by
// runtime/build.rs into a shared library that the runtime loads with dlopen only when a
// CUDA graph is asked for, so binaries keep running on CPU-only libtorch installs.
//
// Every entry point returns 0 on success. On failure it returns 1 and writes the reason,
// NUL-terminated and cut to `cap` bytes, into `err`: no C++ exception crosses into Rust.

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "../cpp/c_api.h"

namespace {

struct Graph {
  explicit Graph(c10::DeviceIndex device)
      : device(device), side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {}
  c10::DeviceIndex device;
  at::cuda::CUDAGraph graph;
  // The side stream the warm-up and the capture run on (capture is refused on the default
  // stream), one for the graph's life so the warm-up primes the stream that is captured.
  // Current on the calling thread between enter_stream and exit_stream.
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  // The memory pool of the capture, set by capture_begin.
  std::optional<at::cuda::MempoolId_t> pool;
  bool capturing = false;
  bool captured = false;
};

// After a capture that failed to end: libtorch 2.11's CUDAGraph::capture_end throws before
// it stops routing allocations to the capture's pool and before the default generator
// leaves capture mode, which would break every later allocation and random draw on the
// device. Undo both, as far as the public API allows: end the routing and release the pool,
// then run an empty capture, whose prologue and epilogue take the generator through a
// capture cleanly.
void recover_from_failed_capture(Graph* g) {
  if (g->pool) {
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(g->device, *g->pool);
      at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(*g->pool);
      c10::cuda::CUDACachingAllocator::releasePool(g->device, *g->pool);
    } catch (...) {
    }
  }
  try {
    at::cuda::CUDAGraph reset;
    reset.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    reset.capture_end();
  } catch (...) {
  }
}

}  // namespace

extern "C" {

// A graph for CUDA device `device`; null (with the reason in `err`) when it cannot be made.
void* hc_graph_new(int device, char* err, size_t cap) {
  Graph* g = nullptr;
  int rc = headcount::guarded([&] {
    int count = static_cast<int>(c10::cuda::device_count());
    if (device < 0 || device >= count) {
      throw std::runtime_error("CUDA device " + std::to_string(device) + " does not exist (" +
                               std::to_string(count) + " visible)");
    }
    g = new Graph(static_cast<c10::DeviceIndex>(device));
  }, err, cap);
  return rc == 0 ? g : nullptr;
}

// Makes a side stream current on this thread, after the work already queued on the current
// stream has finished. Work issued until hc_graph_exit_stream (warm-up steps, the capture)
// goes to that stream.
int hc_graph_enter_stream(void* h, char* err, size_t cap) {
  return headcount::guarded([&] {
    auto* g = static_cast<Graph*>(h);
    if (g->guard) throw std::runtime_error("the side stream is already current");
    c10::cuda::getCurrentCUDAStream(g->device).synchronize();
    g->guard.emplace(g->side);
  }, err, cap);
}

// Waits for the side stream and makes the previous stream current again.
int hc_graph_exit_stream(void* h, char* err, size_t cap) {
  return headcount::guarded([&] {
    auto* g = static_cast<Graph*>(h);
    if (!g->guard) throw std::runtime_error("the side stream is not current");
    if (g->capturing) throw std::runtime_error("a capture is still open");
    g->side.synchronize();
    g->guard.reset();
  }, err, cap);
}

// Starts capturing the work this thread issues (the side stream must be current). The
// mode is thread-local: other threads' CUDA calls neither join nor invalidate the capture.
int hc_graph_capture_begin(void* h, char* err, size_t cap) {
  return headcount::guarded([&] {
    auto* g = static_cast<Graph*>(h);
    if (!g->guard) throw std::runtime_error("enter the side stream before capturing");
    if (g->captured || g->capturing) throw std::runtime_error("this graph was already captured");
    g->pool = at::cuda::graph_pool_handle();
    g->capturing = true;
    try {
      g->graph.capture_begin(*g->pool, cudaStreamCaptureModeThreadLocal);
    } catch (...) {
      g->capturing = false;
      recover_from_failed_capture(g);
      throw;
    }
  }, err, cap);
}

// Ends the capture. On failure the device is put back in a usable state before the error
// is returned (see recover_from_failed_capture).
int hc_graph_capture_end(void* h, char* err, size_t cap) {
  return headcount::guarded([&] {
    auto* g = static_cast<Graph*>(h);
    if (!g->capturing) throw std::runtime_error("no capture is open");
    g->capturing = false;
    try {
      g->graph.capture_end();
    } catch (...) {
      recover_from_failed_capture(g);
      throw;
    }
    g->captured = true;
  }, err, cap);
}

// Replays the captured work on the current stream.
int hc_graph_replay(void* h, char* err, size_t cap) {
  return headcount::guarded([&] {
    auto* g = static_cast<Graph*>(h);
    if (!g->captured) throw std::runtime_error("replay before a capture");
    g->graph.replay();
  }, err, cap);
}

void hc_graph_free(void* h) {
  auto* g = static_cast<Graph*>(h);
  try {
    delete g;
  } catch (...) {
  }
}

// The most bytes libtorch's caching allocator has had allocated on `device` since the last
// reset (what torch.cuda.max_memory_allocated reports), written to `out`.
int hc_cuda_peak_allocated(int device, long long* out, char* err, size_t cap) {
  return headcount::guarded([&] {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    *out = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }, err, cap);
}

int hc_cuda_reset_peak(int device, char* err, size_t cap) {
  return headcount::guarded([&] {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  }, err, cap);
}

}  // extern "C"

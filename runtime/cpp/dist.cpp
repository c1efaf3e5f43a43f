// The C interface of headcount's process groups over c10d (torch.distributed's C++ core):
// a TCPStore for the rendezvous and ProcessGroupGloo for collectives on CPU tensors.
// Tensors are torch-sys's `tensor` handles (`at::Tensor*`). Every entry point returns 0, or
// 1 with the message in the caller's buffer (c_api.h); every wait has a timeout.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <c10/util/Logging.h>

#include "c_api.h"

namespace {

using Ms = std::chrono::milliseconds;

struct Store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  Ms timeout;
};

void wait(const c10::intrusive_ptr<c10d::Work>& work, Ms timeout) {
  if (!work->wait(timeout)) {
    throw std::runtime_error("timed out");
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

extern "C" {

// c10d logs each retry and failure to stderr with a C++ backtrace; the caller reports them as
// one error line instead. TORCH_CPP_LOG_LEVEL, when the user sets it, keeps its say.
void hc_quiet_logs() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) {
    FLAGS_caffe2_log_level = 3;
  }
}

// A store at host:port: the server when `is_server` (then `world` ranks are expected), a
// client otherwise. Clients retry until `timeout_ms`.
int hc_store_new(const char* host, int port, int is_server, int world, int64_t timeout_ms, void** out, char* err,
                 size_t len) {
  return headcount::guarded(
      [&] {
        c10d::TCPStoreOptions opts;
        opts.port = static_cast<std::uint16_t>(port);
        opts.isServer = is_server != 0;
        opts.numWorkers = static_cast<std::size_t>(world);
        // Ranks wait for each other at the first collective, with its own timeout.
        opts.waitWorkers = false;
        opts.timeout = Ms(timeout_ms);
        auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
        *out = new Store{store};
      },
      err, len);
}

void hc_store_free(void* store) { delete static_cast<Store*>(store); }

int hc_store_set(void* store, const char* key, const uint8_t* data, size_t n, char* err, size_t len) {
  return headcount::guarded(
      [&] { static_cast<Store*>(store)->store->set(key, std::vector<uint8_t>(data, data + n)); }, err, len);
}

// The value of `key`, waiting up to `timeout_ms` for another rank to set it; `*out` is freed
// with hc_buffer_free.
int hc_store_get(void* store, const char* key, int64_t timeout_ms, uint8_t** out, size_t* n, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto& s = static_cast<Store*>(store)->store;
        s->wait({std::string(key)}, Ms(timeout_ms));
        auto value = s->get(key);
        auto* buf = static_cast<uint8_t*>(std::malloc(value.empty() ? 1 : value.size()));
        if (buf == nullptr) throw std::bad_alloc();
        std::copy(value.begin(), value.end(), buf);
        *out = buf;
        *n = value.size();
      },
      err, len);
}

void hc_buffer_free(uint8_t* buf) { std::free(buf); }

// A Gloo group of `size` ranks under the store key prefix `prefix`. `interfaces` (a
// comma-separated list, GLOO_SOCKET_IFNAME's form) or else `hostname` picks the address
// the group's connections bind to; both empty: the machine's hostname.
int hc_group_new(void* store, const char* prefix, int rank, int size, int64_t timeout_ms, const char* interfaces,
                 const char* hostname, void** out, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto opts = c10d::ProcessGroupGloo::Options::create(Ms(timeout_ms));
        for (const auto& name : split(interfaces, ',')) {
          opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        }
        if (opts->devices.empty()) {
          opts->devices.push_back(std::string(hostname).empty()
                                      ? c10d::ProcessGroupGloo::createDefaultDevice()
                                      : c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
        }
        auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, static_cast<Store*>(store)->store);
        auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
        *out = new Group{pg, Ms(timeout_ms)};
      },
      err, len);
}

void hc_group_free(void* group) { delete static_cast<Group*>(group); }

int hc_all_reduce_sum(void* group, at::Tensor* t, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto* g = static_cast<Group*>(group);
        std::vector<at::Tensor> tensors{*t};
        c10d::AllreduceOptions opts;
        opts.reduceOp = c10d::ReduceOp::SUM;
        wait(g->pg->allreduce(tensors, opts), g->timeout);
      },
      err, len);
}

// `out` (contiguous, size times the elements of `in`) receives every rank's `in`, in rank order.
int hc_all_gather(void* group, at::Tensor* out, at::Tensor* in, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto* g = static_cast<Group*>(group);
        wait(g->pg->_allgather_base(*out, *in), g->timeout);
      },
      err, len);
}

int hc_broadcast(void* group, at::Tensor* t, int root, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto* g = static_cast<Group*>(group);
        std::vector<at::Tensor> tensors{*t};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        wait(g->pg->broadcast(tensors, opts), g->timeout);
      },
      err, len);
}

int hc_send(void* group, at::Tensor* t, int dst, int tag, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto* g = static_cast<Group*>(group);
        std::vector<at::Tensor> tensors{*t};
        wait(g->pg->send(tensors, dst, tag), g->timeout);
      },
      err, len);
}

int hc_recv(void* group, at::Tensor* t, int src, int tag, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto* g = static_cast<Group*>(group);
        std::vector<at::Tensor> tensors{*t};
        wait(g->pg->recv(tensors, src, tag), g->timeout);
      },
      err, len);
}

int hc_barrier(void* group, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        auto* g = static_cast<Group*>(group);
        wait(g->pg->barrier(), g->timeout);
      },
      err, len);
}

}  // extern "C"

// Counts the libtorch operator calls made on the calling thread, through libtorch's
// RecordFunction observer API (the hook its profiler uses). headcount uses it to measure
// how many libtorch calls a decode step and a layer make (docs/PERFORMANCE.md).
//
// A C interface, built by runtime/build.rs into a static library; every entry point catches
// C++ exceptions. Counting is thread-local: a callback added with addThreadLocalCallback
// fires only for operators called on the thread that added it.
//
// Counted per call of an operator through the dispatcher:
//   calls  the calls made from outside libtorch (no operator running on the thread),
//   ops    every operator, the ones other operators call included,
//   leaves the operators that called no other operator (on a GPU, roughly one kernel each,
//          less the views).
// With names on, the counts are also kept per operator name (`aten::mm` ...).

#include <ATen/record_function.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "c_api.h"

namespace {

struct Name {
  long long calls = 0, ops = 0, leaves = 0;
};

struct State {
  bool active = false;
  bool names = false;
  at::CallbackHandle handle = 0;
  int depth = 0;
  // Whether the operator at each depth has called another operator.
  std::vector<bool> nested;
  std::vector<std::string> open;
  long long calls = 0, ops = 0, leaves = 0;
  std::map<std::string, Name> by_name;
};

thread_local State state;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  State& s = state;
  if (!s.active) return nullptr;
  if (s.depth > 0 && !s.nested.empty()) s.nested.back() = true;
  bool top = s.depth == 0;
  s.ops++;
  if (top) s.calls++;
  if (s.names) {
    std::string name = fn.name();
    Name& n = s.by_name[name];
    n.ops++;
    if (top) n.calls++;
    s.open.push_back(std::move(name));
  }
  s.nested.push_back(false);
  s.depth++;
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  State& s = state;
  if (!s.active || s.depth == 0) return;
  s.depth--;
  bool leaf = !s.nested.back();
  s.nested.pop_back();
  if (leaf) s.leaves++;
  if (s.names && !s.open.empty()) {
    if (leaf) s.by_name[s.open.back()].leaves++;
    s.open.pop_back();
  }
}

}  // namespace

extern "C" {

// Starts counting on this thread (from zero). 0 on success, 1 with a message in `err`.
int headcount_ops_begin(int names, char* err, size_t len) {
  return headcount::guarded(
      [&] {
        State& s = state;
        // A count inside a count would reset the outer one's numbers.
        if (s.active) throw std::logic_error("libtorch calls are already being counted on this thread");
        if (s.handle == 0) {
          s.handle = at::addThreadLocalCallback(
              at::RecordFunctionCallback(on_start, on_end).scopes({at::RecordScope::FUNCTION}));
        }
        s.active = true;
        s.names = names != 0;
        s.depth = 0;
        s.nested.clear();
        s.open.clear();
        s.calls = s.ops = s.leaves = 0;
        s.by_name.clear();
      },
      err, len);
}

// Stops counting on this thread and removes its callback; the counts stay readable.
void headcount_ops_end(long long* calls, long long* ops, long long* leaves) {
  State& s = state;
  s.active = false;
  if (s.handle != 0) {
    try {
      at::removeCallback(s.handle);
    } catch (...) {
    }
    s.handle = 0;
  }
  *calls = s.calls;
  *ops = s.ops;
  *leaves = s.leaves;
}

// The number of distinct operator names counted.
size_t headcount_ops_names() { return state.by_name.size(); }

// The `i`th name (in name order) and its counts; 0 past the end. The name is written to
// `buf` (truncated to `len` - 1 bytes, NUL-terminated).
int headcount_ops_name(size_t i, char* buf, size_t len, long long* calls, long long* ops, long long* leaves) {
  State& s = state;
  if (i >= s.by_name.size()) return 0;
  auto it = s.by_name.begin();
  std::advance(it, i);
  headcount::set_error(it->first.c_str(), buf, len);
  *calls = it->second.calls;
  *ops = it->second.ops;
  *leaves = it->second.leaves;
  return 1;
}

}  // extern "C"

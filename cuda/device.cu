// Device discovery for the command line and the tests: whether a CUDA device can be used (and
// why not), and its name. Never aborts: a machine without a GPU is a normal case. Also the
// current device's multiprocessor count for the kernels' persistent grids (cuda/device_util.cuh),
// and the host thread's programmatic-launch mode (cuda/pdl.cuh).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "cuda/check.h"
#include "cuda/device_util.cuh"
#include "cuda/moe_layer.h"
#include "cuda/pdl.cuh"

namespace moecheck::cuda {

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (why != nullptr)
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")";
    return false;
  }
  if (n == 0) {
    if (why != nullptr) *why = "no CUDA device present (cudaGetDeviceCount returned 0)";
    return false;
  }
  return true;
}

std::string device_name(int device) {
  if (!device_available(nullptr)) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

namespace pdl {
namespace {
thread_local Mode g_mode = Mode::kOff;
thread_local cudaEvent_t g_start = nullptr;  // a StartEvent's event, until a launch takes it
thread_local bool g_start_used = false;
}  // namespace

Mode mode() { return g_mode; }
Scope::Scope(Mode m) : prev_(g_mode) { g_mode = m; }
Scope::~Scope() { g_mode = prev_; }
StartEvent::StartEvent(cudaEvent_t ev) : prev_(g_start), prev_used_(g_start_used) {
  g_start = ev;
  g_start_used = false;
}
StartEvent::~StartEvent() {
  g_start = prev_;
  g_start_used = prev_used_;
}
cudaEvent_t take_start_event() {
  if (g_start == nullptr || g_start_used) return nullptr;
  g_start_used = true;
  return g_start;
}
}  // namespace pdl

namespace {
std::mutex g_carve_mu;
bool g_carve_max = true;
std::map<std::pair<const void*, int>, int> g_carve;  // (kernel, device) -> carveout set
}  // namespace

void set_max_shared_carveout(bool on) {
  const std::lock_guard<std::mutex> lock(g_carve_mu);
  g_carve_max = on;
}

void prefer_shared_carveout(const void* kernel) {
  int dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(g_carve_mu);
  const int want = g_carve_max ? static_cast<int>(cudaSharedmemCarveoutMaxShared)
                               : static_cast<int>(cudaSharedmemCarveoutDefault);
  auto [it, fresh] = g_carve.try_emplace({kernel, dev}, want);
  if (!fresh && it->second == want) return;
  MOECHECK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, want));
  it->second = want;
}

namespace {
std::mutex g_attr_mu;
std::map<std::pair<const void*, int>, int> g_smem_limit;           // (kernel, device) -> limit set
std::map<std::tuple<const void*, int, int, int>, int> g_resident;  // (kernel, device, threads,
                                                                   // smem) -> blocks an SM
constexpr int kDefaultDynamicSmem = 48 * 1024;
}  // namespace

void allow_dynamic_smem(const void* kernel, int bytes) {
  if (bytes <= kDefaultDynamicSmem) return;
  int dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(g_attr_mu);
  int& set = g_smem_limit[{kernel, dev}];
  if (set >= bytes) return;
  MOECHECK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  set = bytes;  // only once the call succeeded: a failed raise is tried again
}

int resident_blocks_per_sm(const void* kernel, int threads, int smem) {
  int dev = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(g_attr_mu);
  const auto key = std::make_tuple(kernel, dev, threads, smem);
  if (const auto it = g_resident.find(key); it != g_resident.end()) return it->second;
  int per_sm = 0;
  MOECHECK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                                    static_cast<size_t>(smem)));
  g_resident.emplace(key, per_sm);
  return per_sm;
}

int current_sm_count() {
  int dev = 0, sms = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

}  // namespace moecheck::cuda

// ds41 at prefill sizes (labels gpu and slow: run once per change to the batched kernels, with
// `ctest -L gpu -L slow`, see docs/gpu.md): T = 512 and 4096 tokens, cuda::MoeLayer vs
// emu::MoeLayer bitwise in the output and every stage, host and device route, each forward
// twice. At T = 4096 every expert of the layer is used and most run through MMQ.
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_layer_check.h"

namespace moecheck {
namespace {

TEST(CudaMoeLayerBatchedSlow, Ds41_T512_T4096_HostAndDeviceRoute) {
  MOECHECK_REQUIRE_GPU();
  gputest::run_layer(preset_options("ds41"), {512, 4096},
                     {{8, RouterVariant::kStaged, true, false, RoutePlace::kHost},
                      {8, RouterVariant::kStaged, true, true, RoutePlace::kDevice}},
                     1700);
}

}  // namespace
}  // namespace moecheck

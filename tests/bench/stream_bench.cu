// Streaming experts on the GPU (docs/performance.md "Streaming"): the expert cache's miss path
// from pinned host memory against the pinned host-to-device bandwidth of the same process, the
// file and synthetic sources against their own read / generation rates, a 40-layer streamed
// one-token pass at several cache sizes against misses x 12.8 MB / that bandwidth, prefetch,
// the checks on streamed bytes, the reader pool, and the pipelined multi-layer run. Every run is
// validated first: slot bytes equal the source's, a streamed layer's output equals the
// emulation's bit for bit, the pipelined outputs equal the unpipelined ones. Layers share the
// bytes of two generated ds41 layers (layer L has layer L % 2's) as distinct cache keys.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "core/routing.h"
#include "cuda/expert_lru.h"
#include "cuda/moe_layer.h"
#include "cuda/pipeline.h"
#include "emulate/moe_layer.h"
#include "golden/expert_sources.h"
#include "golden/finite_check.h"
#include "golden/generator.h"
#include "golden/sha256.h"
#include "tests/bench/bench_util.h"

namespace moecheck {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

constexpr int kBaseLayers = 2;
constexpr int kLayers = 40;

int hw_threads() { return std::max(2u, std::thread::hardware_concurrency()); }

template <class F>
void parallel_for(int64_t n, F fn) {
  std::atomic<int64_t> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < hw_threads(); ++t)
    ts.emplace_back([&] {
      for (int64_t i; (i = next++) < n;) fn(i);
    });
  for (auto& t : ts) t.join();
}

// Two ds41 layers in pinned host memory (router, bias, shared expert, the three stacks) and the
// LayerWeights of layers 0..39 over them.
struct Model {
  GenOptions o = preset_options("ds41");
  struct Base {
    std::vector<uint16_t> router;
    std::vector<float> bias;
    std::vector<uint8_t> shared[3];
    uint8_t* stack[3] = {};
  } base[kBaseLayers];
  std::vector<LayerWeights> layers;

  Model() {
    const MoeConfig& c = o.config;
    for (int b = 0; b < kBaseLayers; ++b) {
      Base& x = base[b];
      x.router.resize(static_cast<size_t>(c.n_routed * c.dim));
      x.bias.resize(static_cast<size_t>(c.n_routed));
      generate_router(o, b, x.router.data());
      generate_bias(o, b, x.bias.data());
      for (Proj p : kAllProjs) {
        const int i = static_cast<int>(p);
        x.shared[i].resize(static_cast<size_t>(shared_bytes(o, p)));
        generate_shared(o, b, p, x.shared[i].data());
        const int64_t eb = expert_bytes(o, p);
        MOECHECK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&x.stack[i]),
                                           static_cast<size_t>(eb * c.n_routed)));
        parallel_for(c.n_routed,
                     [&](int64_t e) { generate_expert_blocks(o, b, p, e, x.stack[i] + e * eb); });
      }
    }
    for (int L = 0; L < kLayers; ++L) {
      const Base& x = base[L % kBaseLayers];
      LayerWeights w;
      w.layer = L;
      w.config = c;
      w.router = x.router.data();
      w.bias = x.bias.data();
      w.gate_exps = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, x.stack[0]};
      w.up_exps = ExpertStackView{GgmlType::kQ2K, c.inter, c.dim, c.n_routed, x.stack[1]};
      w.down_exps = ExpertStackView{GgmlType::kQ3K, c.dim, c.inter, c.n_routed, x.stack[2]};
      w.shared_gate = MatView{GgmlType::kBF16, c.inter, c.dim, x.shared[0].data()};
      w.shared_up = MatView{GgmlType::kBF16, c.inter, c.dim, x.shared[1].data()};
      w.shared_down = MatView{GgmlType::kBF16, c.dim, c.inter, x.shared[2].data()};
      layers.push_back(w);
    }
  }
  ~Model() {
    for (Base& x : base)
      for (uint8_t* s : x.stack) (void)cudaFreeHost(s);
  }
  int64_t expert_bytes_all() const { return expert_layout(layers[0]).expert_bytes(); }
};

// Pinned host-to-device copy of 1 GiB from the stacks: bytes / time, median of 10.
double h2d_gbs(const Model& m) {
  const size_t n = size_t{1} << 30;
  void* d = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&d, n));
  const double ms = bench::time_ms(
      [&] {
        MOECHECK_CUDA_CHECK(
            cudaMemcpyAsync(d, m.base[0].stack[0], n, cudaMemcpyHostToDevice, nullptr));
      },
      2, 10, nullptr);
  MOECHECK_CUDA_CHECK(cudaFree(d));
  return static_cast<double>(n) / (ms * 1e-3) / 1e9;
}

// Every slot of the lease holds the source's bytes, else exit 1.
void require_slots(const cuda::ExpertLru& c, const cuda::CacheLease& l, const ExpertSource& src,
                   const char* what) {
  for (size_t i = 0; i < l.experts.size(); ++i)
    for (Proj p : kAllProjs) {
      const size_t n = static_cast<size_t>(c.layout().bytes(p));
      std::vector<uint8_t> want(n), got(n);
      src.read(l.layer, l.experts[i], p, want.data());
      MOECHECK_CUDA_CHECK(
          cudaMemcpy(got.data(), c.slot_data(l.slots[i], p), n, cudaMemcpyDeviceToHost));
      if (got != want) {
        std::fprintf(stderr, "bench: %s: slot %d (layer %d expert %d %s) differs from the source\n",
                     what, l.slots[i], l.layer, l.experts[i], proj_name(p));
        std::exit(1);
      }
    }
  std::printf("validated %s: %zu experts' slots equal the source's bytes\n", what,
              l.experts.size());
}

// The miss path: rounds of `batch` misses (the cache emptied before each), acquire to the
// stream's end; GB/s of expert bytes, median.
double miss_gbs(std::shared_ptr<const ExpertSource> src, const ExpertLayout& lay, int readers,
                int batch, int rounds, const char* what) {
  cuda::CacheOptions co;
  co.slots = batch;
  co.reader_threads = readers;
  cuda::ExpertLru c(src, lay, 384, co);
  cudaStream_t s;
  MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<double> t;
  for (int r = 0; r <= rounds; ++r) {
    std::vector<int32_t> ex;
    for (int i = 0; i < batch; ++i) ex.push_back((r * 37 + i * 11) % 384);
    std::sort(ex.begin(), ex.end());
    ex.erase(std::unique(ex.begin(), ex.end()), ex.end());
    c.evict_all();
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto t0 = Clock::now();
    const cuda::CacheLease l = c.acquire(r % kLayers, ex, s);
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    const double ms = ms_since(t0);
    if (r == 0) require_slots(c, l, *src, what);
    else t.push_back(static_cast<double>(l.bytes_read) / (ms * 1e-3) / 1e9);
    c.release(l, s);
  }
  c.drain();
  MOECHECK_CUDA_CHECK(cudaStreamDestroy(s));
  return bench::median(t);
}

// Host rate of a source alone: `readers` threads reading `n` experts into pinned buffers, GB/s.
double source_gbs(const ExpertSource& src, int readers, int n, int64_t eb) {
  std::vector<uint8_t*> buf(static_cast<size_t>(readers));
  for (auto& b : buf)
    MOECHECK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&b), static_cast<size_t>(eb)));
  std::atomic<int> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < readers; ++r)
    ts.emplace_back([&, r] {
      for (int i; (i = next++) < n;) {
        int64_t off = 0;
        for (Proj p : kAllProjs) {
          src.read(i % kLayers, (i * 11) % 384, p, buf[static_cast<size_t>(r)] + off);
          off += src.layout(0).bytes(p);
        }
      }
    });
  for (auto& t : ts) t.join();
  const double ms = ms_since(t0);
  for (auto* b : buf) (void)cudaFreeHost(b);
  return static_cast<double>(n) * static_cast<double>(eb) / (ms * 1e-3) / 1e9;
}

// Layer L of a source read as layer L % n of another (the model's layers share two layers' bytes).
struct Remap : ExpertSource {
  std::shared_ptr<const ExpertSource> f;
  int n;
  Remap(std::shared_ptr<const ExpertSource> src, int mod) : f(std::move(src)), n(mod) {}
  std::string name() const override {
    return f->name() + " (layer L read as L % " + std::to_string(n) + ")";
  }
  ExpertLayout layout(int L) const override { return f->layout(L % n); }
  void read(int L, int64_t e, Proj p, uint8_t* d) const override { f->read(L % n, e, p, d); }
};

struct PassResult {
  double ms_per_token = 0;
  CacheCounters k;                            // the whole run, warm-up token included
  double misses_per_token = 0, hit_rate = 0;  // the timed tokens only
  double bytes_per_token = 0;                 // read from the source (misses and prefetches)
  std::vector<std::vector<uint16_t>> y;       // last token's outputs, per layer
};

// `tokens` one-token passes over the 40 layers, each token's input chained as a residual stream
// (x_{L+1} = bf16(x_L + y_L)) from a seeded first input.
// rounds 2: the same tokens twice, the second round timed (every expert it reads was read, and
// checked, in the first).
PassResult streamed_pass(const Model& m, std::shared_ptr<const ExpertSource> src, int64_t slots,
                         int readers, int prefetch_k, RoutePlace route, bool checks, int tokens,
                         int rounds = 1) {
  const MoeConfig& c = m.o.config;
  cuda::CacheOptions co;
  co.slots = slots;
  co.reader_threads = readers;
  if (checks)
    co.on_read = [](int layer, int64_t e, Proj p, const uint8_t* bytes, size_t n) {
      const uint32_t type =
          static_cast<uint32_t>(p == Proj::kDown ? GgmlType::kQ3K : GgmlType::kQ2K);
      const int64_t cols = p == Proj::kDown ? 2304 : 5120;
      check_finite_slice("bench", "layer " + std::to_string(layer) + " expert " + std::to_string(e),
                         type, cols, bytes, n);
      (void)sha256_hex(bytes, n);
    };
  auto cache = std::make_shared<cuda::ExpertLru>(src, expert_layout(m.layers[0]), c.n_routed, co);
  cuda::LayerOptions lo;
  lo.route = route;
  lo.prefetch_k = prefetch_k;
  std::vector<std::unique_ptr<cuda::MoeLayer>> ls;
  for (const LayerWeights& w : m.layers) {
    LayerWeights r = w;
    r.gate_exps.data = r.up_exps.data = r.down_exps.data = nullptr;
    ls.push_back(std::make_unique<cuda::MoeLayer>(r, cache, lo));
  }
  if (prefetch_k > 0)
    for (int L = 0; L < kLayers; ++L) ls[L]->set_next(ls[(L + 1) % kLayers].get());
  PassResult res;
  std::vector<double> t;
  CacheCounters k0;
  const int total = rounds * (tokens + 1);
  for (int n = 0; n < total; ++n) {  // token 0 of the last round warms up (graphs, first misses)
    const int tok = n % (tokens + 1);
    const bool timed = n > total - tokens - 1;
    if (n == total - tokens) k0 = cache->counters();
    std::vector<uint16_t> x = generate_input(500 + tok, 1, c.dim);
    res.y.clear();
    const auto t0 = Clock::now();
    for (int L = 0; L < kLayers; ++L) {
      std::vector<uint16_t> y = ls[L]->forward(x.data(), 1);
      for (int64_t i = 0; i < c.dim; ++i) x[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
      res.y.push_back(std::move(y));
    }
    if (timed) t.push_back(ms_since(t0));
  }
  cache->drain();
  res.ms_per_token = bench::median(t);
  res.k = cache->counters();
  const double misses = static_cast<double>(res.k.misses - k0.misses);
  const double asked = static_cast<double>(res.k.hits + res.k.misses - k0.hits - k0.misses);
  res.misses_per_token = misses / tokens;
  res.bytes_per_token = static_cast<double>(res.k.bytes_read - k0.bytes_read) / tokens;
  res.hit_rate = 1.0 - misses / asked;
  return res;
}

}  // namespace
}  // namespace moecheck

int main() {
  using namespace moecheck;
  const std::string gpu = bench::gpu_name();
  std::printf("stream_bench on %s, %d host threads\n", gpu.c_str(), hw_threads());
  const auto t_setup = Clock::now();
  Model m;
  const double setup_s = ms_since(t_setup) / 1e3;
  const int64_t eb = m.expert_bytes_all();
  const ExpertLayout lay = expert_layout(m.layers[0]);
  auto pinned = std::make_shared<HostExpertSource>(m.layers, "pinned host memory");
  const double copy = bench::copy_bandwidth_gbs();
  const double h2d = h2d_gbs(m);
  std::printf("setup %.1f s (two ds41 layers generated and pinned); expert %lld bytes\n", setup_s,
              static_cast<long long>(eb));

  // Validation of a streamed layer against the emulation: one token through layers 0 and 1.
  {
    const MoeConfig& c = m.o.config;
    cuda::CacheOptions co;
    co.slots = 12;
    auto cache = std::make_shared<cuda::ExpertLru>(pinned, lay, c.n_routed, co);
    for (int L = 0; L < 2; ++L) {
      LayerWeights r = m.layers[L];
      r.gate_exps.data = r.up_exps.data = r.down_exps.data = nullptr;
      cuda::MoeLayer layer(r, cache);
      const auto x = generate_input(77 + L, 1, c.dim);
      bench::require_emu_bits("streamed ds41 layer " + std::to_string(L) + " output",
                              layer.forward(x.data(), 1),
                              emu::MoeLayer(m.layers[L]).forward(x.data(), 1));
    }
  }

  std::printf("\n### Miss path (ds41 experts, 32 misses per acquisition, median of 8)\n\n");
  std::printf("pinned host-to-device %.1f GB/s, device copy %.0f GB/s (this process)\n\n", h2d,
              copy);
  std::printf(
      "| source | readers | source alone GB/s | miss path GB/s | of pinned H2D | of source |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (int readers : {0, 4, 8}) {
    const double g = miss_gbs(pinned, lay, readers, 32, 8, "pinned source");
    std::printf("| pinned host | %d | - | %.1f | %.0f %% | - |\n", readers, g, 100 * g / h2d);
  }
  // The generator's layer L % 2, as the pinned model's bytes (the same blocks, made per read).
  auto synth = std::make_shared<Remap>(std::make_shared<SyntheticExpertSource>([&] {
                                         GenOptions o = m.o;
                                         o.n_layers = kBaseLayers;
                                         return o;
                                       }()),
                                       kBaseLayers);
  for (int readers : {4, 8, 16}) {
    const double alone = source_gbs(*synth, readers, 64, eb);
    const double g = miss_gbs(synth, lay, readers, 32, 4, "synthetic source");
    std::printf("| synthetic | %d | %.1f | %.1f | %.0f %% | %.0f %% |\n", readers, alone, g,
                100 * g / h2d, 100 * g / alone);
  }
  {
    GenOptions o = m.o;
    o.n_layers = 1;
    const std::string path = "/tmp/stream_bench_ds41.gguf";
    const auto t0 = Clock::now();
    (void)write_model(o, path);
    const double write_s = ms_since(t0) / 1e3;
    auto file = std::make_shared<FileExpertSource>(path);
    auto one = std::make_shared<Remap>(file, 1);
    for (int readers : {4, 8}) {
      const double alone = source_gbs(*one, readers, 96, eb);
      const double g = miss_gbs(one, lay, readers, 32, 4, "file source");
      std::printf("| file (page cache) | %d | %.1f | %.1f | %.0f %% | %.0f %% |\n", readers, alone,
                  g, 100 * g / h2d, 100 * g / alone);
    }
    std::printf("\n(the file: 1 ds41 layer, written in %.1f s, read back from the page cache)\n",
                write_s);
    (void)unlink(path.c_str());
  }

  std::printf("\n### 40-layer streamed one-token pass (residual chain, 8 tokens, median)\n\n");
  std::printf(
      "floor: misses/token x %lld bytes / pinned H2D; read floor: all bytes read per token "
      "(misses and prefetches) / pinned H2D\n\n",
      static_cast<long long>(eb));
  std::printf(
      "| source | slots | GB | route | readers | prefetch | checks | hit rate | misses/token | "
      "ms/token | tokens/s | floor ms/token | of floor | read floor ms | of read floor |\n");
  std::printf("|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::vector<uint16_t>> ref_y;
  auto row = [&](const char* src_name, std::shared_ptr<const ExpertSource> src, int64_t slots,
                 int readers, int pk, RoutePlace route, bool checks, int rounds = 1) {
    const PassResult r = streamed_pass(m, src, slots, readers, pk, route, checks, 8, rounds);
    if (ref_y.empty()) ref_y = r.y;
    else if (r.y != ref_y) {
      std::fprintf(stderr, "bench: the pass's outputs differ between cache settings\n");
      std::exit(1);
    }
    const double floor = r.misses_per_token * static_cast<double>(eb) / (h2d * 1e9) * 1e3;
    const double read_floor = r.bytes_per_token / (h2d * 1e9) * 1e3;
    std::printf(
        "| %s | %lld | %.1f | %s | %d | %d | %s | %.3f | %.1f | %.2f | %.1f | %.2f | %.2fx | %.2f "
        "| %.2fx |\n",
        src_name, static_cast<long long>(slots),
        static_cast<double>(slots) * static_cast<double>(eb) / 1e9, route_place_name(route),
        readers, pk, checks ? (rounds > 1 ? "on, checked" : "on") : "off", r.hit_rate,
        r.misses_per_token, r.ms_per_token, 1e3 / r.ms_per_token, floor, r.ms_per_token / floor,
        read_floor, r.ms_per_token / read_floor);
    if (pk > 0)
      std::printf(
          "|  | prefetch: issued %llu, used %llu (late %llu), wasted %llu, dropped %llu | | | | | "
          "| | | | | | | | |\n",
          static_cast<unsigned long long>(r.k.prefetch_issued),
          static_cast<unsigned long long>(r.k.prefetch_used),
          static_cast<unsigned long long>(r.k.prefetch_late),
          static_cast<unsigned long long>(r.k.prefetch_wasted),
          static_cast<unsigned long long>(r.k.prefetch_dropped));
  };
  for (int64_t slots : {64, 256, 1024, 4096})
    row("pinned", pinned, slots, 4, 0, RoutePlace::kHost, false);
  row("pinned", pinned, 256, 0, 0, RoutePlace::kHost, false);
  row("pinned", pinned, 256, 4, 6, RoutePlace::kHost, false);
  row("pinned", pinned, 256, 4, 12, RoutePlace::kHost, false);
  row("pinned", pinned, 256, 4, 0, RoutePlace::kDevice, false);
  row("pinned", pinned, 256, 4, 6, RoutePlace::kDevice, false);
  row("pinned", pinned, 256, 4, 0, RoutePlace::kHost, true);
  row("pinned", pinned, 256, 8, 0, RoutePlace::kHost, true);
  row("pinned", pinned, 256, 16, 0, RoutePlace::kHost, true);
  row("pinned", pinned, 256, 8, 0, RoutePlace::kHost, true, 2);
  row("synthetic", synth, 256, 8, 0, RoutePlace::kHost, false);
  row("synthetic", synth, 256, 16, 0, RoutePlace::kHost, false);

  std::printf("\n### Pipelined multi-layer run (40 layers, independent inputs, host route)\n\n");
  std::printf(
      "| T | slots | readers | unpipelined ms | pipelined ms | saved | serialised stages |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t T : {1, 16}) {
    const MoeConfig& c = m.o.config;
    const int64_t slots = T == 1 ? 64 : 512;
    cuda::CacheOptions co;
    co.slots = slots;
    co.reader_threads = 4;
    auto cache = std::make_shared<cuda::ExpertLru>(pinned, lay, c.n_routed, co);
    std::vector<std::unique_ptr<cuda::MoeLayer>> ls;
    std::vector<cuda::MoeLayer*> lp;
    for (const LayerWeights& w : m.layers) {
      LayerWeights r = w;
      r.gate_exps.data = r.up_exps.data = r.down_exps.data = nullptr;
      ls.push_back(std::make_unique<cuda::MoeLayer>(r, cache));
      lp.push_back(ls.back().get());
    }
    std::vector<double> t_plain, t_pipe;
    cuda::PipelineStats st;
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<std::vector<uint16_t>> xs;
      std::vector<const uint16_t*> xp;
      for (int L = 0; L < kLayers; ++L) xs.push_back(generate_input(900 + 100 * rep + L, T, c.dim));
      for (auto& x : xs) xp.push_back(x.data());
      cache->evict_all();
      auto t0 = Clock::now();
      std::vector<std::vector<uint16_t>> a;
      for (int L = 0; L < kLayers; ++L) a.push_back(lp[L]->forward(xp[L], T));
      t_plain.push_back(ms_since(t0));
      cache->evict_all();
      t0 = Clock::now();
      const auto b = cuda::forward_pipelined(lp, xp, T, {}, nullptr, nullptr, &st);
      t_pipe.push_back(ms_since(t0));
      if (a != b) {
        std::fprintf(stderr, "bench: pipelined outputs differ from the unpipelined ones (T=%lld)\n",
                     static_cast<long long>(T));
        return 1;
      }
    }
    const double p = bench::median(t_plain), q = bench::median(t_pipe);
    std::printf("| %lld | %lld | 4 | %.2f | %.2f | %.0f %% | %lld |\n", static_cast<long long>(T),
                static_cast<long long>(slots), p, q, 100 * (p - q) / p,
                static_cast<long long>(st.serialised));
  }
  std::printf(
      "\n(pipelined outputs validated equal to the unpipelined ones in every repetition)\n");
  return 0;
}

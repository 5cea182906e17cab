// `moecheck sensitivity` (compare/sensitivity.h, golden/perturb.h): each planted perturbation
// changes exactly what it says and is undone bit for bit; the copy-on-write view never changes
// the file or the read-only view; on the tiny model the scale of one expert's gate, up and down
// is caught at 0.5% or less (docs/detection.md), the clamp class is caught through the
// adversarial clamp token, and the unperturbed implementation passes every leg.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compare/sensitivity.h"
#include "core/kquant.h"
#include "core/numfmt.h"
#include "emulate/moe_layer.h"
#include "golden/adversarial.h"
#include "golden/generator.h"
#include "golden/model_file.h"
#include "golden/perturb.h"

namespace moecheck {
namespace {

// The tiny preset's layer 0 alone, written to a file of this test's own.
std::string temp_tiny_model(const std::string& tag) {
  const std::string path = std::string(MOECHECK_BINARY_DIR) + "/sensitivity_test-" +
                           std::to_string(::getpid()) + "-" + tag + ".gguf";
  GenOptions g = preset_options("tiny");
  g.n_layers = 1;
  write_model(g, path);
  return path;
}

// A writable copy of one expert's matrix of a generated layer.
struct OwnedMatrix {
  std::vector<uint8_t> bytes;
  KQuantMatrix m;
  OwnedMatrix(const MatView& v) : bytes(v.data, v.data + v.rows * v.row_stride()) {
    m = KQuantMatrix{v.type, v.rows, v.cols, bytes.data()};
  }
};

TEST(Perturb, EachChangesWhatItSaysAndThePatchRestoresEveryByte) {
  const LayerWeights w =
      generate_layer(preset_options("tiny"), 0);  // gate Q2_K 512 cols, down Q3_K 256
  for (const MatView& v : {w.gate_exps.expert(3), w.down_exps.expert(3)}) {
    const std::string t = v.type == GgmlType::kQ2K ? "Q2_K" : "Q3_K";
    OwnedMatrix o(v);
    const std::vector<uint8_t> orig = o.bytes;
    std::vector<float> before(static_cast<size_t>(v.cols)), after(before.size());
    {
      BytePatch undo(o.m.data, o.m.bytes());
      const double moved = perturb_scale_d(o.m, 0.01);
      EXPECT_NEAR(moved, 0.01, 0.001) << t;  // f16 rounding of d x 1.01: within an ulp of 1%
      dequantize_row(v.type, v.row(0), before.data(), v.cols);
      dequantize_row(v.type, o.m.data, after.data(), v.cols);
      double num = 0, den = 0;  // the rows scale with d (Q2_K: the min term does not)
      for (size_t k = 0; k < before.size(); ++k)
        num += after[k] * before[k], den += before[k] * before[k];
      if (v.type == GgmlType::kQ3K) {
        EXPECT_NEAR(num / den, 1.01, 0.001) << t;
      }
      EXPECT_NE(o.bytes, orig) << t;
    }
    EXPECT_EQ(o.bytes, orig) << t << ": scale not undone";
    {
      BytePatch undo(o.m.data, o.m.bytes());
      const int64_t n = perturb_swap_scale_min(o.m, 5);
      EXPECT_GE(n, 1) << t;
      EXPECT_LE(n, 5) << t;
      // Only rows 0..4, only the first block's scales bytes.
      const int64_t rb = o.m.row_bytes();
      EXPECT_EQ(std::memcmp(o.bytes.data() + 5 * rb, orig.data() + 5 * rb, o.bytes.size() - 5 * rb),
                0)
          << t;
      const size_t sc =
          v.type == GgmlType::kQ2K ? offsetof(BlockQ2K, scales) : offsetof(BlockQ3K, scales);
      const size_t sc_len = v.type == GgmlType::kQ2K ? 16 : 12;
      for (int64_t r = 0; r < 5; ++r)
        for (int64_t b = 0; b < rb; ++b) {
          const bool in_scales =
              b >= static_cast<int64_t>(sc) && b < static_cast<int64_t>(sc + sc_len);
          if (!in_scales) {
            EXPECT_EQ(o.bytes[r * rb + b], orig[r * rb + b]) << t << " row " << r << " byte " << b;
          }
        }
      if (v.type == GgmlType::kQ2K) {
        BlockQ2K a, b;
        std::memcpy(&a, orig.data(), sizeof a);
        std::memcpy(&b, o.bytes.data(), sizeof b);
        EXPECT_EQ(q2k_scale(b, 0), q2k_min(a, 0));
        EXPECT_EQ(q2k_min(b, 0), q2k_scale(a, 0));
        for (int s = 1; s < 16; ++s) EXPECT_EQ(b.scales[s], a.scales[s]);
      } else {
        BlockQ3K a, b;
        std::memcpy(&a, orig.data(), sizeof a);
        std::memcpy(&b, o.bytes.data(), sizeof b);
        EXPECT_EQ(q3k_scale(b, 0), q3k_scale(a, 1));
        EXPECT_EQ(q3k_scale(b, 1), q3k_scale(a, 0));
        for (int s = 2; s < 16; ++s)
          EXPECT_EQ(q3k_scale(b, s), q3k_scale(a, s)) << "sub-block " << s;
      }
    }
    EXPECT_EQ(o.bytes, orig) << t << ": swap not undone";
    {
      BytePatch undo(o.m.data, o.m.bytes());
      EXPECT_EQ(perturb_row_offset(o.m, 2), 2) << t;
      const int64_t rb = o.m.row_bytes();
      const size_t bb = v.type == GgmlType::kQ2K ? sizeof(BlockQ2K) : sizeof(BlockQ3K);
      // Row 0 reads from one block past its start: its last block is row 1's first.
      EXPECT_EQ(std::memcmp(o.bytes.data(), orig.data() + bb, static_cast<size_t>(rb)), 0) << t;
      EXPECT_EQ(std::memcmp(o.bytes.data() + rb, orig.data() + rb + bb, static_cast<size_t>(rb)), 0)
          << t;
      EXPECT_EQ(std::memcmp(o.bytes.data() + 2 * rb, orig.data() + 2 * rb, o.bytes.size() - 2 * rb),
                0)
          << t;
    }
    EXPECT_EQ(o.bytes, orig) << t << ": offset not undone";
    {
      BytePatch undo(o.m.data, o.m.bytes());
      EXPECT_EQ(perturb_shift_quants(o.m, 3), 3) << t;
      const size_t qs = v.type == GgmlType::kQ2K ? offsetof(BlockQ2K, qs) : offsetof(BlockQ3K, qs);
      for (int i = 0; i < 63; ++i) EXPECT_EQ(o.bytes[qs + i], orig[qs + i + 1]) << t << " qs " << i;
      EXPECT_EQ(o.bytes[qs + 63], orig[qs + 63]) << t;
    }
    EXPECT_EQ(o.bytes, orig) << t << ": quants not undone";
  }
}

// A scale below an f16 ulp of d changes nothing: the effective size reports it.
TEST(Perturb, ScaleBelowAnF16UlpChangesNothing) {
  const LayerWeights w = generate_layer(preset_options("tiny"), 0);
  OwnedMatrix o(w.gate_exps.expert(0));
  const std::vector<uint8_t> orig = o.bytes;
  BytePatch undo(o.m.data, o.m.bytes());
  EXPECT_EQ(perturb_scale_d(o.m, 1e-5), 0.0);
  EXPECT_EQ(o.bytes, orig);
}

TEST(CopyOnWrite, WritesChangeOnlyThePrivateView) {
  const std::string path = temp_tiny_model("cow");
  {
    const ModelFile ro = ModelFile::open(path);
    const ModelFile cow = ModelFile::open(path, gguf::MapMode::kCopyOnWrite);
    const LayerWeights a = ro.layer(0), b = cow.layer(0);
    const MatView va = a.gate_exps.expert(2), vb = b.gate_exps.expert(2);
    const size_t n = static_cast<size_t>(va.rows * va.row_stride());
    uint8_t* p = cow.writable(vb.data, n);
    p[10] ^= 0xFF;
    EXPECT_NE(std::memcmp(va.data, vb.data, n), 0);
    EXPECT_EQ(ModelFile::open(path).layer(0).gate_exps.expert(2).data[10],
              va.data[10]);  // the file
    p[10] ^= 0xFF;
    EXPECT_EQ(std::memcmp(va.data, vb.data, n), 0);
    EXPECT_THROW(ro.writable(va.data, n), std::logic_error);
    EXPECT_THROW(cow.writable(vb.data, ro.gguf().file_size() + 1), std::logic_error);
  }
  std::remove(path.c_str());
}

// The whole run on the tiny model's layer 0 with its adversarial tokens, the emulation under test.
TEST(Sensitivity, TinyScalesCaughtAtHalfAPercentClampCaughtBaselineClean) {
  const std::string path = temp_tiny_model("tiny");
  {
    const ModelFile ro = ModelFile::open(path);
    const ModelFile cow = ModelFile::open(path, gguf::MapMode::kCopyOnWrite);
    SensitivitySetup s;
    s.truth = ro.layer(0);
    s.impl = cow.layer(0);
    s.writable = [&cow](const void* p, size_t n) { return cow.writable(p, n); };
    s.run = [](const LayerWeights& w, const std::vector<uint16_t>& x, int64_t T) {
      LayerTaps t;
      t.output = emu::MoeLayer(w, emu::LayerOptions{}).forward(x.data(), T, &t);
      t.layer = w.layer;
      t.tokens = T;
      t.input = x;
      return t;
    };
    s.x = generate_input(11, 4, s.truth.config.dim);
    for (const AdversarialToken& a : adversarial_tokens(s.truth, 11))
      s.x.insert(s.x.end(), a.x.begin(), a.x.end());
    s.T = 4 + kAdversarialTokens;
    s.classes = {PerturbClass::kScale, PerturbClass::kOffset, PerturbClass::kClamp};
    const SensitivityReport r = run_sensitivity(s);
    EXPECT_TRUE(r.baseline_clean());
    EXPECT_TRUE(r.all_caught());
    ASSERT_EQ(r.rows.size(), 3u + 3u + 1u);
    for (const SensitivityRow& row : r.rows) {
      ASSERT_GE(row.first, 0) << row.tensor << " " << perturb_class_name(row.cls);
      const SensitivityStep& st = row.steps[static_cast<size_t>(row.first)];
      if (row.cls == PerturbClass::kScale) {
        EXPECT_LE(st.size, 0.005) << row.tensor << ": smallest scale caught";
        EXPECT_GT(st.effective, 0) << row.tensor;
        // The statistical leg is never less sensitive than the accumulated bounds.
        ASSERT_GE(row.first_stat, 0) << row.tensor;
        EXPECT_TRUE(row.first_bounds < 0 || row.first_stat <= row.first_bounds) << row.tensor;
        // The NMSE rule needs a larger error than the legs, when it sees it at all.
        EXPECT_TRUE(row.first_rule < 0 || row.first_rule > row.first) << row.tensor;
      }
      if (row.cls == PerturbClass::kClamp) {
        EXPECT_FALSE(row.no_effect) << "the clamp token reached no clamp";
        EXPECT_NE(row.first_by.find("experts.h"), std::string::npos) << row.first_by;
      }
    }
    // Every perturbation was undone: the private view equals the file again.
    const LayerWeights a = ro.layer(0), b = cow.layer(0);
    for (const auto& [x, y] :
         {std::pair{a.gate_exps, b.gate_exps}, {a.up_exps, b.up_exps}, {a.down_exps, b.down_exps}})
      EXPECT_EQ(std::memcmp(x.expert(r.expert).data, y.expert(r.expert).data,
                            static_cast<size_t>(x.expert_stride())),
                0);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace moecheck

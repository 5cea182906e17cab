// End-to-end tests of the `moecheck` binary (docs/cli.md): gen -> run (ref, emu) -> diff ->
// check; exit codes 0 / 1 / 2 and messages naming the file and field; a dump with one flipped
// bit is found and located; incomparable dumps are refused; missing, truncated and malformed
// files give exit 2 and leave no output file; the committed golden set verifies.
// Repro: the failing command line is printed with every expectation.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "golden/dump.h"
#include "golden/model_file.h"
#include "golden/sha256.h"

namespace {

namespace fs = std::filesystem;

const std::string kBinary = MOECHECK_BINARY_DIR "/tools/moecheck";
const std::string kGoldenDir = MOECHECK_SOURCE_DIR "/golden/data";

struct Result {
  int code = -1;
  std::string out, err, cmd;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("moecheck_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(kBinary))
        << kBinary << " is not built (the cli_test target depends on moecheck)";
    Result g = run("gen --preset tiny --layers 2 --seed 1 -o " + p("tiny.gguf"));
    ASSERT_EQ(g.code, 0) << g.cmd << "\n" << g.err;
    for (const char* impl : {"ref", "emu"}) {
      Result r = run(std::string("run --impl ") + impl + " --model " + p("tiny.gguf") +
                     " --tokens 8 --taps -o " + p(std::string(impl) + ".h5"));
      ASSERT_EQ(r.code, 0) << r.cmd << "\n" << r.err;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string p(const std::string& name) { return (dir_ / name).string(); }

  static Result run(const std::string& args) {
    Result r;
    const fs::path out = dir_ / ".stdout", err = dir_ / ".stderr";
    r.cmd = kBinary + " " + args;
    const int st = std::system((r.cmd + " >" + out.string() + " 2>" + err.string()).c_str());
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static fs::path dir_;
};
fs::path Cli::dir_;

#define EXPECT_CODE(res, want)                                           \
  EXPECT_EQ((res).code, want) << "repro: " << (res).cmd << "\nstdout:\n" \
                              << (res).out << "\nstderr:\n"              \
                              << (res).err
#define EXPECT_HAS(text, needle)                                                              \
  EXPECT_NE((text).find(needle), std::string::npos) << "missing \"" << (needle) << "\" in:\n" \
                                                    << (text)

// Flips bit `bit` of element [row, col] of a 2-d dataset of 16-bit (bf16) or 32-bit (f32)
// elements in place, through the HDF5 API (the file stays a valid dump).
void flip_bit(const std::string& file, const std::string& dataset, hsize_t row, hsize_t col,
              int bit) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0) << dataset;
  hid_t space = H5Dget_space(d);
  hsize_t dims[2];
  ASSERT_EQ(H5Sget_simple_extent_dims(space, dims, nullptr), 2);
  hid_t t = H5Dget_type(d);
  // Read and write the raw bits as unsigned integers of the element's width (no conversion).
  const hid_t mem = H5Tget_size(t) == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
  std::vector<uint32_t> buf(dims[0] * dims[1]);
  std::vector<uint16_t> b16(buf.size());
  void* data =
      mem == H5T_NATIVE_UINT16 ? static_cast<void*>(b16.data()) : static_cast<void*>(buf.data());
  hid_t mt =
      mem == H5T_NATIVE_UINT16 ? H5Tcopy(H5T_STD_U16LE) : H5Tcopy(t);  // f32: read as its own type
  ASSERT_GE(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  if (mem == H5T_NATIVE_UINT16) b16[row * dims[1] + col] ^= static_cast<uint16_t>(1u << bit);
  else buf[row * dims[1] + col] ^= 1u << bit;
  ASSERT_GE(H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  H5Tclose(mt);
  H5Tclose(t);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
}

TEST_F(Cli, HelpAndUsageErrors) {
  Result h = run("--help");
  EXPECT_CODE(h, 0);
  EXPECT_HAS(h.out, "Examples:");
  Result d = run("diff --help");
  EXPECT_CODE(d, 0);
  EXPECT_HAS(d.out, "Exit codes: 0 same");
  EXPECT_CODE(run(""), 2);
  Result bad = run("run --impl gpu --model " + p("tiny.gguf") + " -o " + p("x.h5"));
  EXPECT_CODE(bad, 2);
  EXPECT_FALSE(fs::exists(p("x.h5")));
}

TEST_F(Cli, GenRunDiffCheck_tiny_L2_T8) {
  // Two runs of one implementation are bit-identical (run vs run: bitwise).
  Result again =
      run("run --impl emu --model " + p("tiny.gguf") + " --tokens 8 --taps -o " + p("emu2.h5"));
  EXPECT_CODE(again, 0);
  EXPECT_CODE(run("diff " + p("emu.h5") + " " + p("emu2.h5")), 0);
  // ref ~ emu is not bit-exact, but within an NMSE of 1e-3 on every stage (docs/cli.md "check").
  Result exact = run("diff " + p("ref.h5") + " " + p("emu.h5") + " --exact");
  EXPECT_CODE(exact, 1);
  EXPECT_HAS(exact.out, "result: DIFFERS");
  Result nmse =
      run("diff " + p("ref.h5") + " " + p("emu.h5") + " --nmse 1e-3 --model " + p("tiny.gguf"));
  EXPECT_CODE(nmse, 0);
  EXPECT_HAS(nmse.out, "result: same");
  Result js = run("diff " + p("ref.h5") + " " + p("emu.h5") + " --nmse 1e-3 --json");
  EXPECT_CODE(js, 0);
  EXPECT_EQ(js.out.rfind("{\"a\":", 0), 0u) << js.out.substr(0, 200);
  EXPECT_HAS(js.out, "\"same\":true");
  // check on the same model: both legs it can run, one table per layer.
  Result c = run("check --model " + p("tiny.gguf") + " --tokens 4");
  EXPECT_CODE(c, 0);
  EXPECT_HAS(c.out, "layer 0");
  EXPECT_HAS(c.out, "layer 1");
  EXPECT_HAS(c.out, "ref~emu");
  EXPECT_HAS(c.out, "emu=cuda");
  EXPECT_HAS(c.out, "tokens per expert");
  EXPECT_HAS(c.out, "output L2 norm");
  EXPECT_HAS(c.out, "result: PASS");
  // Inputs from a dump: the same inputs, so the input stage is bit-identical.
  Result from = run("run --impl emu --model " + p("tiny.gguf") + " --input " + p("ref.h5") +
                    " -o " + p("emu_in.h5"));
  EXPECT_CODE(from, 0);
  Result same_in = run("diff " + p("emu.h5") + " " + p("emu_in.h5"));
  EXPECT_CODE(same_in, 0);
}

TEST_F(Cli, CheckWithoutArgumentsRunsTheEmbeddedDefault) {
  Result c = run("check");
  EXPECT_CODE(c, 0);
  EXPECT_HAS(c.out, "embedded default (preset tiny, 2 layers, seed 1)");
  EXPECT_HAS(c.out, "8 seeded + 4 adversarial token(s) per layer");
  // The adversarial tokens reach both clamps from both sides and an exact routing tie; the
  // report says so per layer (the counts are measured on the taps, so a token that stops reaching
  // a side shows as 0 and fails the regex).
  const std::regex clamps(
      R"(token 8 \(clamps\): gate > L [1-9][0-9]*, gate < -L [1-9][0-9]*, up > L )"
      R"([1-9][0-9]*, up < -L [1-9][0-9]*)");
  EXPECT_TRUE(std::regex_search(c.out, clamps)) << c.out;
  EXPECT_HAS(c.out, "exact tie at the top-k boundary");
  EXPECT_HAS(c.out, "the lower id picked");
  EXPECT_EQ(c.out.find("NOT"), std::string::npos) << "an edge case was not reached:\n" << c.out;
  EXPECT_HAS(c.out, "so the +1e-20 is ");
  Result again = run("check");
  EXPECT_EQ(again.out, c.out) << "check is not deterministic";
}

TEST_F(Cli, SensitivityReportsTheSmallestCaughtPerClass) {
  Result r = run("sensitivity --classes scale,clamp");
  EXPECT_CODE(r, 0);
  EXPECT_HAS(r.out, "baseline (nothing planted): bounds agree, stat agree, local agree");
  const std::regex gate(R"(ffn_gate_exps\[[0-9]+\] +scale +0\.00[1-5] )");
  EXPECT_TRUE(std::regex_search(r.out, gate)) << "gate scale not caught at <= 0.5%:\n" << r.out;
  EXPECT_HAS(r.out, "NMSE<=5e-4 rule");
  EXPECT_HAS(r.out, "result: every perturbation caught");
  Result j = run("sensitivity --classes clamp --json");
  EXPECT_CODE(j, 0);
  EXPECT_HAS(j.out, "\"all_caught\":true");
  EXPECT_HAS(j.out, "\"class\":\"clamp\"");
  Result bad = run("sensitivity --classes scale,bogus");
  EXPECT_CODE(bad, 2);
  EXPECT_HAS(bad.err, "--classes: unknown perturbation class \"bogus\"");
  Result layer = run("sensitivity --layer 7");
  EXPECT_CODE(layer, 2);
  EXPECT_HAS(layer.err, "--layer 7");
}

TEST_F(Cli, OneFlippedBitIsFoundAndLocated_tiny_layer1_token3_col17) {
  fs::copy_file(p("emu.h5"), p("flip.h5"), fs::copy_options::overwrite_existing);
  flip_bit(p("flip.h5"), "/layers/1/output", 3, 17, 0);
  Result r = run("diff " + p("emu.h5") + " " + p("flip.h5"));
  EXPECT_CODE(r, 1);
  EXPECT_HAS(r.out, "layer 1: DIFFERS (first failing stage: output)");
  EXPECT_HAS(r.out, "layer 1 output token 3 col 17:");
  EXPECT_HAS(r.out, "1 bf16 ulp");
  EXPECT_HAS(r.out, "layer 0: same");
  // An f32 bit in one expert's gate output: located to the expert, token and weight row.
  fs::copy_file(p("emu.h5"), p("flip2.h5"), fs::copy_options::overwrite_existing);
  hid_t f = H5Fopen(p("flip2.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t g = H5Gopen2(f, "/layers/0/experts", H5P_DEFAULT);
  char name[32] = {};
  H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, 0, name, sizeof name, H5P_DEFAULT);
  H5Gclose(g);
  H5Fclose(f);
  flip_bit(p("flip2.h5"), std::string("/layers/0/experts/") + name + "/gate", 0, 5, 3);
  Result e = run("diff " + p("emu.h5") + " " + p("flip2.h5"));
  EXPECT_CODE(e, 1);
  EXPECT_HAS(e.out, "first failing stage: experts.gate");
  EXPECT_HAS(e.out, std::string("layer 0 experts.gate expert ") + name + " token ");
  EXPECT_HAS(e.out, std::string("weight row 5 of ffn_gate_exps[") + name + "] (Q2_K blocks 0..1)");
}

TEST_F(Cli, IncomparableDumpsAreRefused) {
  ASSERT_EQ(run("gen --preset tiny --layers 2 --seed 2 -o " + p("tiny2.gguf")).code, 0);
  ASSERT_EQ(run("run --impl emu --model " + p("tiny2.gguf") + " -o " + p("other_model.h5")).code,
            0);
  Result m = run("diff " + p("emu.h5") + " " + p("other_model.h5"));
  EXPECT_CODE(m, 2);
  EXPECT_HAS(m.err, "different weights: blk.0.ffn_gate_inp.weight has sha256");
  ASSERT_EQ(run("run --impl emu --model " + p("tiny.gguf") + " --tokens 4 -o " + p("t4.h5")).code,
            0);
  Result t = run("diff " + p("emu.h5") + " " + p("t4.h5"));
  EXPECT_CODE(t, 2);
  EXPECT_HAS(t.err, "different token counts (attribute tokens): 8 vs 4");
  // Same model, another config attribute (edited): refused naming the field.
  fs::copy_file(p("emu.h5"), p("cfg.h5"), fs::copy_options::overwrite_existing);
  hid_t f = H5Fopen(p("cfg.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t a = H5Aopen(f, "config.route_scale", H5P_DEFAULT);
  const float v = 2.0f;
  H5Awrite(a, H5T_NATIVE_FLOAT, &v);
  H5Aclose(a);
  H5Fclose(f);
  Result c = run("diff " + p("emu.h5") + " " + p("cfg.h5"));
  EXPECT_CODE(c, 2);
  EXPECT_HAS(c.err, "config.route_scale is 1.5 vs 2");
}

TEST_F(Cli, MissingTruncatedAndMalformedFilesExit2AndLeaveNoOutput) {
  Result m = run("run --impl emu --model " + p("nope.gguf") + " -o " + p("o1.h5"));
  EXPECT_CODE(m, 2);
  EXPECT_HAS(m.err, "nope.gguf");
  EXPECT_FALSE(fs::exists(p("o1.h5")));

  fs::copy_file(p("tiny.gguf"), p("half.gguf"), fs::copy_options::overwrite_existing);
  fs::resize_file(p("half.gguf"), fs::file_size(p("half.gguf")) / 2);
  Result t = run("run --impl ref --model " + p("half.gguf") + " -o " + p("o2.h5"));
  EXPECT_CODE(t, 2);
  EXPECT_HAS(t.err, "half.gguf");
  EXPECT_FALSE(fs::exists(p("o2.h5")));
  EXPECT_CODE(run("inspect " + p("half.gguf")), 2);

  fs::copy_file(p("tiny.gguf"), p("bad.gguf"), fs::copy_options::overwrite_existing);
  {
    std::fstream f(p("bad.gguf"), std::ios::in | std::ios::out | std::ios::binary);
    f.write("GGUX", 4);  // wrong magic
  }
  Result b = run("run --impl emu --model " + p("bad.gguf") + " -o " + p("o3.h5"));
  EXPECT_CODE(b, 2);
  EXPECT_HAS(b.err, "bad.gguf");
  EXPECT_FALSE(fs::exists(p("o3.h5")));

  fs::copy_file(p("emu.h5"), p("half.h5"), fs::copy_options::overwrite_existing);
  fs::resize_file(p("half.h5"), fs::file_size(p("half.h5")) / 2);
  Result d = run("diff " + p("emu.h5") + " " + p("half.h5"));
  EXPECT_CODE(d, 2);
  EXPECT_HAS(d.err, "half.h5");
  Result i = run("run --impl emu --model " + p("tiny.gguf") + " --input " + p("half.h5") + " -o " +
                 p("o4.h5"));
  EXPECT_CODE(i, 2);
  EXPECT_FALSE(fs::exists(p("o4.h5")));

  fs::copy_file(p("emu.h5"), p("nolayer.h5"), fs::copy_options::overwrite_existing);
  hid_t f = H5Fopen(p("nolayer.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Ldelete(f, "/layers/1/router_logits", H5P_DEFAULT);
  H5Fclose(f);
  Result n = run("inspect " + p("nolayer.h5"));
  EXPECT_CODE(n, 2);
  EXPECT_HAS(n.err, "nolayer.h5: /layers/1/router_logits: missing dataset");

  Result nf = run("diff " + p("emu.h5") + " " + p("absent.h5"));
  EXPECT_CODE(nf, 2);
  EXPECT_HAS(nf.err, "absent.h5: cannot open");
  // Unknown layer: exit 2, naming --layers and the file.
  Result l = run("run --impl emu --model " + p("tiny.gguf") + " --layers 0,5 -o " + p("o5.h5"));
  EXPECT_CODE(l, 2);
  EXPECT_HAS(l.err, "layer 5 is not in");
  EXPECT_FALSE(fs::exists(p("o5.h5")));
  // Nothing half-written anywhere: no temporaries left in the directory.
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(Cli, InspectShowsModelAndDump) {
  Result g = run("inspect " + p("tiny.gguf"));
  EXPECT_CODE(g, 0);
  EXPECT_HAS(g.out, "blk.1.ffn_down_exps.weight");
  EXPECT_HAS(g.out, "Q3_K");
  EXPECT_HAS(g.out, "config: dim 512, inter 256, 16 routed experts, top 4");
  Result d = run("inspect " + p("emu.h5"));
  EXPECT_CODE(d, 0);
  EXPECT_HAS(d.out, "emu (router=staged expert_warps=8)");
  EXPECT_HAS(d.out, "/layers/1:");
  EXPECT_HAS(d.out, "x_q8");
  Result j = run("inspect " + p("emu.h5") + " --json");
  EXPECT_CODE(j, 0);
  EXPECT_HAS(j.out, "\"kind\":\"dump\"");
}

// Provenance: each dump records the SHA-256 of the header and of every tensor and expert slice
// its run read; the whole file's only with --hash-file (then equal to what gen printed). A model
// that differs only where neither run read (here: the header, through another alignment) is
// compared, and said to differ there; --model must hold every slice the dump recorded.
TEST_F(Cli, ProvenanceIsPerSliceAndTheWholeFileOnlyWhenAsked) {
  using namespace moecheck;
  Result g = run("gen --preset tiny --layers 2 --seed 1 -o " + p("again.gguf"));
  ASSERT_EQ(g.code, 0) << g.err;
  const std::string sha = g.out.substr(g.out.find("sha256 ") + 7, 64);
  Result hf = run("run --impl emu --model " + p("tiny.gguf") + " --hash-file -o " + p("hf.h5"));
  ASSERT_EQ(hf.code, 0) << hf.err;
  EXPECT_HAS(run("inspect " + p("hf.h5")).out, "whole-file sha256 " + sha);
  Result i = run("inspect " + p("emu.h5"));
  EXPECT_HAS(i.out, "whole-file sha256 (not recorded)");
  EXPECT_HAS(i.out, "tensors read (sha256):");
  const ModelFile m = ModelFile::open(p("tiny.gguf"));
  const gguf::TensorInfo* router = m.gguf().find_tensor("blk.1.ffn_gate_inp.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_HAS(i.out, "blk.1.ffn_gate_inp.weight" + std::string(44 - 25, ' ') + " " +
                        sha256_hex(m.gguf().data(*router), router->nbytes));
  const gguf::TensorInfo* gate = m.gguf().find_tensor("blk.0.ffn_gate_exps.weight");
  const Dump d = read_dump(p("emu.h5"));
  const SliceHash& first_expert =
      d.slices[0][5];  // router, bias, 3 shared, then the first expert's gate
  ASSERT_EQ(first_expert.tensor, LayerTensor::kGateExps);
  const uint64_t stride = gate->nbytes / 16;
  EXPECT_EQ(first_expert.sha256,
            sha256_hex(m.gguf().data(*gate) + stride * static_cast<uint64_t>(first_expert.expert),
                       stride));

  ASSERT_EQ(run("gen --preset tiny --layers 2 --seed 1 --alignment 64 -o " + p("a64.gguf")).code,
            0);
  ASSERT_EQ(
      run("run --impl emu --model " + p("a64.gguf") + " --tokens 8 --taps -o " + p("a64.h5")).code,
      0);
  Result df = run("diff " + p("emu.h5") + " " + p("a64.h5"));
  EXPECT_CODE(df, 0);
  EXPECT_HAS(df.out, "same tensors:");
  EXPECT_HAS(df.out, "the GGUF headers differ");
  EXPECT_CODE(run("diff " + p("emu.h5") + " " + p("a64.h5") + " --model " + p("a64.gguf")), 0);
  ASSERT_EQ(run("gen --preset tiny --layers 2 --seed 5 -o " + p("seed5.gguf")).code, 0);
  Result wrong = run("diff " + p("emu.h5") + " " + p("emu.h5") + " --model " + p("seed5.gguf"));
  EXPECT_CODE(wrong, 2);
  EXPECT_HAS(wrong.err, "--model is not the model of");
}

// Image spans (model.py Gate.bias_vl): `gen --vision` writes bias_vl; `check --image-tokens`
// routes the listed tokens with it in every implementation and passes; run records the mask
// (format 3), inspect counts it, and diff reports two dumps whose masks differ as different
// inputs.
TEST_F(Cli, GenVisionThenCheckAndRunWithImageTokens_tiny_L2_T8) {
  Result g = run("gen --preset tiny --layers 2 --seed 1 --vision -o " + p("vl.gguf"));
  ASSERT_EQ(g.code, 0) << g.cmd << "\n" << g.err;
  EXPECT_HAS(g.out, "with bias_vl");
  EXPECT_HAS(run("inspect " + p("vl.gguf")).out, "blk.1.exp_probs_b_vl.bias");
  Result c = run("check --model " + p("vl.gguf") + " --image-tokens 0-3,9");
  EXPECT_CODE(c, 0);
  EXPECT_HAS(c.out, "image spans: 5 token(s) select their experts with bias_vl");
  EXPECT_HAS(c.out, "result: PASS");
  const std::string run_vl = "run --impl emu --model " + p("vl.gguf") + " --taps ";
  ASSERT_EQ(run(run_vl + "--image-tokens 2-5 -o " + p("vl_a.h5")).code, 0);
  ASSERT_EQ(run(run_vl + "--image-tokens 2-4 -o " + p("vl_b.h5")).code, 0);
  Result i = run("inspect " + p("vl_a.h5"));
  EXPECT_HAS(i.out, "moecheck dump format 3");
  EXPECT_HAS(i.out, "image_mask     [8] uint8: 4 of 8 token(s) in image spans");
  EXPECT_HAS(run("inspect " + p("emu.h5")).out, "image_mask     none");
  Result d = run("diff " + p("vl_a.h5") + " " + p("vl_b.h5"));
  EXPECT_CODE(d, 1);
  EXPECT_HAS(d.out, "layer 0: DIFFERS (first failing stage: input)");
  EXPECT_HAS(d.out, "image_mask differs on 1 token(s), first 5: A 1, B 0");
  // --input takes the dump's mask with its input: the same run again, bit for bit.
  ASSERT_EQ(run("run --impl emu --model " + p("vl.gguf") + " --input " + p("vl_a.h5") + " -o " +
                p("vl_in.h5"))
                .code,
            0);
  EXPECT_CODE(run("diff " + p("vl_a.h5") + " " + p("vl_in.h5")), 0);
}

// --image-tokens: malformed, reversed, overlapping or out-of-range pieces, and a model without
// bias_vl (model.py would ignore the mask; the flag would change nothing), exit 2 naming the flag
// and the piece or the tensor, leaving no output. --route: a bad value, or an implementation
// other than cuda alone, exit 2.
TEST_F(Cli, ImageTokensAndRouteErrorsExit2) {
  ASSERT_EQ(run("gen --preset tiny --layers 1 --seed 2 --vision -o " + p("vl1.gguf")).code, 0);
  const std::string emu = "run --impl emu --model " + p("vl1.gguf") + " --tokens 8 -o " +
                          p("bad.h5") + " --image-tokens ";
  for (const auto& [arg, piece, why] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"5-2", "\"5-2\"", "is reversed"},
           {"1-5,4", "\"4\"", "overlaps an earlier piece at token 4"},
           {"0,8", "\"8\"", "names token 8, outside the run's 8 token(s)"},
           {"x1", "\"x1\"", "is not a token index or range"},
           {"1,,2", "\"\"", "is not a token index or range"},
           {"3-", "\"3-\"", "is not a token index or range"}}) {
    Result r = run(emu + arg);
    EXPECT_CODE(r, 2);
    EXPECT_HAS(r.err, "--image-tokens \"" + arg + "\": piece " + piece + " " + why);
    EXPECT_FALSE(fs::exists(p("bad.h5"))) << r.cmd;
  }
  EXPECT_CODE(run(emu + "\"\""), 2);
  Result plain =
      run("run --impl ref --model " + p("tiny.gguf") + " --image-tokens 1 -o " + p("bad.h5"));
  EXPECT_CODE(plain, 2);
  EXPECT_HAS(plain.err, "has no tensor \"blk.0.exp_probs_b_vl.bias\"");
  EXPECT_FALSE(fs::exists(p("bad.h5")));
  Result cp = run("check --model " + p("tiny.gguf") + " --impls emu --image-tokens 2-3");
  EXPECT_CODE(cp, 2);
  EXPECT_HAS(cp.err, "--image-tokens: ");
  EXPECT_HAS(cp.err, "blk.0.exp_probs_b_vl.bias");
  Result rv = run("run --impl emu --model " + p("tiny.gguf") + " --route host -o " + p("bad.h5"));
  EXPECT_CODE(rv, 2);
  EXPECT_HAS(rv.err, "--route host: only the cuda implementation has a route knob");
  Result cv = run("check --model " + p("tiny.gguf") + " --impls ref,emu --route device");
  EXPECT_CODE(cv, 2);
  EXPECT_HAS(cv.err, "--route device: only the cuda implementation has a route knob");
  Result bad = run("check --model " + p("tiny.gguf") + " --route sideways");
  EXPECT_CODE(bad, 2);
  EXPECT_HAS(bad.err, "--route: route must be host or device, found \"sideways\"");
  EXPECT_FALSE(fs::exists(p("bad.h5")));
}

TEST_F(Cli, CommittedGoldenSetVerifies) {
  Result v = run("golden verify --data " + kGoldenDir);
  EXPECT_CODE(v, 0);
  EXPECT_HAS(v.out, "tiny emu: same (exact (bit for bit)");
  EXPECT_HAS(v.out, "small emu: same");
  EXPECT_HAS(v.out, "verified");
}

}  // namespace

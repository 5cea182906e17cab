// `moecheck diff A.h5 B.h5`: stage-by-stage comparison of two dumps under one tolerance.
// Contract: docs/cli.md "diff".
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "compare/dump_diff.h"
#include "core/error.h"
#include "golden/sha256.h"
#include "tools/commands.h"
#include "tools/report.h"
#include "tools/runner.h"

namespace moecheck::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  bool exact = false;
  uint64_t ulp = 0;
  double rtol = 0, atol = 0, nmse = 0;
  bool nan_equal = false;
  bool json = false;
  std::string model;
};

// --model must be the model dump A ran on: every tensor and expert slice A recorded has the
// same SHA-256 in the file (a version 1 dump, which recorded only the whole file's digest, is
// checked against the whole file).
void require_model_of(const LoadedModel& m, const Dump& A) {
  const std::string not_it = m.path + ": --model is not the model of " + A.path + ": ";
  if (A.slices.empty()) {
    const std::string sha = m.file.sha256();
    if (sha != A.meta.model_sha256)
      throw InputError(not_it + "sha256 " + sha + ", the dump records " + A.meta.model_sha256);
    return;
  }
  for (size_t li = 0; li < A.slices.size(); ++li) {
    const int L = A.meta.layers[li];
    if (L >= m.file.n_layers()) throw InputError(not_it + "it has no layer " + std::to_string(L));
    for (const SliceHash& h : A.slices[li]) {
      const std::string got = m.hasher->slice(L, h.tensor, h.expert);
      if (got != h.sha256)
        throw InputError(not_it + slice_name(L, h.tensor, h.expert) + " has sha256 " + got +
                         ", the dump records " + h.sha256);
    }
  }
}

struct Given {
  CLI::Option *ulp, *rtol, *atol, *nmse;
};

// A tolerance must be a finite number >= 0: a negative one fails everything, NaN fails every
// comparison, infinity passes everything (docs/cli.md "diff", Rules).
void require_tolerance(const char* flag, double v, const CLI::Option* given) {
  if (given->count() == 0 || (std::isfinite(v) && v >= 0)) return;
  throw InputError(std::string(flag) + " " + given->as<std::string>() +
                   ": expected a finite number >= 0");
}

// --rtol and --atol come together: |a-b| <= atol + rtol |a| has no default for either (numpy's
// atol 1e-8 would be a silent choice; 0 fails every pair across zero), so both are written out.
void require_both_tolerances(const Given& g) {
  if ((g.rtol->count() > 0) == (g.atol->count() > 0)) return;
  const bool rtol = g.rtol->count() > 0;
  throw InputError(std::string(rtol ? "--rtol " : "--atol ") +
                   (rtol ? g.rtol : g.atol)->as<std::string>() + ": give --" +
                   (rtol ? "atol" : "rtol") +
                   " too (the rule is |a-b| <= atol + rtol*|a|; write --" +
                   (rtol ? "atol" : "rtol") + " 0 to leave that term out)");
}

int run_diff(const DiffArgs& a, const Given& g) {
  Tolerance t;
  int modes = (a.exact ? 1 : 0) + (g.ulp->count() ? 1 : 0) +
              (g.rtol->count() || g.atol->count() ? 1 : 0) + (g.nmse->count() ? 1 : 0);
  if (modes > 1) throw InputError("choose one of --exact, --ulp, --rtol/--atol, --nmse");
  // CLI11 reads "-1" into the unsigned --ulp as 2^64 - 1 (every pair would pass): refused.
  if (g.ulp->count() > 0 && g.ulp->as<std::string>().find('-') != std::string::npos)
    throw InputError("--ulp " + g.ulp->as<std::string>() + ": expected a whole number >= 0");
  require_tolerance("--rtol", a.rtol, g.rtol);
  require_tolerance("--atol", a.atol, g.atol);
  require_tolerance("--nmse", a.nmse, g.nmse);
  require_both_tolerances(g);
  if (g.ulp->count()) {
    t.mode = ToleranceMode::kUlp;
    t.ulp = a.ulp;
  } else if (g.rtol->count() || g.atol->count()) {
    t.mode = ToleranceMode::kAbsRel;
    t.rtol = a.rtol;
    t.atol = a.atol;
  } else if (g.nmse->count()) {
    t.mode = ToleranceMode::kNmse;
    t.nmse = a.nmse;
  }
  t.nan_equal = a.nan_equal;
  const Dump A = read_dump(a.a);
  const Dump B = read_dump(a.b);
  DiffOptions o;
  o.tolerance = t;
  std::unique_ptr<LoadedModel> m;
  std::map<int, LayerWeights> weights;  // views into m's mapping, which outlives the diff
  if (!a.model.empty()) {
    m = std::make_unique<LoadedModel>(load_model(a.model));
    require_model_of(*m, A);
    for (int L : A.meta.layers) weights.emplace(L, m->file.layer(L));
    o.bias = [&weights](int L) {
      const LayerWeights& w = weights.at(L);
      return RouteBias{w.bias, w.bias_vl};
    };
  }
  const DiffReport r = diff_dumps(A, B, o);
  if (a.json) {
    Json j;
    diff_json(j, r);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("%s", diff_text(r).c_str());
  }
  return r.same ? kExitSame : kExitDiffers;
}

}  // namespace

void add_diff(CLI::App& app, int& rc) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* s = app.add_subcommand("diff", "Compare two dumps layer by layer and stage by stage");
  s->footer(
      "Examples:\n"
      "  moecheck diff emu.h5 cuda.h5                 # bit for bit (the default, = --exact)\n"
      "  moecheck diff ref.h5 emu.h5 --nmse 1e-3 --model tiny.gguf\n"
      "  moecheck diff a.h5 b.h5 --rtol 1e-2 --atol 1e-4 --json\n"
      "Rules: |a-b| <= atol + rtol*|a| (A is the expected side); NMSE = sum (a-b)^2 / sum a^2 (A's "
      "energy);\n"
      "ULPs in the stage's own format (bf16 or f32); NaN equals nothing unless --nan-equal; "
      "routing\n"
      "compared as sets, expert stages only on tokens whose routing agrees.\n"
      "Exit codes: 0 same (within the tolerance), 1 differs, 2 error (unreadable file, or dumps "
      "of\n"
      "different models, configs, token counts or layer lists).");
  s->add_option("A", a->a, "first dump (the expected side)")->required();
  s->add_option("B", a->b, "second dump")->required();
  s->add_flag("--exact", a->exact, "bit for bit (default)");
  Given g;
  g.ulp = s->add_option("--ulp", a->ulp,
                        "at most N ULPs apart (bf16 ULPs for bf16 stages, f32 for f32)");
  g.rtol = s->add_option("--rtol", a->rtol, "relative tolerance >= 0 (requires --atol)");
  g.atol = s->add_option("--atol", a->atol, "absolute tolerance >= 0 (requires --rtol)");
  g.nmse = s->add_option("--nmse", a->nmse, "per-stage NMSE bound >= 0");
  s->add_flag("--nan-equal", a->nan_equal, "NaN equals NaN");
  s->add_option("--model", a->model,
                "the dumps' model: routing margins in keys (score + bias) instead of logits");
  s->add_flag("--json", a->json, "machine-readable output");
  s->callback([a, g, &rc] { rc = run_diff(*a, g); });
}

}  // namespace moecheck::cli

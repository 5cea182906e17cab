// `moecheck export`: one layer of a dump as .npy (one stage) or .npz (every stage it holds), in
// the layout `moecheck import` reads (tools/import_map.h): to feed an engine moecheck's input, or
// to hand a run's tensors to numpy. Contract: docs/cli.md "export".
#include <memory>

#include "core/error.h"
#include "golden/atomic_file.h"
#include "golden/dump.h"
#include "golden/tensor_file.h"
#include "tools/commands.h"
#include "tools/import_map.h"
#include "tools/preflight.h"

namespace moecheck::cli {
namespace {

struct ExportArgs {
  std::string dump, stage, out;
  int layer = -1;
};

int run_export(const ExportArgs& a) {
  const bool npy = a.out.size() > 4 && a.out.compare(a.out.size() - 4, 4, ".npy") == 0;
  const bool npz = a.out.size() > 4 && a.out.compare(a.out.size() - 4, 4, ".npz") == 0;
  if (!npy && !npz) throw InputError("-o " + a.out + ": expected a .npy or .npz file name");
  if (npy == a.stage.empty())
    throw InputError(npy ? "-o " + a.out + ": a .npy holds one stage; give --stage"
                         : "--stage " + a.stage + ": a .npz holds every stage; write -o X.npy");
  require_output_file("-o", a.out, {{"DUMP", a.dump}});
  const Dump d = read_dump(a.dump);
  size_t li = 0;
  if (a.layer >= 0) {
    while (li < d.layers.size() && d.layers[li].layer != a.layer) ++li;
    if (li == d.layers.size())
      throw InputError("--layer " + std::to_string(a.layer) + ": " + a.dump + " has no such layer");
  }
  std::map<std::string, HostTensor> t = export_layer(d.meta.config, d.layers[li]);
  std::vector<uint8_t> bytes;
  if (npy) {
    auto it = t.find(a.stage);
    if (it == t.end())
      throw InputError("--stage " + a.stage + ": " + a.dump + " layer " +
                       std::to_string(d.layers[li].layer) + " does not hold it");
    bytes = make_npy(it->second);
  } else {
    std::map<std::string, std::vector<uint8_t>> members;
    for (const auto& [k, v] : t) members.emplace(k, make_npy(v));
    bytes = make_npz_stored(members);
  }
  write_file_atomic(a.out, bytes.data(), bytes.size());
  std::printf("wrote %s: layer %d, %s\n", a.out.c_str(), d.layers[li].layer,
              npy ? a.stage.c_str() : (std::to_string(t.size()) + " stage(s)").c_str());
  return kExitSame;
}

}  // namespace

void add_export(CLI::App& app, int& rc) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* s = app.add_subcommand(
      "export", "Write one layer of a dump as .npy / .npz (the layout moecheck import reads)");
  s->footer(
      "Examples:\n"
      "  moecheck export ref.h5 --stage input -o x.npy   # the input to feed an engine (bf16 as "
      "<u2)\n"
      "  moecheck export emu.h5 -o emu.npz               # every stage of the first layer\n"
      "Exit codes: 0 written, 2 error.");
  s->add_option("DUMP", a->dump, "a moecheck dump")->required();
  s->add_option("--layer", a->layer, "the layer (default: the dump's first)");
  s->add_option("--stage", a->stage, "the stage of a .npy, e.g. input, output");
  s->add_option("-o", a->out, "output .npy or .npz")->required();
  s->callback([a, &rc] { rc = run_export(*a); });
}

}  // namespace moecheck::cli

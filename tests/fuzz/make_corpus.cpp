// Writes the GGUF seed corpus of tests/fuzz/fuzz_gguf.cpp: a micro model (dim 256, inter 256,
// 2 experts, top 1, K-quant shared expert, bias_vl, one layer) whole and cut after its header.
// With a dump as second argument it also writes that dump again, stamped (this moecheck's
// writer), as dump/stamped.h5. The committed seeds of tests/fuzz/corpus/ were made by it (with
// tests/data/dump_v1_small_emu.h5, which is also the unstamped dump seed).
#include <cstdio>
#include <string>

#include "golden/dump.h"
#include "golden/generator.h"
#include "golden/model_file.h"

int main(int argc, char** argv) {
  using namespace moecheck;
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: make_corpus <corpus dir> [dump to copy, stamped, into dump/]\n");
    return 2;
  }
  const std::string dir = argv[1];
  GenOptions o = preset_options("tiny");
  o.config.dim = 256;
  o.config.inter = 256;
  o.config.n_routed = 2;
  o.config.topk = 1;
  o.n_layers = 1;
  o.shared = SharedExpertType::kKQuant;
  o.vision = true;
  const std::string model = dir + "/gguf/micro.gguf";
  write_model(o, model);
  const ModelFile m = ModelFile::open(model);
  {  // the header alone (the metadata and tensor infos the parser reads first)
    const uint64_t n = m.gguf().data_offset();
    std::FILE* f = std::fopen((dir + "/gguf/micro_header.gguf").c_str(), "wb");
    std::fwrite(m.gguf().bytes(), 1, n, f);
    std::fclose(f);
  }
  if (argc == 3) write_dump(dir + "/dump/stamped.h5", read_dump(argv[2]));
  return 0;
}

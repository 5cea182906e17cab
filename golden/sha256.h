// SHA-256 through OpenSSL's libcrypto (EVP; it uses the CPU's SHA instructions where present), for
// the provenance of dumps: per-tensor and per-expert-slice digests of what a run read, and the
// whole-file digest when asked for (`--hash-file`). Checked against the FIPS 180-4 vectors in
// tests/model_file_test.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moecheck {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> finish();  // once; the object is spent afterwards

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Lower-case hex digest.
std::string sha256_hex(const void* data, size_t n);
std::string to_hex(const std::array<uint8_t, 32>& digest);
// 64 lower-case hex digits to the 32 bytes; false when `hex` is not that.
bool from_hex(const std::string& hex, std::array<uint8_t, 32>& out);
// Digest of a whole file, read in chunks; InputError naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace moecheck

// SHA-256 (FIPS 180-4), written here so that dumps can record the model file they came from
// without another dependency. Checked against the FIPS test vectors in tests/model_file_test.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace moecheck {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> finish();  // once; the object is spent afterwards

 private:
  void block(const uint8_t* p);

  std::array<uint32_t, 8> h_{};
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

// Lower-case hex digest.
std::string sha256_hex(const void* data, size_t n);
std::string to_hex(const std::array<uint8_t, 32>& digest);
// Digest of a whole file, read in chunks; InputError naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace moecheck

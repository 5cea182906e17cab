// Block formats (emulate/blocks.h) and the row dequantisers (emulate/quantize.h) against
// hand-built blocks: every byte is written at the offset ggml's src/ggml-common.h (d99724f2) and
// docs/blocks.md give, one field or bit at a time, and the expected element values are computed
// here from the layout tables (in double, from the f16 definition), never by calling a decoder
// under test. Then dequantize_row must agree bit for bit with the per-element decoders on random
// blocks.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/blocks.h"
#include "core/error.h"
#include "core/kquant.h"

namespace moecheck {
namespace {

// f16 value from its definition (independent of numfmt.h).
double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? std::nan("") : INFINITY;
  else v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

// A decoded f32 equals the exactly computed double rounded once (NaN matches NaN).
::testing::AssertionResult same_value(float got, double exact) {
  if (std::isnan(exact) ? std::isnan(got) : got == static_cast<float>(exact)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << ", expected " << exact;
}

void put16(uint8_t* p, uint16_t v) {  // little-endian, as GGUF stores it
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Raw 84-byte Q2_K: scales at 0, qs at 16, d at 80, dmin at 82 (§1.1).
struct RawQ2 {
  uint8_t b[84] = {};
  uint8_t* scales() { return b; }
  uint8_t* qs() { return b + 16; }
  void set_d(uint16_t v) { put16(b + 80, v); }
  void set_dmin(uint16_t v) { put16(b + 82, v); }
  BlockQ2K block() const {
    BlockQ2K x;
    std::memcpy(&x, b, sizeof x);
    return x;
  }
};

// Raw 110-byte Q3_K: hmask at 0, qs at 32, scales at 96, d at 108 (§1.2).
struct RawQ3 {
  uint8_t b[110] = {};
  uint8_t* hmask() { return b; }
  uint8_t* qs() { return b + 32; }
  uint8_t* scales() { return b + 96; }
  void set_d(uint16_t v) { put16(b + 108, v); }
  BlockQ3K block() const {
    BlockQ3K x;
    std::memcpy(&x, b, sizeof x);
    return x;
  }
};

// Element index of qs byte `byte` at bit shift 2j (§1.1: e = 128n + 32j + l, byte 32n + l).
int qs_element(int byte, int j) { return 128 * (byte / 32) + 32 * j + byte % 32; }

// Writes 6-bit code c (= scale + 32) of sub-block s per the §1.2 table.
void pack_q3_code(uint8_t* scales, int s, int c) {
  scales[s % 8] = static_cast<uint8_t>(scales[s % 8] | ((c & 0xF) << (4 * (s / 8))));
  scales[8 + s % 4] = static_cast<uint8_t>(scales[8 + s % 4] | ((c >> 4) << (2 * (s / 4))));
}

// The other reader of §1.2 (ggml's kmask form over three LE words): the 16 codes as bytes.
void unpack_q3_codes_kmask(const uint8_t* scales, int codes[16]) {
  uint32_t a[3];
  std::memcpy(a, scales, 12);
  const uint32_t k1 = 0x03030303u, k2 = 0x0F0F0F0Fu, t = a[2];
  const uint32_t w[4] = {(a[0] & k2) | (((t >> 0) & k1) << 4), (a[1] & k2) | (((t >> 2) & k1) << 4),
                         ((a[0] >> 4) & k2) | (((t >> 4) & k1) << 4),
                         ((a[1] >> 4) & k2) | (((t >> 6) & k1) << 4)};
  for (int i = 0; i < 16; ++i) codes[i] = static_cast<int>((w[i / 4] >> (8 * (i % 4))) & 0xFF);
}

// f16 super-scales worth testing: zeros of both signs, smallest and largest subnormal, smallest
// normal, 1, -2, largest finite, an arbitrary pattern, Inf and NaN.
const uint16_t kScalePatterns[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00,
                                   0xC000, 0x7BFF, 0xB555, 0x7C00, 0x7E00};

TEST(Blocks, Q8_1LayoutOffsets) {
  uint8_t raw[36];
  put16(raw, 0x3555);
  put16(raw + 2, 0xC123);
  for (int i = 0; i < 32; ++i) raw[4 + i] = static_cast<uint8_t>(i * 9 + 100);
  BlockQ8_1 b;
  std::memcpy(&b, raw, sizeof b);
  EXPECT_EQ(b.d, 0x3555);
  EXPECT_EQ(b.s, 0xC123);
  for (int i = 0; i < 32; ++i) {
    const int u = (i * 9 + 100) & 0xFF;
    EXPECT_EQ(b.qs[i], u >= 128 ? u - 256 : u) << "qs[" << i << "] is int8 at byte " << 4 + i;
  }
  EXPECT_EQ(row_bytes(GgmlType::kQ8_1, 64), 72);
  EXPECT_EQ(row_bytes(GgmlType::kQ2K, 5120), 20 * 84);
  EXPECT_EQ(row_bytes(GgmlType::kQ3K, 2304), 9 * 110);
  EXPECT_EQ(row_bytes(GgmlType::kF16, 10), 20);
  EXPECT_EQ(row_bytes(GgmlType::kBF16, 10), 20);
  EXPECT_EQ(row_bytes(GgmlType::kF32, 10), 40);
}

// Step 1 (Q2_K): every sub-block's byte, all 16 x 16 (scale, min) pairs. q = 3 everywhere,
// d = 1, dmin = 0.5: sub-block s decodes to 3 * scale - 0.5 * min, every other one to 0.
TEST(Blocks, Q2K_ScaleAndMinNibbles_EverySubBlock) {
  for (int sub = 0; sub < 16; ++sub) {
    for (int sc = 0; sc < 16; ++sc) {
      for (int m = 0; m < 16; ++m) {
        RawQ2 r;
        r.scales()[sub] = static_cast<uint8_t>((m << 4) | sc);
        std::memset(r.qs(), 0xFF, 64);
        r.set_d(0x3C00);
        r.set_dmin(0x3800);
        const BlockQ2K b = r.block();
        ASSERT_EQ(q2k_scale(b, sub), sc);
        ASSERT_EQ(q2k_min(b, sub), m);
        for (int e = 0; e < 256; ++e) {
          const double want = e / 16 == sub ? 3.0 * sc - 0.5 * m : 0.0;
          ASSERT_TRUE(same_value(q2k_dequant(b, e), want))
              << "sub " << sub << " scale " << sc << " min " << m << " element " << e;
        }
      }
    }
  }
}

// Step 2 (Q2_K): every qs byte and shift, each 2-bit value. Scale 1, min 0, d = 1, dmin = 0:
// exactly the element 128n + 32j + l reads v; the int view of §1.1 names the same element.
TEST(Blocks, Q2K_QuantEveryBytePosition) {
  for (int byte = 0; byte < 64; ++byte) {
    for (int j = 0; j < 4; ++j) {
      const int w = byte / 4, bw = byte % 4;  // 32-bit word w, byte bw within it
      const int e_word = (w >= 8 ? 128 : 0) + 32 * j + 4 * (w % 8) + bw;
      ASSERT_EQ(qs_element(byte, j), e_word);
      for (int v = 1; v < 4; ++v) {
        RawQ2 r;
        std::memset(r.scales(), 0x01, 16);
        r.qs()[byte] = static_cast<uint8_t>(v << (2 * j));
        r.set_d(0x3C00);
        const BlockQ2K b = r.block();
        for (int e = 0; e < 256; ++e) {
          const int want = e == e_word ? v : 0;
          ASSERT_EQ(q2k_quant(b, e), want) << "qs byte " << byte << " shift " << 2 * j;
          ASSERT_TRUE(same_value(q2k_dequant(b, e), want)) << "byte " << byte << " e " << e;
        }
      }
    }
  }
}

// Step 3 (Q2_K): d and dmin over zero, signed zero, subnormal, negative, max, Inf, NaN, with
// scale 7, min 15 and q = j of each element. Exact in double; the f32 result rounds once.
TEST(Blocks, Q2K_SuperScalesDAndDmin) {
  for (uint16_t d : kScalePatterns) {
    for (uint16_t dmin : kScalePatterns) {
      RawQ2 r;
      std::memset(r.scales(), 0xF7, 16);
      std::memset(r.qs(), 0xE4, 64);  // shifts 0, 2, 4, 6 hold 0, 1, 2, 3
      r.set_d(d);
      r.set_dmin(dmin);
      const BlockQ2K b = r.block();
      for (int e = 0; e < 256; ++e) {
        const int q = (e / 32) % 4;
        const double want = f16_value(d) * 7 * q - f16_value(dmin) * 15;
        ASSERT_TRUE(same_value(q2k_dequant(b, e), want))
            << std::hex << "d 0x" << d << " dmin 0x" << dmin << std::dec << " e " << e;
      }
    }
  }
}

// Q3_K scale bytes with every code 33 (scale +1), written by hand from the §1.2 table.
const uint8_t kQ3ScaleBytesAllPlusOne[12] = {0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
                                             0x11, 0x11, 0xAA, 0xAA, 0xAA, 0xAA};  // code 33

// Step 4 (Q3_K): every hmask byte m and bit b. All scales +1 (code 33 = 0b10'0001: low nibble
// 1, top bits 2), d = 1, qs = 0: every element is -4 except element 32b + m, which is 0.
TEST(Blocks, Q3K_HmaskEveryBit) {
  for (int m = 0; m < 32; ++m) {
    for (int bit = 0; bit < 8; ++bit) {
      RawQ3 r;
      std::memcpy(r.scales(), kQ3ScaleBytesAllPlusOne, 12);
      r.hmask()[m] = static_cast<uint8_t>(1u << bit);
      r.set_d(0x3C00);
      const BlockQ3K b = r.block();
      for (int s = 0; s < 16; ++s) ASSERT_EQ(q3k_scale(b, s), 1);
      for (int e = 0; e < 256; ++e) {
        const int want = e == 32 * bit + m ? 0 : -4;
        ASSERT_EQ(q3k_quant(b, e), want) << "hmask byte " << m << " bit " << bit << " e " << e;
        ASSERT_TRUE(same_value(q3k_dequant(b, e), want)) << "hmask " << m << "." << bit;
      }
    }
  }
}

// Step 5 (Q3_K): every qs byte and shift with hmask all set (no -4): element reads v.
TEST(Blocks, Q3K_QuantEveryBytePosition) {
  for (int byte = 0; byte < 64; ++byte) {
    for (int j = 0; j < 4; ++j) {
      for (int v = 1; v < 4; ++v) {
        RawQ3 r;
        std::memcpy(r.scales(), kQ3ScaleBytesAllPlusOne, 12);
        std::memset(r.hmask(), 0xFF, 32);
        r.qs()[byte] = static_cast<uint8_t>(v << (2 * j));
        r.set_d(0x3C00);
        const BlockQ3K b = r.block();
        for (int e = 0; e < 256; ++e) {
          const int want = e == qs_element(byte, j) ? v : 0;
          ASSERT_EQ(q3k_quant(b, e), want) << "qs byte " << byte << " shift " << 2 * j;
          ASSERT_TRUE(same_value(q3k_dequant(b, e), want)) << "byte " << byte << " e " << e;
        }
      }
    }
  }
}

// Step 6 (Q3_K): the 3-bit quant table, low bits x hmask bit, over the whole block.
TEST(Blocks, Q3K_QuantOffsetTable) {
  const int table[2][4] = {{-4, -3, -2, -1}, {0, 1, 2, 3}};
  for (int high = 0; high < 2; ++high) {
    for (int low = 0; low < 4; ++low) {
      RawQ3 r;
      std::memcpy(r.scales(), kQ3ScaleBytesAllPlusOne, 12);
      std::memset(r.hmask(), high ? 0xFF : 0x00, 32);
      std::memset(r.qs(), low * 0x55, 64);
      r.set_d(0x3C00);
      const BlockQ3K b = r.block();
      for (int e = 0; e < 256; ++e) {
        ASSERT_EQ(q3k_quant(b, e), table[high][low]) << "low " << low << " high " << high;
      }
    }
  }
}

// Step 7 (Q3_K): each of the 96 scale bits alone. All codes 0 (scale -32) except the owner of
// the bit: byte < 8 holds low nibbles (bits 0-3: sub byte, bits 4-7: sub byte + 8, weight
// 1 << bit % 4); byte 8 + i holds top bits of subs i, i + 4, i + 8, i + 12 (weight 16 or 32).
// q = 1 and d = 1, so each element decodes to its sub-block's signed scale.
TEST(Blocks, Q3K_ScaleEveryBit) {
  for (int p = 0; p < 96; ++p) {
    const int byte = p / 8, bit = p % 8;
    const int owner = byte < 8 ? byte + 8 * (bit / 4) : (byte - 8) + 4 * (bit / 2);
    const int weight = byte < 8 ? 1 << (bit % 4) : 16 << (bit % 2);
    RawQ3 r;
    r.scales()[byte] = static_cast<uint8_t>(1u << bit);
    std::memset(r.hmask(), 0xFF, 32);
    std::memset(r.qs(), 0x55, 64);
    r.set_d(0x3C00);
    const BlockQ3K b = r.block();
    for (int e = 0; e < 256; ++e) {
      const int want = -32 + (e / 16 == owner ? weight : 0);
      ASSERT_EQ(q3k_scale(b, e / 16), want) << "scale byte " << byte << " bit " << bit;
      ASSERT_TRUE(same_value(q3k_dequant(b, e), want)) << "scale bit " << p << " e " << e;
    }
  }
}

// Step 8 (Q3_K): every 6-bit code in every sub-block at once (codes rotate so each sub-block
// sees all 64), read by the decoder and by the kmask word reader.
TEST(Blocks, Q3K_AllScaleCodesEverySubBlock) {
  for (int c0 = 0; c0 < 64; ++c0) {
    RawQ3 r;
    int codes[16];
    for (int s = 0; s < 16; ++s) {
      codes[s] = (c0 + 7 * s) % 64;
      pack_q3_code(r.scales(), s, codes[s]);
    }
    int kmask_codes[16];
    unpack_q3_codes_kmask(r.scales(), kmask_codes);
    const BlockQ3K b = r.block();
    for (int s = 0; s < 16; ++s) {
      ASSERT_EQ(kmask_codes[s], codes[s]) << "sub " << s << " rotation " << c0;
      ASSERT_EQ(q3k_scale(b, s), codes[s] - 32) << "sub " << s << " rotation " << c0;
    }
  }
}

// Step 9 (Q3_K): d over the pattern list with scales -32, 31, 0 and q = -4 .. 3.
TEST(Blocks, Q3K_SuperScaleD) {
  for (uint16_t d : kScalePatterns) {
    RawQ3 r;
    const int code_of[3] = {0, 63, 32};  // scales -32, 31, 0
    for (int s = 0; s < 16; ++s) pack_q3_code(r.scales(), s, code_of[s % 3]);
    for (int e = 0; e < 256; ++e) {  // Lq = e % 8: low bits to qs, bit 2 to hmask
      const int lq = e % 8;
      r.qs()[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((lq & 3) << (2 * ((e / 32) % 4)));
      if (lq >= 4) r.hmask()[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    }
    r.set_d(d);
    const BlockQ3K b = r.block();
    for (int e = 0; e < 256; ++e) {
      const double want = f16_value(d) * (code_of[(e / 16) % 3] - 32) * (e % 8 - 4);
      ASSERT_TRUE(same_value(q3k_dequant(b, e), want))
          << std::hex << "d 0x" << d << std::dec << " e " << e;
    }
  }
}

// Step 10: dequantize_row (from any byte offset) and the typed row decoders agree bit for bit
// with the per-element decoders on random block bytes, NaN and Inf scales included.
RC_GTEST_PROP(Blocks, DequantizeRowMatchesElementDecoders, ()) {
  const int nb = *rc::gen::inRange(1, 4);
  const int offset = *rc::gen::inRange(0, 4);
  const auto q2 = *rc::gen::container<std::vector<uint8_t>>(84 * nb, rc::gen::arbitrary<uint8_t>());
  const auto q3 =
      *rc::gen::container<std::vector<uint8_t>>(110 * nb, rc::gen::arbitrary<uint8_t>());
  const int64_t k = 256 * nb;
  std::vector<uint8_t> buf(offset + 110 * nb);
  std::vector<float> row(k), typed(k);
  std::vector<BlockQ2K> b2(nb);
  std::vector<BlockQ3K> b3(nb);
  std::memcpy(b2.data(), q2.data(), q2.size());
  std::memcpy(b3.data(), q3.data(), q3.size());

  std::memcpy(buf.data() + offset, q2.data(), q2.size());
  dequantize_row(GgmlType::kQ2K, buf.data() + offset, row.data(), k);
  dequantize_row_q2_K(b2.data(), typed.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    const uint32_t want = f32_bits(q2k_dequant(b2[i / 256], static_cast<int>(i % 256)));
    RC_ASSERT(f32_bits(row[i]) == want);
    RC_ASSERT(f32_bits(typed[i]) == want);
  }
  std::memcpy(buf.data() + offset, q3.data(), q3.size());
  dequantize_row(GgmlType::kQ3K, buf.data() + offset, row.data(), k);
  dequantize_row_q3_K(b3.data(), typed.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    const uint32_t want = f32_bits(q3k_dequant(b3[i / 256], static_cast<int>(i % 256)));
    RC_ASSERT(f32_bits(row[i]) == want);
    RC_ASSERT(f32_bits(typed[i]) == want);
  }
}

// Step 11: the scalar types, every 16-bit pattern (value from the definitions), and f32 bits.
TEST(Blocks, DequantizeRowScalarTypes) {
  std::vector<uint8_t> raw(2 * 65536 + 1);
  for (int h = 0; h < 65536; ++h) put16(raw.data() + 1 + 2 * h, static_cast<uint16_t>(h));
  std::vector<float> y(65536);
  dequantize_row(GgmlType::kF16, raw.data() + 1, y.data(), 65536);
  for (int h = 0; h < 65536; ++h) {
    ASSERT_TRUE(same_value(y[h], f16_value(static_cast<uint16_t>(h)))) << "f16 0x" << std::hex << h;
  }
  dequantize_row(GgmlType::kBF16, raw.data() + 1, y.data(), 65536);
  for (int h = 0; h < 65536; ++h) {
    uint32_t bits;
    std::memcpy(&bits, &y[h], 4);
    ASSERT_EQ(bits, static_cast<uint32_t>(h) << 16) << "bf16 is the top half of f32";
  }
  dequantize_row(GgmlType::kF32, raw.data() + 1, y.data(), 100);
  for (int i = 0; i < 100; ++i) {
    uint32_t want;
    std::memcpy(&want, raw.data() + 1 + 4 * i, 4);
    ASSERT_EQ(f32_bits(y[i]), want) << "f32 element " << i;
  }
}

// Step 12: unsupported types and bad row lengths are InputErrors that name what was found.
TEST(Blocks, DequantizeRowRejectsBadInput) {
  std::vector<uint8_t> raw(4096);
  std::vector<float> y(1024);
  for (uint32_t t : {9u, 2u, 8u, 12u, 1000u}) {
    try {
      dequantize_row(static_cast<GgmlType>(t), raw.data(), y.data(), 256);
      FAIL() << "ggml type " << t << " accepted";
    } catch (const InputError& err) {
      EXPECT_NE(std::string(err.what()).find("type " + std::to_string(t)), std::string::npos)
          << err.what();
    }
  }
  EXPECT_THROW(dequantize_row(GgmlType::kQ2K, raw.data(), y.data(), 100), InputError);
  EXPECT_THROW(dequantize_row(GgmlType::kQ3K, raw.data(), y.data(), 257), InputError);
  EXPECT_THROW(dequantize_row(GgmlType::kF16, raw.data(), y.data(), -1), InputError);
  float x[256] = {};
  BlockQ2K b2;
  BlockQ3K b3;
  EXPECT_THROW(quantize_row_q2_K_ref(x, &b2, 255), InputError);
  EXPECT_THROW(quantize_row_q3_K_ref(x, &b3, 128), InputError);
}

}  // namespace
}  // namespace moecheck

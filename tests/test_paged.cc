// Tests of tools/paged: decode-time paged layouts (block table, physical indices, FlashMLA's V32
// FP8 KV cache, DeepGEMM's paged indexer cache, next_n key bounds). Expected bytes are written by
// hand here (one 656-byte FlashMLA token, one 2-token DeepGEMM page); expected slots come from the
// formula block_table[b, pos / page] * page + pos % page evaluated in the test itself.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "ref/attention.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/topk.h"
#include "tools/lib/paged.h"

using namespace indexshare;

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
Tensor<int32_t> vec(std::vector<int32_t> v) {
  Tensor<int32_t> t({int64_t(v.size())});
  t.data = std::move(v);
  return t;
}
void push_u32(std::vector<uint8_t>& out, uint32_t v) {  // little endian, written out by hand
  out.push_back(uint8_t(v));
  out.push_back(uint8_t(v >> 8));
  out.push_back(uint8_t(v >> 16));
  out.push_back(uint8_t(v >> 24));
}
std::vector<uint8_t> slot_bytes(const Tensor<uint8_t>& cache, int64_t slot, int64_t bytes) {
  return std::vector<uint8_t>(cache.data.begin() + slot * bytes, cache.data.begin() + (slot + 1) * bytes);
}
// The 656 bytes of an unused FlashMLA slot, written out.
std::vector<uint8_t> flashmla_nan_token() {
  std::vector<uint8_t> t(656, 0x7F);  // latent codes 0x7F
  for (size_t i = 512; i < 528; i += 4) {  // scales 0x7FC00000: 00 00 C0 7F
    t[i] = 0x00;
    t[i + 1] = 0x00;
    t[i + 2] = 0xC0;
  }
  for (size_t i = 528; i < 656; i += 2) t[i] = 0xC0;  // rope 0x7FC0: C0 7F
  return t;
}

// Random bf16 KV rows [len, 1, 576]: the four latent tiles get very different magnitudes so the
// scales differ per tile (the last tile is tiny: its scale is clamped to 2^-13 and its codes are
// e4m3 subnormals), rope ~ N(0, 1).
Tensor<bf16_t> random_kv(int64_t len, uint64_t seed, uint64_t tag) {
  Tensor<float> f({len, 1, 576});
  fill(f.ptr(), f.numel(), Dist::normal, 1.0f, seed, tag);
  const float tile_mag[4] = {1.0f, 1.0f / 1024.0f, 40.0f, 1.0f / 65536.0f};
  for (int64_t i = 0; i < len; ++i)
    for (int64_t c = 0; c < 512; ++c) f[i * 576 + c] *= tile_mag[c / 128];
  Tensor<bf16_t> kv({len, 1, 576});
  for (int64_t i = 0; i < f.numel(); ++i) kv[i] = f32_to_bf16(f[i]);
  return kv;
}

// Independent quantize/dequantize of logical rows with ref/numerics (quantize in tiles of 128 with
// the FlashMLA rule, f32 dequantize, one bf16 round), rope copied.
Tensor<bf16_t> numerics_quant_dequant(const Tensor<bf16_t>& kv) {
  const int64_t len = kv.dim(0);
  Tensor<float> lat({len, 512});
  for (int64_t i = 0; i < len; ++i)
    for (int64_t c = 0; c < 512; ++c) lat.at(i, c) = bf16_to_f32(kv[i * 576 + c]);
  const Tensor<float> deq = dequantize(quantize(lat, 128, ScaleRule::flashmla_pow2, "test kv"), 128);
  Tensor<bf16_t> out(kv.shape);
  for (int64_t i = 0; i < len; ++i) {
    for (int64_t c = 0; c < 512; ++c) out[i * 576 + c] = f32_to_bf16(deq.at(i, c));
    for (int64_t c = 512; c < 576; ++c) out[i * 576 + c] = kv[i * 576 + c];
  }
  return out;
}

// slot -> (b, pos) for the used slots, from the formula; unused slots map to (-1, -1).
std::vector<std::pair<int64_t, int64_t>> slot_owner(const paged::PagedLayout& l) {
  std::vector<std::pair<int64_t, int64_t>> owner(static_cast<size_t>(l.num_blocks * l.page), {-1, -1});
  for (int64_t b = 0; b < l.batch(); ++b)
    for (int64_t pos = 0; pos < l.cache_seqlens[b]; ++pos) {
      const int64_t slot = int64_t(l.block_table.at(b, pos / l.page)) * l.page + pos % l.page;
      REQUIRE(owner[size_t(slot)].first == -1);
      owner[size_t(slot)] = {b, pos};
    }
  return owner;
}

}  // namespace

TEST_CASE("paged: physical index formula against a hand-written block table") {
  paged::PagedLayout l;
  l.page = 4;
  l.block_table = Tensor<int32_t>({2, 3});
  l.block_table.data = {3, 0, -1,   // sequence 0: 6 tokens in blocks 3, 0
                        1, 4, 2};   // sequence 1: 11 tokens in blocks 1, 4, 2
  l.cache_seqlens = vec({6, 11});
  l.num_blocks = 6;
  // Sequence 0.
  CHECK(paged::physical_index(l, 0, 0) == 12);
  CHECK(paged::physical_index(l, 0, 3) == 15);
  CHECK(paged::physical_index(l, 0, 4) == 0);
  CHECK(paged::physical_index(l, 0, 5) == 1);
  CHECK(paged::physical_index(l, 0, 7) == 3);    // allocated block, past the length: its slot
  CHECK(paged::physical_index(l, 0, 8) == -1);   // block-table entry -1
  CHECK(paged::physical_index(l, 0, 12) == -1);  // block id beyond max_blocks
  CHECK(paged::physical_index(l, 0, -1) == -1);
  CHECK(paged::physical_index(l, 0, -7) == -1);
  // Sequence 1.
  CHECK(paged::physical_index(l, 1, 0) == 4);
  CHECK(paged::physical_index(l, 1, 5) == 17);
  CHECK(paged::physical_index(l, 1, 10) == 10);
  CHECK(paged::physical_index(l, 1, 12) == -1);
  CHECK_THROWS_AS(paged::physical_index(l, 2, 0), Error);
  CHECK_THROWS_AS(paged::physical_index(l, -1, 0), Error);

  Tensor<int32_t> logical({2, 2, 3});
  logical.data = {0, -1, 5,  8, 4, -1,
                  10, 5, -1, -1, 0, 12};
  const Tensor<int32_t> phys = paged::logical_to_physical(l, logical);
  REQUIRE(phys.shape == Shape{2, 2, 3});
  CHECK(phys.data == std::vector<int32_t>{12, -1, 1, -1, 0, -1,
                                          10, 17, -1, -1, 4, -1});
  CHECK_THROWS_AS(paged::logical_to_physical(l, Tensor<int32_t>({3, 1, 1})), Error);
  CHECK_THROWS_AS(paged::logical_to_physical(l, Tensor<int32_t>({2, 1})), Error);
}

TEST_CASE("paged: make_layout shuffles blocks, keeps spares, pads the block table with -1") {
  const std::vector<std::vector<int64_t>> cases = {{70, 130, 5}, {64}, {0, 1, 128, 129}, {1}, {0}, {}};
  for (const auto& seqlens : cases) {
    for (int64_t page : {1, 16, 64}) {
      for (uint64_t seed : {1u, 2u, 3u}) {
        CAPTURE(page);
        CAPTURE(seed);
        CAPTURE(seqlens.size());
        const paged::PagedLayout l = paged::make_layout(seqlens, page, seed);
        int64_t used = 0, max_blocks = 1;
        for (int64_t len : seqlens) {
          used += (len + page - 1) / page;
          max_blocks = std::max(max_blocks, (len + page - 1) / page);
        }
        REQUIRE(l.page == page);
        REQUIRE(l.block_table.shape == Shape{int64_t(seqlens.size()), max_blocks});
        REQUIRE(l.cache_seqlens.shape == Shape{int64_t(seqlens.size())});
        CHECK(l.num_blocks > used);  // at least one spare block
        std::set<int32_t> seen;
        bool moved = false;
        for (size_t b = 0; b < seqlens.size(); ++b) {
          CHECK(l.cache_seqlens[int64_t(b)] == seqlens[b]);
          const int64_t nb = (seqlens[b] + page - 1) / page;
          for (int64_t j = 0; j < max_blocks; ++j) {
            const int32_t blk = l.block_table.at(int64_t(b), j);
            if (j < nb) {
              CHECK(blk >= 0);
              CHECK(blk < l.num_blocks);
              CHECK(seen.insert(blk).second);  // each physical block used once
            } else {
              CHECK(blk == -1);
            }
          }
          for (int64_t pos = 0; pos < seqlens[b]; ++pos)
            moved = moved || paged::physical_index(l, int64_t(b), pos) != pos;
        }
        CHECK(int64_t(seen.size()) == used);
        if (used > 0) CHECK(moved);  // logical != physical somewhere
        if (!seqlens.empty() && seqlens[0] > 0) CHECK(paged::physical_index(l, 0, 0) != 0);
        // Deterministic.
        const paged::PagedLayout again = paged::make_layout(seqlens, page, seed);
        CHECK(again.block_table.data == l.block_table.data);
        CHECK(again.num_blocks == l.num_blocks);
      }
    }
  }
  // Different seeds give different tables (18 blocks: a collision would be astronomically rare).
  CHECK(paged::make_layout({70, 130, 5}, 16, 1).block_table.data !=
        paged::make_layout({70, 130, 5}, 16, 2).block_table.data);
  CHECK_THROWS_AS(paged::make_layout({4}, 0, 1), Error);
  CHECK_THROWS_AS(paged::make_layout({-1}, 4, 1), Error);
  CHECK_THROWS_AS(paged::make_layout({int64_t(1) << 31}, 64, 1), Error);
}

TEST_CASE("paged: FlashMLA 656-byte token written by hand, unused slots NaN") {
  // One token; its 576 values are chosen so every code is checked by hand.
  std::vector<float> x(576, 0.0f);
  // Tile 0: amax 336 -> 336/448 = 0.75 -> scale 1.0.
  x[0] = 336.0f;           // between 320 and 352 (spacing 32): tie -> even mantissa 320 = 0x7A
  x[1] = -100.0f;          // between 96 and 104: tie -> 96 (mantissa 100b) -> 0xEC
  x[2] = 0.25f;            // 2^-2: exponent field 5 -> 0x28
  x[3] = 0.001953125f;     // 2^-9, the smallest subnormal -> 0x01
  x[4] = 0.0009765625f;    // 2^-10: tie between 0 and 2^-9 -> 0x00
  x[5] = 0.0029296875f;    // 3 * 2^-10: tie between 1 and 2 subnormal steps -> 2 -> 0x02
  // Tile 1: all zero -> max(0, 1e-4) -> scale 2^-13 (vLLM's test value); -0.0 keeps its sign.
  x[130] = -0.0f;          // -> 0x80
  // Tile 2: amax 1.0 -> 1/448 = 0.00223 -> scale 2^-8.
  x[256] = 1.0f;           // 256 = 2^8 -> 0x78
  x[300] = -0.5f;          // -128 -> 0xF0
  x[301] = 0.75f;          // 192 = 1.5 * 2^7 -> 0x74
  // Tile 3: amax 1792 -> 1792/448 = 4 exactly -> scale 4.
  x[384] = 1792.0f;        // 448 -> 0x7E
  x[385] = 0.0234375f;     // 3 * 2^-7 / 4 = 3 * 2^-9 -> subnormal 0x03
  x[511] = -1000.0f;       // -250, between 240 and 256 (spacing 16) -> -256 -> 0xF8
  Tensor<bf16_t> kv({1, 1, 576});
  for (int i = 0; i < 512; ++i) {
    kv[i] = f32_to_bf16(x[size_t(i)]);
    REQUIRE(bf16_to_f32(kv[i]) == x[size_t(i)]);  // exact in bf16
  }
  for (int r = 0; r < 64; ++r) kv[512 + r] = bf16_t{uint16_t(r % 2 ? 0xBF00 + r : 0x3F80 + r)};

  std::vector<uint8_t> expect(512, 0x00);
  expect[0] = 0x7A; expect[1] = 0xEC; expect[2] = 0x28; expect[3] = 0x01; expect[4] = 0x00;
  expect[5] = 0x02; expect[130] = 0x80; expect[256] = 0x78; expect[300] = 0xF0; expect[301] = 0x74;
  expect[384] = 0x7E; expect[385] = 0x03; expect[511] = 0xF8;
  push_u32(expect, 0x3F800000u);  // 1.0
  push_u32(expect, 0x39000000u);  // 2^-13 (biased exponent 114)
  push_u32(expect, 0x3B800000u);  // 2^-8  (biased exponent 119)
  push_u32(expect, 0x40800000u);  // 4.0
  for (int r = 0; r < 64; ++r) {
    const uint16_t v = uint16_t(r % 2 ? 0xBF00 + r : 0x3F80 + r);
    expect.push_back(uint8_t(v & 0xFF));
    expect.push_back(uint8_t(v >> 8));
  }
  REQUIRE(expect.size() == 656);

  const paged::PagedLayout l = paged::make_layout({1}, 2, 5);
  REQUIRE(l.num_blocks == 2);  // one used block, one spare
  const Tensor<uint8_t> cache = paged::flashmla_fp8_cache(l, {kv});
  REQUIRE(cache.shape == Shape{2, 2, 1, 656});
  const int64_t slot = paged::physical_index(l, 0, 0);
  REQUIRE(slot == int64_t(l.block_table.at(0, 0)) * 2);
  CHECK(slot_bytes(cache, slot, 656) == expect);
  const std::vector<uint8_t> nan_token = flashmla_nan_token();
  for (int64_t s = 0; s < 4; ++s)
    if (s != slot) CHECK(slot_bytes(cache, s, 656) == nan_token);

  // Dequantized values, by hand.
  const Tensor<bf16_t> flat = paged::flashmla_dequant(cache);
  REQUIRE(flat.shape == Shape{4, 1, 576});
  auto deq = [&](int64_t c) { return bf16_to_f32(flat[slot * 576 + c]); };
  CHECK(deq(0) == 320.0f);
  CHECK(deq(1) == -96.0f);
  CHECK(deq(2) == 0.25f);
  CHECK(deq(3) == 0.001953125f);
  CHECK(deq(4) == 0.0f);
  CHECK(deq(5) == 0.00390625f);
  CHECK(flat[slot * 576 + 130].bits == 0x8000);  // -0.0
  CHECK(deq(256) == 1.0f);
  CHECK(deq(300) == -0.5f);
  CHECK(deq(301) == 0.75f);
  CHECK(deq(384) == 1792.0f);
  CHECK(deq(385) == 0.0234375f);
  CHECK(deq(511) == -1024.0f);
  for (int r = 0; r < 64; ++r) CHECK(flat[slot * 576 + 512 + r] == kv[512 + r]);
  for (int64_t s = 0; s < 4; ++s)
    if (s != slot)
      for (int64_t c = 0; c < 576; ++c) CHECK(std::isnan(bf16_to_f32(flat[s * 576 + c])));
  // The logical-row helper gives the same row.
  const Tensor<bf16_t> qd = paged::flashmla_quant_dequant(kv);
  CHECK(std::equal(qd.data.begin(), qd.data.end(), flat.data.begin() + slot * 576));
}

TEST_CASE("paged: DeepGEMM block-first layout for a 2-token page written by hand") {
  const int64_t D = 4;
  const paged::PagedLayout l = paged::make_layout({3, 1}, 2, 11);
  REQUIRE(l.num_blocks == 4);  // 2 + 1 used, 1 spare
  auto codes = [](std::vector<uint8_t> v) {
    Tensor<e4m3_t> t({int64_t(v.size()) / 4, 4});
    for (size_t i = 0; i < v.size(); ++i) t.data[i] = e4m3_t{v[i]};
    return t;
  };
  auto floats = [](std::vector<float> v) {
    Tensor<float> t({int64_t(v.size())});
    t.data = std::move(v);
    return t;
  };
  const std::vector<Tensor<e4m3_t>> k = {
      codes({0x01, 0x02, 0x03, 0x04, 0x11, 0x12, 0x13, 0x14, 0x21, 0x22, 0x23, 0x24}),
      codes({0x81, 0x82, 0x83, 0x84})};
  const std::vector<Tensor<float>> sc = {floats({0.5f, 2.0f, 0.125f}), floats({3.0f})};
  const Tensor<uint8_t> cache = paged::deepgemm_index_cache(l, k, sc, D);
  REQUIRE(cache.shape == Shape{4, 2, 1, 8});

  // Per block: 2 x 4 code bytes, then 2 little-endian f32 scales.
  std::vector<std::vector<uint8_t>> expect(4);
  const uint8_t N = 0x7F;
  expect[size_t(l.block_table.at(0, 0))] = {0x01, 0x02, 0x03, 0x04, 0x11, 0x12, 0x13, 0x14,
                                            0x00, 0x00, 0x00, 0x3F, 0x00, 0x00, 0x00, 0x40};
  expect[size_t(l.block_table.at(0, 1))] = {0x21, 0x22, 0x23, 0x24, N, N, N, N,
                                            0x00, 0x00, 0x00, 0x3E, 0x00, 0x00, 0xC0, 0x7F};
  expect[size_t(l.block_table.at(1, 0))] = {0x81, 0x82, 0x83, 0x84, N, N, N, N,
                                            0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0xC0, 0x7F};
  int spares = 0;
  for (auto& e : expect)
    if (e.empty()) {
      e = {N, N, N, N, N, N, N, N, 0x00, 0x00, 0xC0, 0x7F, 0x00, 0x00, 0xC0, 0x7F};
      ++spares;
    }
  REQUIRE(spares == 1);
  for (int64_t blk = 0; blk < 4; ++blk) {
    CAPTURE(blk);
    CHECK(slot_bytes(cache, blk, 16) == expect[size_t(blk)]);
  }

  // Reader: per physical slot.
  const paged::IndexCacheRows rows = paged::deepgemm_index_read(cache);
  REQUIRE(rows.k.shape == Shape{8, 4});
  REQUIRE(rows.scale.shape == Shape{8});
  const auto owner = slot_owner(l);
  for (int64_t s = 0; s < 8; ++s) {
    CAPTURE(s);
    const auto [b, pos] = owner[size_t(s)];
    if (b < 0) {
      for (int64_t d = 0; d < D; ++d) CHECK(rows.k.at(s, d).bits == 0x7F);
      CHECK(bits_of(rows.scale[s]) == 0x7FC00000u);
    } else {
      for (int64_t d = 0; d < D; ++d) CHECK(rows.k.at(s, d) == k[size_t(b)].at(pos, d));
      CHECK(bits_of(rows.scale[s]) == bits_of(sc[size_t(b)][pos]));
    }
  }

  // Input errors.
  CHECK_THROWS_AS(paged::deepgemm_index_cache(l, {k[0]}, sc, D), Error);
  CHECK_THROWS_AS(paged::deepgemm_index_cache(l, k, sc, 3), Error);
  auto bad = k;
  bad[1].data[2] = e4m3_t{0xFF};
  CHECK_THROWS_AS(paged::deepgemm_index_cache(l, bad, sc, D), Error);
  auto bad_sc = sc;
  bad_sc[0].data[1] = std::nanf("");
  CHECK_THROWS_AS(paged::deepgemm_index_cache(l, k, bad_sc, D), Error);
}

TEST_CASE("paged: every unused slot decodes to NaN, every used slot is its token") {
  const std::vector<int64_t> seqlens = {70, 130, 5, 64};
  for (int64_t page : {16, 64}) {
    CAPTURE(page);
    const paged::PagedLayout l = paged::make_layout(seqlens, page, 21);
    std::vector<Tensor<bf16_t>> kv;
    std::vector<Tensor<e4m3_t>> k;
    std::vector<Tensor<float>> ks;
    const int64_t D = 128;
    for (size_t b = 0; b < seqlens.size(); ++b) {
      kv.push_back(random_kv(seqlens[b], 7, 100 + b));
      Tensor<float> kf({seqlens[b], D});
      fill(kf.ptr(), kf.numel(), Dist::normal, 1.0f, 7, 200 + b);
      Quantized q = quantize(kf, int(D), ScaleRule::fp32_amax, "test k");
      k.push_back(q.codes);
      q.scales.shape = {seqlens[b]};
      ks.push_back(q.scales);
    }
    const Tensor<uint8_t> cache = paged::flashmla_fp8_cache(l, kv);
    const Tensor<bf16_t> flat = paged::flashmla_dequant(cache);
    const paged::IndexCacheRows idx = paged::deepgemm_index_read(paged::deepgemm_index_cache(l, k, ks, D));
    const auto owner = slot_owner(l);
    const std::vector<uint8_t> nan_token = flashmla_nan_token();
    int64_t unused = 0, spare_block_slots = 0;
    for (int64_t s = 0; s < l.num_blocks * page; ++s) {
      const auto [b, pos] = owner[size_t(s)];
      if (b < 0) {
        ++unused;
        bool block_unused = true;
        for (int64_t o = 0; o < page; ++o) block_unused = block_unused && owner[size_t(s - s % page + o)].first < 0;
        spare_block_slots += block_unused;
        CHECK(slot_bytes(cache, s, 656) == nan_token);
        for (int64_t c = 0; c < 576; ++c) REQUIRE(std::isnan(bf16_to_f32(flat[s * 576 + c])));
        for (int64_t d = 0; d < D; ++d) REQUIRE(idx.k.at(s, d).bits == 0x7F);
        REQUIRE(std::isnan(idx.scale[s]));
      } else {
        for (int64_t c = 0; c < 576; ++c) REQUIRE(std::isfinite(bf16_to_f32(flat[s * 576 + c])));
        for (int64_t d = 0; d < D; ++d) REQUIRE(idx.k.at(s, d) == k[size_t(b)].at(pos, d));
        REQUIRE(bits_of(idx.scale[s]) == bits_of(ks[size_t(b)][pos]));
      }
    }
    CHECK(spare_block_slots >= page);             // whole spare blocks
    CHECK(unused - spare_block_slots > 0);        // and tails of partly filled blocks
  }
}

TEST_CASE("paged: dequantized latent within e4m3 error, rope exact, power-of-two FlashMLA scales") {
  const std::vector<int64_t> seqlens = {37, 64};
  const paged::PagedLayout l = paged::make_layout(seqlens, 16, 4);
  std::vector<Tensor<bf16_t>> kv;
  for (size_t b = 0; b < seqlens.size(); ++b) kv.push_back(random_kv(seqlens[b], 9, b));
  const Tensor<uint8_t> cache = paged::flashmla_fp8_cache(l, kv);
  const Tensor<bf16_t> flat = paged::flashmla_dequant(cache);
  std::set<uint32_t> distinct_scales;
  for (size_t b = 0; b < seqlens.size(); ++b) {
    const Tensor<bf16_t> qd = paged::flashmla_quant_dequant(kv[b]);
    const Tensor<bf16_t> indep = numerics_quant_dequant(kv[b]);
    CHECK(qd.data == indep.data);
    for (int64_t pos = 0; pos < seqlens[b]; ++pos) {
      const int64_t s = paged::physical_index(l, int64_t(b), pos);
      const uint8_t* tok = cache.ptr() + s * 656;
      for (int t = 0; t < 4; ++t) {
        uint32_t u = 0;
        for (int i = 0; i < 4; ++i) u |= uint32_t(tok[512 + 4 * t + i]) << (8 * i);
        REQUIRE((u & 0x7FFFFFu) == 0u);            // a power of two: no mantissa bits
        REQUIRE((u >> 23) >= 1u);
        REQUIRE((u >> 23) < 255u);                 // positive, normal, finite
        distinct_scales.insert(u);
        float scale;
        std::memcpy(&scale, &u, 4);
        float amax = 0.0f;
        for (int c = 128 * t; c < 128 * (t + 1); ++c)
          amax = std::max(amax, std::fabs(bf16_to_f32(kv[b][pos * 576 + c])));
        const float m = std::max(amax / 448.0f, 1e-4f);
        REQUIRE(m <= scale);                       // the smallest power of two >= m
        REQUIRE(scale / 2.0f < m);
        for (int c = 128 * t; c < 128 * (t + 1); ++c) {
          const float x = bf16_to_f32(kv[b][pos * 576 + c]);
          const float y = bf16_to_f32(flat[s * 576 + c]);
          CAPTURE(c);
          REQUIRE(std::fabs(y - x) <= std::fabs(x) * 0.0625f + scale * 0x1p-10f);
          REQUIRE(qd[pos * 576 + c] == flat[s * 576 + c]);
        }
      }
      for (int c = 512; c < 576; ++c) REQUIRE(flat[s * 576 + c] == kv[b][pos * 576 + c]);
    }
  }
  CHECK(distinct_scales.count(0x39000000u) == 1);  // the tiny tile's clamped scale 2^-13
  CHECK(distinct_scales.size() >= 4);
  // Input errors: NaN in the latent or the rope, wrong shapes, wrong count.
  Tensor<bf16_t> bad = kv[0];
  bad[5 * 576 + 7] = bf16_t{0x7FC0};
  CHECK_THROWS_AS(paged::flashmla_fp8_cache(l, {bad, kv[1]}), Error);
  bad = kv[0];
  bad[5 * 576 + 570] = bf16_t{0x7F80};
  CHECK_THROWS_AS(paged::flashmla_fp8_cache(l, {bad, kv[1]}), Error);
  CHECK_THROWS_AS(paged::flashmla_fp8_cache(l, {kv[0]}), Error);
  CHECK_THROWS_AS(paged::flashmla_fp8_cache(l, {kv[1], kv[0]}), Error);
  CHECK_THROWS_AS(paged::flashmla_dequant(Tensor<uint8_t>({2, 16, 1, 655})), Error);
}

TEST_CASE("paged: sparse attention over physical indices equals logical indices, bit for bit") {
  // Decode step with next_n = 2 query rows per sequence; the indices come from ref::topk over
  // random logits inside the next_n key windows (sequence 2 is shorter than topk: -1 padding).
  const std::vector<int64_t> seqlens = {70, 130, 5};
  const int64_t B = 3, next_n = 2, topk = 32, h_q = 4, max_len = 130;
  const paged::PagedLayout l = paged::make_layout(seqlens, 16, 8);
  std::vector<Tensor<bf16_t>> kv;
  for (int64_t b = 0; b < B; ++b) kv.push_back(random_kv(seqlens[size_t(b)], 13, uint64_t(b)));
  const Tensor<bf16_t> flat = paged::flashmla_dequant(paged::flashmla_fp8_cache(l, kv));

  Tensor<float> logits({B * next_n, max_len});
  fill(logits.ptr(), logits.numel(), Dist::normal, 1.0f, 13, 50);
  const paged::DecodeBounds bounds = paged::decode_ks_ke(l.cache_seqlens, next_n);
  Tensor<int32_t> logical = ref::topk(logits, bounds.ks, bounds.ke, topk);
  logical.shape = {B, next_n, topk};
  const Tensor<int32_t> phys = paged::logical_to_physical(l, logical);
  REQUIRE(phys.shape == logical.shape);
  int64_t padded = 0, moved = 0;
  for (int64_t i = 0; i < logical.numel(); ++i) {
    REQUIRE((logical[i] < 0) == (phys[i] < 0));
    padded += logical[i] < 0;
    moved += logical[i] != phys[i];
  }
  CHECK(padded > 0);
  CHECK(moved > 0);

  // Note: ref::sparse_attention sums over the valid rows in ascending row order, and the physical
  // order of a sequence's tokens differs from their logical order once blocks are shuffled. Sums
  // run in double and each output is rounded to f32 once, so a different order can change an f32
  // output only when the double result sits within ~2^-29 relative of an f32 rounding boundary;
  // with the fixed seeds here the result is deterministic, and equal bit for bit.
  const float sm_scale = 0.0625f;
  bool logical_into_flat_differs = false;
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    Tensor<float> qf({next_n, h_q, 576});
    fill(qf.ptr(), qf.numel(), Dist::uniform, 1.0f, 13, 60 + uint64_t(b));
    Tensor<bf16_t> q(qf.shape);
    for (int64_t i = 0; i < qf.numel(); ++i) q[i] = f32_to_bf16(qf[i]);
    Tensor<int32_t> idx_l({next_n, 1, topk}), idx_p({next_n, 1, topk});
    std::copy_n(logical.data.begin() + b * next_n * topk, next_n * topk, idx_l.data.begin());
    std::copy_n(phys.data.begin() + b * next_n * topk, next_n * topk, idx_p.data.begin());
    const Tensor<bf16_t> rows = numerics_quant_dequant(kv[size_t(b)]);
    const ref::AttentionOut want = ref::sparse_attention(q, rows, idx_l, sm_scale, 512);
    const ref::AttentionOut got = ref::sparse_attention(q, flat, idx_p, sm_scale, 512);
    for (float v : want.out.data) REQUIRE(std::isfinite(v));
    for (int64_t i = 0; i < want.out.numel(); ++i) REQUIRE(bits_of(got.out[i]) == bits_of(want.out[i]));
    CHECK(got.out_bf16.data == want.out_bf16.data);
    for (int64_t i = 0; i < want.lse.numel(); ++i) {
      REQUIRE(bits_of(got.lse[i]) == bits_of(want.lse[i]));
      REQUIRE(bits_of(got.max_logits[i]) == bits_of(want.max_logits[i]));
    }
    // Negative control: untranslated (logical) indices into the paged cache read other tokens or
    // NaN slots.
    const ref::AttentionOut wrong = ref::sparse_attention(q, flat, idx_l, sm_scale, 512);
    for (int64_t i = 0; i < want.out.numel(); ++i)
      if (bits_of(wrong.out[i]) != bits_of(want.out[i])) logical_into_flat_differs = true;
  }
  CHECK(logical_into_flat_differs);
}

TEST_CASE("paged: next_n key bounds") {
  CHECK(paged::next_n_key_end(10, 2, 0) == 9);   // row 0 sits at position 8, sees keys 0..8
  CHECK(paged::next_n_key_end(10, 2, 1) == 10);  // row 1 sits at position 9, sees keys 0..9
  CHECK(paged::next_n_key_end(10, 1, 0) == 10);
  CHECK(paged::next_n_key_end(5, 5, 0) == 1);
  CHECK_THROWS_AS(paged::next_n_key_end(10, 0, 0), Error);
  CHECK_THROWS_AS(paged::next_n_key_end(10, 11, 0), Error);
  CHECK_THROWS_AS(paged::next_n_key_end(10, 2, 2), Error);
  CHECK_THROWS_AS(paged::next_n_key_end(10, 2, -1), Error);
  const paged::DecodeBounds d = paged::decode_ks_ke(vec({10, 3, 64}), 2);
  CHECK(d.ks.data == std::vector<int32_t>{0, 0, 0, 0, 0, 0});
  CHECK(d.ke.data == std::vector<int32_t>{9, 10, 2, 3, 63, 64});
  CHECK(paged::decode_ks_ke(vec({7}), 3).ke.data == std::vector<int32_t>{5, 6, 7});
  CHECK_THROWS_AS(paged::decode_ks_ke(vec({1, 3}), 2), Error);
  CHECK_THROWS_AS(paged::decode_ks_ke(vec({4}), 0), Error);
}

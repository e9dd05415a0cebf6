// Tests of tools/lib/paged_model1.h and tools/lib/golden_model1.h: FlashMLA's MODEL1 FP8 KV cache byte
// for byte and the two-scope sparse decode. Expected bytes come from offsets and codes written out by
// hand here (token t at 576 t, footer at 576 B + 8 t, e4m3 codes of 64 / 128 / 192 / 256 as bit
// patterns); the decode is checked against a brute-force single softmax that reads the cache bytes
// with the test's own decoder.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ref/numerics.h"
#include "ref/rng.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_model1.h"
#include "tools/lib/impl.h"
#include "tools/lib/paged_model1.h"

using namespace indexshare;

namespace {

// Token values a test can quantize by hand: tile k holds small integers v in [-4, 4] times 2^e_k,
// so amax = 4 * 2^e_k, scale = 2^ceil(log2(4 * 2^e_k / 448)) = 2^(e_k - 6) and code = 64 v exactly.
int tile_exp(int64_t pos, int64_t k) { return int((pos + k) % 5) - 3; }  // e_k in [-3, 1]
int small_int(int64_t pos, int64_t i) { return int((pos * 7 + i * 3) % 9) - 4; }
Tensor<bf16_t> hand_tokens(int64_t len) {
  Tensor<bf16_t> kv({len, 1, 512});
  for (int64_t pos = 0; pos < len; ++pos) {
    for (int64_t i = 0; i < 448; ++i) {
      int v = small_int(pos, i);
      if (i % 64 == 5) v = (pos % 2) ? -4 : 4;  // every tile reaches |v| = 4
      kv[pos * 512 + i] = f32_to_bf16(std::ldexp(float(v), tile_exp(pos, i / 64)));
    }
    for (int64_t r = 0; r < 64; ++r) kv[pos * 512 + 448 + r] = f32_to_bf16(0.25f * float(r - 32) + 0.001f * float(pos));
  }
  return kv;
}
// The e4m3fn byte of 64 v for v in [-4, 4], by hand: 64 = 1.0 x 2^6 -> exponent field 13 -> 0x68;
// 128 -> 0x70; 192 = 1.5 x 2^7 -> 0x74; 256 -> 0x78; the sign is bit 7.
uint8_t code_of(int v) {
  const uint8_t mag[5] = {0x00, 0x68, 0x70, 0x74, 0x78};
  return uint8_t(mag[std::abs(v)] | (v < 0 ? 0x80 : 0));
}

// The test's own reader of one slot: 448 e4m3 * e8m0 in double, 64 bf16 little endian.
std::vector<double> read_slot(const Tensor<uint8_t>& cache, int64_t B, int64_t slot) {
  const int64_t bb = cache.dim(1), blk = slot / B, t = slot % B;
  const uint8_t* base = cache.ptr() + blk * bb;
  std::vector<double> row(512);
  for (int64_t i = 0; i < 448; ++i) {
    const uint8_t s = base[576 * B + 8 * t + i / 64];
    const double v = double(e4m3_to_f32(e4m3_t{base[576 * t + i]})) * std::ldexp(1.0, int(s) - 127);
    row[size_t(i)] = (s == 0xFF || std::isnan(v)) ? std::nan("") : v;
  }
  for (int64_t r = 0; r < 64; ++r) {
    const uint16_t bits = uint16_t(base[576 * t + 448 + 2 * r] | (base[576 * t + 449 + 2 * r] << 8));
    row[size_t(448 + r)] = double(bf16_to_f32(bf16_t{bits}));
  }
  return row;
}

paged::PagedLayout one_sequence(int64_t len, int64_t B) { return paged::make_layout({len}, B, 5); }

}  // namespace

TEST_CASE("model1: block sizes and the kernel's strided view") {
  CHECK(paged::model1_block_bytes(256) == 149760);  // 584 * 256 = 149504 -> 260 * 576
  CHECK(paged::model1_block_bytes(64) == 37440);    // 37376 -> 65 * 576
  CHECK(paged::model1_block_bytes(2) == 1728);      // 1168 -> 3 * 576
  CHECK(paged::model1_block_bytes(4) == 2880);      // 2336 -> 5 * 576
  const paged::Model1View v = paged::model1_view(3, 4);
  CHECK(v.shape == std::vector<int64_t>{3, 4, 1, 584});
  CHECK(v.strides == std::vector<int64_t>{2880, 584, 584, 1});
  // view[1, 1, 0, 0] is byte 2880 + 584, but token 1 of block 1 starts at 2880 + 576.
  CHECK(v.strides[0] + v.strides[1] != 2880 + 576);
}

TEST_CASE("model1: every byte of the cache, decoded by hand-written offsets") {
  const int64_t B = 4, len = 6;
  const paged::PagedLayout l = one_sequence(len, B);  // 2 used blocks + 1 spare
  const Tensor<bf16_t> kv = hand_tokens(len);
  const Tensor<uint8_t> cache = paged::model1_fp8_cache(l, {kv}, "k_cache");
  REQUIRE(cache.shape == Shape{l.num_blocks, 2880});
  std::vector<bool> used(size_t(l.num_blocks * B), false);
  for (int64_t pos = 0; pos < len; ++pos) {
    CAPTURE(pos);
    const int64_t blk = l.block_table.at(0, pos / B), t = pos % B;
    used[size_t(blk * B + t)] = true;
    const uint8_t* base = cache.ptr() + blk * 2880;
    for (int64_t k = 0; k < 7; ++k) CHECK(int(base[576 * B + 8 * t + k]) == 127 + tile_exp(pos, k) - 6);
    CHECK(base[576 * B + 8 * t + 7] == 0x00);
    for (int64_t i = 0; i < 448; ++i) {
      int v = small_int(pos, i);
      if (i % 64 == 5) v = (pos % 2) ? -4 : 4;
      CHECK(base[576 * t + i] == code_of(v));
    }
    for (int64_t r = 0; r < 64; ++r) {
      const uint16_t bits = kv[pos * 512 + 448 + r].bits;
      CHECK(base[576 * t + 448 + 2 * r] == (bits & 0xFF));
      CHECK(base[576 * t + 449 + 2 * r] == (bits >> 8));
    }
    // The dequantized row is the input exactly (code * scale is exact; the bf16 round a no-op).
    const std::vector<double> row = read_slot(cache, B, blk * B + t);
    for (int64_t i = 0; i < 512; ++i) CHECK(row[size_t(i)] == double(bf16_to_f32(kv[pos * 512 + i])));
  }
  // Unused slots: NaN poison, byte for byte; the block tail after 584 B bytes: 0x7F.
  for (int64_t blk = 0; blk < l.num_blocks; ++blk) {
    const uint8_t* base = cache.ptr() + blk * 2880;
    for (int64_t i = 584 * B; i < 2880; ++i) CHECK(base[i] == 0x7F);
    for (int64_t t = 0; t < B; ++t) {
      if (used[size_t(blk * B + t)]) continue;
      for (int64_t i = 0; i < 448; ++i) CHECK(base[576 * t + i] == 0x7F);
      for (int64_t r = 0; r < 64; ++r) {
        CHECK(base[576 * t + 448 + 2 * r] == 0xC0);
        CHECK(base[576 * t + 449 + 2 * r] == 0x7F);
      }
      for (int64_t k = 0; k < 8; ++k) CHECK(base[576 * B + 8 * t + k] == 0xFF);
    }
  }
  // model1_dequant: FlashMLA's bf16(bf16(code) * bf16(e8m0)), against the test's reader.
  const Tensor<bf16_t> rows = paged::model1_dequant(cache, B, "k_cache");
  for (int64_t s = 0; s < l.num_blocks * B; ++s) {
    const std::vector<double> want = read_slot(cache, B, s);
    for (int64_t i = 0; i < 512; ++i) {
      const float got = bf16_to_f32(rows[s * 512 + i]);
      if (std::isnan(want[size_t(i)])) CHECK(std::isnan(got));
      else CHECK(double(got) == want[size_t(i)]);
    }
  }
  CHECK_NOTHROW(paged::model1_check_cache(cache, l, "k_cache"));
}

TEST_CASE("model1: the scale rule on random data (2^ceil(log2(max(amax / 448, 1e-4)))), by doubling") {
  Tensor<float> f({3, 512});
  fill(f.ptr(), f.numel(), Dist::normal, 0.1f, 7, stream_tag("model1.test"));
  Tensor<bf16_t> kv({3, 1, 512});
  for (int64_t i = 0; i < f.numel(); ++i) kv[i] = f32_to_bf16(f[i]);
  for (int64_t i = 0; i < 64; ++i) kv[2 * 512 + i] = bf16_t{0};  // an all-zero tile: 2^-13 (1e-4 clamp)
  const paged::PagedLayout l = one_sequence(3, 2);
  const Tensor<uint8_t> cache = paged::model1_fp8_cache(l, {kv}, "k_cache");
  for (int64_t pos = 0; pos < 3; ++pos)
    for (int64_t k = 0; k < 7; ++k) {
      double amax = 0;
      for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(double(bf16_to_f32(kv[pos * 512 + k * 64 + i]))));
      const double target = std::max(double(float(amax) / 448.0f), double(1e-4f));
      int e = -40;
      while (std::ldexp(1.0, e) < target) ++e;
      const int64_t blk = l.block_table.at(0, pos / 2), t = pos % 2;
      CHECK(int(cache[blk * 1728 + 576 * 2 + 8 * t + k]) == 127 + e);
    }
}

TEST_CASE("model1: a corrupted or wrongly sized cache is refused, naming the tensor") {
  const int64_t B = 4;
  const paged::PagedLayout l = one_sequence(5, B);
  Tensor<uint8_t> cache = paged::model1_fp8_cache(l, {hand_tokens(5)}, "k_cache");
  auto throws_with = [](auto f, const std::string& part) {
    try {
      f();
    } catch (const Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
      return;
    }
    FAIL("no Error (expected one naming " << part << ")");
  };
  // wrong block size: 584 * 4 bytes per block instead of the padded 2880
  Tensor<uint8_t> unpadded({l.num_blocks, 584 * B}, 0);
  throws_with([&] { paged::model1_dequant(unpadded, B, "extra_k_cache"); }, "extra_k_cache");
  throws_with([&] { paged::model1_dequant(unpadded, B, "extra_k_cache"); }, "2880");
  throws_with([&] { paged::model1_check_cache(cache, paged::make_layout({5}, 2, 5), "k_cache"); }, "k_cache");
  // a used token's e8m0 scale set to the NaN byte
  const int64_t blk = l.block_table.at(0, 0);  // position 1: block 0 of the sequence, token 1
  Tensor<uint8_t> bad = cache;
  bad[blk * 2880 + 576 * B + 8 * 1 + 3] = 0xFF;
  throws_with([&] { paged::model1_check_cache(bad, l, "k_cache"); }, "k_cache block " + std::to_string(blk) + " token 1");
  throws_with([&] { paged::model1_check_cache(bad, l, "k_cache"); }, "tile 3");
  bad = cache;
  bad[blk * 2880 + 576 * 1 + 10] = 0x7F;
  throws_with([&] { paged::model1_check_cache(bad, l, "k_cache"); }, "NoPE byte 10");
  // an index neither -1 nor a slot of the pool
  paged::Model1Scope main{"k_cache", cache, B, Tensor<int32_t>({1, 1, 64}, -1), Tensor<int32_t>()};
  paged::Model1Scope extra{"extra_k_cache", cache, B, Tensor<int32_t>({1, 1, 64}, -1), Tensor<int32_t>()};
  extra.indices[3] = int32_t(l.num_blocks * B);
  throws_with([&] { paged::model1_gather(main, &extra); }, "extra_indices_in_kvcache[0, 0, 3]");
  main.indices[0] = -2;
  throws_with([&] { paged::model1_gather(main, nullptr); }, "indices[0, 0, 0] = -2");
}

namespace {

// Brute force: one softmax over both scopes' valid slots, read from the bytes by read_slot, NaN as 0.
struct Brute {
  std::vector<double> out, lse;
};
Brute brute_decode(const Tensor<bf16_t>& q, const paged::Model1Scope& m, const paged::Model1Scope& x, float sm,
                   const Tensor<float>& sink) {
  const int64_t b = m.indices.dim(0), s_q = m.indices.dim(1), h_q = q.dim(1);
  Brute r{std::vector<double>(size_t(b * s_q * h_q * 512), 0.0), std::vector<double>(size_t(b * s_q * h_q), 0.0)};
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < s_q; ++t) {
      std::vector<std::vector<double>> rows;
      for (const paged::Model1Scope* s : {&m, &x})
        for (int64_t j = 0; j < s->indices.dim(2); ++j) {
          const int32_t v = s->indices.at(i, t, j);
          if (v == -1 || j >= s->topk_length[i]) continue;
          std::vector<double> row = read_slot(s->cache, s->block, v);
          for (double& e : row)
            if (std::isnan(e)) e = 0;
          rows.push_back(row);
        }
      const int64_t row = i * s_q + t;
      for (int64_t h = 0; h < h_q; ++h) {
        const size_t o = size_t(row * h_q + h);
        if (rows.empty()) {
          r.lse[o] = std::numeric_limits<double>::infinity();
          continue;
        }
        std::vector<double> z;
        for (const auto& kr : rows) {
          double dot = 0;
          for (int64_t d = 0; d < 512; ++d) dot += double(bf16_to_f32(q[(row * h_q + h) * 512 + d])) * kr[size_t(d)];
          z.push_back(dot * double(sm));
        }
        double mx = -1e300, sum = 0;
        for (double v : z) mx = std::max(mx, v);
        for (double v : z) sum += std::exp(v - mx);
        r.lse[o] = mx + std::log(sum);
        const double gate = 1.0 / (1.0 + std::exp(double(sink[h]) - r.lse[o]));
        for (size_t k = 0; k < rows.size(); ++k)
          for (int64_t d = 0; d < 512; ++d) r.out[o * 512 + size_t(d)] += std::exp(z[k] - r.lse[o]) * rows[k][size_t(d)] * gate;
      }
    }
  return r;
}

}  // namespace

TEST_CASE("model1: the two-scope decode equals a brute-force single softmax, ref and simd agree bit for bit") {
  const int64_t b = 2, s_q = 2, h_q = 3;
  const paged::PagedLayout ml = paged::make_layout({9, 7}, 4, 11), xl = paged::make_layout({5, 6}, 2, 12);
  auto kv_of = [](int64_t len, const std::string& tag) {
    Tensor<float> f({len, 1, 512});
    fill(f.ptr(), f.numel(), Dist::normal, 0.1f, 3, stream_tag(tag));
    Tensor<bf16_t> kv(f.shape);
    for (int64_t i = 0; i < f.numel(); ++i) kv[i] = f32_to_bf16(f[i]);
    return kv;
  };
  paged::Model1Scope m{"k_cache", paged::model1_fp8_cache(ml, {kv_of(9, "m0"), kv_of(7, "m1")}, "k_cache"), 4,
                       Tensor<int32_t>({b, s_q, 64}, -1), Tensor<int32_t>({b}, 64)};
  paged::Model1Scope x{"extra_k_cache", paged::model1_fp8_cache(xl, {kv_of(5, "x0"), kv_of(6, "x1")}, "extra_k_cache"), 2,
                       Tensor<int32_t>({b, s_q, 64}, -1), Tensor<int32_t>({b}, 64)};
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < s_q; ++t) {
      for (int64_t j = 0; j < 5; ++j) m.indices.at(i, t, j) = paged::physical_index(ml, i, (t + 2 * j) % (i ? 7 : 9));
      for (int64_t j = 0; j < 4; ++j) x.indices.at(i, t, 2 * j) = paged::physical_index(xl, i, (j + t) % 5);
    }
  m.topk_length[1] = 3;  // sequence 1: main slots 3, 4 ignored
  x.topk_length[0] = 5;  // sequence 0: extra slot 6 ignored
  // a valid index to an unused (NaN-poisoned) slot: its row counts as zeros (FlashMLA's ref)
  int64_t unused_slot = -1;
  for (int64_t s = 0; s < ml.num_blocks * 4 && unused_slot < 0; ++s) {
    bool hit = false;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t pos = 0; pos < ml.cache_seqlens[i]; ++pos) hit = hit || paged::physical_index(ml, i, pos) == s;
    if (!hit) unused_slot = s;
  }
  m.indices.at(0, 1, 7) = int32_t(unused_slot);
  // row (1, 1): every slot invalid -> out 0, lse +inf
  for (int64_t j = 0; j < 64; ++j) m.indices.at(1, 1, j) = x.indices.at(1, 1, j) = -1;
  Tensor<bf16_t> q({b * s_q, h_q, 512});
  {
    Tensor<float> f(q.shape);
    fill(f.ptr(), f.numel(), Dist::normal, 1.0f, 4, stream_tag("q"));
    for (int64_t i = 0; i < f.numel(); ++i) q[i] = f32_to_bf16(std::clamp(f[i], -1.0f, 1.0f));
  }
  Tensor<float> sink({h_q});
  sink[0] = 0.5f, sink[1] = -1.0f, sink[2] = 2.0f;
  const float sm = 0.05f;
  const ref::AttentionOut r = paged::model1_decode(q, m, &x, sm, &sink, kernels_for(Impl::ref));
  const ref::AttentionOut v = paged::model1_decode(q, m, &x, sm, &sink, kernels_for(Impl::simd));
  CHECK(std::memcmp(r.out.ptr(), v.out.ptr(), size_t(r.out.numel()) * 4) == 0);
  CHECK(std::memcmp(r.lse.ptr(), v.lse.ptr(), size_t(r.lse.numel()) * 4) == 0);
  const Brute want = brute_decode(q, m, x, sm, sink);
  double max_err = 0;
  for (int64_t i = 0; i < r.out.numel(); ++i) max_err = std::max(max_err, std::fabs(double(r.out[i]) - want.out[size_t(i)]));
  CHECK(max_err < 1e-6);
  for (int64_t i = 0; i < r.lse.numel(); ++i) {
    if (std::isinf(want.lse[size_t(i)])) CHECK(std::isinf(r.lse[i]));
    else CHECK(std::fabs(double(r.lse[i]) - want.lse[size_t(i)]) < 1e-5);
  }
  for (int64_t h = 0; h < h_q; ++h) {
    CHECK(std::isinf(r.lse[(1 * s_q + 1) * h_q + h]));
    CHECK(r.lse[(1 * s_q + 1) * h_q + h] > 0);
    for (int64_t d = 0; d < 512; ++d) CHECK(r.out[((1 * s_q + 1) * h_q + h) * 512 + d] == 0.0f);
  }
}

TEST_CASE("model1: the golden set reads back, its generic tensors are the two scopes' mapping") {
  const std::string spec_text = "model1 b2 nextn2 hq64 len300 win128 blk256 ek128 eblk2 elen260 seed3";
  const golden::Model1DecodeSpec spec = golden::parse_model1_spec(spec_text);
  CHECK(golden::to_string(spec) == spec_text);
  CHECK(golden::model1_violations(spec).empty());
  const std::vector<std::string> bad = golden::model1_violations(golden::parse_model1_spec("model1 hq32 win100 ek96"));
  REQUIRE(bad.size() == 3);
  CHECK(bad[0].find("h_q 32: flashmla-sparse-decode-model1 takes 64 or 128 (csrc/api/sparse_decode.h)") == 0);
  CHECK(bad[1].find("topk 100: flashmla-sparse-decode-model1 takes a multiple of 64") == 0);
  CHECK(bad[2].find("extra_topk 96: ") == 0);
  CHECK_THROWS_WITH_AS(golden::parse_model1_spec("model1 hq64 ek512x"), doctest::Contains("unknown token 'ek512x'"), Error);
  golden::GoldenSet set = golden::build_model1_decode(spec, "test", Impl::simd);
  golden::for_kernel_model1(set, kreg::kernel("flashmla-sparse-decode-model1"), spec);
  const std::string dir = (std::filesystem::temp_directory_path() / ("indexshare-model1-" + std::to_string(::getpid()))).string();
  golden::write(dir, std::move(set), true);
  const golden::Loaded g = golden::read(dir);
  CHECK(g.manifest["kind"] == "decode-model1");
  CHECK(g.manifest["kernel"]["views"]["k_cache"]["strides_bytes"] == nlohmann::json({149760, 584, 584, 1}));
  CHECK(g.manifest["kernel"]["views"]["extra_k_cache"]["strides_bytes"] == nlohmann::json({1728, 584, 584, 1}));
  // The caches pass the layout check, and attn.indices / attn.kv are model1_gather's.
  paged::PagedLayout ml, xl;
  ml.page = 256, xl.page = 2;
  ml.block_table = g.tensor<int32_t>("block_table"), ml.cache_seqlens = g.tensor<int32_t>("cache_seqlens");
  xl.block_table = g.tensor<int32_t>("extra_block_table"), xl.cache_seqlens = g.tensor<int32_t>("extra_cache_seqlens");
  paged::Model1Scope m{"k_cache", g.tensor<uint8_t>("layers.0.attn.model1.k_cache"), 256,
                       g.tensor<int32_t>("layers.0.attn.model1.indices"), g.tensor<int32_t>("layers.0.attn.model1.topk_length")};
  paged::Model1Scope x{"extra_k_cache", g.tensor<uint8_t>("layers.0.attn.model1.extra_k_cache"), 2,
                       g.tensor<int32_t>("layers.0.attn.model1.extra_indices"),
                       g.tensor<int32_t>("layers.0.attn.model1.extra_topk_length")};
  ml.num_blocks = m.cache.dim(0), xl.num_blocks = x.cache.dim(0);
  CHECK_NOTHROW(paged::model1_check_cache(m.cache, ml, "k_cache"));
  CHECK_NOTHROW(paged::model1_check_cache(x.cache, xl, "extra_k_cache"));
  const paged::Model1Gathered cat = paged::model1_gather(m, &x);
  CHECK(cat.indices.data == g.tensor<int32_t>("layers.0.attn.indices").data);
  const Tensor<bf16_t> kv = g.tensor<bf16_t>("layers.0.attn.kv");
  CHECK(std::memcmp(cat.kv.ptr(), kv.ptr(), size_t(kv.numel()) * 2) == 0);
  // Window: row t of sequence i holds pos, pos - 1, ... as physical slots; topk_length W, W - 32.
  CHECK(m.topk_length[0] == 128);
  CHECK(m.topk_length[1] == 96);
  CHECK(x.topk_length[1] == 64);
  const int64_t pos = ml.cache_seqlens[1] - 2 + 1;
  for (int64_t j = 0; j < 128; ++j) CHECK(m.indices.at(1, 1, j) == paged::physical_index(ml, 1, pos - j));
  std::filesystem::remove_all(dir);
}

TEST_CASE("model1: reading a set refuses a cache or a mapping that disagrees, naming the tensor") {
  const golden::Model1DecodeSpec spec = golden::parse_model1_spec("model1 b2 nextn1 hq64 len200 win64 blk64 ek128 eblk2 elen250 seed4");
  const std::string dir = (std::filesystem::temp_directory_path() / ("indexshare-model1-bad-" + std::to_string(::getpid()))).string();
  // Each fault is applied to the built set's tensor bytes before writing (the hashes are the faulty
  // bytes' own), so only the consistency check can refuse it.
  struct Fault {
    std::string tensor;
    std::function<void(io::TensorView&, const golden::GoldenSet&)> apply;
    std::string named;
  };
  auto used_slot0 = [](const golden::GoldenSet& s, const char* table) {
    for (const io::TensorView& v : s.tensors)
      if (v.name == table) {
        int32_t blk;
        std::memcpy(&blk, v.bytes.data(), 4);  // block_table[0, 0]: sequence 0's first block
        return int64_t(blk);
      }
    return int64_t(-1);
  };
  const std::vector<Fault> faults = {
      {"layers.0.attn.model1.k_cache",
       [&](io::TensorView& v, const golden::GoldenSet& s) {
         v.bytes.mutable_data()[size_t(used_slot0(s, "block_table") * paged::model1_block_bytes(64) + 576 * 64 + 2)] = 0xFF;  // token 0, tile 2
       },
       "layers.0.attn.model1.k_cache' block"},
      {"layers.0.attn.model1.extra_k_cache",
       [&](io::TensorView& v, const golden::GoldenSet& s) {
         v.bytes.mutable_data()[size_t(used_slot0(s, "extra_block_table") * paged::model1_block_bytes(2) + 576 * 2 + 7)] = 0x01;  // pad
       },
       "extra_k_cache' block"},
      {"layers.0.attn.indices", [](io::TensorView& v, const golden::GoldenSet&) { v.bytes.mutable_data()[0] ^= 1; }, "tensor 'layers.0.attn.indices'"},
      {"layers.0.attn.kv", [](io::TensorView& v, const golden::GoldenSet&) { v.bytes.mutable_data()[100] ^= 1; }, "tensor 'layers.0.attn.kv'"},
      {"layers.0.attn.model1.topk_length",
       [](io::TensorView& v, const golden::GoldenSet&) {
         const int32_t beyond = 65;  // win64: one past the top-k
         std::memcpy(v.bytes.mutable_data(), &beyond, 4);
       },
       "topk_length[0] = 65 exceeds the top-k 64"},
      {"layers.0.attn.model1.extra_topk_length",
       [](io::TensorView& v, const golden::GoldenSet&) {
         const int32_t beyond = 129;  // ek128
         std::memcpy(v.bytes.mutable_data() + 4, &beyond, 4);
       },
       "extra_topk_length[1] = 129 exceeds the top-k 128"},
  };
  for (const Fault& f : faults) {
    CAPTURE(f.tensor);
    golden::GoldenSet set = golden::build_model1_decode(spec, "test", Impl::simd);
    for (io::TensorView& v : set.tensors)
      if (v.name == f.tensor) {
        f.apply(v, set);
      }
    golden::write(dir, std::move(set), true);
    try {
      golden::read(dir);
      FAIL("read accepted the fault");
    } catch (const Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(f.named) != std::string::npos, e.what());
    }
  }
  // A set written for the kernel records its caches' strided views; a wrong one is refused by field.
  for (const std::string cache : {"k_cache", "extra_k_cache"})
    for (const std::string key : {"shape", "strides_bytes"}) {
      CAPTURE(cache + "." + key);
      golden::GoldenSet set = golden::build_model1_decode(spec, "test", Impl::simd);
      golden::for_kernel_model1(set, kreg::kernel("flashmla-sparse-decode-model1"), spec);
      auto& v = set.manifest["kernel"]["views"][cache][key];
      v[key == "shape" ? 1 : 0] = v[key == "shape" ? 1 : 0].get<int64_t>() + 1;  // block size + 1, or a block's stride + 1
      golden::write(dir, std::move(set), true);
      try {
        golden::read(dir);
        FAIL("read accepted a wrong view");
      } catch (const Error& e) {
        CHECK_MESSAGE(std::string(e.what()).find("field 'kernel.views." + cache + "." + key + "'") != std::string::npos, e.what());
      }
    }
  golden::GoldenSet good = golden::build_model1_decode(spec, "test", Impl::simd);
  golden::for_kernel_model1(good, kreg::kernel("flashmla-sparse-decode-model1"), spec);
  golden::write(dir, std::move(good), true);
  CHECK_NOTHROW(golden::read(dir));
  std::filesystem::remove_all(dir);
}

// The spec's sink=, kv= and empty (what the kernel preset uses so that a dropped sink, bf16 q.k
// logits and a head's scale show): each printed back, bad values refused; the rows of an empty
// sequence have out 0 and lse +inf, a +inf sink zeroes every output. golden::model1_attn_indices
// rebuilds attn.indices from the kernel's inputs, and each broken rule gives another mapping.
TEST_CASE("model1: sink=, kv= and empty, and the index mapping rebuilt and broken rule by rule") {
  const std::string text = "model1 b2 nextn2 hq64 len300 win128 blk256 ek128 eblk2 elen260 seed3 sink=strong kv=1 empty";
  const golden::Model1DecodeSpec spec = golden::parse_model1_spec(text);
  CHECK(golden::to_string(spec) == text);
  CHECK(spec.sink == "strong");
  CHECK(spec.empty);
  CHECK_THROWS_WITH_AS(golden::parse_model1_spec("model1 sink=huge"), doctest::Contains("expected sink=normal, strong, pinf or ninf"), Error);
  CHECK_THROWS_WITH_AS(golden::parse_model1_spec("model1 kv=0"), doctest::Contains("'kv=0'"), Error);
  CHECK_THROWS_WITH_AS(golden::parse_model1_spec("model1 kv=x"), doctest::Contains("'kv=x'"), Error);
  const std::string dir = (std::filesystem::temp_directory_path() / ("indexshare-model1-opts-" + std::to_string(::getpid()))).string();
  golden::write(dir, golden::build_model1_decode(spec, "test", Impl::simd), true);
  const golden::Loaded g = golden::read(dir);
  const Tensor<float> lse = g.tensor<float>("layers.0.attn.lse"), out = g.tensor<float>("layers.0.attn.out");
  const Tensor<float> sink = g.tensor<float>("layers.0.attn.sink");
  double mean = 0;
  for (float v : sink.data) mean += v / 64.0;
  CHECK(mean > 4.5);  // the draws (mean 0, sd 1/8 over 64 heads) plus ln(128 + 128) = 5.5
  for (int64_t r = 2; r < 4; ++r)  // sequence 1 (the last): no valid entry
    for (int64_t h = 0; h < 64; ++h) CHECK(lse[r * 64 + h] == std::numeric_limits<float>::infinity());
  CHECK(out[2 * 64 * 512] == 0.0f);
  CHECK(std::isfinite(lse[0]));
  CHECK(g.manifest["model1"]["empty_rows"] == 2);
  CHECK(g.manifest["model1"]["kv_std"] == "1");
  const Tensor<int32_t> ix = g.tensor<int32_t>("layers.0.attn.indices");
  CHECK(golden::model1_attn_indices(g).data == ix.data);
  const int64_t W = 128, E = 128, main_slots = g.manifest["model1"]["main_slots"].get<int64_t>();
  const Tensor<int32_t> no_extra = golden::model1_attn_indices(g, {true, true, false, true});
  const Tensor<int32_t> no_offset = golden::model1_attn_indices(g, {true, true, true, false});
  const Tensor<int32_t> all_window = golden::model1_attn_indices(g, {false, true, true, true});
  for (int64_t j = 0; j < E; ++j) {
    CHECK(no_extra[W + j] == -1);
    if (ix[W + j] >= 0) CHECK(no_offset[W + j] == ix[W + j] - main_slots);
  }
  CHECK(ix[(2 * (W + E)) + 0] == -1);        // the empty sequence's rows: all -1 ...
  CHECK(all_window[(2 * (W + E)) + 0] >= 0);  // ... until topk_length is ignored
  std::filesystem::remove_all(dir);
  const golden::Loaded pinf = [&] {
    golden::write(dir, golden::build_model1_decode(golden::parse_model1_spec("model1 b2 nextn1 hq64 len300 win128 blk256 ek128 eblk2 elen260 sink=pinf"),
                                                   "test", Impl::simd), true);
    return golden::read(dir);
  }();
  const Tensor<float> zero = pinf.tensor<float>("layers.0.attn.out");
  CHECK(std::all_of(zero.data.begin(), zero.data.end(), [](float v) { return v == 0.0f; }));
  std::filesystem::remove_all(dir);
}

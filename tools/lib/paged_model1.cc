#include "tools/lib/paged_model1.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ref/error.h"
#include "ref/numerics.h"

namespace indexshare::paged {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The e8m0 byte of a power-of-two f32 scale (its biased exponent); the scale rule only gives
// normal powers of two.
uint8_t e8m0_of(float scale, const std::string& what) {
  uint32_t u;
  std::memcpy(&u, &scale, 4);
  const uint32_t e = (u >> 23) & 0xFFu;
  require((u & 0x807FFFFFu) == 0 && e != 0 && e != 0xFFu, what + ": scale " + std::to_string(scale) + " is not a normal power of two");
  return uint8_t(e);
}
// 2^(byte - 127) as f32 (byte 0: 2^-127, an f32 subnormal); 0xFF: NaN.
float e8m0_value(uint8_t byte) {
  if (byte == kE8m0NanCode) return std::nanf("");
  return std::ldexp(1.0f, int(byte) - 127);
}

std::string token_name(const std::string& what, int64_t blk, int64_t t) {
  return what + " block " + std::to_string(blk) + " token " + std::to_string(t);
}

// One token (512 bf16) -> its 576 data bytes and 8 footer bytes.
void encode_token(const bf16_t* row, uint8_t* data, uint8_t* footer, const std::string& what) {
  float nope[kModel1Nope];
  for (int64_t i = 0; i < kModel1Nope; ++i) nope[i] = bf16_to_f32(row[i]);
  e4m3_t codes[kModel1Nope];
  float scales[kModel1Tiles];
  quantize_rows(nope, 1, kModel1Nope, int(kModel1Tile), ScaleRule::flashmla_pow2, codes, scales, what);
  for (int64_t i = 0; i < kModel1Nope; ++i) data[i] = codes[i].bits;
  for (int64_t r = 0; r < kModel1Rope; ++r) {
    const bf16_t v = row[kModel1Nope + r];
    require(std::isfinite(bf16_to_f32(v)), what + ": non-finite rope value at column " + std::to_string(kModel1Nope + r));
    data[kModel1Nope + 2 * r] = uint8_t(v.bits & 0xFFu);
    data[kModel1Nope + 2 * r + 1] = uint8_t(v.bits >> 8);
  }
  for (int64_t k = 0; k < kModel1Tiles; ++k) footer[k] = e8m0_of(scales[k], what);
  footer[kModel1Tiles] = 0x00;
}

void poison_token(uint8_t* data, uint8_t* footer) {
  std::fill(data, data + kModel1Nope, kE4m3NanCode);
  for (int64_t r = 0; r < kModel1Rope; ++r) {
    data[kModel1Nope + 2 * r] = uint8_t(kBf16NanBits & 0xFFu);
    data[kModel1Nope + 2 * r + 1] = uint8_t(kBf16NanBits >> 8);
  }
  std::fill(footer, footer + kModel1FooterBytes, kE8m0NanCode);
}

// 576 data bytes + 8 footer bytes -> 512 bf16 (FlashMLA tests/quant.py dequantize_k_cache, MODEL1).
void decode_token(const uint8_t* data, const uint8_t* footer, bf16_t* row) {
  for (int64_t i = 0; i < kModel1Nope; ++i)
    row[i] = f32_to_bf16(e4m3_to_f32(e4m3_t{data[i]}) * e8m0_value(footer[i / kModel1Tile]));
  for (int64_t r = 0; r < kModel1Rope; ++r)
    row[kModel1Nope + r] = bf16_t{uint16_t(data[kModel1Nope + 2 * r] | (uint16_t(data[kModel1Nope + 2 * r + 1]) << 8))};
}

void check_cache_shape(const Tensor<uint8_t>& cache, int64_t B, const std::string& what) {
  require(B >= 1, what + ": block size must be >= 1, got " + std::to_string(B));
  require(cache.rank() == 2 && cache.dim(1) == model1_block_bytes(B),
          what + ": expected the MODEL1 cache U8 [num_blocks, " + std::to_string(model1_block_bytes(B)) +
              "] (ceil(584 * " + std::to_string(B) + " / 576) * 576 bytes per block of " + std::to_string(B) + " tokens), got " +
              shape_str(cache.shape));
}

// Scope indices [b, s_q, topk] -> idx_cat's columns [col0, col0 + topk) of row (b, t), offset by
// `base`; invalid slots (-1, or j >= topk_length[b]) -> -1. A length beyond topk is refused, not
// clamped: the kernel would read past the row.
void map_scope(const Model1Scope& s, int64_t base, int64_t col0, int64_t width, Tensor<int32_t>& out) {
  const int64_t b = s.indices.dim(0), s_q = s.indices.dim(1), topk = s.indices.dim(2);
  const int64_t slots = s.cache.dim(0) * s.block;
  const std::string iname = s.name == "k_cache" ? "indices" : "extra_indices_in_kvcache";
  const std::string lname = s.name == "k_cache" ? "topk_length" : "extra_topk_length";
  const bool has_len = s.topk_length.numel() > 0;
  if (has_len) require_shape(s.topk_length, {b}, lname);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = has_len ? int64_t(s.topk_length[i]) : topk;
    require(len >= 0 && len <= topk, lname + "[" + std::to_string(i) + "] = " + std::to_string(len) +
                                         (len < 0 ? " is negative" : " exceeds the top-k " + std::to_string(topk) + " (" + iname +
                                                                         "'s last dimension): FlashMLA requires topk_length <= topk"));
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 0; j < topk; ++j) {
        const int32_t v = s.indices.at(i, t, j);
        int32_t m = -1;
        if (v != -1 && j < len) {
          require(v >= 0 && v < slots, iname + "[" + std::to_string(i) + ", " + std::to_string(t) + ", " + std::to_string(j) +
                                           "] = " + std::to_string(v) + " is neither -1 nor a slot of " + s.name + " [0, " +
                                           std::to_string(slots) + ")");
          m = int32_t(base + v);
        }
        out[(i * s_q + t) * width + col0 + j] = m;
      }
  }
}

}  // namespace

int64_t model1_block_bytes(int64_t B) {
  require(B >= 1, "model1_block_bytes: block size must be >= 1, got " + std::to_string(B));
  return ceil_div(kModel1BytesPerToken * B, kModel1BlockAlign) * kModel1BlockAlign;
}

Model1View model1_view(int64_t num_blocks, int64_t B) {
  return {{num_blocks, B, 1, kModel1BytesPerToken}, {model1_block_bytes(B), kModel1BytesPerToken, kModel1BytesPerToken, 1}};
}

Tensor<uint8_t> model1_fp8_cache(const PagedLayout& layout, const std::vector<Tensor<bf16_t>>& kv_per_seq, const std::string& what) {
  const int64_t B = layout.page, bb = model1_block_bytes(B);
  require(layout.block_table.rank() == 2 && layout.cache_seqlens.rank() == 1 && layout.block_table.dim(0) == layout.batch(),
          what + ": malformed layout");
  require(int64_t(kv_per_seq.size()) == layout.batch(),
          what + ": " + std::to_string(kv_per_seq.size()) + " sequences for a batch of " + std::to_string(layout.batch()));
  Tensor<uint8_t> cache({layout.num_blocks, bb}, kModel1TailByte);
  for (int64_t blk = 0; blk < layout.num_blocks; ++blk) {
    uint8_t* base = cache.ptr() + blk * bb;
    for (int64_t t = 0; t < B; ++t) poison_token(base + kModel1DataBytes * t, base + kModel1DataBytes * B + kModel1FooterBytes * t);
  }
  std::vector<bool> taken(size_t(layout.num_blocks), false);
  for (int64_t b = 0; b < layout.batch(); ++b) {
    const std::string sb = what + " kv_per_seq[" + std::to_string(b) + "]";
    const int64_t len = layout.cache_seqlens[b];
    require_shape(kv_per_seq[size_t(b)], {len, 1, kModel1Dqk}, sb);
    require(ceil_div(len, B) <= layout.max_blocks(), sb + ": " + std::to_string(len) + " tokens do not fit the block table");
    for (int64_t j = 0; j < ceil_div(len, B); ++j) {
      const int32_t blk = layout.block_table.at(b, j);
      require(blk >= 0 && blk < layout.num_blocks && !taken[size_t(blk)],
              what + ": block_table[" + std::to_string(b) + ", " + std::to_string(j) + "] = " + std::to_string(blk) +
                  " is not a free block of the pool");
      taken[size_t(blk)] = true;
    }
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t blk = layout.block_table.at(b, pos / B), t = pos % B;
      uint8_t* base = cache.ptr() + blk * bb;
      encode_token(kv_per_seq[size_t(b)].ptr() + pos * kModel1Dqk, base + kModel1DataBytes * t,
                   base + kModel1DataBytes * B + kModel1FooterBytes * t, sb + " token " + std::to_string(pos));
    }
  }
  return cache;
}

Tensor<bf16_t> model1_dequant(const Tensor<uint8_t>& cache, int64_t B, const std::string& what) {
  check_cache_shape(cache, B, what);
  const int64_t nb = cache.dim(0), bb = cache.dim(1);
  Tensor<bf16_t> rows({nb * B, 1, kModel1Dqk});
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t* base = cache.ptr() + blk * bb;
    for (int64_t t = 0; t < B; ++t)
      decode_token(base + kModel1DataBytes * t, base + kModel1DataBytes * B + kModel1FooterBytes * t,
                   rows.ptr() + (blk * B + t) * kModel1Dqk);
  }
  return rows;
}

void model1_check_cache(const Tensor<uint8_t>& cache, const PagedLayout& layout, const std::string& what) {
  const int64_t B = layout.page;
  check_cache_shape(cache, B, what);
  require(cache.dim(0) == layout.num_blocks, what + ": " + std::to_string(cache.dim(0)) + " blocks, but the layout's pool holds " +
                                                 std::to_string(layout.num_blocks));
  const int64_t bb = cache.dim(1);
  require(layout.cache_seqlens.rank() == 1 && layout.block_table.rank() == 2 && layout.block_table.dim(0) == layout.batch(),
          what + ": its block table must be [batch, max_blocks] and cache_seqlens [batch]");
  for (int64_t b = 0; b < layout.batch(); ++b) {
    const int64_t len = layout.cache_seqlens[b];
    require(len >= 0 && ceil_div(len, B) <= layout.max_blocks(),
            what + ": cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(len) + " does not fit its block table");
    for (int64_t j = 0; j < ceil_div(len, B); ++j)
      require(layout.block_table.at(b, j) >= 0 && layout.block_table.at(b, j) < layout.num_blocks,
              what + ": block_table[" + std::to_string(b) + ", " + std::to_string(j) + "] = " +
                  std::to_string(layout.block_table.at(b, j)) + " is not a block of the cache");
  }
  for (int64_t b = 0; b < layout.batch(); ++b)
    for (int64_t pos = 0; pos < layout.cache_seqlens[b]; ++pos) {
      const int64_t blk = layout.block_table.at(b, pos / B), t = pos % B;
      const uint8_t* data = cache.ptr() + blk * bb + kModel1DataBytes * t;
      const uint8_t* footer = cache.ptr() + blk * bb + kModel1DataBytes * B + kModel1FooterBytes * t;
      const std::string at = token_name(what, blk, t) + " (sequence " + std::to_string(b) + " position " + std::to_string(pos) + ")";
      for (int64_t k = 0; k < kModel1Tiles; ++k)
        require(footer[k] != kE8m0NanCode, at + ": e8m0 scale of tile " + std::to_string(k) + " is 0xFF (NaN)");
      require(footer[kModel1Tiles] == 0x00, at + ": footer pad byte is " + std::to_string(footer[kModel1Tiles]) + ", not 0");
      for (int64_t i = 0; i < kModel1Nope; ++i)
        require((data[i] & 0x7Fu) != 0x7Fu, at + ": NoPE byte " + std::to_string(i) + " is an e4m3 NaN code");
      for (int64_t r = 0; r < kModel1Rope; ++r) {
        const uint16_t v = uint16_t(data[kModel1Nope + 2 * r] | (uint16_t(data[kModel1Nope + 2 * r + 1]) << 8));
        require((v & 0x7F80u) != 0x7F80u, at + ": RoPE value " + std::to_string(r) + " is not finite");
      }
    }
}

Tensor<bf16_t> model1_quant_dequant(const Tensor<bf16_t>& kv) {
  require(kv.rank() == 3 && kv.dim(1) == 1 && kv.dim(2) == kModel1Dqk,
          "model1_quant_dequant: expected kv [len, 1, 512], got " + shape_str(kv.shape));
  Tensor<bf16_t> out(kv.shape);
  uint8_t data[kModel1DataBytes], footer[kModel1FooterBytes];
  for (int64_t pos = 0; pos < kv.dim(0); ++pos) {
    encode_token(kv.ptr() + pos * kModel1Dqk, data, footer, "model1_quant_dequant token " + std::to_string(pos));
    decode_token(data, footer, out.ptr() + pos * kModel1Dqk);
  }
  return out;
}

Model1Gathered model1_gather(const Model1Scope& main, const Model1Scope* extra) {
  check_cache_shape(main.cache, main.block, main.name);
  require(main.indices.rank() == 3, "indices: expected [b, s_q, topk], got " + shape_str(main.indices.shape));
  const int64_t b = main.indices.dim(0), s_q = main.indices.dim(1), topk = main.indices.dim(2);
  int64_t etopk = 0, eslots = 0;
  if (extra) {
    check_cache_shape(extra->cache, extra->block, extra->name);
    require(extra->indices.rank() == 3 && extra->indices.dim(0) == b && extra->indices.dim(1) == s_q,
            "extra_indices_in_kvcache: expected [" + std::to_string(b) + ", " + std::to_string(s_q) + ", extra_topk], got " +
                shape_str(extra->indices.shape));
    etopk = extra->indices.dim(2);
    eslots = extra->cache.dim(0) * extra->block;
  }
  Model1Gathered g;
  g.main_slots = main.cache.dim(0) * main.block;
  const int64_t width = topk + etopk;
  g.indices = Tensor<int32_t>({b * s_q, 1, width}, -1);
  map_scope(main, 0, 0, width, g.indices);
  if (extra) map_scope(*extra, g.main_slots, topk, width, g.indices);
  g.kv = Tensor<bf16_t>({g.main_slots + eslots, 1, kModel1Dqk});
  const Tensor<bf16_t> m = model1_dequant(main.cache, main.block, main.name);
  std::copy(m.data.begin(), m.data.end(), g.kv.data.begin());
  if (extra) {
    const Tensor<bf16_t> e = model1_dequant(extra->cache, extra->block, extra->name);
    std::copy(e.data.begin(), e.data.end(), g.kv.data.begin() + m.numel());
  }
  for (int64_t i = 0; i < g.kv.numel(); ++i)
    if ((g.kv[i].bits & 0x7FFFu) > 0x7F80u) g.kv[i] = bf16_t{0};  // NaN -> +0 (FlashMLA's ref)
  return g;
}

ref::AttentionOut model1_decode(const Tensor<bf16_t>& q, const Model1Scope& main, const Model1Scope* extra, float sm_scale,
                                const Tensor<float>* sink, const ref::Kernels& kern) {
  const Model1Gathered g = model1_gather(main, extra);
  require(q.rank() == 3 && q.dim(0) == g.indices.dim(0) && q.dim(2) == kModel1Dqk,
          "q: expected [b * s_q, h_q, 512] = [" + std::to_string(g.indices.dim(0)) + ", h_q, 512], got " + shape_str(q.shape));
  return kern.sparse_attention(q, g.kv, g.indices, sm_scale, kModel1Dqk, nullptr, sink);
}

}  // namespace indexshare::paged

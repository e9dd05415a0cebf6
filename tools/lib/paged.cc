#include "tools/lib/paged.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "ref/numerics.h"
#include "ref/rng.h"

namespace indexshare::paged {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Little-endian stores and loads, independent of the host byte order.
void put_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v & 0xFFu);
  p[1] = uint8_t(v >> 8);
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i) & 0xFFu);
}
uint16_t get_u16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float f32_of_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void check_layout(const PagedLayout& l, const std::string& what) {
  require(l.page >= 1, what + ": layout page must be >= 1");
  require(l.cache_seqlens.rank() == 1, what + ": layout cache_seqlens must be rank 1 [batch]");
  require(l.block_table.rank() == 2 && l.block_table.dim(0) == l.batch(),
          what + ": layout block_table must be [batch, max_blocks], got " +
              shape_str(l.block_table.shape));
  require(l.num_blocks >= 0 && l.num_blocks * l.page <= kInt32Max,
          what + ": layout num_blocks * page must be in [0, INT32_MAX]");
  std::vector<bool> taken(static_cast<size_t>(l.num_blocks), false);
  for (int64_t b = 0; b < l.batch(); ++b) {
    const int64_t len = l.cache_seqlens[b];
    require(len >= 0 && ceil_div(len, l.page) <= l.max_blocks(),
            what + ": cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(len) +
                " does not fit the block table");
    for (int64_t j = 0; j < ceil_div(len, l.page); ++j) {
      const int32_t blk = l.block_table.at(b, j);
      require(blk >= 0 && blk < l.num_blocks,
              what + ": block_table[" + std::to_string(b) + ", " + std::to_string(j) + "] = " +
                  std::to_string(blk) + " is not a block of the pool");
      require(!taken[size_t(blk)], what + ": physical block " + std::to_string(blk) +
                                       " is allocated twice in the block table");
      taken[size_t(blk)] = true;
    }
  }
}

// Physical slot of every used token: slots[b][pos].
std::vector<std::vector<int64_t>> used_slots(const PagedLayout& l) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(l.batch()));
  for (int64_t b = 0; b < l.batch(); ++b) {
    const int64_t len = l.cache_seqlens[b];
    auto& v = out[size_t(b)];
    v.resize(static_cast<size_t>(len));
    for (int64_t pos = 0; pos < len; ++pos)
      v[size_t(pos)] = int64_t(l.block_table.at(b, pos / l.page)) * l.page + pos % l.page;
  }
  return out;
}

// One FlashMLA V32 token: row (576 bf16) -> 656 bytes.
void encode_flashmla_token(const bf16_t* row, uint8_t* out, const std::string& what) {
  float latent[kFlashMlaLatent];
  for (int64_t i = 0; i < kFlashMlaLatent; ++i) latent[i] = bf16_to_f32(row[i]);
  e4m3_t codes[kFlashMlaLatent];
  float scales[kFlashMlaLatent / kFlashMlaTile];
  quantize_rows(latent, 1, kFlashMlaLatent, int(kFlashMlaTile), ScaleRule::flashmla_pow2, codes,
                scales, what);
  for (int64_t i = 0; i < kFlashMlaLatent; ++i) out[i] = codes[i].bits;
  for (int64_t t = 0; t < kFlashMlaLatent / kFlashMlaTile; ++t)
    put_u32(out + kFlashMlaScaleOffset + 4 * t, f32_bits(scales[t]));
  for (int64_t r = 0; r < kFlashMlaRope; ++r) {
    const bf16_t v = row[kFlashMlaLatent + r];
    require(std::isfinite(bf16_to_f32(v)),
            what + ": non-finite rope value at column " + std::to_string(kFlashMlaLatent + r));
    put_u16(out + kFlashMlaRopeOffset + 2 * r, v.bits);
  }
}

void fill_flashmla_nan(uint8_t* out) {
  std::fill(out, out + kFlashMlaLatent, kE4m3NanCode);
  for (int64_t t = 0; t < kFlashMlaLatent / kFlashMlaTile; ++t)
    put_u32(out + kFlashMlaScaleOffset + 4 * t, kF32NanBits);
  for (int64_t r = 0; r < kFlashMlaRope; ++r) put_u16(out + kFlashMlaRopeOffset + 2 * r, kBf16NanBits);
}

// One 656-byte token -> 576 bf16 (FlashMLA tests/quant.py dequantize_k_cache).
void decode_flashmla_token(const uint8_t* in, bf16_t* row) {
  for (int64_t i = 0; i < kFlashMlaLatent; ++i) {
    const float scale = f32_of_bits(get_u32(in + kFlashMlaScaleOffset + 4 * (i / kFlashMlaTile)));
    row[i] = f32_to_bf16(e4m3_to_f32(e4m3_t{in[i]}) * scale);
  }
  for (int64_t r = 0; r < kFlashMlaRope; ++r)
    row[kFlashMlaLatent + r] = bf16_t{get_u16(in + kFlashMlaRopeOffset + 2 * r)};
}

}  // namespace

PagedLayout make_layout(const std::vector<int64_t>& seqlens, int64_t page, uint64_t seed) {
  require(page >= 1, "make_layout: page must be >= 1, got " + std::to_string(page));
  const int64_t batch = int64_t(seqlens.size());
  int64_t used = 0, max_blocks = 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = seqlens[size_t(b)];
    require(len >= 0 && len <= kInt32Max,
            "make_layout: seqlens[" + std::to_string(b) + "] = " + std::to_string(len) +
                " must be in [0, INT32_MAX]");
    used += ceil_div(len, page);
    max_blocks = std::max(max_blocks, ceil_div(len, page));
    require(used <= kInt32Max, "make_layout: too many blocks");
  }
  const int64_t spare = 1 + used / 4;
  PagedLayout l;
  l.page = page;
  l.num_blocks = used + spare;
  require(l.num_blocks <= kInt32Max / page,
          "make_layout: num_blocks * page = " + std::to_string(l.num_blocks) + " * " +
              std::to_string(page) + " exceeds INT32_MAX (physical slots are int32)");
  l.cache_seqlens = Tensor<int32_t>({batch});
  for (int64_t b = 0; b < batch; ++b) l.cache_seqlens[b] = int32_t(seqlens[size_t(b)]);
  l.block_table = Tensor<int32_t>({batch, max_blocks}, -1);

  // Fisher-Yates shuffle of the pool, exact integer draws.
  std::vector<int32_t> perm(static_cast<size_t>(l.num_blocks));
  for (int64_t i = 0; i < l.num_blocks; ++i) perm[size_t(i)] = int32_t(i);
  Xoshiro256 g(seed ^ stream_tag("paged.block_table"));
  for (int64_t i = l.num_blocks - 1; i > 0; --i) {
    const int64_t j = int64_t(g.below(uint64_t(i + 1)));
    std::swap(perm[size_t(i)], perm[size_t(j)]);
  }
  if (used > 0 && perm[0] == 0) std::swap(perm[0], perm[size_t(l.num_blocks - 1)]);

  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < ceil_div(seqlens[size_t(b)], page); ++j) l.block_table.at(b, j) = perm[next++];
  return l;
}

int32_t physical_index(const PagedLayout& layout, int64_t batch, int64_t pos) {
  require(layout.block_table.rank() == 2, "physical_index: layout block_table must be rank 2");
  require(batch >= 0 && batch < layout.block_table.dim(0),
          "physical_index: batch " + std::to_string(batch) + " outside [0, " +
              std::to_string(layout.block_table.dim(0)) + ")");
  require(layout.page >= 1, "physical_index: layout page must be >= 1");
  if (pos < 0) return -1;
  const int64_t j = pos / layout.page;
  if (j >= layout.max_blocks()) return -1;
  const int64_t blk = layout.block_table.at(batch, j);
  if (blk < 0) return -1;
  const int64_t slot = blk * layout.page + pos % layout.page;
  require(slot <= kInt32Max, "physical_index: slot exceeds INT32_MAX");
  return int32_t(slot);
}

Tensor<int32_t> logical_to_physical(const PagedLayout& layout, const Tensor<int32_t>& logical) {
  require(logical.rank() == 3, "logical_to_physical: expected logical indices [batch, s_q, topk], got " +
                                   shape_str(logical.shape));
  require(logical.dim(0) == layout.block_table.dim(0),
          "logical_to_physical: batch " + std::to_string(logical.dim(0)) + " differs from the layout's " +
              std::to_string(layout.block_table.dim(0)));
  Tensor<int32_t> out(logical.shape, -1);
  const int64_t per_b = logical.dim(1) * logical.dim(2);
  for (int64_t b = 0; b < logical.dim(0); ++b)
    for (int64_t i = 0; i < per_b; ++i)
      out[b * per_b + i] = physical_index(layout, b, logical[b * per_b + i]);
  return out;
}

Tensor<uint8_t> flashmla_fp8_cache(const PagedLayout& layout,
                                   const std::vector<Tensor<bf16_t>>& kv_per_seq) {
  check_layout(layout, "flashmla_fp8_cache");
  require(int64_t(kv_per_seq.size()) == layout.batch(),
          "flashmla_fp8_cache: " + std::to_string(kv_per_seq.size()) + " sequences for a batch of " +
              std::to_string(layout.batch()));
  Tensor<uint8_t> cache({layout.num_blocks, layout.page, 1, kFlashMlaTokenBytes});
  const int64_t slots = layout.num_blocks * layout.page;
  for (int64_t s = 0; s < slots; ++s) fill_flashmla_nan(cache.ptr() + s * kFlashMlaTokenBytes);
  const auto phys = used_slots(layout);
  for (int64_t b = 0; b < layout.batch(); ++b) {
    const std::string what = "flashmla_fp8_cache kv_per_seq[" + std::to_string(b) + "]";
    const Tensor<bf16_t>& kv = kv_per_seq[size_t(b)];
    require_shape(kv, {layout.cache_seqlens[b], 1, kFlashMlaDqk}, what);
    for (int64_t pos = 0; pos < layout.cache_seqlens[b]; ++pos)
      encode_flashmla_token(kv.ptr() + pos * kFlashMlaDqk,
                            cache.ptr() + phys[size_t(b)][size_t(pos)] * kFlashMlaTokenBytes,
                            what + " token " + std::to_string(pos));
  }
  return cache;
}

Tensor<bf16_t> flashmla_dequant(const Tensor<uint8_t>& cache) {
  require(cache.rank() == 4 && cache.dim(2) == 1 && cache.dim(3) == kFlashMlaTokenBytes,
          "flashmla_dequant: expected cache [num_blocks, page, 1, 656], got " + shape_str(cache.shape));
  const int64_t slots = cache.dim(0) * cache.dim(1);
  Tensor<bf16_t> rows({slots, 1, kFlashMlaDqk});
  for (int64_t s = 0; s < slots; ++s)
    decode_flashmla_token(cache.ptr() + s * kFlashMlaTokenBytes, rows.ptr() + s * kFlashMlaDqk);
  return rows;
}

Tensor<bf16_t> flashmla_quant_dequant(const Tensor<bf16_t>& kv) {
  require(kv.rank() == 3 && kv.dim(1) == 1 && kv.dim(2) == kFlashMlaDqk,
          "flashmla_quant_dequant: expected kv [len, 1, 576], got " + shape_str(kv.shape));
  Tensor<bf16_t> out(kv.shape);
  uint8_t token[kFlashMlaTokenBytes];
  for (int64_t pos = 0; pos < kv.dim(0); ++pos) {
    encode_flashmla_token(kv.ptr() + pos * kFlashMlaDqk, token,
                          "flashmla_quant_dequant token " + std::to_string(pos));
    decode_flashmla_token(token, out.ptr() + pos * kFlashMlaDqk);
  }
  return out;
}

Tensor<uint8_t> deepgemm_index_cache(const PagedLayout& layout,
                                     const std::vector<Tensor<e4m3_t>>& k_per_seq,
                                     const std::vector<Tensor<float>>& k_scale_per_seq, int64_t D) {
  check_layout(layout, "deepgemm_index_cache");
  require(D >= 1, "deepgemm_index_cache: D must be >= 1, got " + std::to_string(D));
  require(int64_t(k_per_seq.size()) == layout.batch() && int64_t(k_scale_per_seq.size()) == layout.batch(),
          "deepgemm_index_cache: k_per_seq and k_scale_per_seq must hold one tensor per sequence (" +
              std::to_string(layout.batch()) + ")");
  const int64_t page = layout.page, block_bytes = page * (D + 4);
  Tensor<uint8_t> cache({layout.num_blocks, page, 1, D + 4});
  for (int64_t blk = 0; blk < layout.num_blocks; ++blk) {
    uint8_t* base = cache.ptr() + blk * block_bytes;
    std::fill(base, base + page * D, kE4m3NanCode);
    for (int64_t off = 0; off < page; ++off) put_u32(base + page * D + 4 * off, kF32NanBits);
  }
  for (int64_t b = 0; b < layout.batch(); ++b) {
    const std::string sb = "[" + std::to_string(b) + "]";
    const int64_t len = layout.cache_seqlens[b];
    const Tensor<e4m3_t>& k = k_per_seq[size_t(b)];
    const Tensor<float>& sc = k_scale_per_seq[size_t(b)];
    require_shape(k, {len, D}, "deepgemm_index_cache k_per_seq" + sb);
    require_shape(sc, {len}, "deepgemm_index_cache k_scale_per_seq" + sb);
    for (int64_t pos = 0; pos < len; ++pos) {
      std::string at = sb;
      at += " token " + std::to_string(pos);
      require(std::isfinite(sc[pos]), "deepgemm_index_cache k_scale_per_seq" + at + " is not finite");
      const int64_t blk = layout.block_table.at(b, pos / page), off = pos % page;
      uint8_t* base = cache.ptr() + blk * block_bytes;
      for (int64_t d = 0; d < D; ++d) {
        const uint8_t code = k[pos * D + d].bits;
        require((code & 0x7Fu) != 0x7Fu, "deepgemm_index_cache k_per_seq" + at + " holds a NaN code");
        base[off * D + d] = code;
      }
      put_u32(base + page * D + 4 * off, f32_bits(sc[pos]));
    }
  }
  return cache;
}

IndexCacheRows deepgemm_index_read(const Tensor<uint8_t>& cache) {
  require(cache.rank() == 4 && cache.dim(2) == 1 && cache.dim(3) >= 5,
          "deepgemm_index_read: expected cache [num_blocks, page, 1, D + 4], got " + shape_str(cache.shape));
  const int64_t num_blocks = cache.dim(0), page = cache.dim(1), D = cache.dim(3) - 4;
  const int64_t block_bytes = page * (D + 4);
  IndexCacheRows r{Tensor<e4m3_t>({num_blocks * page, D}), Tensor<float>({num_blocks * page})};
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const uint8_t* base = cache.ptr() + blk * block_bytes;
    for (int64_t off = 0; off < page; ++off) {
      const int64_t s = blk * page + off;
      for (int64_t d = 0; d < D; ++d) r.k[s * D + d] = e4m3_t{base[off * D + d]};
      r.scale[s] = f32_of_bits(get_u32(base + page * D + 4 * off));
    }
  }
  return r;
}

int32_t next_n_key_end(int64_t context_len, int64_t next_n, int64_t t) {
  require(next_n >= 1 && next_n <= context_len && context_len <= kInt32Max,
          "next_n_key_end: need 1 <= next_n <= context_len <= INT32_MAX, got next_n " +
              std::to_string(next_n) + ", context_len " + std::to_string(context_len));
  require(t >= 0 && t < next_n, "next_n_key_end: query row " + std::to_string(t) + " outside [0, " +
                                    std::to_string(next_n) + ")");
  return int32_t(context_len - next_n + t + 1);
}

DecodeBounds decode_ks_ke(const Tensor<int32_t>& context_lens, int64_t next_n) {
  require(context_lens.rank() == 1, "decode_ks_ke: context_lens must be rank 1 [batch], got " +
                                        shape_str(context_lens.shape));
  require(next_n >= 1, "decode_ks_ke: next_n must be >= 1, got " + std::to_string(next_n));
  const int64_t batch = context_lens.numel();
  DecodeBounds d{Tensor<int32_t>({batch * next_n}, 0), Tensor<int32_t>({batch * next_n})};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < next_n; ++t) d.ke[b * next_n + t] = next_n_key_end(context_lens[b], next_n, t);
  return d;
}

}  // namespace indexshare::paged

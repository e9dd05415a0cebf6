#include "ref/inputs.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>

#include "ref/indexer.h"
#include "ref/numerics.h"
#include "ref/topk.h"

namespace indexshare::ref {

Tensor<float> generate(const Problem& p, const std::string& name, const Shape& shape, float scale) {
  Tensor<float> t(shape);
  fill(t.ptr(), t.numel(), p.dist, scale, p.seed, stream_tag(name));
  return t;
}

namespace {
// Calls fill(i, first, count) for each run of consecutive ascending rows: rows[i .. i + count) are
// the problem rows first .. first + count - 1 (a run is one range of the stream). Errors name the
// stream when a row is outside [0, n_rows).
template <class Fill>
void for_each_row_run(const std::string& name, int64_t n_rows, std::span<const int64_t> rows, Fill&& fill) {
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    require(rows[i] >= 0 && rows[j - 1] < n_rows,
            "generate_rows: " + name + ": row outside [0, " + std::to_string(n_rows) + ")");
    fill(int64_t(i), rows[i], int64_t(j - i));
    i = j;
  }
}
}  // namespace

Tensor<float> generate_rows(const Problem& p, const std::string& name, const Shape& shape,
                            std::span<const int64_t> rows, float scale, const Kernels& k) {
  require(!shape.empty(), "generate_rows: " + name + ": shape must have a leading row dim");
  const int64_t row_len = shape[0] > 0 ? shape_numel(shape) / shape[0] : 0;
  Shape out_shape = shape;
  out_shape[0] = int64_t(rows.size());
  Tensor<float> t(out_shape);
  // A run of consecutive rows is one range of the stream (all rows in order: exactly `generate`).
  for_each_row_run(name, shape[0], rows, [&](int64_t i, int64_t first, int64_t count) {
    k.fill_range(t.ptr() + i * row_len, first * row_len, count * row_len, p.dist, scale, p.seed, stream_tag(name));
  });
  return t;
}

Tensor<bf16_t> generate_rows_bf16(const Problem& p, const std::string& name, const Shape& shape,
                                  std::span<const int64_t> rows, float scale, const Kernels& k) {
  require(!shape.empty(), "generate_rows: " + name + ": shape must have a leading row dim");
  const int64_t row_len = shape[0] > 0 ? shape_numel(shape) / shape[0] : 0;
  Shape out_shape = shape;
  out_shape[0] = int64_t(rows.size());
  Tensor<bf16_t> t(out_shape);
  const uint64_t tag = stream_tag(name);
  // A run of consecutive rows is one range of the stream, converted a chunk at a time (rng.h).
  for_each_row_run(name, shape[0], rows, [&](int64_t i, int64_t first, int64_t count) {
    k.fill_range_bf16(t.ptr() + i * row_len, first * row_len, count * row_len, p.dist, scale, p.seed, tag);
  });
  return t;
}

std::vector<int64_t> all_rows(const Problem& p) {
  std::vector<int64_t> rows(static_cast<size_t>(p.s_q));
  for (int64_t t = 0; t < p.s_q; ++t) rows[size_t(t)] = t;
  return rows;
}

void check_rows(const Problem& p, std::span<const int64_t> rows) {
  require(!rows.empty(), "rows: the row list is empty");
  std::vector<bool> seen(static_cast<size_t>(p.s_q), false);
  for (int64_t t : rows) {
    require(t >= 0 && t < p.s_q, "rows: row " + std::to_string(t) + " is outside [0, sq = " + std::to_string(p.s_q) + ")");
    require(!seen[size_t(t)], "rows: row " + std::to_string(t) + " is listed twice");
    seen[size_t(t)] = true;
  }
}

std::string format_rows(std::span<const int64_t> rows) {
  std::string out;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(rows[i]);
    if (j - i > 1) {
      out += '-';
      out += std::to_string(rows[j - 1]);
    }
    i = j;
  }
  return out;
}

namespace {


// Rows [0, n) as a list.
std::vector<int64_t> all_rows_of(int64_t n) {
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = i;
  return r;
}

// Rows [s0, s0 + n) as a list, for the key-side tensors generated in blocks.
std::vector<int64_t> row_range(int64_t s0, int64_t n) {
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = s0 + i;
  return r;
}

// drift=: the correlation r_l of layer l's own part with layer l - 1's (see the header).
float drift_step(const Problem& p, int layer) {
  if (p.jumps > 0) {
    Xoshiro256 g(p.seed ^ stream_tag("stack.drift.jump." + std::to_string(layer)));
    if (double(g.below(uint64_t(1) << 24)) < double(p.jumps) * 16777216.0) return p.jump_rho;
  }
  return p.drift;
}

// The layer's own part: its own draw, or with drift= the AR(1) chain over layers 0..layer.
Tensor<float> own_part(const Problem& p, const std::string& name, int layer, const Shape& shape,
                       std::span<const int64_t> rows, const Kernels& k) {
  if (p.drift == 0.0f) return generate_rows(p, "layers." + std::to_string(layer) + "." + name, shape, rows, 1.0f, k);
  Tensor<float> c = generate_rows(p, "layers.0." + name, shape, rows, 1.0f, k);
  for (int j = 1; j <= layer; ++j) {
    const float r = drift_step(p, j), s = float(std::sqrt(1.0 - double(r) * double(r)));
    const Tensor<float> own = generate_rows(p, "layers." + std::to_string(j) + "." + name, shape, rows, 1.0f, k);
#pragma omp parallel for schedule(static) if (c.numel() >= (int64_t(1) << 16))
    for (int64_t i = 0; i < c.numel(); ++i) c[i] = r * c[i] + s * own[i];
  }
  return c;
}

// a * base + b * own, elementwise in f32 (a = sim, b = f32(sqrt(1 - sim^2))), for the given rows
// of a tensor of `shape`.
Tensor<float> mixed(const Problem& p, const std::string& name, int layer, const Shape& shape,
                    std::span<const int64_t> rows, const Kernels& k) {
  const float a = p.sim, b = float(std::sqrt(1.0 - double(p.sim) * double(p.sim)));
  Tensor<float> base = generate_rows(p, "stack." + name, shape, rows, 1.0f, k);
  const Tensor<float> own = own_part(p, name, layer, shape, rows, k);
  // Elementwise (OpenMP over elements where there are many: no value depends on the split).
#pragma omp parallel for schedule(static) if (base.numel() >= (int64_t(1) << 16))
  for (int64_t i = 0; i < base.numel(); ++i) base[i] = a * base[i] + b * own[i];
  return base;
}

// The indexer's q and k are generated a block of rows (query rows, or keys) at a time, the blocks
// in parallel: every step (the draws, the cross-layer mix, the overwrite, bf16, the FP8 scale of
// each head vector) is per row, so no byte depends on the split, and the f32 draws are never held
// whole (q at s_q 4096, H 64, D 128 is 134 MB of f32 per stream; 1M keys x 128 dims 512 MB). A
// block is about kBlockElems elements of the stream, and a multiple of 16 chunks where that is
// small enough: simd's fill runs whole groups of chunks in lanes (up to 16 lanes), so a block
// edge inside a group would send that group to ref's scalar fill.
constexpr int64_t kBlockElems = int64_t(1) << 18;

int64_t block_rows(int64_t row_len) {
  if (row_len <= 0) return 1;
  const int64_t group = 16 * kChunk;
  const int64_t aligned = group / std::gcd(row_len, group);  // rows per multiple of `group` elements
  if (aligned * row_len <= 4 * kBlockElems) return aligned * std::max<int64_t>(1, kBlockElems / (aligned * row_len));
  return std::max<int64_t>(1, kBlockElems / row_len);
}

// fn(r0, count) for the blocks [r0, r0 + count) of n rows, `per` rows each, in parallel (OpenMP).
// An error is rethrown after the loop: the one of the lowest block, as a serial loop would.
template <class Fn>
void for_each_block(int64_t n, int64_t per, Fn&& fn) {
  const int64_t blocks = (n + per - 1) / per;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(dynamic, 1) if (blocks >= 2)
  for (int64_t b = 0; b < blocks; ++b) {
    try {
      fn(b * per, std::min(per, n - b * per));
    } catch (...) {
      errors[size_t(b)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

LayerInputs make_layer_inputs(const Problem& p, int layer, bool with_indexer) {
  p.validate();
  return make_layer_inputs(p, layer, with_indexer, all_rows(p));
}

LayerInputs make_layer_inputs(const Problem& p, int layer, bool with_indexer, std::span<const int64_t> rows,
                              const Kernels& kern) {
  p.validate();
  check_rows(p, rows);
  const int64_t n = int64_t(rows.size()), s_q = p.s_q, s_kv = p.s_kv, H = p.index_n_heads, D = p.index_head_dim;
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  LayerInputs in;
  in.has_indexer = with_indexer;
  // Causal bounds: query row t belongs to sequence i = t / seq_q, whose keys are the kv rows
  // [i * seq_kv, (i + 1) * seq_kv); it is position start + (t mod seq_q) of that sequence and sees
  // its keys [0, start + (t mod seq_q)]. Row r of the inputs is the problem's row t = rows[r].
  in.ks = Tensor<int32_t>({n});
  in.ke = Tensor<int32_t>({n});
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = rows[size_t(r)], seq = t / p.seq_q(), local = t % p.seq_q();
    in.ks[r] = int32_t(seq * p.seq_kv());
    in.ke[r] = int32_t(seq * p.seq_kv() + p.start_pos() + local + 1);
  }

  if (with_indexer) {
    const float g = float(2.0 * std::pow(double(D), 0.25));
    const bool biased = D >= 2 && (p.recency > 0 || p.sinks > 0);
    // Query side, the sampled rows only. 1. Cross-layer mix of q and the raw head weights.
    // Query side, the sampled rows only, in blocks (see block_rows). The raw head weights first
    // (their signs orient the overwrite), whole: [n, H] is small.
    Tensor<float> w = mixed(p, "indexer.weights", layer, {s_q, H}, rows, kern);
    const bool fp8 = p.indexer == IndexerMode::fp8;
    if (fp8) {
      in.index_q8 = Tensor<e4m3_t>({n, H, D});
      in.index_q_scale = Tensor<float>({n, H});
    } else {
      in.index_q = Tensor<float>({n, H, D});
      in.index_q_scale = Tensor<float>({n, H}, 1.0f);
    }
    for_each_block(n, block_rows(H * D), [&](int64_t r0, int64_t nb) {
      // 1. Cross-layer mix of q.
      Tensor<float> q = mixed(p, "indexer.q", layer, {s_q, H, D}, rows.subspan(size_t(r0), size_t(nb)), kern);
      // 2. Recency and sink dims (see the header).
      if (biased)
        for (int64_t r = 0; r < nb; ++r)
          for (int64_t h = 0; h < H; ++h) {
            const float sg = w.at(r0 + r, h) < 0 ? -g : g;
            q.at(r, h, D - 1) = sg;
            q.at(r, h, D - 2) = sg;
          }
      // 3. bf16, then FP8 codes with one scale per head vector (fp8 mode).
      for (float& v : q.data) v = round_bf16(v);
      if (fp8)
        kern.quantize_rows(q.ptr(), nb * H, D, int(D), p.scale, in.index_q8.ptr() + r0 * H * D,
                           in.index_q_scale.ptr() + r0 * H, prefix + "indexer.q");
      else
        std::copy(q.data.begin(), q.data.end(), in.index_q.data.begin() + r0 * H * D);
    });
    // Key side, every key (each row scores them all): the same steps 1-3 in blocks of keys (the
    // mix, the overwrite and the per-key quantization are all per key).
    if (fp8) {
      in.index_k8 = Tensor<e4m3_t>({s_kv, D});
      in.index_k_scale = Tensor<float>({s_kv});
    } else {
      in.index_k = Tensor<float>({s_kv, D});
      in.index_k_scale = Tensor<float>({s_kv}, 1.0f);
    }
    for_each_block(s_kv, block_rows(D), [&](int64_t s0, int64_t nb) {
      Tensor<float> k = mixed(p, "indexer.k", layer, {s_kv, D}, row_range(s0, nb), kern);
      if (biased)
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t s = s0 + j;
          k.at(j, D - 1) = p.recency * g * float(s + 1) / float(s_kv);
          k.at(j, D - 2) = s < p.sinks ? g : 0.0f;
        }
      for (float& v : k.data) v = round_bf16(v);
      if (fp8)
        kern.quantize_rows(k.ptr(), nb, D, int(D), p.scale, in.index_k8.ptr() + s0 * D, in.index_k_scale.ptr() + s0,
                           prefix + "indexer.k");
      else
        std::copy(k.data.begin(), k.data.end(), in.index_k.data.begin() + s0 * D);
    });
    // 4. Weights: weights_proj(x) * H^-0.5 * q_scale * D^-0.5, left to right in f32.
    const float h_scale = float(1.0 / std::sqrt(double(H))), d_scale = float(1.0 / std::sqrt(double(D)));
    in.index_weights = std::move(w);
    for (int64_t i = 0; i < n * H; ++i)
      in.index_weights[i] = in.index_weights[i] * h_scale * in.index_q_scale[i] * d_scale;
  }

  // Attention inputs, the layer's own streams: q for the sampled rows, kv for every key (in blocks).
  in.q = generate_rows_bf16(p, prefix + "attn.q", {s_q, p.h_q, p.d_qk}, rows, 1.0f, kern);
  in.kv = generate_rows_bf16(p, prefix + "attn.kv", {s_kv, 1, p.d_qk}, all_rows_of(s_kv), 1.0f, kern);
  if (p.sink != SinkMode::none) {
    const float inf = std::numeric_limits<float>::infinity();
    if (p.sink == SinkMode::random || p.sink == SinkMode::strong) in.sink = generate(p, prefix + "attn.sink", {p.h_q});
    // strong: the draw plus ln(topk) (in double, rounded to f32 once): a sink worth a row's mass.
    if (p.sink == SinkMode::strong)
      for (float& s : in.sink->data) s = float(double(s) + std::log(double(p.index_topk)));
    if (p.sink == SinkMode::pinf) in.sink = Tensor<float>({p.h_q}, inf);
    if (p.sink == SinkMode::ninf) in.sink = Tensor<float>({p.h_q}, -inf);
  }
  return in;
}

}  // namespace indexshare::ref

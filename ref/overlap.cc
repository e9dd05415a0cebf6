#include "ref/overlap.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ref/attention.h"
#include "ref/numerics.h"
#include "ref/topk.h"

namespace indexshare::ref {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// |a ∩ b| of two ascending position lists.
int64_t count_common(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int64_t common = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++common, ++i, ++j;
    }
  }
  return common;
}

// Summaries of per-row overlaps of one layer pair: whole rows and per bucket.
PairOverlap summarize_pair(const std::vector<RowOverlap>& rows, const std::vector<QueryBucket>& buckets,
                           int layer_a, int layer_b) {
  PairOverlap r;
  r.a = layer_a;
  r.b = layer_b;
  r.rows = int64_t(rows.size());
  std::vector<double> overlap, jaccard;
  for (const RowOverlap& row : rows) {
    if (row.trivial) {
      ++r.trivial_rows;
      continue;
    }
    overlap.push_back(row.overlap);
    jaccard.push_back(row.jaccard);
  }
  r.overlap = summarize_distribution(overlap);
  r.jaccard = summarize_distribution(jaccard);
  for (const QueryBucket& b : buckets) {
    std::vector<double> v;
    for (int64_t t = b.t_begin; t < b.t_end && t < int64_t(rows.size()); ++t)
      if (!rows[size_t(t)].trivial) v.push_back(rows[size_t(t)].overlap);
    r.overlap_by_bucket.push_back(summarize_distribution(v));
  }
  return r;
}

// Throws unless every layer has layer 0's causal windows (ks, ke).
void require_same_windows(const std::vector<LayerInputs>& in, const std::string& what) {
  for (size_t l = 1; l < in.size(); ++l)
    require(in[l].ks.data == in[0].ks.data && in[l].ke.data == in[0].ke.data,
            what + ": layer " + std::to_string(l) + " has causal windows (ks/ke) different from layer 0's");
}

// Softmax over the logits z (in the order given), max-subtracted, summed in order.
std::vector<double> softmax(const std::vector<double>& z) {
  std::vector<double> p(z.size());
  if (z.empty()) return p;
  const double m = *std::max_element(z.begin(), z.end());
  double sum = 0.0;
  for (size_t i = 0; i < z.size(); ++i) sum += (p[i] = std::exp(z[i] - m));
  for (double& v : p) v /= sum;
  return p;
}

}  // namespace

// ---- Distributions ------------------------------------------------------------------------

double percentile_nearest_rank(const std::vector<double>& sorted, int percent) {
  require(!sorted.empty(), "percentile: empty list");
  require(0 <= percent && percent <= 100, "percentile: percent must be in [0, 100], got " + std::to_string(percent));
  const int64_t n = int64_t(sorted.size());
  // r = ceil(percent * n / 100) in integers (exact), at least 1.
  const int64_t r = std::max<int64_t>(1, (int64_t(percent) * n + 99) / 100);
  return sorted[size_t(r - 1)];
}

DistSummary summarize_distribution(std::vector<double> values) {
  DistSummary d;
  d.count = int64_t(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0.0;
  for (double v : values) sum += v;
  d.mean = sum / double(values.size());
  d.min = values.front();
  d.max = values.back();
  d.p10 = percentile_nearest_rank(values, 10);
  d.p50 = percentile_nearest_rank(values, 50);
  d.p90 = percentile_nearest_rank(values, 90);
  return d;
}

// ---- Per-row set overlap -------------------------------------------------------------------

std::vector<int64_t> valid_lengths(const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  require(ks.rank() == 1 && ks.shape == ke.shape, "valid_lengths: ks and ke must be [s_q]");
  std::vector<int64_t> len(size_t(ks.numel()));
  for (int64_t t = 0; t < ks.numel(); ++t) {
    require(ks[t] <= ke[t], "valid_lengths: row " + std::to_string(t) + " has ke < ks");
    len[size_t(t)] = int64_t(ke[t]) - int64_t(ks[t]);
  }
  return len;
}

void check_topk_rows(const Tensor<int32_t>& topk, const std::vector<int64_t>& valid_len, const std::string& what) {
  require(topk.rank() == 2 && topk.dim(0) == int64_t(valid_len.size()),
          what + ": expected [s_q=" + std::to_string(valid_len.size()) + ", topk], got " + shape_str(topk.shape));
  const int64_t s_q = topk.dim(0), k = topk.dim(1);
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t L = valid_len[size_t(t)];
    const std::string row = what + ": row " + std::to_string(t);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t v = topk.at(t, j);
      require(v == -1 || (0 <= v && v < L), row + " slot " + std::to_string(j) + " holds " + std::to_string(v) +
                                                ", outside -1 and [0, " + std::to_string(L) + ")");
    }
    const std::vector<int32_t> pos = row_positions(topk, t);
    require(std::adjacent_find(pos.begin(), pos.end()) == pos.end(), row + " repeats a position");
    const int64_t expect = std::min(k, L);
    require(int64_t(pos.size()) == expect, row + " selects " + std::to_string(pos.size()) +
                                               " positions, a top-k selects min(topk, ke - ks) = " +
                                               std::to_string(expect));
  }
}

std::vector<int32_t> row_positions(const Tensor<int32_t>& topk, int64_t t) {
  std::vector<int32_t> pos;
  for (int64_t j = 0; j < topk.dim(1); ++j)
    if (topk.at(t, j) >= 0) pos.push_back(topk.at(t, j));
  std::sort(pos.begin(), pos.end());
  return pos;
}

std::vector<RowOverlap> row_overlaps(const Tensor<int32_t>& a, const Tensor<int32_t>& b,
                                     const std::vector<int64_t>& valid_len) {
  check_topk_rows(a, valid_len, "overlap A");
  check_topk_rows(b, valid_len, "overlap B");
  require(a.shape == b.shape, "overlap: A " + shape_str(a.shape) + " and B " + shape_str(b.shape) + " differ in shape");
  const int64_t s_q = a.dim(0), k = a.dim(1);
  std::vector<RowOverlap> rows(static_cast<size_t>(s_q));
  for (int64_t t = 0; t < s_q; ++t) {
    RowOverlap& r = rows[size_t(t)];
    const std::vector<int32_t> sa = row_positions(a, t), sb = row_positions(b, t);
    r.trivial = valid_len[size_t(t)] <= k;
    r.size_a = int64_t(sa.size());
    r.size_b = int64_t(sb.size());
    r.common = count_common(sa, sb);
    r.union_size = r.size_a + r.size_b - r.common;
    if (!r.trivial) {  // |A| = |B| = k > 0 here
      r.overlap = double(r.common) / double(r.size_a);
      r.jaccard = double(r.common) / double(r.union_size);
    }
  }
  return rows;
}

std::vector<QueryBucket> query_buckets(int64_t s_q, int n_buckets, int64_t start_pos) {
  // A bucket per query position at most (and at most kMaxBuckets): more would only add empty rows
  // to the report (10^7 buckets took 20 s and 3.7 GB for a 16-row problem).
  require(n_buckets >= 1 && n_buckets <= kMaxBuckets,
          "query buckets: --buckets must be in [1, " + std::to_string(kMaxBuckets) + "], got " + std::to_string(n_buckets));
  require(s_q >= 0, "query buckets: s_q must be >= 0");
  std::vector<QueryBucket> buckets(static_cast<size_t>(n_buckets));
  const int64_t n = n_buckets;
  for (int64_t b = 0; b < n; ++b) {
    QueryBucket& q = buckets[size_t(b)];
    q.t_begin = (b * s_q + n - 1) / n;        // ceil(b s_q / n)
    q.t_end = ((b + 1) * s_q + n - 1) / n;    // ceil((b + 1) s_q / n)
    q.pos_begin = start_pos + q.t_begin;
    q.pos_end = start_pos + q.t_end;
  }
  return buckets;
}

PairOverlap pair_overlap(const Tensor<int32_t>& a, const Tensor<int32_t>& b,
                         const std::vector<int64_t>& valid_len, const std::vector<QueryBucket>& buckets,
                         int layer_a, int layer_b) {
  return summarize_pair(row_overlaps(a, b, valid_len), buckets, layer_a, layer_b);
}

// ---- Attention probabilities and errors ----------------------------------------------------

double attention_logit(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, int64_t t, int64_t h,
                       int64_t row, double sm_scale) {
  const int64_t d_qk = q.dim(2);
  double dot = 0.0;
  for (int64_t d = 0; d < d_qk; ++d)
    dot += double(bf16_to_f32(q.at(t, h, d))) * double(bf16_to_f32(kv.at(row, 0, d)));
  return dot * sm_scale;
}

Tensor<double> dense_probabilities(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                                   const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  require(q.rank() == 3 && kv.rank() == 3 && kv.dim(1) == 1 && kv.dim(2) == q.dim(2),
          "dense_probabilities: expected q [s_q, h_q, d_qk] and kv [s_kv, 1, d_qk], got " +
              shape_str(q.shape) + " and " + shape_str(kv.shape));
  const int64_t s_q = q.dim(0), h_q = q.dim(1), s_kv = kv.dim(0);
  require_shape(ks, {s_q}, "dense_probabilities ks");
  require_shape(ke, {s_q}, "dense_probabilities ke");
  Tensor<double> prob({s_q, h_q, s_kv}, 0.0);
  std::vector<double> z;
  for (int64_t t = 0; t < s_q; ++t) {
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "dense_probabilities: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
    for (int64_t h = 0; h < h_q; ++h) {
      // 1. Logits over the window, ascending kv row. 2. Softmax. 3. Scatter into the row.
      z.clear();
      for (int64_t s = ks[t]; s < ke[t]; ++s) z.push_back(attention_logit(q, kv, t, h, s, double(sm_scale)));
      const std::vector<double> p = softmax(z);
      for (int64_t s = ks[t]; s < ke[t]; ++s) prob.at(t, h, s) = p[size_t(s - ks[t])];
    }
  }
  return prob;
}

double relative_error(const Tensor<float>& got, const Tensor<float>& ref) {
  require(got.shape == ref.shape, "relative_error: shapes " + shape_str(got.shape) + " and " +
                                      shape_str(ref.shape) + " differ");
  RelativeError e;
  e.add(got.data.data(), ref.data.data(), ref.numel());
  return e.value();
}

void RelativeError::add(const float* got, const float* ref, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(ref[i]);
    diff2 += d * d;
    ref2 += double(ref[i]) * double(ref[i]);
  }
}

double RelativeError::value() const {
  if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff2) / std::sqrt(ref2);
}

RowDivergence row_divergence(const Problem& p, const LayerInputs& in, int64_t t,
                             const std::vector<int32_t>& own, const std::vector<int32_t>& used) {
  RowDivergence r;
  if (own == used || own.empty()) return r;  // identical sets: nothing lost, KL exactly 0
  const int64_t h_q = in.q.dim(1), ks = in.ks[t];
  const double sm = double(p.sm_scale());
  std::vector<double> z_own(own.size()), z_used(used.size());
  double mass_kept = 0.0, mass_lost = 0.0, kl = 0.0;
  for (int64_t h = 0; h < h_q; ++h) {
    // 1. The layer's logits at its own and at the used positions (kv row = position + ks).
    for (size_t i = 0; i < own.size(); ++i) z_own[i] = attention_logit(in.q, in.kv, t, h, own[i] + ks, sm);
    for (size_t i = 0; i < used.size(); ++i) z_used[i] = attention_logit(in.q, in.kv, t, h, used[i] + ks, sm);
    // 2. The all-Full distribution pO over O and the schedule's qU over U.
    const std::vector<double> pO = softmax(z_own), qU = softmax(z_used);
    // 3. Mass of pO outside U, and the skewed KL, over O in ascending position.
    double kept = 0.0, lost = 0.0, div = 0.0;
    for (size_t i = 0; i < own.size(); ++i) {
      const auto it = std::lower_bound(used.begin(), used.end(), own[i]);
      const bool in_used = it != used.end() && *it == own[i];
      const double q = in_used ? qU[size_t(it - used.begin())] : 0.0;
      (in_used ? kept : lost) += pO[i];
      if (pO[i] > 0.0) div += pO[i] * std::log(pO[i] / ((1.0 - kKlSkew) * q + kKlSkew * pO[i]));
    }
    // kept + lost = 1 up to rounding; dividing by it keeps both shares in [0, 1] and exact at
    // the ends (lost = 0 when O ⊆ U, kept = 0 when U ∩ O is empty).
    mass_kept += kept / (kept + lost);
    mass_lost += lost / (kept + lost);
    kl += div;
  }
  r.mass_kept = mass_kept / double(h_q);
  r.mass_lost = mass_lost / double(h_q);
  r.kl = kl / double(h_q);
  return r;
}

// ---- Overlap report --------------------------------------------------------------------------

SharedLayerRows shared_layer_rows(const Problem& p, const LayerInputs& li, const StackLayerOutputs& o, const Kernels& k) {
  const Tensor<int32_t>& ks = li.ks;
  const std::vector<int64_t> len = valid_lengths(ks, li.ke);
  const int64_t s_q = int64_t(len.size());
  SharedLayerRows r;
  const std::vector<RowOverlap> rows = row_overlaps(o.own_topk, o.used_topk, len);
  const Tensor<double> prob = dense_probabilities(li.q, li.kv, p.sm_scale(), li.ks, li.ke);
  const int64_t h_q = prob.dim(1);
  for (int64_t t = 0; t < s_q; ++t) {
    if (rows[size_t(t)].trivial) {
      ++r.trivial_rows;
      continue;
    }
    const std::vector<int32_t> own = row_positions(o.own_topk, t), used = row_positions(o.used_topk, t);
    r.recall.push_back(rows[size_t(t)].overlap);
    double mu = 0.0, mo = 0.0;  // head-mean mass: sum over heads, then positions, ascending
    for (int64_t h = 0; h < h_q; ++h) {
      for (int32_t s : used) mu += prob.at(t, h, s + ks[t]);
      for (int32_t s : own) mo += prob.at(t, h, s + ks[t]);
    }
    r.mass_used.push_back(mu / double(h_q));
    r.mass_own.push_back(mo / double(h_q));
    r.mass_recall.push_back(row_divergence(p, li, t, own, used).mass_kept);
  }
  r.own_out = layer_attention(p, li, local_to_kv_rows(o.own_topk, li.ks), k).out;
  return r;
}

SharedLayerStats shared_layer_stats(int layer, int source, int64_t s_q, SharedLayerRows rows, double out_rel_error) {
  SharedLayerStats st;
  st.layer = layer;
  st.source = source;
  st.rows = s_q;
  st.trivial_rows = rows.trivial_rows;
  st.recall = summarize_distribution(std::move(rows.recall));
  st.mass_used = summarize_distribution(std::move(rows.mass_used));
  st.mass_own = summarize_distribution(std::move(rows.mass_own));
  st.mass_recall = summarize_distribution(std::move(rows.mass_recall));
  st.out_rel_error = out_rel_error;
  return st;
}

OutputCosts::OutputCosts(int n_layers, std::function<Tensor<float>(size_t, size_t)> out, std::string what)
    : out_(std::move(out)), what_(std::move(what)) {
  for (int j = 0; j < n_layers; ++j) own_out_.push_back(out_(size_t(j), size_t(j)));
}

double OutputCosts::layer_cost(int layer, int source) {
  require(0 <= source && source <= layer && layer < n_layers(), "search: layer cost needs 0 <= source <= layer < #" + what_ + "s, got " +
                                                                    std::to_string(layer) + ", " + std::to_string(source));
  if (source == layer) return 0.0;
  const auto key = std::make_pair(layer, source);
  if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
  return cache_[key] = relative_error(out_(size_t(layer), size_t(source)), own_out_[size_t(layer)]);
}

OverlapReport own_selection_report(int64_t n_keys, int64_t k, const Tensor<int32_t>& ke, const std::vector<Tensor<int32_t>>& own,
                                   const std::vector<int>& layer, const std::string& pattern, const std::string& what,
                                   const std::string& problem, int n_buckets) {
  const int n = int(own.size());
  require(n > 0 && layer.size() == own.size(), "overlap: no " + what + " to compare");
  require(int(pattern.size()) == n, "overlap: pattern '" + pattern + "' for " + std::to_string(n) + " " + what + "s");
  const int64_t s_q = ke.numel();
  Problem p;  // the statistics read only the rows' windows and the selections
  p.s_q = p.s_kv = s_q;
  p.index_topk = k;
  p.n_layers = n;
  LayerInputs rows;
  rows.has_indexer = true;
  rows.ks = Tensor<int32_t>({s_q}, 0);
  rows.ke = ke;
  std::vector<LayerInputs> in(size_t(n), rows);
  std::vector<StackLayerOutputs> out(static_cast<size_t>(n));
  int src = 0;
  for (int j = 0; j < n; ++j) {
    const char c = pattern[size_t(j)];
    require(c == 'F' || c == 'S', "overlap: pattern '" + pattern + "' character " + std::to_string(j) + " is not F or S");
    require(j > 0 || c == 'F', "overlap: pattern '" + pattern + "' starts with S (the first " + what + " has no source)");
    if (c == 'F') src = j;
    StackLayerOutputs& o = out[size_t(j)];
    o.layer = j;
    o.kind = c == 'F' ? LayerKind::full : LayerKind::shared;
    o.source = src;
    o.own_topk = own[size_t(j)];
    require(c == 'S' || o.own_topk.numel() > 0, "overlap: Full " + what + " " + std::to_string(layer[size_t(j)]) + " has no selections");
  }
  OverlapOptions opt;
  opt.n_buckets = n_buckets;
  opt.shared_stats = false;
  OverlapReport r = overlap_report(p, in, out, opt);
  r.problem = problem;
  r.s_kv = n_keys;
  return r;
}

OverlapReport overlap_report(const Problem& p, const std::vector<LayerInputs>& in,
                             const std::vector<StackLayerOutputs>& out, const OverlapOptions& opt) {
  require(!out.empty() && in.size() == out.size(),
          "overlap: " + std::to_string(in.size()) + " layer inputs for " + std::to_string(out.size()) + " layer outputs");
  require_same_windows(in, "overlap");
  const int n = int(out.size());
  const Tensor<int32_t>& ks = in[0].ks;
  const std::vector<int64_t> len = valid_lengths(ks, in[0].ke);
  const int64_t s_q = int64_t(len.size()), k = p.index_topk;

  OverlapReport r;
  r.problem = to_string(p);
  r.n_layers = n;
  r.s_q = s_q;
  r.s_kv = p.s_kv;
  r.topk = k;
  r.start_pos = p.start_pos();
  r.rows = s_q;
  for (int64_t L : len) r.trivial_rows += L <= k ? 1 : 0;
  r.buckets = query_buckets(s_q, opt.n_buckets, p.start_pos());

  // 1. Layers; the schedule is read back from the outputs.
  for (int l = 0; l < n; ++l) {
    const StackLayerOutputs& o = out[size_t(l)];
    r.layers.push_back({l, o.kind, o.source, o.own_topk.numel() > 0});
    r.pattern += o.kind == LayerKind::full ? 'F' : 'S';
    if (o.own_topk.numel() > 0)
      require(o.own_topk.rank() == 2 && o.own_topk.dim(1) == k,
              "overlap: layer " + std::to_string(l) + " own top-k " + shape_str(o.own_topk.shape) +
                  " does not have the problem's topk " + std::to_string(k) + " columns");
    if (o.own_topk.numel() > 0) check_topk_rows(o.own_topk, len, "overlap: layer " + std::to_string(l) + " own top-k");
    require(o.kind == LayerKind::shared || o.own_topk.numel() > 0,
            "overlap: Full layer " + std::to_string(l) + " has no own top-k");
  }

  // 2. All pairs (i < j, mirrored) of own top-k; adjacent pairs keep their full summaries.
  r.matrix_overlap.assign(size_t(n) * size_t(n), kNaN);
  r.matrix_jaccard.assign(size_t(n) * size_t(n), kNaN);
  const bool any_nontrivial = r.trivial_rows < s_q;
  std::vector<double> pooled_overlap, pooled_jaccard, offdiag;
  std::vector<std::vector<double>> pooled_bucket(r.buckets.size());
  for (int i = 0; i < n; ++i) {
    if (!r.layers[size_t(i)].has_own_topk) continue;
    if (any_nontrivial) {
      r.matrix_overlap[size_t(i) * size_t(n) + size_t(i)] = 1.0;
      r.matrix_jaccard[size_t(i) * size_t(n) + size_t(i)] = 1.0;
    }
    for (int j = i + 1; j < n; ++j) {
      if (!r.layers[size_t(j)].has_own_topk) continue;
      const std::vector<RowOverlap> rows = row_overlaps(out[size_t(i)].own_topk, out[size_t(j)].own_topk, len);
      const PairOverlap pair = summarize_pair(rows, r.buckets, i, j);
      for (size_t c : {size_t(i) * size_t(n) + size_t(j), size_t(j) * size_t(n) + size_t(i)}) {
        r.matrix_overlap[c] = pair.overlap.mean;
        r.matrix_jaccard[c] = pair.jaccard.mean;
      }
      if (pair.overlap.count > 0) offdiag.push_back(pair.overlap.mean);
      if (j != i + 1) continue;
      r.adjacent.push_back(pair);
      for (const QueryBucket& b : r.buckets) {
        const size_t bi = size_t(&b - r.buckets.data());
        for (int64_t t = b.t_begin; t < b.t_end; ++t)
          if (!rows[size_t(t)].trivial) pooled_bucket[bi].push_back(rows[size_t(t)].overlap);
      }
      for (const RowOverlap& row : rows)
        if (!row.trivial) pooled_overlap.push_back(row.overlap), pooled_jaccard.push_back(row.jaccard);
    }
  }
  r.adjacent_overlap = summarize_distribution(pooled_overlap);
  r.adjacent_jaccard = summarize_distribution(pooled_jaccard);
  for (auto& v : pooled_bucket) r.adjacent_by_bucket.push_back(summarize_distribution(std::move(v)));
  r.offdiag_overlap = summarize_distribution(offdiag);

  // 3. What sharing costs each Shared layer that has its own top-k.
  if (!opt.shared_stats) return r;
  for (int l = 0; l < n; ++l) {
    const StackLayerOutputs& o = out[size_t(l)];
    if (o.kind != LayerKind::shared || o.own_topk.numel() == 0) continue;
    SharedLayerRows rows = shared_layer_rows(p, in[size_t(l)], o, opt.kernels);
    const double err = relative_error(o.attn.out, rows.own_out);
    r.shared.push_back(shared_layer_stats(l, o.source, s_q, std::move(rows), err));
  }
  return r;
}

OverlapReport overlap_report(const Problem& p, const OverlapOptions& opt) {
  const Schedule s = p.schedule();
  const std::vector<LayerInputs> in = make_stack_inputs(p, s);
  const std::vector<StackLayerOutputs> out = run_stack(p, s, in, /*keep_logits=*/false, opt.kernels);
  return overlap_report(p, in, out, opt);
}

// ---- Greedy search ---------------------------------------------------------------------------

std::string search_loss_name(SearchLoss loss) {
  switch (loss) {
    case SearchLoss::output: return "output";
    case SearchLoss::mass: return "mass";
    case SearchLoss::kl: return "kl";
  }
  return "?";
}

std::vector<std::string> search_loss_names() { return {"output", "mass", "kl"}; }

SearchLoss parse_search_loss(const std::string& name) {
  if (name == "output") return SearchLoss::output;
  if (name == "mass") return SearchLoss::mass;
  if (name == "kl") return SearchLoss::kl;
  throw Error("search loss: unknown '" + name + "' (known: output, mass, kl)");
}

ScheduleEvaluator::ScheduleEvaluator(const Problem& p, const std::vector<LayerInputs>& in, SearchLoss loss,
                                     const Kernels& k)
    : p_(p), in_(in), loss_(loss), k_(k) {
  require(!in.empty() && int64_t(in.size()) == p.n_layers,
          "search: " + std::to_string(in.size()) + " layer inputs for a problem of nl" + std::to_string(p.n_layers));
  for (size_t l = 0; l < in.size(); ++l)
    require(in[l].has_indexer, "search: layer " + std::to_string(l) +
                                   " has no indexer inputs (every layer needs them: use own=yes)");
  require_same_windows(in, "search");
  valid_len_ = valid_lengths(in[0].ks, in[0].ke);
  // Each layer's own top-k once; for the output loss also its all-Full attention output.
  for (const LayerInputs& li : in) {
    own_.push_back(layer_topk(p, li, k_));
    if (loss == SearchLoss::output) own_out_.push_back(layer_attention(p, li, local_to_kv_rows(own_.back(), li.ks), k_).out);
  }
}

double ScheduleEvaluator::layer_cost(int layer, int source) {
  require(0 <= source && source <= layer && layer < n_layers(),
          "search: layer cost needs 0 <= source <= layer < nl, got layer " + std::to_string(layer) +
              ", source " + std::to_string(source));
  if (source == layer) return 0.0;
  const auto key = std::make_pair(layer, source);
  if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
  const LayerInputs& li = in_[size_t(layer)];
  const Tensor<int32_t>& own = own_[size_t(layer)];
  const Tensor<int32_t>& used = own_[size_t(source)];
  double cost = 0.0;
  if (loss_ == SearchLoss::output) {
    cost = output_cost(layer_attention(p_, li, local_to_kv_rows(used, li.ks), k_).out, own_out_[size_t(layer)]);
  } else {
    std::vector<double> terms;
    for (int64_t t = 0; t < own.dim(0); ++t) {
      if (valid_len_[size_t(t)] <= p_.index_topk) continue;  // trivial row: U = O
      const RowDivergence d = row_divergence(p_, li, t, row_positions(own, t), row_positions(used, t));
      terms.push_back(loss_ == SearchLoss::mass ? d.mass_lost : d.kl);
    }
    cost = row_mean_cost(terms);
  }
  cache_[key] = cost;
  return cost;
}

double ScheduleEvaluator::output_cost(const Tensor<float>& got, const Tensor<float>& own) {
  return relative_error(got, own);
}

double ScheduleEvaluator::row_mean_cost(const std::vector<double>& terms) {
  double sum = 0.0;  // in row order
  for (double v : terms) sum += v;
  return terms.empty() ? 0.0 : sum / double(terms.size());
}

double LayerCosts::schedule_loss(const Schedule& s) {
  s.validate();
  require(s.n_layers() == n_layers(), "search: schedule has " + std::to_string(s.n_layers()) +
                                          " layers, the inputs " + std::to_string(n_layers()));
  double sum = 0.0;
  for (int l = 0; l < n_layers(); ++l) sum += layer_cost(l, s.source(l));
  return sum / double(n_layers());
}

SearchResult greedy_search(const Problem& p, const std::vector<LayerInputs>& in, const SearchOptions& opt) {
  ScheduleEvaluator ev(p, in, opt.loss, opt.kernels);
  return greedy_search(p, ev, opt);
}

SearchResult greedy_search(const Problem& p, ScheduleEvaluator& ev, const SearchOptions& opt) {
  return greedy_search(to_string(p), static_cast<LayerCosts&>(ev), opt);
}

SearchResult greedy_search(const std::string& problem, LayerCosts& ev, const SearchOptions& opt) {
  const int n = ev.n_layers();
  require(1 <= opt.n_full && opt.n_full <= n, "search: n_full must be in [1, nl=" + std::to_string(n) +
                                                  "], got " + std::to_string(opt.n_full));
  SearchResult r;
  r.problem = problem;
  r.loss = ev.loss();
  r.n_layers = n;
  r.n_full = opt.n_full;
  Schedule current{std::vector<LayerKind>(size_t(n), LayerKind::full)};
  r.initial_loss = ev.schedule_loss(current);
  while (current.n_full() > opt.n_full) {
    // 1. Try every Full layer but layer 0, ascending. 2. Keep the first strictly lowest loss.
    SearchStep step;
    int best = -1;
    double best_loss = 0.0;
    for (int l = 1; l < n; ++l) {
      if (!current.is_full(l)) continue;
      Schedule candidate = current;
      candidate.kinds[size_t(l)] = LayerKind::shared;
      const double loss = ev.schedule_loss(candidate);
      step.candidates.push_back(l);
      step.candidate_losses.push_back(loss);
      if (best < 0 || loss < best_loss) best = l, best_loss = loss;
    }
    // 3. Commit.
    current.kinds[size_t(best)] = LayerKind::shared;
    step.flipped = best;
    step.loss = best_loss;
    step.pattern = current.pattern();
    r.flips.push_back(best);
    r.losses.push_back(best_loss);
    r.steps.push_back(std::move(step));
  }
  r.pattern = current.pattern();
  for (int l = 0; l < n; ++l) r.layer_costs.push_back(ev.layer_cost(l, current.source(l)));
  return r;
}

SearchResult greedy_search(const Problem& p, const SearchOptions& opt) {
  const Schedule all_full = schedule_preset("all-full", int(p.n_layers));
  const std::vector<LayerInputs> in = make_stack_inputs(p, all_full);
  return greedy_search(p, in, opt);
}

double schedule_loss(const Problem& p, const std::vector<LayerInputs>& in, const Schedule& s, SearchLoss loss) {
  ScheduleEvaluator ev(p, in, loss);
  return ev.schedule_loss(s);
}

}  // namespace indexshare::ref

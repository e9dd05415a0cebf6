// indexshare diff: row sets, the picture's per-row strips, and the structure tests' layout of each
// judged tensor (sequences, sampled rows, role pools).
#include <algorithm>
#include <cstdio>

#include "tools/judge/anchors.h"
#include "tools/judge/walk.h"

namespace indexshare::diff {

namespace detail {

Tensor<int32_t> rows_to_local(const Tensor<int32_t>& rows, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  const int64_t s_q = rows.dim(0), k = rows.dim(2);
  Tensor<int32_t> local({s_q, k}, -1);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = rows[t * k + j];
      local.at(t, j) = r < 0 ? -1 : (r >= ks[t] && r < ke[t] ? int32_t(r - ks[t]) : -2);
    }
  return local;
}

std::optional<Tensor<int32_t>> pad_beyond_window(const Tensor<int32_t>& local, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  const int64_t s_q = local.dim(0), k = local.dim(1);
  Tensor<int32_t> out = local;
  int64_t padded = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = ke[t] - ks[t];
    if (len >= k) continue;
    std::vector<int32_t> keep;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t v = local.at(t, j);
      if (v >= len) ++padded;
      else if (v != -1) keep.push_back(v);  // other negatives stay, and still fail
    }
    for (int64_t j = 0; j < k; ++j) out.at(t, j) = j < int64_t(keep.size()) ? keep[size_t(j)] : -1;
  }
  if (padded == 0) return std::nullopt;
  return out;
}

void row_set(const int32_t* row, int64_t k, int64_t s_kv, RowSet& out) {
  out.clear();
  for (int64_t j = 0; j < k; ++j)
    if (row[j] >= 0 && row[j] < s_kv) out.push_back(row[j]);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

std::vector<RowSet> row_sets(const Tensor<int32_t>& rows, int64_t s_kv) {
  const int64_t s_q = rows.dim(0), k = rows.numel() / std::max<int64_t>(1, s_q);
  std::vector<RowSet> out(static_cast<size_t>(s_q));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s_q; ++t) {
    out[size_t(t)].reserve(size_t(k));
    row_set(rows.ptr() + t * k, k, s_kv, out[size_t(t)]);
  }
  return out;
}

void release_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

RowsAgainst rows_against(const Tensor<int32_t>& cand, const Tensor<int32_t>& gold, int64_t s_kv) {
  require(cand.dim(0) == gold.dim(0) && cand.numel() == gold.numel(), "rows_against: the rows differ in number or length");
  const int64_t s_q = gold.dim(0), k = gold.numel() / std::max<int64_t>(1, s_q);
  RowsAgainst r;
  r.recall.assign(size_t(s_q), 1.0);
  std::vector<uint8_t> same(size_t(s_q), 1);
#pragma omp parallel
  {
    RowSet c, g;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < s_q; ++t) {
      const int32_t *cr = cand.ptr() + t * k, *gr = gold.ptr() + t * k;
      if (std::equal(cr, cr + k, gr)) continue;
      row_set(cr, k, s_kv, c);
      row_set(gr, k, s_kv, g);
      same[size_t(t)] = c == g;
      if (g.empty()) continue;
      size_t common = 0;
      for (int32_t v : c) common += std::binary_search(g.begin(), g.end(), v);
      r.recall[size_t(t)] = double(common) / double(g.size());
    }
  }
  r.same_sets = std::all_of(same.begin(), same.end(), [](uint8_t x) { return x != 0; });
  return r;
}

std::vector<double> out_ratios(const Tensor<float>& expected, const Tensor<float>& got, const std::vector<float>& bound,
                               int64_t d_v) {
  const int64_t n = expected.numel() / std::max<int64_t>(1, d_v);
  std::vector<double> r(size_t(n), 0.0);
  const float* bp = bound.empty() ? nullptr : bound.data();
#pragma omp parallel for schedule(static) if (n * d_v >= (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) {
    double m = 0;
    for (int64_t c = 0; c < d_v; ++c) {
      const int64_t e = i * d_v + c;
      const double x = got[e], y = expected[e], b = bp ? double(bp[e]) : 0.0;
      double q;
      if (!std::isfinite(x) || !std::isfinite(y)) q = x == y ? 0.0 : INFINITY;
      else if (x == y) q = 0.0;  // no division where there is no error (an exact copy has none)
      else q = b > 0 ? std::fabs(x - y) / b : INFINITY;
      m = std::max(m, q);
    }
    r[size_t(i)] = m;
  }
  return r;
}

void finish_panel(Result& res, io::DiffPanel panel, const std::string& prefix, size_t diagnoses0, size_t tensors0) {
  for (size_t i = diagnoses0; i < res.diagnoses.size(); ++i) {
    const std::string& d = res.diagnoses[i];
    panel.findings.push_back(d.rfind(prefix + ": ", 0) == 0 ? d.substr(prefix.size() + 2) : d);
  }
  std::string failed;
  for (size_t i = tensors0; i < res.tensors.size(); ++i)
    if (res.tensors[i].report.verdict == cmp::Verdict::fail) failed += (failed.empty() ? "" : ", ") + res.tensors[i].name;
  panel.verdict = std::to_string(res.tensors.size() - tensors0) + " tensor(s) judged; " + (failed.empty() ? "none failed" : "failed: " + failed);
  if (panel.rows > 0 || !panel.recall.empty()) res.panels.push_back(std::move(panel));
}

std::vector<int64_t> row_sequences(const golden::Loaded& g, int64_t s_q, const Tensor<int32_t>* ks) {
  std::vector<int64_t> seq;
  if (g.find("cu_seqlens_q")) {
    const Tensor<int32_t> cu = g.tensor<int32_t>("cu_seqlens_q");
    if (cu.numel() <= 2) return {};
    seq.assign(size_t(s_q), 0);
    for (int64_t i = 0; i + 1 < cu.numel(); ++i)
      for (int64_t t = std::max<int64_t>(0, cu[i]); t < std::min<int64_t>(s_q, cu[i + 1]); ++t) seq[size_t(t)] = i;
    return seq;
  }
  if (!ks || ks->numel() != s_q) return {};
  std::vector<int32_t> starts(ks->data.begin(), ks->data.end());
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  if (starts.size() < 2) return {};
  for (int64_t t = 0; t < s_q; ++t)
    seq.push_back(std::lower_bound(starts.begin(), starts.end(), (*ks)[t]) - starts.begin());
  return seq;
}

void pool(std::map<std::string, std::pair<int, std::vector<cmp::ClusterSums>>>& pools, const std::string& tensor, bool full,
          const cmp::StructureReport& st, RoleLayers& roles, int l) {
  auto& rl = roles[tensor + "|" + (full ? "Full" : "Shared")];
  rl.first.push_back(l);
  if (st.flagged) rl.second.push_back(l);
  if (st.flagged) return;  // already failed on its own: the pool looks for what no single layer shows
  auto& p = pools[tensor + "|" + (full ? "Full" : "Shared")];
  ++p.first;
  p.second.insert(p.second.end(), st.clusters.begin(), st.clusters.end());
}

std::vector<int64_t> row_ids(const golden::Loaded& g) {
  std::vector<int64_t> ids;
  if (g.find("rows")) {
    const Tensor<int32_t> r = g.tensor<int32_t>("rows");
    ids.assign(r.data.begin(), r.data.end());
  }
  return ids;
}

double rms_v(const Tensor<bf16_t>& kv, int64_t d_v) {
  const int64_t d_qk = kv.dim(2);
  double s = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < kv.dim(0); ++i)
    for (int64_t c = 0; c < d_v; ++c, ++n) s += double(bf16_to_f32(kv[i * d_qk + c])) * double(bf16_to_f32(kv[i * d_qk + c]));
  return n ? std::sqrt(s / double(n)) : 0.0;
}

double out_anchor_scale(const Tensor<bf16_t>& kv, int64_t d_v) { return std::max(1.0, rms_v(kv, d_v) / kFlashMlaDataRms); }

double lse_anchor_scale(const Tensor<float>& max_logits) { return std::max(1.0, cmp::rms_finite(max_logits)); }

std::string anchor_named(const std::string& name, double scale) {
  if (scale <= 1.0) return name + ", at FlashMLA's test scale";
  char buf[64];
  std::snprintf(buf, sizeof buf, ", abs scaled x%.3g to the set's values", scale);
  return name + buf;
}

Tensor<bf16_t> q_at_rows(const Tensor<bf16_t>& q, const std::vector<int64_t>& rows) {
  const int64_t w = q.numel() / std::max<int64_t>(1, q.dim(0));
  Tensor<bf16_t> out({int64_t(rows.size()), q.dim(1), q.dim(2)});
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(q.ptr() + rows[i] * w, w, out.ptr() + int64_t(i) * w);
  return out;
}

}  // namespace detail

}  // namespace indexshare::diff

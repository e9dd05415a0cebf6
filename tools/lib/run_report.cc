#include "tools/lib/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "ref/overlap.h"  // row_positions

namespace indexshare::run_report {

std::vector<double> recall_rows(const Tensor<int32_t>& a, const Tensor<int32_t>& b) {
  std::vector<double> r(static_cast<size_t>(a.dim(0)));
  auto set_of = [](const Tensor<int32_t>& x, int64_t t) {
    std::vector<int32_t> s = ref::row_positions(x, t);  // valid, ascending
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return s;
  };
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < a.dim(0); ++t) {
    const std::vector<int32_t> sa = set_of(a, t), sb = set_of(b, t);
    std::vector<int32_t> common;
    std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(common));
    r[size_t(t)] = sa.empty() ? 1.0 : double(common.size()) / double(sa.size());
  }
  return r;
}

void LayerFold::add_recalls(std::span<const double> r) {
  for (double v : r) recall_sum += v;
  rows += int64_t(r.size());
}

namespace {
constexpr uint64_t kFnvPrime = 0x100000001B3ull;
}

void LayerFold::add_out(std::span<const float> out) {
  size_t i = 0;
  // Up to the next element number that is a multiple of kFoldLanes, one at a time; then whole
  // groups of lanes; then the rest.
  auto one = [&](size_t k) {
    const int lane = int((uint64_t(numel) + k) % kFoldLanes);
    uint32_t w;
    std::memcpy(&w, &out[k], sizeof w);
    ss_lane[lane] += double(out[k]) * out[k];
    fp_lane[lane] = (fp_lane[lane] ^ w) * kFnvPrime;
  };
  for (; i < out.size() && (uint64_t(numel) + i) % kFoldLanes != 0; ++i) one(i);
  for (; i + kFoldLanes <= out.size(); i += kFoldLanes)
    for (int j = 0; j < kFoldLanes; ++j) {
      uint32_t w;
      std::memcpy(&w, &out[i + size_t(j)], sizeof w);
      ss_lane[j] += double(out[i + size_t(j)]) * out[i + size_t(j)];
      fp_lane[j] = (fp_lane[j] ^ w) * kFnvPrime;
    }
  for (; i < out.size(); ++i) one(i);
  numel += int64_t(out.size());
}

double LayerFold::ss() const {
  double s = 0;
  for (double v : ss_lane) s += v;
  return s;
}

uint64_t LayerFold::fp() const {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint64_t v : fp_lane)
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xFF)) * kFnvPrime;
  return h;
}

std::string layer_line(int l, bool full, int source, bool has_own, const LayerFold& f) {
  const double rms = std::sqrt(f.ss() / double(std::max<int64_t>(1, f.numel)));
  const double recall = f.rows ? f.recall_sum / double(f.rows) : std::nan("");
  char line[256];
  std::snprintf(line, sizeof line, "layer %3d %-6s source %3d  own-vs-used recall %-6s  out rms %.5f  fingerprint %016llx\n", l,
                full ? "full" : "shared", source, has_own ? (std::to_string(recall).substr(0, 5)).c_str() : "-", rms,
                (unsigned long long)f.fp());
  return line;
}

std::string layer_line(int l, bool full, int source, const Tensor<int32_t>& own, const Tensor<int32_t>& used,
                       const Tensor<float>& out) {
  LayerFold f;
  if (own.numel() && used.numel()) f.add_recalls(recall_rows(own, used));
  f.add_out(out.data);
  return layer_line(l, full, source, own.numel() > 0, f);
}

std::string stack_layer_line(const ref::StackLayerOutputs& o) {
  return layer_line(o.layer, o.kind == LayerKind::full, o.source, o.own_topk, o.used_topk, o.attn.out);
}

}  // namespace indexshare::run_report

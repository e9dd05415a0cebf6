// indexshare diff: a GLM-5.3 KPool-DSA set (kind kpool, tools/lib/golden_kpool.h). Per DSA layer, for
// the names the candidate holds (the contract: f32 arithmetic in any order; u = 2^-24):
//   indexer.pool_logits  z = f32(gate + ape): one IEEE f32 addition, a single value in any order:
//                        bound 0
//   indexer.pool_keys    per element twice the softmax-weighted pool's error of judge/v4_bounds.h
//                        (softmax_pool_error over the P slots: (gamma(P + 8) + 3u (max z - min z) +
//                        gamma(P)) sum_j a_j |k_j|, the V4 compressor's pooled-entry line); a set
//                        written with rounding hf-bf16 adds one bf16 ulp of the golden value and
//                        2^-8 sum_j a_j |k_j| (torch's f32 exp and partial sums move a bf16
//                        rounding of a probability or of the sum by one ulp: ref/kpool/pool.h)
//   indexer.scores       v4b::index_score_bounds (the V4 indexer score's derivation: the dot products'
//                        gamma(D + 2 log2 D + 4) (it allows a Hadamard rotation KPool does not have:
//                        slightly loose), the keys' own bound above propagated through |q|, the head
//                        sum's gamma(H + 3)), times 2; -inf exactly where the pool is not visible
//   indexer.pools        compare_topk over the golden scores with ks 0, ke = the visible pools: sets
//                        modulo ties, tie rule score descending then pool ascending, -1 padded
//   indexer.history      per row, as a multiset: the P tokens of each of the row's pools (the
//                        candidate's when they passed, else the golden's)
//   indexer.tail         exact: (pos + 1) mod P tokens ending at pos, ascending, -1 padded
//   indexer.indices, attn.indices   per row, as a multiset: history + tail (tail exact: no tie
//                        freedom); a Shared layer's against its source's pools, and as sets equal
//                        to the candidate's source list when it holds it
//   indexer.pool_keys_fp8   SGLang's FP8 pages (golden_kpool.h kpool_fp8_pages), decoded, each value
//                        code x scale against the golden's: an in-bound Kbar (above) plus one bf16 ulp
//                        flip, through the Hadamard (|H| = D^-1/2 per entry: D^-1/2 sum_d e_d, and
//                        twice gamma(log2 D + 1) D^-1/2 sum_d |x_d| for its f32 butterflies), one more
//                        bf16 ulp (e2); then each side's e4m3 rounding, at most 2^-4 |value| + 2^-10 s
//                        (half a step, normal or subnormal) with the candidate's scale at most
//                        (max(amax, 1e-4) + max e2) / 448, doubled for the pow2 rule, and 4u for the
//                        f32 divide and multiply
//   attn.out, attn.lse, attn.max_logits   ref::sparse_attention over the list used (recomputed when
//                        the candidate's list differs from the golden's by ties), within
//                        cmp::attention_bounds_sm, plus the structure tests
// Named diagnoses of a failure: pools scored with max or with mean instead of the softmax weighting
// (keys, scores, pools), the tail left out or doubled (lists, attention), a Shared layer off its
// source's list (lists, attention).
#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>

#include "ref/kpool/layer.h"
#include "ref/numerics.h"
#include "tools/judge/precision.h"
#include "tools/judge/v4_bounds.h"
#include "tools/judge/walk.h"
#include "tools/lib/golden_kpool.h"

namespace indexshare::diff {

namespace {

using detail::bound_rule;
using detail::passes;
using detail::rule_of;
using detail::KindJudge;

double bf16_ulp(double x) { return x > 0 ? std::ldexp(1.0, std::ilogb(x) - 7) : 0x1p-133; }

// The pooled keys of a known mistake: each channel's max over the pool's P slots, or their mean.
Tensor<float> pooled_by(const Tensor<float>& k, int64_t P, bool max) {
  const int64_t n = k.dim(0) / P, D = k.dim(1);
  Tensor<float> out({n, D});
  for (int64_t p = 0; p < n; ++p)
    for (int64_t d = 0; d < D; ++d) {
      double acc = max ? -INFINITY : 0.0;
      for (int64_t j = 0; j < P; ++j) acc = max ? std::max(acc, double(k.at(p * P + j, d))) : acc + double(k.at(p * P + j, d));
      out.at(p, d) = float(max ? acc : acc / double(P));
    }
  return out;
}

// A row's multiset: its entries other than -1, sorted.
std::vector<int32_t> multiset(const int32_t* row, int64_t w) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < w; ++i)
    if (row[i] != -1) out.push_back(row[i]);
  std::sort(out.begin(), out.end());
  return out;
}

class KpoolJudge : public KindJudge {
 public:
  KpoolJudge(const golden::Loaded& g, const io::SafetensorsFile& c, const ref::Kernels& k)
      : KindJudge(g, c, k), lay_(golden::kpool_layout(g.manifest)), cfg_(lay_.cfg) {}
  std::set<int> layers(const std::set<int>& wanted) const;
  void layer(int l);

 private:
  std::string P(int l) const {
    const golden::KpoolLayer* x = lay_.find(l);
    return "layer " + std::to_string(l) + (x->full ? "" : " (Shared from " + std::to_string(x->source) + ")");
  }
  int64_t pos(int64_t t) const { return cfg_.s_kv - cfg_.s_q + t; }
  std::vector<int32_t> tail_of(int64_t t) const;
  std::vector<int32_t> expected_row(const Tensor<int32_t>& pools, int64_t t, int tails) const;
  std::vector<float> key_bounds(int l) const;
  void indexer(int l);
  void fp8_pages(int l, const std::vector<float>& kb);
  void pools_hypotheses(int l, const std::string& what, const std::function<bool(const Tensor<float>& kbar)>& explains);
  cmp::Report list_report(const std::string& what, const Tensor<int32_t>& cand, const Tensor<int32_t>& pools, int tails) const;
  Tensor<int32_t> list_pools(int source, const Tensor<int32_t>& list, const Tensor<int32_t>& pools) const;
  void lists(int l, Tensor<int32_t>& used);
  void attention(int l, const Tensor<int32_t>& used, const std::string& note);

  golden::KpoolLayout lay_;
  const ref::kpool::KpoolConfig& cfg_;
  std::map<int, Tensor<int32_t>> pools_;      // per Full layer: the pools its list comes from
  std::map<int, Tensor<int32_t>> cand_list_;  // per layer: the candidate's list when it holds one
  std::map<int, Tensor<int32_t>> cand_any_;   // per layer: the candidate's list as handed in, passing or not
};

std::set<int> KpoolJudge::layers(const std::set<int>& wanted) const {
  // A glm5_next model dump's inputs (golden_kpool.h kpool_dump_inputs) are passed over.
  const int n_layers = lay_.layers.empty() ? 0 : lay_.layers.back().layer + 1;
  return own_list_layers(g_, c_, n_layers, golden::kpool_outputs(), golden::kpool_dump_inputs(), "kpool",
                         "layers.{l}.indexer.pool_logits, pool_keys, scores, pools, history, tail, indices, attn.indices, "
                         "attn.out, attn.lse or attn.max_logits",
                         [this](int l) {
                           const golden::KpoolLayer* x = lay_.find(l);
                           if (!x) return "layer " + std::to_string(l) + " is not a DSA layer of the set";
                           return "the golden layer " + std::to_string(l) + " (" +
                                  (x->full ? std::string("Full") : std::string("Shared: no indexer of its own")) +
                                  ") holds no such tensor";
                         },
                         wanted);
}

std::vector<int32_t> KpoolJudge::tail_of(int64_t t) const {
  std::vector<int32_t> out;
  if (!cfg_.tail) return out;
  const int64_t n = (pos(t) + 1) % cfg_.pool;
  for (int64_t i = pos(t) - n + 1; i <= pos(t); ++i) out.push_back(int32_t(i));
  return out;
}

// Row t's tokens: the P tokens of each pool, then the tail `tails` times (1: the rule), sorted.
std::vector<int32_t> KpoolJudge::expected_row(const Tensor<int32_t>& pools, int64_t t, int tails) const {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < pools.dim(1); ++i) {
    const int32_t p = pools.at(t, i);
    if (p >= 0)
      for (int64_t j = 0; j < cfg_.pool; ++j) out.push_back(int32_t(p * cfg_.pool + j));
  }
  const std::vector<int32_t> tail = tail_of(t);
  for (int r = 0; r < tails; ++r) out.insert(out.end(), tail.begin(), tail.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<float> KpoolJudge::key_bounds(int l) const {
  const Tensor<float> k = g_.tensor<float>(nm(l, "indexer.k")), z = g_.tensor<float>(nm(l, "indexer.pool_logits"));
  const Tensor<float> gold = g_.tensor<float>(nm(l, "indexer.pool_keys"));
  const int64_t n = z.dim(0), Pn = cfg_.pool, D = cfg_.dim;
  const bool bf = cfg_.rounding == ref::kpool::PoolRounding::hf_bf16;
  std::vector<float> out(size_t(n * D));
  std::vector<double> zz(static_cast<size_t>(Pn)), kk(static_cast<size_t>(Pn));
  for (int64_t p = 0; p < n; ++p)
    for (int64_t d = 0; d < D; ++d) {
      double mag = 0, exact = 0;
      for (int64_t j = 0; j < Pn; ++j) {
        zz[size_t(j)] = z.at(p, j, d);
        kk[size_t(j)] = k.at(p * Pn + j, d);
        mag = std::max(mag, std::fabs(kk[size_t(j)]));  // >= sum_j a_j |k_j| (the a_j sum to 1)
      }
      double b = 2.0 * v4b::softmax_pool_error(zz.data(), kk.data(), size_t(Pn), &exact);
      if (bf) {
        const double x = std::fabs(double(gold.at(p, d)));
        b += bf16_ulp(x) + 0x1p-8 * mag;
      }
      out[size_t(p * D + d)] = cmp::bound_f32(b);
    }
  return out;
}

void KpoolJudge::layer(int l) {
  const golden::KpoolLayer& x = *lay_.find(l);
  if (x.full) indexer(l);
  Tensor<int32_t> used = g_.tensor<int32_t>(nm(l, "attn.indices"));
  used.shape = {cfg_.s_q, cfg_.width()};
  const Tensor<int32_t> gold = used;
  lists(l, used);
  const std::string note = used.data != gold.data ? "expected recomputed on the candidate's list (the same sets up to ties)" : "";
  used.shape = {cfg_.s_q, 1, cfg_.width()};
  if (has(l, "attn.out") || has(l, "attn.lse") || has(l, "attn.max_logits")) attention(l, used, note);
}

// A Full layer's pool logits, keys, scores and pools; pools_[l] becomes the pools its list is judged
// against (the candidate's when they pass).
void KpoolJudge::indexer(int l) {
  pools_[l] = g_.tensor<int32_t>(nm(l, "indexer.pools"));
  const std::string how = "f32 arithmetic in any order, twice the softmax-weighted pool's gamma bound (judge/kpool.cc)";
  if (has(l, "indexer.pool_logits")) {
    const Tensor<float> gold = g_.tensor<float>(nm(l, "indexer.pool_logits"));
    add(l, "indexer.pool_logits", cmp::compare_floats("", gold, candidate_float(c_, nm(l, "indexer.pool_logits"), gold.shape),
                                                      rule_of(std::vector<float>(size_t(gold.numel()), 0.0f),
                                                              "one f32 addition g + ape: the same value in any order")));
  }
  const bool need_kb = has(l, "indexer.pool_keys") || has(l, "indexer.scores") || has(l, "indexer.pools") ||
                       has(l, "indexer.pool_keys_fp8");
  const std::vector<float> kb = need_kb ? key_bounds(l) : std::vector<float>();
  if (has(l, "indexer.pool_keys_fp8")) fp8_pages(l, kb);
  const Tensor<float> q = g_.tensor<float>(nm(l, "indexer.q")), w = g_.tensor<float>(nm(l, "indexer.weights"));
  const Tensor<int32_t> ke = g_.tensor<int32_t>(nm(l, "indexer.ke")), ks({cfg_.s_q}, 0);
  if (has(l, "indexer.pool_keys")) {
    const Tensor<float> gold = g_.tensor<float>(nm(l, "indexer.pool_keys"));
    const Tensor<float> cand = candidate_float(c_, nm(l, "indexer.pool_keys"), gold.shape);
    const bool failed = add(l, "indexer.pool_keys", cmp::compare_floats("", gold, cand, rule_of(kb, how))) == cmp::Verdict::fail;
    // The precision test where the contract is f32 (rounding hf-bf16 rounds the keys to bf16 by contract).
    if (cfg_.rounding == ref::kpool::PoolRounding::f32)
      values_precision(P(l), "indexer.pool_keys", gold, cand, cfg_.pool, [&](const prec::Moved& m) {
        return ref::kpool::pool_keys(m(g_.tensor<float>(nm(l, "indexer.k")), "k"), m(g_.tensor<float>(nm(l, "indexer.pool_logits")), "z"),
                                     cfg_.rounding);
      });
    if (failed)
      pools_hypotheses(l, "indexer.pool_keys", [&](const Tensor<float>& kbar) {
        return passes(cmp::compare_floats("", kbar, cand, rule_of(kb, "")));
      });
  }
  Tensor<float> cand_scores;
  const Tensor<float> kbar = g_.tensor<float>(nm(l, "indexer.pool_keys"));
  std::vector<float> score_bound;
  std::optional<prec::ClassValues> score_values;  // the f32 contract's classes (rounding=f32 only)
  if (has(l, "indexer.scores")) {
    const Tensor<float> gold = g_.tensor<float>(nm(l, "indexer.scores"));
    cand_scores = candidate_float(c_, nm(l, "indexer.scores"), gold.shape);
    score_bound = v4b::index_score_bounds(q, kbar, w, ke, kb);
    const bool failed = add(l, "indexer.scores", cmp::compare_floats("", gold, cand_scores, rule_of(score_bound, how))) == cmp::Verdict::fail;
    if (cfg_.rounding == ref::kpool::PoolRounding::f32)  // hf-bf16 keys: a bf16 rounding flip moves a score far more
      score_values = values_precision(P(l), "indexer.scores", gold, cand_scores, cfg_.heads * cfg_.dim, [&](const prec::Moved& m) {
        return ref::kpool::pool_scores(m(q, "q"), m(kbar, "kbar"), m(w, "w"), cfg_.s_kv, cfg_.pool, k_);
      });
    if (failed)
      pools_hypotheses(l, "indexer.scores", [&](const Tensor<float>& kv) {
        const Tensor<float> s = ref::kpool::pool_scores(q, kv, w, cfg_.s_kv, cfg_.pool, k_);
        return passes(cmp::compare_floats("", s, cand_scores, rule_of(v4b::index_score_bounds(q, kv, w, ke, kb), "")));
      });
  }
  if (has(l, "indexer.pools")) {
    const Tensor<float> scores = g_.tensor<float>(nm(l, "indexer.scores"));
    const Tensor<int32_t> gold = pools_[l];
    const Tensor<int32_t> cand = candidate_int(c_, nm(l, "indexer.pools"), gold.shape, res.diagnoses);
    // Near ties within the scores' bound and, with rounding f32, the f32 contract (values_topk).
    const bool with = cand_scores.numel() > 0;
    auto select = [&](const Tensor<float>& s) {
      return ref::kpool::select_tokens(s, cfg_.s_kv, cfg_.pool, cfg_.index_topk, cfg_.tail, k_).pools;
    };
    if (values_topk(l, P(l), "indexer.pools", scores, ks, ke, gold, cand, with ? &cand_scores : nullptr, score_bound,
                    with && score_values ? &*score_values : nullptr, select) != cmp::Verdict::fail) {
      pools_[l] = cand;
    } else {
      pools_hypotheses(l, "indexer.pools", [&](const Tensor<float>& kv) {
        const Tensor<float> s = ref::kpool::pool_scores(q, kv, w, cfg_.s_kv, cfg_.pool, k_);
        const ref::kpool::Selection sel = ref::kpool::select_tokens(s, cfg_.s_kv, cfg_.pool, cfg_.index_topk, cfg_.tail, k_);
        return passes(cmp::compare_topk("", s, ks, ke, sel.pools, cand));
      });
    }
  }
}

// SGLang's FP8 pages, decoded, against the golden's (the header's bound).
void KpoolJudge::fp8_pages(int l, const std::vector<float>& kb) {
  const int64_t n = cfg_.n_pools(), D = cfg_.dim;
  const std::string name = nm(l, "indexer.pool_keys_fp8");
  const io::TensorView* v = c_.find(name);
  const Shape shape = g_.get(name).shape;
  if (v->dtype != io::DType::U8 || v->shape != shape)
    throw Error(c_.source + ": tensor '" + name + "' is " + io::dtype_name(v->dtype) + " " + shape_str(v->shape) + ", expected U8 " +
                shape_str(shape) + " (SGLang's pages of 64 pooled keys)");
  Tensor<e4m3_t> gc, cc;
  Tensor<float> gs, cs;
  golden::kpool_fp8_unpage(g_.tensor<uint8_t>(name), n, D, gc, gs);
  golden::kpool_fp8_unpage(io::as_tensor<uint8_t>(*v, c_.source), n, D, cc, cs);
  const Tensor<float> kbar = g_.tensor<float>(nm(l, "indexer.pool_keys"));
  const Tensor<float> rot = ref::kpool::sglang_pooled_fp8(kbar, lay_.fp8 == "pow2").rotated;
  constexpr double u = 0x1p-24;
  const double g_h = (std::log2(double(D)) + 1) * u / (1 - (std::log2(double(D)) + 1) * u), rs = 1.0 / std::sqrt(double(D));
  Tensor<float> gold({n, D}), cand({n, D});
  std::vector<float> bound(size_t(n * D));
  for (int64_t p = 0; p < n; ++p) {
    double e1 = 0, mag = 0, amax = 0;
    for (int64_t d = 0; d < D; ++d) {
      e1 += double(kb[size_t(p * D + d)]) + bf16_ulp(std::fabs(double(kbar.at(p, d))));
      mag += std::fabs(double(kbar.at(p, d)));
      amax = std::max(amax, std::fabs(double(rot.at(p, d))));
    }
    const double h = rs * e1 + 2 * g_h * rs * mag;
    std::vector<double> e2(static_cast<size_t>(D));
    double E = 0;
    for (int64_t d = 0; d < D; ++d) E = std::max(E, e2[size_t(d)] = h + bf16_ulp(std::fabs(double(rot.at(p, d)))));
    const double s_max = (std::max(amax, 1e-4) + E) / 448 * (lay_.fp8 == "pow2" ? 2 : 1) * (1 + u);
    for (int64_t d = 0; d < D; ++d) {
      gold.at(p, d) = e4m3_to_f32(gc.at(p, d)) * gs[p];
      cand.at(p, d) = e4m3_to_f32(cc.at(p, d)) * cs[p];
      const double r = std::fabs(double(rot.at(p, d))), e = e2[size_t(d)];
      bound[size_t(p * D + d)] = cmp::bound_f32(e + 0x1p-4 * (2 * r + e) + 0x1p-10 * (double(gs[p]) + s_max) + 4 * u * (r + e));
    }
  }
  add(l, "indexer.pool_keys_fp8", cmp::compare_floats("", gold, cand, rule_of(std::move(bound),
      "the pooled keys' bound through bf16, the Hadamard, bf16 and e4m3 with its scale (judge/kpool.cc), on code x scale")),
      "decoded: code x scale per pooled key");
}

// The known mistakes of the pooling: the slots' max, or their mean, where the softmax weighting belongs.
void KpoolJudge::pools_hypotheses(int l, const std::string& what, const std::function<bool(const Tensor<float>& kbar)>& explains) {
  const Tensor<float> k = g_.tensor<float>(nm(l, "indexer.k"));
  for (const bool max : {true, false})
    if (explains(pooled_by(k, cfg_.pool, max)))
      res.diagnoses.push_back(P(l) + ": " + what + (max ? ": pools scored with max (each channel's largest slot key)"
                                                        : ": pools scored with mean (the slots' plain average)") +
                              ", not the softmax weighting of g + ape");
}

// Rows of `cand` ([s_q, w], -1 padded) against the multiset of each row's pools' tokens plus the
// tail `tails` times; what: "history" (no tail) or "list".
cmp::Report KpoolJudge::list_report(const std::string& what, const Tensor<int32_t>& cand, const Tensor<int32_t>& pools, int tails) const {
  cmp::Report r;
  r.stats.n = cfg_.s_q;
  const int64_t w = cand.numel() / cfg_.s_q;
  auto text = [](const std::vector<int32_t>& v) {
    std::ostringstream out;
    for (size_t i = 0; i < v.size() && i < 8; ++i) out << (i ? " " : "") << v[i];
    if (v.size() > 8) out << " ...";
    return out.str();
  };
  for (int64_t t = 0; t < cfg_.s_q; ++t) {
    const std::vector<int32_t> got = multiset(&cand[t * w], w), want = expected_row(pools, t, tails);
    if (got == want) continue;
    ++r.stats.n_fail;
    if (r.mismatches.size() >= cmp::kMaxMismatches) continue;
    std::vector<int32_t> missing, extra;
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
    r.mismatches.push_back({{t}, 0, 0, 0, 0, "row " + std::to_string(t) + ": not the " + what + " of the row's pools" +
                                                 (tails ? " and its tail" : "") + (missing.empty() ? "" : "; lacks " + text(missing)) +
                                                 (extra.empty() ? "" : "; extra " + text(extra))});
  }
  if (r.stats.n_fail) {
    r.verdict = cmp::Verdict::fail;
    r.reasons.push_back(std::to_string(r.stats.n_fail) + " of " + std::to_string(cfg_.s_q) + " rows differ (as multisets)");
  }
  return r;
}

// The pools a list [s_q, w] (a history or a union list) is judged against: `pools`, or, when the list's complete visible pools
// (all P tokens present) differ from them and pass compare_topk over the source's golden scores (a
// selection that differs by exact ties), those.
Tensor<int32_t> KpoolJudge::list_pools(int source, const Tensor<int32_t>& list, const Tensor<int32_t>& pools) const {
  const int64_t S = cfg_.s_q, width = list.numel() / S, k = pools.dim(1);
  const Tensor<int32_t> ke = g_.tensor<int32_t>(nm(source, "indexer.ke"));
  Tensor<int32_t> found(pools.shape, -1);
  for (int64_t t = 0; t < S; ++t) {
    std::map<int32_t, int64_t> count;
    for (int64_t i = 0; i < width; ++i)
      if (list[t * width + i] >= 0 && list[t * width + i] / cfg_.pool < ke[t]) ++count[int32_t(list[t * width + i] / cfg_.pool)];
    int64_t j = 0;
    for (const auto& [p, c] : count)
      if (c == cfg_.pool && j < k) found.at(t, j++) = p;
  }
  if (found.data == pools.data) return pools;
  const Tensor<int32_t> ks({S}, 0);
  const Tensor<float> scores = g_.tensor<float>(nm(source, "indexer.scores"));
  return passes(cmp::compare_topk("", scores, ks, ke, g_.tensor<int32_t>(nm(source, "indexer.pools")), found)) ? found : pools;
}

// history, tail, indexer.indices and attn.indices; `used` ([s_q, width]) becomes the candidate's list
// when it passes.
void KpoolJudge::lists(int l, Tensor<int32_t>& used) {
  const golden::KpoolLayer& x = *lay_.find(l);
  const Tensor<int32_t> gold_pools = g_.tensor<int32_t>(nm(x.source, "indexer.pools"));
  if (!pools_.count(x.source)) pools_[x.source] = gold_pools;
  const Tensor<int32_t>& pools = pools_[x.source];
  const int64_t S = cfg_.s_q, width = cfg_.width();
  if (has(l, "indexer.history")) {
    const Shape shape = g_.get(nm(l, "indexer.history")).shape;
    const Tensor<int32_t> cand = candidate_int(c_, nm(l, "indexer.history"), shape, res.diagnoses);
    add(l, "indexer.history", list_report("tokens", cand, list_pools(x.source, cand, pools), 0));
  }
  if (has(l, "indexer.tail")) {
    const Tensor<int32_t> gold = g_.tensor<int32_t>(nm(l, "indexer.tail"));
    Tensor<int32_t> want(gold.shape, -1);
    for (int64_t t = 0; t < S; ++t) {
      const std::vector<int32_t> tail = tail_of(t);
      std::copy(tail.begin(), tail.end(), &want.at(t, 0));
    }
    add(l, "indexer.tail", cmp::compare_exact("", want, candidate_int(c_, nm(l, "indexer.tail"), gold.shape, res.diagnoses)));
  }
  if (pools.data != gold_pools.data) {  // the source's pools differ from the golden's by ties: their list
    used = Tensor<int32_t>({S, width}, -1);
    for (int64_t t = 0; t < S; ++t) {
      std::vector<int32_t> row;
      for (int64_t i = 0; i < pools.dim(1); ++i)
        for (int64_t j = 0; j < cfg_.pool && pools.at(t, i) >= 0; ++j) row.push_back(int32_t(pools.at(t, i) * cfg_.pool + j));
      for (int32_t v : tail_of(t)) row.push_back(v);
      std::copy(row.begin(), row.end(), &used.at(t, 0));
    }
  }
  for (const char* n : {"indexer.indices", "attn.indices"}) {
    if (!has(l, n)) continue;
    const Shape shape = g_.get(nm(l, n)).shape;
    Tensor<int32_t> cand = candidate_int(c_, nm(l, n), shape, res.diagnoses);
    cand.shape = {S, width};
    const Tensor<int32_t> row_pools = list_pools(x.source, cand, pools);
    cmp::Report r = list_report("tokens", cand, row_pools, 1);
    if (!x.full && cand_list_.count(x.source) && r.verdict != cmp::Verdict::fail)
      for (int64_t t = 0; t < S; ++t)
        if (multiset(&cand[t * width], width) != multiset(&cand_list_[x.source][t * width], width)) {
          r.verdict = cmp::Verdict::fail;
          r.reasons.push_back("row " + std::to_string(t) + " is not the candidate's list of the source layer " + std::to_string(x.source));
          break;
        }
    const bool ok = add(l, n, std::move(r), x.full ? "" : "judged on its source layer " + std::to_string(x.source) + "'s pools") !=
                    cmp::Verdict::fail;
    // A Shared layer that holds exactly the candidate's own (failing) source list is not off its
    // source: the source layer's report names what is wrong there.
    const auto src_any = x.full ? cand_any_.end() : cand_any_.find(x.source);
    bool follows_source = src_any != cand_any_.end();
    for (int64_t t = 0; t < S && follows_source; ++t)
      follows_source = multiset(&cand[t * width], width) == multiset(&src_any->second[t * width], width);
    cand_any_[l] = cand;
    if (ok) {
      used = cand;
      cand_list_[l] = cand;
      continue;
    }
    // The mistakes: failing rows that are the rule's rows without the tail, or with it twice.
    bool named = false;
    for (const int tails : {0, 2}) {
      int64_t explained = 0, failing = 0;
      for (int64_t t = 0; t < S; ++t) {
        const std::vector<int32_t> got = multiset(&cand[t * width], width);
        if (got == expected_row(row_pools, t, 1)) continue;
        ++failing;
        explained += got == expected_row(row_pools, t, tails);
      }
      if (failing && explained == failing && (named = true))
        res.diagnoses.push_back(P(l) + ": " + n + (tails ? ": the tail doubled (the query's incomplete pool's tokens twice)"
                                                          : ": the tail left out (the query's incomplete pool's tokens missing)"));
    }
    if (!x.full)
      for (const golden::KpoolLayer& o : lay_.layers) {
        if (!o.full || o.layer == x.source) continue;
        const Tensor<int32_t> other = g_.tensor<int32_t>(nm(o.layer, "indexer.indices"));
        bool same = true;
        for (int64_t t = 0; t < S && same; ++t) same = multiset(&cand[t * width], width) == multiset(&other[t * width], width);
        if (same && (named = true))
          res.diagnoses.push_back(P(l) + ": " + n + ": a Shared layer off its source's list: it holds layer " + std::to_string(o.layer) +
                                  "'s list, not its source layer " + std::to_string(x.source) + "'s");
      }
    if (!x.full && !named && !follows_source)
      res.diagnoses.push_back(P(l) + ": " + n + ": a Shared layer off its source's list (not its source layer " + std::to_string(x.source) +
                              "'s union list)");
  }
}

void KpoolJudge::attention(int l, const Tensor<int32_t>& used, const std::string& note) {
  const int64_t S = cfg_.s_q, H = cfg_.h_q, dv = cfg_.d_v, width = cfg_.width();
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(nm(l, "attn.q")), kv = g_.tensor<bf16_t>(nm(l, "attn.kv"));
  const float sm = cfg_.sm_scale;
  ref::AttentionOut e;
  if (note.empty()) {
    e.out = g_.tensor<float>(nm(l, "attn.out"));
    e.lse = g_.tensor<float>(nm(l, "attn.lse"));
    e.max_logits = g_.tensor<float>(nm(l, "attn.max_logits"));
  } else {
    e = k_.sparse_attention(q, kv, used, sm, dv, nullptr, nullptr);
  }
  const cmp::AttentionBounds b = k_.attention_bounds_sm(q, kv, used, sm, dv, nullptr, nullptr, e, nullptr);
  auto spec = [&](const char* n, int64_t cols, double floor) { return detail::attention_spec(n, S, H, cols, floor); };
  // The precision test (judge/precision.h, kind attention), emulated on sampled query rows of the
  // golden's q and kv over the list used.
  const std::vector<int64_t> rows = prec::sample_rows(used, nullptr, kv.dim(0), H, kv.dim(2), dv);
  prec::AttentionClasses classes(rows, [&q, &rows] { return detail::q_at_rows(q, rows); }, kv, used, nullptr, nullptr, sm, dv);
  auto judged = [&](const char* n, const Tensor<float>& gold, const Tensor<float>& cand, const std::vector<float>& bound, int64_t cols,
                    double floor, int which) {
    add(l, n, cmp::compare_structured("", gold, cand, bound_rule(bound, -1), spec(n, cols, floor)), note);
    precision(P(l), n, prec::at_rows(gold, rows), prec::at_rows(cand, rows), prec::Kind::attention, classes.values(which));
    return res.tensors.back().report.verdict == cmp::Verdict::fail;
  };
  Tensor<float> co;
  bool failed = false;
  if (has(l, "attn.out")) {
    co = candidate_float(c_, nm(l, "attn.out"), {S, H, dv});
    failed = judged("attn.out", e.out, co, b.out, dv, cmp::kFloorOut, 0);
  }
  if (has(l, "attn.lse")) judged("attn.lse", e.lse, candidate_float(c_, nm(l, "attn.lse"), {S, H}), b.lse, 1, cmp::kFloorLse, 1);
  if (has(l, "attn.max_logits"))
    judged("attn.max_logits", e.max_logits, candidate_float(c_, nm(l, "attn.max_logits"), {S, H}), b.max_logits, 1, cmp::kFloorLse, 2);
  if (!failed) return;
  // The attention over a mistaken list, within the same kind of bound, names the mistake.
  auto over = [&](const Tensor<int32_t>& list) {
    const ref::AttentionOut o = k_.sparse_attention(q, kv, list, sm, dv, nullptr, nullptr);
    const cmp::AttentionBounds ob = k_.attention_bounds_sm(q, kv, list, sm, dv, nullptr, nullptr, o, nullptr);
    return passes(cmp::compare_floats("", o.out, co, bound_rule(ob.out, -1)));
  };
  for (const int tails : {0, 2}) {  // the tail doubled where the row has room for it
    Tensor<int32_t> list({S, 1, width}, -1);
    bool differs = false;
    for (int64_t t = 0; t < S; ++t) {
      std::vector<int32_t> row = multiset(&used[t * width], width);
      const std::vector<int32_t> tail = tail_of(t);
      const bool room = !tails || int64_t(row.size() + tail.size()) <= width;
      for (int32_t v : room ? tail : std::vector<int32_t>()) {
        const auto it = std::find(row.begin(), row.end(), v);
        if (tails) row.push_back(v);
        else if (it != row.end()) row.erase(it);
      }
      differs = differs || (room && !tail.empty());
      std::copy(row.begin(), row.end(), &list[t * width]);
    }
    if (differs && over(list))
      res.diagnoses.push_back(P(l) + (tails ? ": attn.out is the attention with the tail doubled" : ": attn.out is the attention without the tail"));
  }
  const golden::KpoolLayer& x = *lay_.find(l);
  if (!x.full)
    for (const golden::KpoolLayer& o : lay_.layers)
      if (o.full && o.layer != x.source && over(g_.tensor<int32_t>(nm(o.layer, "attn.indices"))))
        res.diagnoses.push_back(P(l) + ": attn.out is the attention over layer " + std::to_string(o.layer) +
                                "'s list: a Shared layer off its source's list");
}

}  // namespace

Result judge_kpool(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k) {
  // A Shared layer's list is checked against its source's: sources precede (layers ascending).
  return detail::judge_layers<KpoolJudge>(g, c, wanted, k);
}

}  // namespace indexshare::diff

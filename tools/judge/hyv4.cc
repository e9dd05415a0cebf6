// indexshare diff: a Hunyuan HY V4 set (kind hyv4, tools/lib/golden_hyv4.h). Per layer, for the names
// the candidate holds:
//   indexer.k_norm, q_rope, k_rope, weights, scores   per-element bounds (judge/hyv4_bounds.h),
//                    each from the golden's inputs, so a candidate that computes its own in-bound
//                    intermediates passes downstream
//   indexer.topk     compare_topk over the golden scores (the causal window, sets, tie rule; near
//                    ties by the candidate's own scores within their bound)
//   attn.indices     the source layer's top-k (its own on a Full layer) as a top-k over the source's
//                    scores, and equal as sets per row to the candidate's source top-k when it holds it
//   attn.out, attn.lse, attn.max_logits   the attention recomputed on the indices used (when they
//                    differ from the golden's) with the unscaled sink, within cmp::attention_bounds_sm,
//                    plus the structure tests
//   attn.o_v, attn.gated   W_uv and the sigmoid gate of the expected out, within hyb::o_v_bounds and
//                    hyb::gated_bounds (attn.out's bound carried through)
// Named diagnoses of a failure: the indexer's RoPE on the leading dims (the RoPE layout swapped: q_rope,
// k_rope, scores, top-k), the sink scaled by sm_scale or left out (out, o_v, gated), the gate left
// out (gated), a Shared layer off its source (attn.indices and the attention on another Full layer's
// top-k).
#include <algorithm>
#include <map>
#include <memory>

#include "ref/numerics.h"
#include "tools/judge/hyv4_bounds.h"
#include "tools/judge/precision.h"
#include "tools/judge/walk.h"
#include "tools/lib/golden_hyv4.h"

namespace indexshare::diff {

namespace {

using detail::bound_rule;
using detail::passes;
using detail::rule_of;
using detail::KindJudge;
namespace hy = ref::hyv4;

Tensor<int32_t> as_2d(Tensor<int32_t> t) {
  t.shape = {t.dim(0), t.numel() / std::max<int64_t>(t.dim(0), 1)};
  return t;
}

// The golden's indexer inputs of a Full layer and the bounds of its intermediates.
struct IndexerData {
  Tensor<float> q, k, k_norm_w, k_norm_b, raw;
  Tensor<int32_t> ks, ke;
  std::vector<float> kn_b, q_b, k_b, w_b, s_b;
};

// An expected attention (the golden's or an alternative's) with its bounds.
struct Expect {
  hy::AttentionOutputs o;
  cmp::AttentionBounds b;
  std::vector<float> ov_b, g_b;
};

class HyJudge : public KindJudge {
 public:
  HyJudge(const golden::Loaded& g, const io::SafetensorsFile& c, const ref::Kernels& k)
      : KindJudge(g, c, k), lay_(golden::hyv4_layout(g.manifest)), cfg_(lay_.spec.cfg) {}
  std::set<int> layers(const std::set<int>& wanted) const;
  void layer(int l);

 private:
  std::string P(int l) const {
    return "layer " + std::to_string(l) + (lay_.schedule.is_full(l) ? "" : " (Shared from " + std::to_string(lay_.schedule.source(l)) + ")");
  }
  IndexerData indexer_data(int l, hy::RopeSlice slice) const;
  // An input stored BF16 (generated) or F32 (a model dump's), as f32 values.
  Tensor<float> values(const std::string& name) const {
    return g_.get(name).dtype == io::DType::F32 ? g_.tensor<float>(name) : bf16_to_f32(g_.tensor<bf16_t>(name));
  }
  hy::IndexerParams params(hy::RopeSlice slice) const {
    hy::IndexerParams p = hy::indexer_params(cfg_);
    p.slice = slice;
    return p;
  }
  void indexer(int l);
  void rope_hypothesis(int l, const std::map<std::string, Tensor<float>>& cand, const Tensor<int32_t>* topk);
  Tensor<int32_t> indices(int l);
  Expect expect(int l, const Tensor<int32_t>& indices2d, const Tensor<float>& sink) const;
  prec::ClassValues through_w_uv(prec::ClassValues out, int l, const std::vector<int64_t>& rows, bool gated) const;
  void attention(int l, const Tensor<int32_t>& used2d, const std::string& note);
  void attention_hypotheses(int l, const Tensor<int32_t>& used2d, const std::map<std::string, Tensor<float>>& failed,
                            const Expect& gold);
  bool within(const Expect& e, const std::map<std::string, Tensor<float>>& failed) const;

  golden::Hyv4Layout lay_;
  const hy::Config& cfg_;
  std::map<int, Tensor<int32_t>> cand_topk_;  // the candidate's passing top-k per Full layer
};

std::set<int> HyJudge::layers(const std::set<int>& wanted) const {
  return own_list_layers(g_, c_, lay_.schedule.n_layers(), golden::hyv4_outputs(), golden::hyv4_dump_inputs(), "hyv4",
                         "layers.{l}.indexer.k_norm, q_rope, k_rope, weights, scores, topk, attn.indices, out, lse, "
                         "max_logits, o_v or gated",
                         [](int l) {
                           return "the golden layer " + std::to_string(l) + " is a Shared layer (no indexer of its own): it "
                                  "holds no such tensor";
                         },
                         wanted);
}

void HyJudge::layer(int l) {
  if (lay_.schedule.is_full(l)) indexer(l);
  const Tensor<int32_t> used = indices(l);
  const std::string note = used.data != g_.tensor<int32_t>(nm(l, "attn.indices")).data
                               ? "expected recomputed on the candidate's indices (the same sets up to ties)" : "";
  for (const char* n : {"attn.out", "attn.lse", "attn.max_logits", "attn.o_v", "attn.gated"})
    if (has(l, n)) return attention(l, used, note);
}

IndexerData HyJudge::indexer_data(int l, hy::RopeSlice slice) const {
  IndexerData d;
  const std::string p = nm(l, "indexer.");
  d.q = values(p + "q");
  d.k = values(p + "k");
  d.k_norm_w = g_.tensor<float>(p + "k_norm_w");
  d.k_norm_b = g_.tensor<float>(p + "k_norm_b");
  d.raw = g_.tensor<float>(p + "weights_raw");
  d.ks = g_.tensor<int32_t>(p + "ks");
  d.ke = g_.tensor<int32_t>(p + "ke");
  const hy::IndexerParams ip = params(slice);
  const hy::IndexerOutputs o = slice == hy::RopeSlice::trailing ? hy::IndexerOutputs{}
                                                                 : hy::run_indexer(d.q, d.k, d.k_norm_w, d.k_norm_b, d.raw, ip, k_);
  const Tensor<float> k_norm = g_.tensor<float>(p + "k_norm");
  d.kn_b = hyb::k_norm_bounds(d.k, d.k_norm_w, d.k_norm_b);
  d.q_b = hyb::rope_bounds(d.q, {}, cfg_.s_kv - cfg_.s_q, ip);
  d.k_b = hyb::rope_bounds(k_norm, d.kn_b, 0, ip);
  const Tensor<float> w = g_.tensor<float>(p + "weights");
  d.w_b = hyb::weights_bounds(w);
  if (slice == hy::RopeSlice::trailing)
    d.s_b = hyb::score_bounds(g_.tensor<float>(p + "q_rope"), g_.tensor<float>(p + "k_rope"), w, d.ke, d.q_b, d.k_b, d.w_b);
  else
    d.s_b = hyb::score_bounds(o.q_rope, o.k_rope, o.weights, d.ke, d.q_b, d.k_b, d.w_b);
  return d;
}

void HyJudge::indexer(int l) {
  bool any = false;
  for (const char* n : {"indexer.k_norm", "indexer.q_rope", "indexer.k_rope", "indexer.weights", "indexer.scores", "indexer.topk"})
    any = any || has(l, n);
  if (!any) return;
  const IndexerData d = indexer_data(l, hy::RopeSlice::trailing);
  const std::string how = "f32 arithmetic in any order, twice one evaluation's error (judge/hyv4_bounds.h)";
  std::map<std::string, Tensor<float>> failed;
  const std::pair<const char*, const std::vector<float>*> floats[] = {{"indexer.k_norm", &d.kn_b}, {"indexer.q_rope", &d.q_b},
                                                                      {"indexer.k_rope", &d.k_b},  {"indexer.weights", &d.w_b},
                                                                      {"indexer.scores", &d.s_b}};
  Tensor<float> cand_scores;
  prec::ClassValues score_values;
  for (const auto& [n, b] : floats) {
    if (!has(l, n)) continue;
    const Tensor<float> gold = g_.tensor<float>(nm(l, n));
    Tensor<float> cand = candidate_float(c_, nm(l, n), gold.shape);
    add(l, n, cmp::compare_floats("", gold, cand, rule_of(*b, how)));
    if (std::string(n) != "indexer.scores") {
      // The precision test of the steps before the scores (LayerNorm over D, RoPE, two products).
      const std::string name = n;
      values_precision(P(l), n, gold, cand, name == "indexer.q_rope" || name == "indexer.weights" ? 2 : cfg_.dim,
                       [&d, name, this](const prec::Moved& m) {
                         hy::IndexerOutputs o = hy::indexer_front(m(d.q, "q"), m(d.k, "k"), d.k_norm_w, d.k_norm_b,
                                                                  m(d.raw, "weights_raw"), params(hy::RopeSlice::trailing));
                         return name == "indexer.k_norm" ? o.k_norm : name == "indexer.q_rope" ? o.q_rope
                                : name == "indexer.k_rope" ? o.k_rope : o.weights;
                       });
    } else {
      // The precision test: the whole indexer (LayerNorm, RoPE, weights, scores) on moved inputs.
      score_values = values_precision(P(l), n, gold, cand, cfg_.heads * cfg_.dim, [&](const prec::Moved& m) {
        return hy::run_indexer(m(d.q, "q"), m(d.k, "k"), d.k_norm_w, d.k_norm_b, m(d.raw, "weights_raw"), params(hy::RopeSlice::trailing), k_)
            .scores;
      });
      cand_scores = cand;
    }
    if (res.tensors.back().report.verdict == cmp::Verdict::fail) failed[n] = std::move(cand);  // bound or precision
  }
  Tensor<int32_t> cand_topk;
  if (has(l, "indexer.topk")) {
    const Tensor<int32_t> gold = g_.tensor<int32_t>(nm(l, "indexer.topk"));
    cand_topk = candidate_int(c_, nm(l, "indexer.topk"), gold.shape, res.diagnoses);
    // Near ties within the scores' bound and the f32 contract (values_topk).
    const bool with = cand_scores.numel() > 0;
    if (values_topk(l, P(l), "indexer.topk", g_.tensor<float>(nm(l, "indexer.scores")), d.ks, d.ke, gold, cand_topk,
                    with ? &cand_scores : nullptr, d.s_b, with ? &score_values : nullptr,
                    [&](const Tensor<float>& s) { return k_.topk(s, d.ks, d.ke, gold.dim(1)); }) == cmp::Verdict::fail) {
      failed["indexer.topk"] = Tensor<float>();
    } else {
      cand_topk_[l] = cand_topk;
    }
  }
  if (!failed.empty()) rope_hypothesis(l, failed, failed.count("indexer.topk") ? &cand_topk : nullptr);
}

// The indexer's RoPE on the leading dims (DeepSeek-V3.2's layout) in place of the trailing ones: each
// failed tensor against the indexer with that layout, within its bounds for that layout.
void HyJudge::rope_hypothesis(int l, const std::map<std::string, Tensor<float>>& cand, const Tensor<int32_t>* topk) {
  const IndexerData d = indexer_data(l, hy::RopeSlice::leading);
  const hy::IndexerOutputs o = hy::run_indexer(d.q, d.k, d.k_norm_w, d.k_norm_b, d.raw, params(hy::RopeSlice::leading), k_);
  const std::map<std::string, std::pair<const Tensor<float>*, const std::vector<float>*>> alt = {
      {"indexer.q_rope", {&o.q_rope, &d.q_b}}, {"indexer.k_rope", {&o.k_rope, &d.k_b}}, {"indexer.scores", {&o.scores, &d.s_b}}};
  std::string names;
  for (const auto& [n, t] : cand) {
    const auto a = alt.find(n);
    bool fits = false;
    if (a != alt.end()) fits = passes(cmp::compare_floats("", *a->second.first, t, rule_of(*a->second.second, "")));
    if (n == "indexer.topk" && topk)
      fits = passes(cmp::compare_topk("", o.scores, d.ks, d.ke, o.indices, *topk));
    if (fits) names += (names.empty() ? "" : ", ") + n;
  }
  if (!names.empty())
    res.diagnoses.push_back(P(l) + ": " + names + " match the indexer with its RoPE on the leading " + std::to_string(cfg_.rope) +
                            " dims of each head instead of the trailing ones (the RoPE layout swapped: DeepSeek-V3.2's)");
}

// attn.indices: the source's top-k (the candidate's when it holds a passing one). Returns the
// indices [s_q, k] the attention is judged on.
Tensor<int32_t> HyJudge::indices(int l) {
  const int src = lay_.schedule.source(l);
  const auto cs = cand_topk_.find(src);
  Tensor<int32_t> expected = cs != cand_topk_.end() ? cs->second : as_2d(g_.tensor<int32_t>(nm(l, "attn.indices")));
  if (!has(l, "attn.indices")) return expected;
  const Tensor<int32_t> gold = g_.tensor<int32_t>(nm(l, "attn.indices"));
  const Tensor<int32_t> cand = as_2d(candidate_int(c_, nm(l, "attn.indices"), gold.shape, res.diagnoses));
  const std::string sp = nm(src, "indexer.");
  const Tensor<float> scores = g_.tensor<float>(sp + "scores");
  const Tensor<int32_t> ks = g_.tensor<int32_t>(sp + "ks"), ke = g_.tensor<int32_t>(sp + "ke");
  cmp::Report r = cmp::compare_topk("", scores, ks, ke, as_2d(gold), cand);
  if (passes(r) && cs != cand_topk_.end()) {  // the candidate's own source top-k, as sets per row
    const detail::RowsAgainst ra = detail::rows_against(cand, expected, cfg_.s_kv);
    if (!ra.same_sets) {
      r.verdict = cmp::Verdict::fail;
      r.reasons.push_back("the rows are not the candidate's own top-k of layer " + std::to_string(src) + " as sets");
    }
  }
  const bool ok = add(l, "attn.indices", std::move(r), src == l ? "" : "judged on its source layer " + std::to_string(src) + "'s scores") !=
                  cmp::Verdict::fail;
  if (ok) return cand;
  for (int f : lay_.schedule.full_layers())  // another Full layer's top-k: the Shared layer off its source
    if (f != src && passes(cmp::compare_topk("", g_.tensor<float>(nm(f, "indexer.scores")), ks, ke, g_.tensor<int32_t>(nm(f, "indexer.topk")), cand)))
      res.diagnoses.push_back(P(l) + ": attn.indices are layer " + std::to_string(f) + "'s top-k, not its source layer " +
                              std::to_string(src) + "'s (another Full layer's positions: a Shared layer off its source)");
  res.diagnoses.push_back(P(l) + ": attn.indices are not the top-k of layer " + std::to_string(src) +
                          ": the attention is judged on the golden's indices");
  return expected;
}

Expect HyJudge::expect(int l, const Tensor<int32_t>& indices2d, const Tensor<float>& sink) const {
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(nm(l, "attn.q")), kv = g_.tensor<bf16_t>(nm(l, "attn.kv"));
  const Tensor<float> w_uv = bf16_to_f32(g_.tensor<bf16_t>(nm(l, "attn.w_uv"))), gate = bf16_to_f32(g_.tensor<bf16_t>(nm(l, "attn.gate")));
  Expect e;
  e.o = hy::gated_attention(q, kv, indices2d, sink, cfg_.sm_scale, cfg_.kv_lora, &w_uv, gate, k_);
  Tensor<int32_t> idx = indices2d;
  idx.shape = {indices2d.dim(0), 1, indices2d.dim(1)};
  e.b = k_.attention_bounds_sm(q, kv, idx, cfg_.sm_scale, cfg_.kv_lora, nullptr, sink.numel() ? &sink : nullptr, e.o.attn, nullptr);
  e.ov_b = hyb::o_v_bounds(e.o.attn.out, e.b.out, w_uv);
  e.g_b = hyb::gated_bounds(e.o.o_v, e.ov_b, gate);
  return e;
}

// The attention classes' out (at the sampled rows) carried through W_uv, and with `gated` the
// sigmoid gate, as gated_attention does: the classes of attn.o_v and attn.gated (each member's
// o_v summed over d_v in double, rounded to f32; the gate's own f32 steps are far below a class).
prec::ClassValues HyJudge::through_w_uv(prec::ClassValues out, int l, const std::vector<int64_t>& rows, bool gated) const {
  const int64_t hq = cfg_.h_q, dv = cfg_.kv_lora, v = cfg_.v_dim;
  auto w_uv = std::make_shared<Tensor<float>>(bf16_to_f32(g_.tensor<bf16_t>(nm(l, "attn.w_uv"))));
  auto gate = std::make_shared<Tensor<float>>(bf16_to_f32(g_.tensor<bf16_t>(nm(l, "attn.gate"))));
  return [out = std::move(out), w_uv, gate, rows, hq, dv, v, gated](const std::string& cls) {
    std::vector<std::vector<double>> members;
    for (const std::vector<double>& o : out(cls)) {
      std::vector<double> x(rows.size() * size_t(hq * v));
      for (size_t r = 0; r < rows.size(); ++r)
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t i = 0; i < v; ++i) {
            double acc = 0;
            for (int64_t d = 0; d < dv; ++d) acc += double(w_uv->at(h, i, d)) * o[(r * size_t(hq) + size_t(h)) * size_t(dv) + size_t(d)];
            float y = float(acc);
            if (gated) y *= float(1.0 / (1.0 + exp_portable(-double(gate->at(rows[r], h, i)))));
            x[(r * size_t(hq) + size_t(h)) * size_t(v) + size_t(i)] = double(y);
          }
      members.push_back(std::move(x));
    }
    return members;
  };
}

void HyJudge::attention(int l, const Tensor<int32_t>& used2d, const std::string& note) {
  const int64_t sq = cfg_.s_q, hq = cfg_.h_q;
  const Tensor<float> sink = cfg_.sink ? g_.tensor<float>(nm(l, "attn.sink")) : Tensor<float>();
  const Expect e = expect(l, used2d, sink);
  auto spec = [&](const char* n, int64_t cols, double floor) { return detail::attention_spec(n, sq, hq, cols, floor); };
  const std::string via = "attn.out's bound through W_uv and the gate (judge/hyv4_bounds.h)";
  struct Item {
    const char* name;
    const Tensor<float>* want;
    cmp::FloatRule rule;
    int64_t cols;
    double floor;
  };
  const Item items[] = {{"attn.out", &e.o.attn.out, bound_rule(e.b.out, -1), cfg_.kv_lora, cmp::kFloorOut},
                        {"attn.lse", &e.o.attn.lse, bound_rule(e.b.lse, -1), 1, cmp::kFloorLse},
                        {"attn.max_logits", &e.o.attn.max_logits, bound_rule(e.b.max_logits, -1), 1, cmp::kFloorLse},
                        {"attn.o_v", &e.o.o_v, rule_of(e.ov_b, via), cfg_.v_dim, cmp::kFloorOut},
                        {"attn.gated", &e.o.gated, rule_of(e.g_b, via), cfg_.v_dim, cmp::kFloorOut}};
  // The precision test of attn.out, lse and max_logits (judge/precision.h, kind attention),
  // emulated on sampled query rows of the golden's q and kv over the indices used.
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(nm(l, "attn.q")), kv = g_.tensor<bf16_t>(nm(l, "attn.kv"));
  Tensor<int32_t> idx = used2d;
  idx.shape = {used2d.dim(0), 1, used2d.dim(1)};
  const std::vector<int64_t> rows = prec::sample_rows(idx, nullptr, kv.dim(0), hq, kv.dim(2), cfg_.kv_lora);
  prec::AttentionClasses classes(rows, [&q, &rows] { return detail::q_at_rows(q, rows); }, kv, idx, nullptr,
                                 sink.numel() ? &sink : nullptr, cfg_.sm_scale, cfg_.kv_lora);
  std::map<std::string, Tensor<float>> failed;
  for (size_t i = 0; i < std::size(items); ++i) {
    const Item& it = items[i];
    if (!has(l, it.name)) continue;
    Tensor<float> cand = candidate_float(c_, nm(l, it.name), it.want->shape);
    add(l, it.name, cmp::compare_structured("", *it.want, cand, it.rule, spec(it.name, it.cols, it.floor)), note);
    precision(P(l), it.name, prec::at_rows(*it.want, rows), prec::at_rows(cand, rows), prec::Kind::attention,
              i < 3 ? classes.values(int(i)) : through_w_uv(classes.values(0), l, rows, i == 4));
    if (res.tensors.back().report.verdict == cmp::Verdict::fail) failed[it.name] = std::move(cand);
  }
  if (!failed.empty()) attention_hypotheses(l, used2d, failed, e);
}

// Whether every failed tensor among attn.out, o_v and gated lies within e's bounds (at least one tested).
bool HyJudge::within(const Expect& e, const std::map<std::string, Tensor<float>>& failed) const {
  const std::map<std::string, std::pair<const Tensor<float>*, const std::vector<float>*>> m = {
      {"attn.out", {&e.o.attn.out, &e.b.out}}, {"attn.o_v", {&e.o.o_v, &e.ov_b}}, {"attn.gated", {&e.o.gated, &e.g_b}}};
  int tested = 0;
  for (const auto& [n, cand] : failed) {
    const auto it = m.find(n);
    if (it == m.end()) continue;
    ++tested;
    if (!passes(cmp::compare_floats("", *it->second.first, cand, rule_of(*it->second.second, "")))) return false;
  }
  return tested > 0;
}

void HyJudge::attention_hypotheses(int l, const Tensor<int32_t>& used, const std::map<std::string, Tensor<float>>& failed,
                                   const Expect& gold) {
  if (cfg_.sink) {
    Tensor<float> scaled = g_.tensor<float>(nm(l, "attn.sink"));
    for (float& s : scaled.data) s *= cfg_.sm_scale;
    if (within(expect(l, used, scaled), failed))
      res.diagnoses.push_back(P(l) + ": the attention matches the sink scaled by sm_scale (HY V4's sink is an unscaled logit, "
                                     "next to the scaled q.k)");
    if (within(expect(l, used, Tensor<float>()), failed)) res.diagnoses.push_back(P(l) + ": the attention matches the sink left out");
  }
  const auto g = failed.find("attn.gated");
  if (g != failed.end() && passes(cmp::compare_floats("", gold.o.o_v, g->second, rule_of(gold.ov_b, ""))))
    res.diagnoses.push_back(P(l) + ": attn.gated is attn.o_v without the output gate (sigmoid(gate) left out)");
  const int src = lay_.schedule.source(l);
  const Tensor<float> sink = cfg_.sink ? g_.tensor<float>(nm(l, "attn.sink")) : Tensor<float>();
  if (src != l)
    for (int f : lay_.schedule.full_layers())
      if (f != src && within(expect(l, g_.tensor<int32_t>(nm(f, "indexer.topk")), sink), failed))
        res.diagnoses.push_back(P(l) + ": the attention matches layer " + std::to_string(f) + "'s top-k, not its source layer " +
                                std::to_string(src) + "'s (another Full layer's positions: a Shared layer off its source)");
}

}  // namespace

Result judge_hyv4(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k) {
  // Layers ascending: a Shared layer's source (a Full layer before it) is judged first.
  return detail::judge_layers<HyJudge>(g, c, wanted, k);
}

}  // namespace indexshare::diff

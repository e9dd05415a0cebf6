// indexshare diff: a DeepSeek-V4 set (kind v4, tools/lib/golden_v4.h). Per layer, for the names the
// candidate holds:
//   compressor.entries, indexer.entries, indexer.scores   per-element bounds (judge/v4_bounds.h)
//   indexer.blocks   compare_topk over the golden scores (ks 0, ke the causal block end; sets, tie
//                    rule); a Shared C4A layer's against its source's scores, and equal as sets per
//                    row to the candidate's source blocks when it holds them
//   attn.indices     per row: the W window slots exact; the rest, as a multiset, T + the blocks the
//                    candidate holds for the layer (else the golden's), HCA / SWA the golden's
//   attn.out, attn.lse, attn.max_logits   the attention recomputed on (attn.q, attn.kv = kv_full,
//                    the indices used, attn.sink) when they differ from the golden's, within
//                    cmp::attention_bounds_sm and FlashMLA's MODEL1 prefill criteria (judge/anchors.h:
//                    abs 8e-4 or rel 3.01/128 and cos_diff 7e-6; lse abs 1e-6 or rel 2.01/65536), plus
//                    the structure tests and the precision test (as the stack judge)
//   attn.out_rotated the inverse RoPE of the expected out, within v4b::rotated_bounds
// A deepseek_v4 model dump (python -m indexshare.dump) is judged as it is: its input tensors are
// skipped. Named diagnoses of a failure: judge/v4.cc *_hypotheses (entries without the norm weight,
// at bf16 precision or without RoPE, CSA's window halves swapped or its previous window left out;
// blocks off by one or not the source's, or shared as another freq rule or one counted over every
// layer shares them; attention without the
// sink, without its window or without its compressed entries; lse with the sink; out_rotated
// without or with the forward rotation).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/v4/layer.h"
#include "tools/judge/anchors.h"
#include "tools/judge/emulate.h"
#include "tools/judge/precision.h"
#include "tools/judge/v4_bounds.h"
#include "tools/judge/walk.h"
#include "tools/lib/golden_v4.h"

namespace indexshare::diff {

namespace {

using ref::v4::LayerType;
using detail::bound_rule;
using detail::passes;
using detail::rule_of;
using detail::KindJudge;

// Whether row t of a and b [rows, k] hold the same entries (as multisets).
bool same_row_set(const Tensor<int32_t>& a, const Tensor<int32_t>& b, int64_t t) {
  const int64_t k = a.dim(1);
  std::vector<int32_t> x(&a[t * k], &a[t * k] + k), y(&b[t * k], &b[t * k] + k);
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  return x == y;
}

const std::vector<std::string> kJudgedV4 = {"compressor.entries", "indexer.entries", "indexer.scores",  "indexer.blocks",
                                            "attn.indices",       "attn.out",        "attn.out_rotated", "attn.lse",
                                            "attn.max_logits",    "attn.kv"};

class V4Judge : public KindJudge {
 public:
  V4Judge(const golden::Loaded& g, const io::SafetensorsFile& c, const ref::Kernels& k)
      : KindJudge(g, c, k), lay_(golden::v4_layout(g.manifest)) {}
  std::set<int> layers(const std::set<int>& wanted) const;
  void layer(int l);
  void finish() { schedule_hypotheses(); }

 private:
  // The golden's inputs of layer l's compressor (part "compressor") or indexer's ("indexer"), and its parameters.
  struct Compressor {
    Tensor<float> kv, gate, bias, norm;
    ref::v4::CompressorParams cp;
  };
  Compressor compressor(int l, const std::string& part) const;
  std::vector<float> entry_bounds(int l, const std::string& part);
  void blocks(int l, Tensor<int32_t>& used);
  cmp::Report indices(int l, const Tensor<int32_t>& cand, const Tensor<int32_t>& gold, const Tensor<int32_t>* blocks) const;
  void attention(int l, const Tensor<int32_t>& used_indices, std::string note);
  // A whole pipeline's own kv_full (attn.kv, the token rows and its bf16 compressed entries): judged,
  // and when it passes, the kv the attention is judged on (true).
  bool candidate_kv(int l, Tensor<bf16_t>& kv);
  // Hypotheses on a failure: each emulates a known bug on the golden's inputs and names it when
  // the candidate is within the tensor's bound of that emulation.
  void entries_precision(int l, const std::string& part, const Tensor<float>& gold, const Tensor<float>& cand);
  void entries_hypotheses(int l, const std::string& part, const Tensor<float>& cand, const std::vector<float>& bound);
  void blocks_hypotheses(int l, const Tensor<float>& scores, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                         const Tensor<int32_t>& gold, const Tensor<int32_t>& cand, bool follows_source);
  void attention_hypotheses(int l, const Tensor<int32_t>& used, const Tensor<float>* out, const Tensor<float>* rot,
                            const Tensor<float>* lse, const Tensor<float>* max_logits, const cmp::AttentionBounds& b,
                            const ref::AttentionOut& gold);
  void softmax_scale_hypothesis(int l, const Tensor<int32_t>& used, const Tensor<float>* out, const Tensor<float>* lse,
                                const Tensor<float>& max_logits, const ref::AttentionOut& gold);
  void schedule_hypotheses();
  template <class Near>
  void overlap_hypotheses(int l, const std::string& part, const Compressor& c, const Near& near);
  std::string P(int l) const { return "layer " + std::to_string(l); }

  golden::V4Layout lay_;
  std::map<int, Tensor<int32_t>> cand_blocks_;  // the candidate's blocks per C4A layer it holds
  struct Scores {
    Tensor<float> cand;
    std::vector<float> bound;
    prec::ClassValues values;
  };
  std::map<int, Scores> scores_;  // per Full C4A layer whose scores the candidate holds
};

std::set<int> V4Judge::layers(const std::set<int>& wanted) const {
  const std::set<std::string> outputs(kJudgedV4.begin(), kJudgedV4.end());
  return own_list_layers(g_, c_, int(lay_.schedule.types.size()), outputs, golden::v4_dump_inputs(), "v4",
                         "layers.{l}.compressor.entries, indexer.entries, indexer.scores, indexer.blocks, attn.indices, "
                         "attn.out, attn.out_rotated, attn.lse, attn.max_logits or attn.kv",
                         [&](int l) {
                           return "the golden layer " + std::to_string(l) + " (" +
                                  ref::v4::layer_type_name(lay_.schedule.types[size_t(l)]) + ", " +
                                  (lay_.schedule.full(size_t(l)) ? "Full" : "no indexer of its own") + ") holds no such tensor";
                         },
                         wanted);
}

V4Judge::Compressor V4Judge::compressor(int l, const std::string& part) const {
  const std::string p = nm(l, part + ".");
  const LayerType t = part == "indexer" ? LayerType::csa : lay_.schedule.types[size_t(l)];
  return {g_.tensor<float>(p + "kv"), g_.tensor<float>(p + "gate"), g_.tensor<float>(p + "position_bias"),
          g_.tensor<float>(p + "norm_weight"),
          part == "indexer" ? ref::v4::indexer_compressor_params(lay_.cfg) : ref::v4::compressor_params(lay_.cfg, t)};
}

// The compressor's (part "compressor") or the indexer's ("indexer") entry bounds of layer l.
std::vector<float> V4Judge::entry_bounds(int l, const std::string& part) {
  const Compressor c = compressor(l, part);
  return v4b::compressor_bounds(c.kv, c.gate, c.bias, c.norm, c.cp);
}

void V4Judge::layer(int l) {
  const size_t L = size_t(l);
  const LayerType t = lay_.schedule.types[L];
  const std::string P = "layer " + std::to_string(l) + " (" + std::string(1, ref::v4::layer_type_char(t)) +
                        (t != LayerType::csa ? "" : lay_.schedule.full(L) ? ", Full" : ", Shared from " + std::to_string(lay_.schedule.source[L])) + ")";
  const std::string how = "f32 arithmetic in any order, 2 x gamma(n) x magnitude sums (judge/v4_bounds.h)";
  if (has(l, "compressor.entries")) {
    const Tensor<float> gold = g_.tensor<float>(nm(l, "compressor.entries"));
    const Tensor<float> cand = candidate_float(c_, nm(l, "compressor.entries"), gold.shape);
    std::vector<float> b = entry_bounds(l, "compressor");
    const bool failed = add(l, "compressor.entries", cmp::compare_floats("", gold, cand, rule_of(b, how))) == cmp::Verdict::fail;
    entries_precision(l, "compressor", gold, cand);
    if (failed) entries_hypotheses(l, "compressor", cand, b);
  }
  std::vector<float> kb;
  if (has(l, "indexer.entries") || has(l, "indexer.scores")) kb = entry_bounds(l, "indexer");
  if (has(l, "indexer.entries")) {
    const Tensor<float> gold = g_.tensor<float>(nm(l, "indexer.entries"));
    const Tensor<float> cand = candidate_float(c_, nm(l, "indexer.entries"), gold.shape);
    const bool failed = add(l, "indexer.entries", cmp::compare_floats("", gold, cand, rule_of(kb, how))) == cmp::Verdict::fail;
    entries_precision(l, "indexer", gold, cand);
    if (failed) entries_hypotheses(l, "indexer", cand, kb);
  }
  if (has(l, "indexer.scores")) {
    const std::string p = "layers." + std::to_string(l) + ".indexer.";
    const Tensor<float> gold = g_.tensor<float>(p + "scores");
    std::vector<float> b = v4b::index_score_bounds(g_.tensor<float>(p + "q"), g_.tensor<float>(p + "entries"),
                                                   g_.tensor<float>(p + "weights"), lay_.cfg.csa_ratio, kb);
    Tensor<float> cand = candidate_float(c_, p + "scores", gold.shape);
    add(l, "indexer.scores", cmp::compare_floats("", gold, cand, rule_of(b, how)));
    const Tensor<float> q = g_.tensor<float>(p + "q");
    // The blocks' near ties are held to the same arithmetic (blocks()): the classes outlive this call.
    prec::ClassValues values =
        values_precision(V4Judge::P(l), "indexer.scores", gold, cand, q.dim(1) * q.dim(2), [this, q, p](const prec::Moved& m) {
          return ref::v4::index_scores(m(q, "q"), m(g_.tensor<float>(p + "entries"), "entries"), m(g_.tensor<float>(p + "weights"), "weights"),
                                       lay_.cfg.csa_ratio, lay_.cfg.rotation, k_);
        });
    scores_[l] = {std::move(cand), std::move(b), std::move(values)};
  }
  Tensor<int32_t> used = g_.tensor<int32_t>(nm(l, "attn.indices"));
  std::string note;
  if (t == LayerType::csa && has(l, "indexer.blocks")) blocks(l, used);
  if (has(l, "attn.indices")) {
    const Tensor<int32_t> gold = g_.tensor<int32_t>(nm(l, "attn.indices"));
    const Tensor<int32_t> cand = candidate_int(c_, nm(l, "attn.indices"), gold.shape, res.diagnoses);
    const auto cb = cand_blocks_.find(l);
    Tensor<int32_t> gb;
    if (t == LayerType::csa && cb == cand_blocks_.end()) gb = g_.tensor<int32_t>(nm(l, "indexer.blocks"));
    const Tensor<int32_t>* bl = t != LayerType::csa ? nullptr : cb != cand_blocks_.end() ? &cb->second : &gb;
    if (add(l, "attn.indices", indices(l, cand, gold, bl)) != cmp::Verdict::fail) used = cand;
    else res.diagnoses.push_back(P + ": attn.indices differ from the window and the selected blocks: the attention is judged on "
                                 "the golden's indices");
  }
  if (used.data != g_.tensor<int32_t>(nm(l, "attn.indices")).data)
    note = "expected recomputed on the candidate's indices (the same sets up to ties)";
  if (has(l, "attn.out") || has(l, "attn.out_rotated") || has(l, "attn.lse") || has(l, "attn.max_logits")) attention(l, used, note);
}

// indexer.blocks: compare_topk over the (source's) golden scores; a Shared layer's equal to the
// candidate's source blocks. `used` becomes the indices built from the candidate's blocks when
// they pass.
void V4Judge::blocks(int l, Tensor<int32_t>& used) {
  const size_t L = size_t(l);
  const int src = lay_.schedule.source[L];
  const Tensor<int32_t> gold = g_.tensor<int32_t>(nm(l, "indexer.blocks"));
  Tensor<int32_t> cand = candidate_int(c_, nm(l, "indexer.blocks"), gold.shape, res.diagnoses);
  const int64_t T = lay_.cfg.n_tokens, n_b = T / lay_.cfg.csa_ratio;
  const Tensor<float> scores = g_.tensor<float>(nm(src, "indexer.scores"));
  const Tensor<int32_t> ks({T}, 0), ke = ref::v4::causal_block_end(T, lay_.cfg.csa_ratio, n_b);
  // The candidate's own scores (a Full layer's, when it holds them) explain near ties within their
  // bound and the f32 contract (values_topk); a Shared layer's blocks are its source's, judged on its scores.
  const auto own = src == l ? scores_.find(l) : scores_.end();
  const bool with = own != scores_.end();
  bool ok = values_topk(l, P(l), "indexer.blocks", scores, ks, ke, gold, cand, with ? &own->second.cand : nullptr,
                        with ? own->second.bound : std::vector<float>(), with ? &own->second.values : nullptr,
                        [&](const Tensor<float>& s) { return ref::v4::select_blocks(s, lay_.cfg.csa_ratio, lay_.cfg.index_topk, k_); },
                        src == l ? "" : "judged on its source layer " + std::to_string(src) + "'s scores") != cmp::Verdict::fail;
  const bool wrong = !ok;
  bool follows_source = false;  // a Shared layer equal as sets, row by row, to the candidate's source blocks
  if (src != l && has(src, "indexer.blocks")) {  // Shared: the candidate's source blocks, as sets per row
    const Tensor<int32_t> sbt = candidate_int(c_, nm(src, "indexer.blocks"), gold.shape, res.diagnoses);
    const Tensor<int32_t>* sb = &sbt;
    cmp::Report r;
    r.stats.n = T;
    for (int64_t t = 0; t < T; ++t) {
      if (same_row_set(cand, *sb, t)) continue;
      ++r.stats.n_fail;
      if (r.mismatches.size() < cmp::kMaxMismatches)
        r.mismatches.push_back({{t}, 0, 0, 0, 0, "row " + std::to_string(t) + ": not the source layer " + std::to_string(src) + "'s blocks"});
    }
    if (r.stats.n_fail) {
      r.verdict = cmp::Verdict::fail;
      r.reasons.push_back("a Shared C4A layer must use its source layer " + std::to_string(src) + "'s blocks (" +
                          std::to_string(r.stats.n_fail) + " rows differ)");
      ok = false;
    }
    follows_source = r.stats.n_fail == 0;
    add(l, "indexer.blocks [= source's]", std::move(r));
  }
  // A Shared layer that holds exactly its source's (wrong) blocks is not off its source: the
  // source layer's own report names what is wrong there.
  if (wrong) blocks_hypotheses(l, scores, ks, ke, gold, cand, follows_source);
  cand_blocks_[l] = cand;
  if (ok) used = ref::v4::attention_indices(lay_.cfg, LayerType::csa, lay_.n_c[L], &cand);
}

cmp::Report V4Judge::indices(int l, const Tensor<int32_t>& cand, const Tensor<int32_t>& gold, const Tensor<int32_t>* bl) const {
  const int64_t T = lay_.cfg.n_tokens, W = lay_.cfg.window, width = gold.dim(2) - W;
  cmp::Report r;
  r.stats.n = T;
  auto miss = [&](int64_t t, const std::string& what) {
    ++r.stats.n_fail;
    if (r.mismatches.size() < cmp::kMaxMismatches) r.mismatches.push_back({{t}, 0, 0, 0, 0, "row " + std::to_string(t) + ": " + what});
  };
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* c = &cand[t * (W + width)];
    const int32_t* g = &gold[t * (W + width)];
    bool win = true;
    for (int64_t i = 0; i < W; ++i) win = win && c[i] == g[i];
    if (!win) {
      miss(t, "the window slots are not t - W + 1 .. t (-1 below 0)");
      continue;
    }
    std::vector<int32_t> want(g + W, g + W + width), got(c + W, c + W + width);
    if (bl)
      for (int64_t j = 0; j < width; ++j) {
        const int32_t b = (*bl)[t * width + j];
        want[size_t(j)] = b >= 0 ? int32_t(T + b) : -1;
      }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want != got) miss(t, bl ? "the compressed slots are not T + the row's blocks" : "the compressed slots are not T + the causal entries");
  }
  if (r.stats.n_fail) {
    r.verdict = cmp::Verdict::fail;
    r.reasons.push_back(std::to_string(r.stats.n_fail) + " of " + std::to_string(T) + " rows differ (window exact; compressed part as sets)");
  }
  (void)l;
  return r;
}

void V4Judge::attention(int l, const Tensor<int32_t>& used, std::string note) {
  const ref::v4::Config& cfg = lay_.cfg;
  const int64_t T = cfg.n_tokens, H = cfg.n_heads, D = cfg.head_dim;
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(nm(l, "attn.q"));
  Tensor<bf16_t> kv = g_.tensor<bf16_t>(nm(l, "attn.kv"));
  const Tensor<float> sink = g_.tensor<float>(nm(l, "attn.sink"));
  const float sm = cfg.sm_scale();
  ref::AttentionOut e;
  // A kernel's own kv_full (a model dump's attn.kv is an input of another meaning: not judged).
  const auto fmt = c_.metadata.find("format");
  const bool dump = fmt != c_.metadata.end() && fmt->second == golden::kDumpFormat;
  if (!dump && has(l, "attn.kv") && candidate_kv(l, kv))  // conditional evaluation on the candidate's own kv_full
    note = note.empty() ? "expected recomputed on the candidate's attn.kv" : note + "; on the candidate's attn.kv";
  if (note.empty()) {
    e.out = g_.tensor<float>(nm(l, "attn.out"));
    e.lse = g_.tensor<float>(nm(l, "attn.lse"));
    e.max_logits = g_.tensor<float>(nm(l, "attn.max_logits"));
  } else {
    e = k_.sparse_attention(q, kv, used, sm, D, nullptr, &sink);
  }
  const cmp::AttentionBounds b = k_.attention_bounds_sm(q, kv, used, sm, D, nullptr, &sink, e, nullptr);
  auto spec = [&](const char* n, int64_t cols, double floor) { return detail::attention_spec(n, T, H, cols, floor); };
  // FlashMLA's MODEL1 sparse prefill test criteria on top of the derived bounds (judge/anchors.h):
  // never looser than the kernel's own test on the same data.
  const double lse_scale = detail::lse_anchor_scale(e.max_logits), out_scale = detail::out_anchor_scale(kv, D);
  const double lse_abs = detail::kFlashMlaLseAbs * lse_scale;
  auto anchored = [&](cmp::FloatRule r, double abs, double rel, const char* name) {
    r.anchor_abs = abs;
    r.anchor_rel = rel;
    r.anchor_name = detail::anchor_named(name, abs == lse_abs ? lse_scale : out_scale);
    return r;
  };
  cmp::FloatRule out_rule = anchored(bound_rule(b.out, -1), detail::kFlashMlaOutAbs * out_scale, detail::kFlashMlaOutRel,
                                     "FlashMLA's prefill check_is_allclose");
  out_rule.metric_max = detail::kFlashMlaOutCos;
  out_rule.metric_name = "(FlashMLA's prefill cos_diff_tol)";
  // The precision test (judge/precision.h, kind attention: the f32 contract against bf16 logits,
  // products or P.V accumulation), emulated on sampled query rows of the golden's q and kv_full.
  const std::vector<int64_t> rows = prec::sample_rows(used, nullptr, kv.dim(0), H, D, D);
  prec::AttentionClasses classes(rows, [&q, &rows] { return detail::q_at_rows(q, rows); }, kv, used, nullptr, &sink, sm, D);
  auto judged = [&](const char* n, const Tensor<float>& gold, const Tensor<float>& cand, const cmp::FloatRule& r, int64_t cols,
                    double floor, int which) {
    add(l, n, cmp::compare_structured("", gold, cand, r, spec(n, cols, floor)), note);
    precision(P(l), n, prec::at_rows(gold, classes.rows()), prec::at_rows(cand, classes.rows()), prec::Kind::attention,
              classes.values(which));
    return res.tensors.back().report.verdict == cmp::Verdict::fail;
  };
  bool failed = false;
  Tensor<float> co, cr, cl;
  if (has(l, "attn.out")) {
    co = candidate_float(c_, nm(l, "attn.out"), {T, H, D});
    failed |= judged("attn.out", e.out, co, out_rule, D, cmp::kFloorOut, 0);
  }
  if (has(l, "attn.out_rotated")) {
    const ref::v4::RopeParams& rope = lay_.schedule.types[size_t(l)] == LayerType::sliding ? cfg.main_rope : cfg.compress_rope;
    Tensor<float> rot = e.out;
    const std::vector<float> freq = ref::v4::inv_freq(rope);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) ref::v4::apply_rope_inverse(&rot.at(t, h, D - rope.rope_dim), rope.rope_dim, t, freq);
    cmp::FloatRule r = rule_of(v4b::rotated_bounds(e.out, b.out, rope), "attn.out's bound through the inverse RoPE (judge/v4_bounds.h)");
    cr = candidate_float(c_, nm(l, "attn.out_rotated"), {T, H, D});
    add(l, "attn.out_rotated", cmp::compare_structured("", rot, cr, r, spec("attn.out_rotated", D, cmp::kFloorOut)), note);
    // The precision test: out's classes through the same inverse RoPE (f32, as above).
    const std::vector<int64_t> at = classes.rows();
    precision(P(l), "attn.out_rotated", prec::at_rows(rot, at), prec::at_rows(cr, at), prec::Kind::attention,
              [out = classes.values(0), at, freq, H, D, rd = rope.rope_dim](const std::string& cls) {
                std::vector<std::vector<double>> members;
                for (const std::vector<double>& o : out(cls)) {
                  std::vector<double> x = o;
                  std::vector<float> head(static_cast<size_t>(rd));
                  for (size_t r = 0; r < at.size(); ++r)
                    for (int64_t h = 0; h < H; ++h) {
                      const size_t base = (r * size_t(H) + size_t(h)) * size_t(D) + size_t(D - rd);
                      for (int i = 0; i < rd; ++i) head[size_t(i)] = float(x[base + size_t(i)]);
                      ref::v4::apply_rope_inverse(head.data(), rd, at[r], freq);
                      for (int i = 0; i < rd; ++i) x[base + size_t(i)] = double(head[size_t(i)]);
                    }
                  members.push_back(std::move(x));
                }
                return members;
              });
    failed |= res.tensors.back().report.verdict == cmp::Verdict::fail;
  }
  if (has(l, "attn.lse")) {
    cl = candidate_float(c_, nm(l, "attn.lse"), {T, H});
    failed |= judged("attn.lse", e.lse, cl,
                     anchored(bound_rule(b.lse, -1), lse_abs, detail::kFlashMlaLseRel, "FlashMLA's prefill lse check"), 1,
                     cmp::kFloorLse, 1);
  }
  Tensor<float> cm;
  if (has(l, "attn.max_logits")) {
    cm = candidate_float(c_, nm(l, "attn.max_logits"), {T, H});
    failed |= judged("attn.max_logits", e.max_logits, cm,
                     anchored(bound_rule(b.max_logits, -1), lse_abs, detail::kFlashMlaLseRel, "FlashMLA's prefill max_logits check"), 1,
                     cmp::kFloorLse, 2);
  }
  if (failed)
    attention_hypotheses(l, used, co.numel() ? &co : nullptr, cr.numel() ? &cr : nullptr, cl.numel() ? &cl : nullptr,
                         cm.numel() ? &cm : nullptr, b, e);
}

// attn.kv [T + n_c, 1, D] bf16: the token rows are the layer's inputs (equal bit for bit); compressed
// row T + j is the kernel's own bf16 rounding of its entry j, within the entry's bound
// (compressor.entries') plus one bf16 ulp at the bound's edge (a value within the bound may round
// to the neighbouring bf16 either way). A passing kv (rounded to bf16 if handed in as f32) replaces
// the golden's for the attention's expected values; attn.q and the indices stay the golden's.
bool V4Judge::candidate_kv(int l, Tensor<bf16_t>& kv) {
  const int64_t T = lay_.cfg.n_tokens, D = lay_.cfg.head_dim, n_c = kv.dim(0) - T;
  Tensor<float> expected = bf16_to_f32(kv);
  std::vector<float> bound(size_t(expected.numel()), 0.0f);
  if (n_c > 0) {
    const Tensor<float> entries = g_.tensor<float>(nm(l, "compressor.entries"));
    const std::vector<float> eb = entry_bounds(l, "compressor");
    for (int64_t j = 0; j < n_c; ++j)
      for (int64_t d = 0; d < D; ++d) {
        const size_t i = size_t((T + j) * D + d), e = size_t(j * D + d);
        expected[int64_t(i)] = entries[int64_t(e)];
        const double edge = std::fabs(double(entries[int64_t(e)])) + double(eb[e]);
        bound[i] = cmp::bound_f32(double(eb[e]) + std::ldexp(1.0, std::max(std::ilogb(std::max(edge, 1e-30)), -126) - 7));
      }
  }
  const Tensor<float> cand = candidate_float(c_, nm(l, "attn.kv"), kv.shape);
  const bool ok = add(l, "attn.kv", cmp::compare_floats("", expected, cand,
                                                        rule_of(std::move(bound), "token rows exact (the layer's inputs); compressed rows "
                                                                                  "within compressor.entries' bound plus one bf16 ulp"))) !=
                  cmp::Verdict::fail;
  if (ok)
    for (int64_t i = 0; i < kv.numel(); ++i) kv[i] = f32_to_bf16(cand[i]);
  return ok;
}

// The precision test of a compressor's entries (judge/precision.h, kind values), where the set's
// compressor rounds in f32 (hf_bf16 rounds to bf16 by contract, as transformers' bf16 model): the
// compressor recomputed on moved kv, gate, position bias and norm weight. The longest sum behind an
// entry is the norm's over D (the softmax pools 2m or m slots, fewer than D in every V4 config).
void V4Judge::entries_precision(int l, const std::string& part, const Tensor<float>& gold, const Tensor<float>& cand) {
  const Compressor c = compressor(l, part);
  if (c.cp.rounding != ref::v4::CompressorRounding::f32) return;
  const int64_t n = std::max<int64_t>(c.norm.numel(), c.cp.overlap ? 2 * c.cp.ratio : c.cp.ratio);
  values_precision(P(l), part + ".entries", gold, cand, n, [&](const prec::Moved& m) {
    return ref::v4::compress(m(c.kv, "kv"), m(c.gate, "gate"), m(c.bias, "position_bias"), m(c.norm, "norm_weight"), c.cp);
  });
}

void V4Judge::entries_hypotheses(int l, const std::string& part, const Tensor<float>& cand, const std::vector<float>& bound) {
  const Compressor c = compressor(l, part);
  const Tensor<float>&kv = c.kv, &gate = c.gate, &bias = c.bias, &w = c.norm;
  const ref::v4::CompressorParams& cp = c.cp;
  auto near = [&](const Tensor<float>& x, double rel) {
    std::vector<float> b = bound;
    for (size_t i = 0; i < b.size(); ++i) b[i] = cmp::bound_f32(double(b[i]) + rel * std::fabs(double(x[int64_t(i)])));
    return passes(cmp::compare_floats("", x, cand, rule_of(std::move(b), "")));
  };
  const Tensor<float> ones(w.shape, 1.0f);
  if (near(ref::v4::compress(kv, gate, bias, ones, cp), 0))
    res.diagnoses.push_back(P(l) + ": " + part + ".entries match the compressor without its RMSNorm weight (norm_weight ignored)");
  ref::v4::CompressorParams bf = cp;
  bf.rounding = ref::v4::CompressorRounding::hf_bf16;
  if (near(ref::v4::compress(kv, gate, bias, w, bf), 0x1p-7))
    res.diagnoses.push_back(P(l) + ": " + part + ".entries are at bf16 precision (transformers' bf16 rounding points), not f32 arithmetic");
  Tensor<float> unrot = ref::v4::compress(kv, gate, bias, w, cp);
  const int rd = cp.rope.rope_dim;
  const std::vector<float> freq = ref::v4::inv_freq(cp.rope);
  for (int64_t e = 0; e < unrot.dim(0); ++e) ref::v4::apply_rope_inverse(&unrot.at(e, unrot.dim(1) - rd), rd, e * cp.ratio, freq);
  if (near(unrot, 0)) res.diagnoses.push_back(P(l) + ": " + part + ".entries match the entries without their RoPE");
  // Another RMSNorm epsilon in place of the set's: the values configs and frameworks use (1e-5 and
  // 1e-6 in model configs, torch.nn.RMSNorm's default the dtype's epsilon, 1e-8, 1e-12, none).
  for (const float eps : {1e-5f, 1e-6f, 0x1p-23f, 1e-8f, 1e-12f, 0.0f}) {
    if (eps == cp.eps) continue;
    ref::v4::CompressorParams other = cp;
    other.eps = eps;
    if (near(ref::v4::compress(kv, gate, bias, w, other), 0)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g (the set's is %g)", double(eps), double(cp.eps));
      res.diagnoses.push_back(P(l) + ": " + part + ".entries match the compressor's RMSNorm with eps " + buf);
      break;
    }
  }
  if (cp.overlap) overlap_hypotheses(l, part, c, near);
}

// CSA's overlapping windows taken wrong: entry w pools the previous window's Ca half (columns
// [0, D)) with its own window's Cb half ([D, 2D)). Emulated on the golden's inputs: the halves
// swapped (columns exchanged in kv, gate and position_bias), and the previous window left out (its
// slots' gates at -1e4, so their softmax weights are exactly 0).
template <class Near>
void V4Judge::overlap_hypotheses(int l, const std::string& part, const Compressor& c, const Near& near) {
  const Tensor<float>&kv = c.kv, &bias = c.bias, &w = c.norm;
  const ref::v4::CompressorParams& cp = c.cp;
  Tensor<float> gate = c.gate;
  const int64_t D = w.dim(0);
  Tensor<float> swapped[3] = {kv, gate, bias};
  for (Tensor<float>& x : swapped)
    for (int64_t r = 0; r < x.dim(0); ++r) std::swap_ranges(&x.at(r, 0), &x.at(r, 0) + D, &x.at(r, D));
  if (near(ref::v4::compress(swapped[0], swapped[1], swapped[2], w, cp), 0))
    res.diagnoses.push_back(P(l) + ": " + part + ".entries pool the overlapping windows' halves swapped (the previous window's Cb "
                            "and this window's Ca; the rule is the previous window's Ca = kv[:, :D] and this window's Cb = kv[:, D:])");
  for (int64_t r = 0; r < gate.dim(0); ++r) std::fill(&gate.at(r, 0), &gate.at(r, 0) + D, -1e4f);
  if (near(ref::v4::compress(kv, gate, bias, w, cp), 0))
    res.diagnoses.push_back(P(l) + ": " + part + ".entries leave out the previous window (no overlap: each entry pools only its own "
                            "window's Cb half, as an HCA compressor would)");
}

// After the walk, when the candidate's C4A layers share blocks in another grouping than the
// golden's: the groups of layers whose candidate blocks are equal (as sets per row) compared with
// the groups (layers with one source) of two mistaken schedules, for a set built from a freq rule:
// the rule counted over every layer index l in place of the C4A rank j, and the other freq rule.
void V4Judge::schedule_hypotheses() {
  const nlohmann::json& sj = g_.manifest["schedule"];
  if (!sj.contains("freq") || cand_blocks_.size() < 2 || !res.failed()) return;
  const int f = sj["freq"].get<int>();
  const ref::v4::FreqRule rule = ref::v4::parse_freq_rule(sj["freq_rule"].get<std::string>());
  const ref::v4::FreqRule other = rule == ref::v4::FreqRule::modulo ? ref::v4::FreqRule::max_minus_one : ref::v4::FreqRule::modulo;
  const std::vector<LayerType>& types = lay_.schedule.types;
  std::string by_layer;  // the rule over layer indices; the first C4A layer Full regardless
  for (size_t l = 0; l < types.size(); ++l)
    if (types[l] == LayerType::csa)
      by_layer += by_layer.empty() || (rule == ref::v4::FreqRule::modulo ? int(l) : std::max(int(l) - 1, 0)) % f == 0 ? 'F' : 'S';
  auto same_rows = [](const Tensor<int32_t>& a, const Tensor<int32_t>& b) {
    for (int64_t t = 0; t < a.dim(0); ++t)
      if (!same_row_set(a, b, t)) return false;
    return true;
  };
  auto grouped_as = [&](const ref::v4::Schedule& s) {  // over the layers the candidate holds blocks for
    for (auto a = cand_blocks_.begin(); a != cand_blocks_.end(); ++a)
      for (auto b = std::next(a); b != cand_blocks_.end(); ++b)
        if ((s.source[size_t(a->first)] == s.source[size_t(b->first)]) != same_rows(a->second, b->second)) return false;
    return true;
  };
  if (grouped_as(lay_.schedule)) return;
  const std::string fs = "freq=" + std::to_string(f) + " ";
  const std::pair<ref::v4::Schedule, std::string> alts[] = {
      {ref::v4::from_pattern(types, by_layer), fs + ref::v4::freq_rule_name(rule) + " counted over every layer index, not over the C4A "
                                                                                    "layers' ranks j"},
      {ref::v4::from_freq(types, f, other), fs + ref::v4::freq_rule_name(other) + " in place of the set's " + ref::v4::freq_rule_name(rule)}};
  for (const auto& [alt, why] : alts)
    if (alt.source != lay_.schedule.source && grouped_as(alt))
      res.diagnoses.push_back("indexer.blocks are shared as the C4A schedule " + alt.pattern() + " shares them (" + why +
                              "); the set's schedule is " + lay_.schedule.pattern());
}

void V4Judge::blocks_hypotheses(int l, const Tensor<float>& scores, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                const Tensor<int32_t>& gold, const Tensor<int32_t>& cand, bool follows_source) {
  for (int shift : {-1, 1}) {
    Tensor<int32_t> s = cand;
    for (int32_t& x : s.data) x = x >= 0 ? x + shift : x;
    if (passes(cmp::compare_topk("", scores, ks, ke, gold, s)))
      res.diagnoses.push_back(P(l) + ": indexer.blocks are the golden's shifted by " + std::to_string(-shift) +
                              " block (an off-by-one block number)");
  }
  const int src = lay_.schedule.source[size_t(l)];
  if (src != l && !follows_source)
    res.diagnoses.push_back(P(l) + ": a Shared C4A layer whose blocks are not its source layer " + std::to_string(src) +
                            "'s (its own indexer, or the schedule off)");
}

void V4Judge::attention_hypotheses(int l, const Tensor<int32_t>& used, const Tensor<float>* out, const Tensor<float>* rot,
                                   const Tensor<float>* lse, const Tensor<float>* max_logits, const cmp::AttentionBounds& b,
                                   const ref::AttentionOut& gold) {
  const ref::v4::Config& cfg = lay_.cfg;
  const int64_t T = cfg.n_tokens, H = cfg.n_heads, D = cfg.head_dim;
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(nm(l, "attn.q")), kv = g_.tensor<bf16_t>(nm(l, "attn.kv"));
  const Tensor<float> sink = g_.tensor<float>(nm(l, "attn.sink"));
  const ref::AttentionOut& e = gold;
  const std::vector<float>&out_bound = b.out, &lse_bound = b.lse;
  if (max_logits) softmax_scale_hypothesis(l, used, out, lse, *max_logits, gold);
  // One key missing per row: each row's first (the oldest window slot) or last valid slot dropped,
  // a loop bound over the slots off by one.
  for (const bool last : {true, false}) {
    int64_t dropped = 0;
    const Tensor<int32_t> fewer = emul::drop_one_key(used, nullptr, kv.dim(0), last, &dropped);
    if (dropped == 0 || (!out && !lse)) continue;
    const ref::AttentionOut o = k_.sparse_attention(q, kv, fewer, cfg.sm_scale(), D, nullptr, &sink);
    const cmp::AttentionBounds ob = k_.attention_bounds_sm(q, kv, fewer, cfg.sm_scale(), D, nullptr, &sink, o, nullptr);
    if ((!out || detail::explains(o.out, ob.out, *out, e.out)) && (!lse || detail::explains(o.lse, ob.lse, *lse, e.lse)))
      res.diagnoses.push_back(P(l) + ": " + (out ? "attn.out" : "attn.lse") + " is the attention without each row's " +
                              (last ? "last" : "first") + " slot (one key missing per row: a loop bound over the slots off by one)");
  }
  if (out) {
    const ref::AttentionOut n = k_.sparse_attention(q, kv, used, cfg.sm_scale(), D, nullptr, nullptr);
    const cmp::AttentionBounds nb = k_.attention_bounds_sm(q, kv, used, cfg.sm_scale(), D, nullptr, nullptr, n, nullptr);
    if (passes(cmp::compare_floats("", n.out, *out, bound_rule(nb.out, -1))))
      res.diagnoses.push_back(P(l) + ": attn.out is the attention without the sink (the sink ignored)");
    // One part of the indices dropped: the window's W slots, or the compressed slots after them.
    const int64_t W = cfg.window, width = used.dim(2);
    for (const bool window : {true, false}) {
      if (!window && width == W) continue;  // SWA: no compressed part
      Tensor<int32_t> part = used;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = window ? 0 : W; i < (window ? W : width); ++i) part[t * width + i] = -1;
      const ref::AttentionOut o = k_.sparse_attention(q, kv, part, cfg.sm_scale(), D, nullptr, &sink);
      const cmp::AttentionBounds ob = k_.attention_bounds_sm(q, kv, part, cfg.sm_scale(), D, nullptr, &sink, o, nullptr);
      if (passes(cmp::compare_floats("", o.out, *out, bound_rule(ob.out, -1))))
        res.diagnoses.push_back(P(l) + (window ? ": attn.out is the attention without its sliding window (the compressed entries only)"
                                               : ": attn.out is the attention without the compressed entries (the window only)"));
    }
  }
  if (lse) {
    Tensor<float> with = e.lse;
    for (int64_t i = 0; i < with.numel(); ++i) {
      const double x = with[i], s = sink[i % H], mx = std::max(x, s);
      with[i] = float(mx + std::log(std::exp(x - mx) + std::exp(s - mx)));
    }
    if (passes(cmp::compare_floats("", with, *lse, bound_rule(lse_bound, -1))))
      res.diagnoses.push_back(P(l) + ": attn.lse includes the sink (ln(exp(lse) + exp(sink))); the golden's excludes it");
  }
  if (rot) {
    const ref::v4::RopeParams& rope = lay_.schedule.types[size_t(l)] == LayerType::sliding ? cfg.main_rope : cfg.compress_rope;
    const std::vector<float> freq = ref::v4::inv_freq(rope);
    const std::vector<float> rb = v4b::rotated_bounds(e.out, out_bound, rope);
    if (passes(cmp::compare_floats("", e.out, *rot, rule_of(rb, ""))))
      res.diagnoses.push_back(P(l) + ": attn.out_rotated is the kernel output without the inverse RoPE (the rotation skipped)");
    Tensor<float> fwd = e.out;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) ref::apply_rope(&fwd.at(t, h, D - rope.rope_dim), rope.rope_dim, t, freq, ref::RopeLayout::interleaved);
    if (passes(cmp::compare_floats("", fwd, *rot, rule_of(rb, ""))))
      res.diagnoses.push_back(P(l) + ": attn.out_rotated is rotated by +angle (the forward RoPE), not the inverse (-sin)");
  }
}

// A softmax scale other than the set's (576^-1/2 where the set has 512^-1/2, say): max_logits =
// sm_scale * max q.k is then the golden's times one factor c in every element. c is fitted by least
// squares over max_logits; the hypothesis holds when the attention recomputed at c * sm_scale
// explains every attention output the candidate holds (within its bounds, twice as close as the
// golden). The report gives the scale as d^-1/2.
void V4Judge::softmax_scale_hypothesis(int l, const Tensor<int32_t>& used, const Tensor<float>* out, const Tensor<float>* lse,
                                       const Tensor<float>& max_logits, const ref::AttentionOut& gold) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < max_logits.numel(); ++i)
    if (std::isfinite(max_logits[i]) && std::isfinite(gold.max_logits[i])) {
      num += double(max_logits[i]) * gold.max_logits[i];
      den += double(gold.max_logits[i]) * gold.max_logits[i];
    }
  if (den <= 0) return;
  const double c = num / den;
  const float sm = float(double(lay_.cfg.sm_scale()) * c);
  if (!(c > 0) || sm == lay_.cfg.sm_scale()) return;
  const int64_t D = lay_.cfg.head_dim;
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(nm(l, "attn.q")), kv = g_.tensor<bf16_t>(nm(l, "attn.kv"));
  const Tensor<float> sink = g_.tensor<float>(nm(l, "attn.sink"));
  const ref::AttentionOut o = k_.sparse_attention(q, kv, used, sm, D, nullptr, &sink);
  const cmp::AttentionBounds ob = k_.attention_bounds_sm(q, kv, used, sm, D, nullptr, &sink, o, nullptr);
  if (!detail::explains(o.max_logits, ob.max_logits, max_logits, gold.max_logits)) return;
  if (out && !detail::explains(o.out, ob.out, *out, gold.out)) return;
  if (lse && !detail::explains(o.lse, ob.lse, *lse, gold.lse)) return;
  char buf[200];
  std::snprintf(buf, sizeof buf, ": the attention matches a wrong softmax scale: %.6g = %.4g^-1/2 (x%.4f), where the set's is %.6g = %lld^-1/2",
                double(sm), 1.0 / (double(sm) * double(sm)), c, double(lay_.cfg.sm_scale()), (long long)D);
  res.diagnoses.push_back(P(l) + buf);
}

}  // namespace

Result judge_v4(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k) {
  // The blocks of a Shared layer are checked against its source's: a source the candidate holds is
  // judged first (layers ascending: sources precede).
  return detail::judge_layers<V4Judge>(g, c, wanted, k);
}

}  // namespace indexshare::diff

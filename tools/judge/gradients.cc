// indexshare diff: a training set's gradients (tools/lib/golden_train.h). Each gradient the
// candidate holds is judged per element against the bounds of judge/grad_bounds.h, by the
// structure tests, and on a failure against the usual backward bugs, each emulated on the golden's
// own values (a hypothesis explains the candidate when the candidate sits at least twice as close
// to it as to the golden, in RMS).
#include <cmath>

#include "ref/indexer.h"
#include "ref/train/attention_bwd.h"
#include "ref/train/indexer_loss.h"
#include "tools/judge/grad_bounds.h"
#include "tools/judge/precision.h"
#include "tools/judge/walk.h"

namespace indexshare::diff::detail {

namespace {

constexpr double kFloorGrad = 0x1p-11;  // attn.out's floor: P and dS round to nearest, unbiased

double rms_diff(const Tensor<float>& a, const Tensor<float>& b) {
  double s = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    if (std::isfinite(d)) {
      s += d * d;
      ++n;
    }
  }
  return n ? std::sqrt(s / double(n)) : 0.0;
}

Tensor<float> scaled(const Tensor<float>& x, double f) {
  Tensor<float> y(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = float(double(x[i]) * f);
  return y;
}

// The V part of dkv, sum over the occurrences of j of P dO (columns < d_v): the golden's P and dO
// (P is 0 on the ignored slots, those past topk_length included).
Tensor<float> dkv_v_part(const Tensor<float>& p, const Tensor<bf16_t>& d_out, const Tensor<int32_t>& ind, int64_t s_kv,
                         int64_t d_qk, const Tensor<int32_t>* len) {
  const int64_t s_q = d_out.dim(0), h_q = d_out.dim(1), d_v = d_out.dim(2), topk = ind.dim(2);
  std::vector<double> acc(size_t(s_kv * d_qk), 0.0), dO(static_cast<size_t>(d_v));
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < h_q; ++h) {
      for (int64_t c = 0; c < d_v; ++c) dO[size_t(c)] = double(bf16_to_f32(d_out[(t * h_q + h) * d_v + c]));
      for (int64_t j = 0; j < (len ? std::min<int64_t>((*len)[t], topk) : topk); ++j) {
        const int64_t i = ind[t * topk + j];
        if (i < 0 || i >= s_kv) continue;
        const double P = p[(t * h_q + h) * topk + j];
        double* a = acc.data() + i * d_qk;
        for (int64_t c = 0; c < d_v; ++c) a[c] += P * dO[size_t(c)];
      }
    }
  Tensor<float> v({s_kv, 1, d_qk});
  for (int64_t e = 0; e < v.numel(); ++e) v[e] = float(acc[size_t(e)]);
  return v;
}

// The indices with every repeated occurrence of a kv row within a row's used slots replaced by -1:
// a kernel that counts a duplicate once (a set-like gather). Empty when no row holds a duplicate.
std::optional<Tensor<int32_t>> without_duplicates(const Tensor<int32_t>& ind, int64_t s_kv, const Tensor<int32_t>* len) {
  Tensor<int32_t> d = ind;
  const int64_t s_q = ind.dim(0), topk = ind.dim(2);
  bool any = false;
  std::vector<std::pair<int32_t, int64_t>> used;  // (kv row, slot) of a row's valid slots
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t n = len ? std::clamp<int64_t>((*len)[t], 0, topk) : topk;
    used.clear();
    for (int64_t j = 0; j < n; ++j)
      if (d[t * topk + j] >= 0 && d[t * topk + j] < s_kv) used.push_back({d[t * topk + j], j});
    std::sort(used.begin(), used.end());  // equal rows adjacent, their first slot first
    for (size_t e = 1; e < used.size(); ++e)
      if (used[e].first == used[e - 1].first) {
        d[t * topk + used[e].second] = -1;
        any = true;
      }
  }
  if (!any) return std::nullopt;
  return d;
}

// The gradients' precision test's classes (judge/precision.h, kind gradients): the low-precision
// emulation (the contract, bf16-p-ds) and its bf16-accumulating variant, in the candidate's dtype,
// each computed once when the test asks. dq's rows are independent: its emulation runs on prec's
// sample of query rows (as the forward's test does). dkv sums over every query row, so its test
// emulates the whole set, and the judge runs it only when that costs at most kGradPrecisionWork
// multiply-adds (a few seconds on one core); above it the report notes the test was not run.
constexpr int64_t kGradPrecisionWork = int64_t(1) << 30;

struct LowpBackward {
  const Tensor<bf16_t>& q;
  const Tensor<bf16_t>& kv;
  const Tensor<int32_t>& ind;
  const Tensor<bf16_t>& d_out;
  const Tensor<float>* sink;
  const Tensor<int32_t>* len;
  float sm;
  int64_t d_v;
  std::vector<int64_t> rows;                                 // the sampled query rows
  mutable std::optional<ref::AttentionBackwardOut> emu[2][2];  // [whole set][bf16-acc]

  // The whole emulation's multiply-adds: valid (row, slot) pairs x heads x (d_qk + d_v) x 2.
  int64_t whole_work(int64_t h_q, int64_t d_qk, int64_t s_kv) const {
    int64_t slots = 0;
    for (int64_t t = 0; t < q.dim(0); ++t) slots += int64_t(ref::valid_kv_rows(ind, len, t, s_kv).size());
    return slots * h_q * 2 * (d_qk + d_v);
  }
  // x's sampled rows along dim 0.
  template <class T>
  Tensor<T> slice(const Tensor<T>& x) const {
    Tensor<T> y = x;
    const int64_t w = x.dim(0) ? x.numel() / x.dim(0) : 0;
    y.shape[0] = int64_t(rows.size());
    y.data.resize(rows.size() * size_t(w));
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy(x.data.begin() + rows[r] * w, x.data.begin() + (rows[r] + 1) * w, y.data.begin() + int64_t(r) * w);
    return y;
  }
  const ref::AttentionBackwardOut& get(bool whole, bool acc) const {
    std::optional<ref::AttentionBackwardOut>& e = emu[whole][acc];
    if (e) return *e;
    if (whole) {
      e = cmp::emulate_attention_backward_lowp(q, kv, ind, sm, d_v, d_out, len, sink, acc);
    } else {
      const std::optional<Tensor<int32_t>> len_rows = len ? std::optional(slice(*len)) : std::nullopt;
      e = cmp::emulate_attention_backward_lowp(slice(q), kv, slice(ind), sm, d_v, slice(d_out), len_rows ? &*len_rows : nullptr,
                                               sink, acc);
    }
    return *e;
  }
  // dq's classes on the sampled rows, or dkv's on the whole set; `bf16`: the candidate's dtype.
  prec::ClassValues classes(bool is_dq, bool bf16) const {
    return [this, is_dq, bf16](const std::string& cls) {
      const ref::AttentionBackwardOut& e = get(!is_dq, cls == "bf16-acc");
      const Tensor<float>& f = is_dq ? e.dq : e.dkv;
      const Tensor<bf16_t>& b = is_dq ? e.dq_bf16 : e.dkv_bf16;
      std::vector<double> v(size_t(f.numel()));
      for (int64_t i = 0; i < f.numel(); ++i) v[size_t(i)] = bf16 ? double(bf16_to_f32(b[i])) : double(f[i]);
      return std::vector<std::vector<double>>{std::move(v)};
    };
  }
};

}  // namespace

void Judge::judge_gradient(int l, const std::string& P, const std::string& n, const Tensor<float>& golden, std::vector<float> bound,
                           int64_t rows, int64_t heads, int64_t cols, double floor,
                           const std::vector<std::pair<std::string, Tensor<float>>>& hypotheses,
                           const prec::ClassValues* values, const std::vector<int64_t>* sample) {
  const Tensor<float> got = cand_float(name(l, n), golden.shape);
  const bool bf16 = c_.find(name(l, n))->dtype == io::DType::BF16;
  if (bf16)  // the kernel's final cast: half a bf16 ulp more
    for (int64_t i = 0; i < golden.numel(); ++i) bound[size_t(i)] += float(0x1p-8 * std::fabs(double(golden[i])));
  // A bf16 cast moves each element by up to 2^-9 of itself, deterministically: on a small tensor
  // its errors can line up into an apparent scale of that size (measured: 0.3% on 1,024 elements
  // of indexer_loss.dq, the cast plus the f32 kernel's own error), so the structure tests of a bf16
  // candidate do not flag systematic effects below 2^-8.
  if (bf16) floor = std::max(floor, 0x1p-8);
  cmp::FloatRule rule;
  rule.bound = std::move(bound);
  rule.derivation = "per-element bound of the backward's f32 and bf16 roundings, reduction lengths and magnitudes "
                    "(judge/grad_bounds.h), times 2";
  cmp::Report r;
  if (heads > 0) {
    cmp::StructureSpec spec;
    spec.tensor = n;
    spec.rows = rows;
    spec.heads = heads;
    spec.cols = cols;
    spec.cluster_cols = cols;
    spec.lanes = cols >= 16;
    spec.floor = floor;
    spec.scale_meaning = "a gradient scale factor";
    cmp::StructureReport st;
    r = cmp::compare_structured("", golden, got, rule, spec, &st);
    for (const std::string& f : st.findings) symptoms_.push_back(P + ": " + f);
  } else {
    r = cmp::compare_floats("", golden, got, rule);
  }
  // TileLang's own criterion, for comparison (it passes at <= 1e-4).
  double sxy = 0, sxx = 0;
  for (int64_t i = 0; i < golden.numel(); ++i) {
    sxy += double(golden[i]) * double(got[i]);
    sxx += double(golden[i]) * double(golden[i]) + double(got[i]) * double(got[i]);
  }
  const double sim = sxx > 0 ? 1 - 2 * sxy / sxx : 0.0;
  if (r.verdict == cmp::Verdict::fail) {
    char note[128];
    std::snprintf(note, sizeof note, "TileLang's global similarity 1 - 2xy/(x^2+y^2) = %.3g (its tests pass at <= 1e-4)", sim);
    r.reasons.push_back(note);
  }
  add(l, n, std::move(r));
  if (values) {  // every element, or the sampled rows along dim 0
    std::vector<double> gv, cv;
    if (sample) {
      gv = prec::at_rows(golden, *sample);
      cv = prec::at_rows(got, *sample);
    } else {
      gv.assign(golden.data.begin(), golden.data.end());
      cv.assign(got.data.begin(), got.data.end());
    }
    precision(P, n, gv, cv, prec::Kind::gradients, *values);
  }
  if (res.tensors.back().report.verdict != cmp::Verdict::fail) return;
  const double e_gold = rms_diff(got, golden);
  for (const auto& [what, alt] : hypotheses)
    if (rms_diff(got, alt) * 2 <= e_gold) {
      res.diagnoses.push_back(P + ": " + n + " fits " + what);
      return;
    }
}

void Judge::judge_gradients(int l, const std::string& P) {
  for (const char* n : {"attn_bwd.delta", "attn_bwd.dq", "attn_bwd.dkv", "attn_bwd.d_sink"})
    if (has(l, n)) {
      judge_attention_backward(l, P);
      break;
    }
  for (const std::string& n : kJudgedTrain)
    if (n.rfind("indexer_loss.", 0) == 0 && has(l, n)) {
      judge_indexer_loss(l, P);
      break;
    }
}

void Judge::judge_attention_backward(int l, const std::string& P) {
  const phases::Scope s("gradients: sparse attention backward");
  const Tensor<bf16_t> q = g_.tensor<bf16_t>(name(l, "attn.q")), kv = g_.tensor<bf16_t>(name(l, "attn.kv"));
  const Tensor<int32_t> ind = g_.tensor<int32_t>(name(l, "attn.indices"));
  const Tensor<bf16_t> d_out = g_.tensor<bf16_t>(name(l, "attn.d_out"));
  std::optional<Tensor<float>> sink;
  if (g_.find(name(l, "attn.sink"))) sink = g_.tensor<float>(name(l, "attn.sink"));
  std::optional<Tensor<int32_t>> len;
  if (g_.find(name(l, "attn.topk_length"))) len = g_.tensor<int32_t>(name(l, "attn.topk_length"));
  const Tensor<int32_t>* lp = len ? &*len : nullptr;
  const Tensor<float> out = g_.tensor<float>(name(l, "attn.out")), lse = g_.tensor<float>(name(l, "attn.lse"));
  const Tensor<float> p = g_.tensor<float>(name(l, "attn_bwd.p")), ds = g_.tensor<float>(name(l, "attn_bwd.ds"));
  const Tensor<float> delta = g_.tensor<float>(name(l, "attn_bwd.delta"));
  const Tensor<float> dq = g_.tensor<float>(name(l, "attn_bwd.dq")), dkv = g_.tensor<float>(name(l, "attn_bwd.dkv"));
  cmp::AttentionBackwardTruth t{&q, &kv, &ind, lp, &d_out, sink ? &*sink : nullptr, &out, &lse, &p, &ds, &delta, sm_, d_v_};
  std::map<std::string, std::vector<float>> b = cmp::delta_sink_bounds(t);
  {  // dq and dkv: the specification's bounds (ref/train/attention_bwd.h), Delta from the bf16 out allowed
    ref::AttentionBackwardOut exact;
    exact.out = out;
    exact.lse = lse;
    exact.delta = delta;
    exact.p = p;
    exact.ds = ds;
    exact.dq = dq;
    exact.dkv = dkv;
    cmp::AttentionBackwardBounds ab = k_.attention_backward_bounds(q, kv, ind, sm_, d_v_, d_out, lp, exact, true);
    b["dq"] = std::move(ab.dq);
    b["dkv"] = std::move(ab.dkv);
  }
  const int64_t s_kv = kv.dim(0), d_qk = q.dim(2);
  // The usual backward bugs, on the golden's values.
  const Tensor<float> vpart = dkv_v_part(p, d_out, ind, s_kv, d_qk, lp);
  Tensor<float> kpart(dkv.shape), twice(dkv.shape), none(dkv.shape);
  for (int64_t e = 0; e < dkv.numel(); ++e) {
    kpart[e] = dkv[e] - vpart[e];
    twice[e] = float(double(kpart[e]) * sm_ + vpart[e]);
    none[e] = float(double(kpart[e]) / sm_ + vpart[e]);
  }
  // -1 read as a key: torch's index -1 is the last kv row (the gradients recomputed so).
  Tensor<int32_t> wrapped = ind;
  bool any_pad = false;
  for (int64_t e = 0; e < wrapped.numel(); ++e)
    if (wrapped[e] == -1) {
      wrapped[e] = int32_t(s_kv - 1);
      any_pad = true;
    }
  std::optional<ref::AttentionBackwardOut> wr;
  if (any_pad) wr = ref::sparse_attention_backward(q, kv, wrapped, sm_, d_v_, d_out, lp, sink ? &*sink : nullptr);
  const std::string kWrap = "the backward with -1 padding read as kv row s_kv - 1 (torch's index -1): -1 treated as a key";
  // A duplicated index counted once (the forward's rule, and TileLang's, count each occurrence).
  std::optional<ref::AttentionBackwardOut> once;
  if (const std::optional<Tensor<int32_t>> dd = without_duplicates(ind, s_kv, lp))
    once = ref::sparse_attention_backward(q, kv, *dd, sm_, d_v_, d_out, lp, sink ? &*sink : nullptr);
  const LowpBackward emu{q, kv, ind, d_out, sink ? &*sink : nullptr, lp, sm_, d_v_,
                         prec::sample_rows(ind, lp, s_kv, h_q_, d_qk, d_v_), {}};
  const int64_t dkv_work = emu.whole_work(h_q_, d_qk, s_kv);
  const bool dkv_precision = dkv_work <= kGradPrecisionWork;
  const std::string kOnce = "the backward with each duplicated index counted once: duplicates counted once (each "
                            "occurrence is one softmax term and adds its own dkv contribution)";
  if (has(l, "attn_bwd.dq")) {
    std::vector<std::pair<std::string, Tensor<float>>> h = {
        {"sm_scale x the truth: the softmax scale applied twice", scaled(dq, sm_)},
        {"the truth / sm_scale: the softmax scale not applied", scaled(dq, 1 / double(sm_))}};
    if (wr) h.push_back({kWrap, wr->dq});
    if (once) h.push_back({kOnce, once->dq});
    const prec::ClassValues cv = emu.classes(true, c_.find(name(l, "attn_bwd.dq"))->dtype == io::DType::BF16);
    judge_gradient(l, P, "attn_bwd.dq", dq, std::move(b["dq"]), s_q_, h_q_, d_qk, kFloorGrad, h, &cv, &emu.rows);
  }
  if (has(l, "attn_bwd.dkv")) {
    std::vector<std::pair<std::string, Tensor<float>>> h = {
        {"the K part alone: dkv misses the V part (sum P dO) of the shared latent", kpart},
        {"the V part alone: dkv misses the K part (dS q)", vpart},
        {"the K part times sm_scale: the softmax scale applied twice", twice},
        {"the K part without sm_scale: the softmax scale not applied", none}};
    if (wr) h.push_back({kWrap, wr->dkv});
    if (once) h.push_back({kOnce, once->dkv});
    const prec::ClassValues cv = emu.classes(false, c_.find(name(l, "attn_bwd.dkv"))->dtype == io::DType::BF16);
    judge_gradient(l, P, "attn_bwd.dkv", dkv, std::move(b["dkv"]), s_kv, 1, d_qk, kFloorGrad, h, dkv_precision ? &cv : nullptr);
    if (!dkv_precision)
      res.notes.push_back(P + ": attn_bwd.dkv: precision test not run (its emulation sums over every query row: " +
                          std::to_string(dkv_work) + " multiply-adds, above the judge's 2^30)");
  }
  if (has(l, "attn_bwd.delta")) {
    // Delta summed in bf16 (each partial sum rounded), from the bf16 out, c ascending.
    Tensor<float> bf_sum(delta.shape);
    for (int64_t e = 0; e < delta.numel(); ++e) {
      float acc = 0;
      for (int64_t c = 0; c < d_v_; ++c)
        acc = bf16_to_f32(f32_to_bf16(acc + bf16_to_f32(f32_to_bf16(out[e * d_v_ + c])) * bf16_to_f32(d_out[e * d_v_ + c])));
      bf_sum[e] = acc;
    }
    judge_gradient(l, P, "attn_bwd.delta", delta, std::move(b["delta"]), s_q_, h_q_, 1, kFloorGrad,
                   {{"Delta accumulated in bf16 (each partial sum rounded to bf16) instead of f32", bf_sum}});
  }
  if (has(l, "attn_bwd.d_sink")) {
    if (!sink) throw Error(c_.source + ": " + name(l, "attn_bwd.d_sink") + ": the golden set's layer " + std::to_string(l) + " has no sink");
    const Tensor<float> dsink = g_.tensor<float>(name(l, "attn_bwd.d_sink"));
    judge_gradient(l, P, "attn_bwd.d_sink", dsink, std::move(b["d_sink"]), 0, 0, 0, kFloorGrad, {});
  }
}

void Judge::judge_indexer_loss(int l, const std::string& P) {
  const phases::Scope s("gradients: indexer loss");
  const json& tr = m_["train"];
  std::vector<int> teachers;
  for (const json& e : tr["indexer_losses"])
    if (e["layer"] == l) teachers = e["teachers"].get<std::vector<int>>();
  if (teachers.empty())
    throw Error(c_.source + ": " + name(l, "indexer_loss.*") + ": layer " + std::to_string(l) + " has no indexer loss in the golden set");
  const Tensor<bf16_t> iq = g_.tensor<bf16_t>(name(l, "indexer.q")), ik = g_.tensor<bf16_t>(name(l, "indexer.k"));
  const Tensor<float> w = g_.tensor<float>(name(l, "indexer.weights"));
  const Tensor<int32_t> ks = g_.tensor<int32_t>(name(l, "indexer.ks")), ke = g_.tensor<int32_t>(name(l, "indexer.ke"));
  const Tensor<int32_t> topk = g_.tensor<int32_t>(name(l, "indexer.topk"));
  std::vector<Tensor<bf16_t>> tq, tkv;
  for (int m : teachers) {
    tq.push_back(g_.tensor<bf16_t>(name(m, "attn.q")));
    tkv.push_back(g_.tensor<bf16_t>(name(m, "attn.kv")));
  }
  std::map<std::string, Tensor<float>> gold;
  for (const char* n : {"p", "log_q", "kl", "loss", "d_scores", "dq", "dk", "dw"})
    gold[n] = g_.tensor<float>(name(l, std::string("indexer_loss.") + n));
  const Tensor<float> scores = g_.find(name(l, "indexer.logits")) ? g_.tensor<float>(name(l, "indexer.logits"))
                                                                  : ref::indexer_logits_f32(bf16_to_f32(iq), bf16_to_f32(ik), Tensor<float>({ik.dim(0)}, 1.0f), w, ks, ke);
  int64_t valid = 0;
  for (int64_t t = 0; t < ks.numel(); ++t) valid += ke[t] > ks[t];
  const double coeff = tr["loss_coeff"].get<double>(), N = double(std::max<int64_t>(valid, 1));
  cmp::IndexerLossTruth x;
  x.q = &iq;
  x.k = &ik;
  x.w = &w;
  x.ks = &ks;
  x.ke = &ke;
  x.topk = tr["loss"] == "sparse" ? &topk : nullptr;
  for (size_t i = 0; i < teachers.size(); ++i) {
    x.teacher_q.push_back(&tq[i]);
    x.teacher_kv.push_back(&tkv[i]);
  }
  x.sm = sm_;
  x.relu = tr["relu"].get<bool>();
  x.scores = &scores;
  x.p = &gold["p"];
  x.log_q = &gold["log_q"];
  x.kl = &gold["kl"];
  x.d_scores = &gold["d_scores"];
  x.dq = &gold["dq"];
  x.dk = &gold["dk"];
  x.dw = &gold["dw"];
  x.loss = gold["loss"][0];
  x.g = coeff / N;
  x.coeff_over_n = coeff / N;
  std::map<std::string, std::vector<float>> b = cmp::indexer_loss_bounds(x);
  // The loss convention (ref/train/indexer_loss.h, kl_form): with more than one teacher, kl and loss
  // hold KL(p-bar || q) or mean_j KL(p_j || q), which differ by a constant of the teachers (the
  // gradients are the same). The set names its own (kl-of-mean where it does not say); a candidate
  // that declares the other (--precision kl=...) is judged on it, recomputed from the set's inputs;
  // an undeclared one that matches the other form is named.
  const std::string set_form = tr.value("kl_form", std::string("kl-of-mean"));
  std::map<std::string, Tensor<float>> other;  // kl, loss under the form the set does not hold
  std::string other_form;
  if (teachers.size() > 1 && (has(l, "indexer_loss.kl") || has(l, "indexer_loss.loss"))) {
    other_form = set_form == "kl-of-mean" ? "mean-of-kl" : "kl-of-mean";
    std::vector<ref::train::TeacherLayer> tl;
    for (size_t i = 0; i < teachers.size(); ++i) tl.push_back({&tq[i], &tkv[i], sm_, nullptr});
    ref::train::IndexerLossOptions o;
    o.relu = x.relu;
    o.sparse = x.topk != nullptr;
    o.loss_coeff = coeff;
    o.target = ref::train::Target::served_layers;
    o.kl_form = ref::train::parse_kl_form(other_form);
    const ref::train::IndexerLossOut r = k_.indexer_loss(bf16_to_f32(iq), bf16_to_f32(ik), w, ks, ke, x.topk, tl, o);
    other["kl"] = r.kl;
    other["loss"] = Tensor<float>({1}, float(r.loss));
    if (contract_.kl_form == other_form) {  // declared: the expected values are the other form's
      for (const char* n : {"kl", "loss"}) gold[n] = other[n];  // the gap is a constant, exact in double
      other.clear();
    }
  }
  const int64_t H = iq.dim(1), D = iq.dim(2), s_kv = ik.dim(0);
  for (const char* n : {"p", "log_q", "kl", "loss", "d_scores", "dq", "dk", "dw"}) {
    const std::string tn = std::string("indexer_loss.") + n;
    if (!has(l, tn)) continue;
    const Tensor<float>& gt = gold[n];
    // Normalised by every row instead of the valid rows, or the coefficient applied twice / not at all.
    std::vector<std::pair<std::string, Tensor<float>>> h;
    if (other.count(n))
      h.push_back({"the loss convention " + other_form + (other_form == "mean-of-kl" ? " (mean_j KL(p_j || q))" : " (KL(mean_j p_j || q))") +
                       "; the set holds " + set_form + ": declare it with --precision kl=" + other_form,
                   other[n]});
    if (std::string(n) != "p" && std::string(n) != "log_q" && std::string(n) != "kl") {
      if (valid != s_q_) h.push_back({"the loss normalised by all rows (s_q) instead of the valid rows", scaled(gt, N / double(s_q_))});
      if (coeff != 1) {
        h.push_back({"loss_coeff applied twice", scaled(gt, coeff)});
        h.push_back({"loss_coeff not applied", scaled(gt, 1 / coeff)});
      }
    }
    const bool matrix = std::string(n) == "dq";
    const bool rows2 = std::string(n) == "p" || std::string(n) == "log_q" || std::string(n) == "d_scores" || std::string(n) == "dk" ||
                       std::string(n) == "dw";
    const int64_t rows = std::string(n) == "dk" ? s_kv : s_q_;
    const int64_t heads = matrix ? H : (rows2 ? 1 : 0);
    const int64_t cols = matrix ? D : std::string(n) == "dk" ? D : std::string(n) == "dw" ? H : rows2 ? s_kv : 1;
    judge_gradient(l, P, tn, gt, std::move(b[n]), rows, heads, cols, 0x1p-14, h);
  }
}

}  // namespace indexshare::diff::detail

// indexshare diff: the walk over layers and tensors (class Judge), steps 1-5 of judge/diff.h.
#include "tools/judge/walk.h"

#include <algorithm>
#include <cmath>

namespace indexshare::diff {

namespace detail {

std::set<int> Judge::candidate_layers(const std::set<int>& wanted) const {
  std::set<int> layers;
  // A model dump (python -m indexshare.dump) is a candidate too: the model's own choices are under
  // the judged names, and its inputs (which --from reads) are passed over.
  auto fmt = c_.metadata.find("format");
  const bool model_dump = fmt != c_.metadata.end() && fmt->second == golden::kDumpFormat;
  for (const io::TensorView& v : c_.tensors) {
    int l = -1;
    char rest[128] = {0};
    if (model_dump && (v.name == "cu_seqlens_q" || v.name == "cu_seqlens_k" ||
                       (std::sscanf(v.name.c_str(), "layers.%d.%127s", &l, rest) == 2 && kDumpInputs.count(rest))))
      continue;
    const bool parsed = std::sscanf(v.name.c_str(), "layers.%d.%127s", &l, rest) == 2;
    const bool judged = std::find(kJudged.begin(), kJudged.end(), std::string(rest)) != kJudged.end() ||
                        (train_ && std::find(kJudgedTrain.begin(), kJudgedTrain.end(), std::string(rest)) != kJudgedTrain.end());
    if (!parsed || !judged ||
        v.name != "layers." + std::to_string(l) + "." + rest)
      throw Error(c_.source + ": tensor '" + v.name + "' is not a golden output name (expected layers.{l}." +
                  "indexer.logits, indexer.topk, attn.indices, attn.indices_physical, attn.out, attn.lse, attn.max_logits, a "
                  "model dump's attn.model_out, or a training set's attn_bwd.{delta,dq,dkv,d_sink} and "
                  "indexer_loss.{p,log_q,kl,loss,d_scores,dq,dk,dw})");
    if (l < 0 || l >= n_layers_)
      throw Error(c_.source + ": tensor '" + v.name + "': layer " + std::to_string(l) + " is outside the golden set's " +
                  std::to_string(n_layers_) + " layers");
    if (wanted.empty() || wanted.count(l)) layers.insert(l);
  }
  for (int l : wanted)
    if (!layers.count(l)) throw Error(c_.source + ": --layer-list asks for layer " + std::to_string(l) + ", which the candidate does not hold");
  if (layers.empty()) throw Error(c_.source + ": no golden output names to judge");
  return layers;
}

void Judge::judge_layer(int l) {
  release_freed_memory();  // what reading the set and the previous layer left in the heap
  const LayerData& d = layer(l);
  const std::string P = "layer " + std::to_string(l) + (d.full ? " (Full)" : " (Shared, source " + std::to_string(d.source) + ")");
  io::DiffPanel panel;
  panel.layer = l;
  panel.label = P;
  panel.row_ids = ids_;
  const size_t diagnoses0 = res.diagnoses.size(), tensors0 = res.tensors.size();
  {  // the candidate's logits and their bound serve the logits and top-k checks only
    phases::begin("indexer logits and top-k");
    Tensor<float> cand_logits;
    if (has(l, "indexer.logits")) cand_logits = judge_logits(d, P);
    if (has(l, "indexer.topk")) judge_topk(d, P, cand_logits, panel);
    data_[size_t(l)].logits_rule = cmp::FloatRule();
    // The layer's indexer inputs serve its own logits' bound only (a failure's hypotheses read
    // them from the set again): freed before the attention's buffers are allocated.
    LayerData& y = data_[size_t(l)];
    y.index_q8 = y.index_k8 = Tensor<e4m3_t>();
    y.index_k_scale = y.index_weights = Tensor<float>();
  }
  release_freed_memory();
  phases::begin("indices");
  UsedIndices used{d.indices, ""};
  if (has(l, "attn.indices")) used = judge_indices(d, P, panel);
  if (has(l, "attn.indices_physical")) judge_physical(d, P);
  release_logits_after(l);
  release_freed_memory();  // the logits and the indices' row sets, before the attention's buffers
  if (has(l, "attn.model_out")) judge_model_out(d, P, used, panel);
  if (has(l, "attn.out") || has(l, "attn.lse") || has(l, "attn.max_logits")) judge_attention(d, P, used, panel);
  if (train_) judge_gradients(l, P);
  // Causes first (the hypotheses and arithmetic classes that explain a failure), then the symptoms
  // (the structure tests' findings): the first diagnosis of a layer names the bug when one does.
  res.diagnoses.insert(res.diagnoses.end(), symptoms_.begin(), symptoms_.end());
  symptoms_.clear();
  finish_panel(res, std::move(panel), P, diagnoses0, tensors0);
  // Memory: the layer's attention tensors are not read again (later layers read only another
  // layer's indices, windows, logits and top-k).
  LayerData& done = data_[size_t(l)];
  done.q = done.kv = Tensor<bf16_t>();
  done.out = done.lse = done.max_logits = Tensor<float>();
  done.sink.reset();
}

cmp::FloatRule Judge::logits_rule(const LayerData& d) {
  const std::string p = name(d.l, "");
  if (g_.get(p + "indexer.q").dtype == io::DType::F8_E4M3)  // the indexer's inputs as loaded with the layer
    data_[size_t(d.l)].logits_rule = k_.indexer_logits_rule(d.index_q8, d.index_k8, d.index_k_scale, d.index_weights, d.logits);
  else if (d.logits_rule.bound.empty())  // bf16-mode sets: the same rule on their bf16 q and k (ref/bounds.h)
    data_[size_t(d.l)].logits_rule =
        cmp::indexer_logits_rule(g_.tensor<bf16_t>(p + "indexer.q"), g_.tensor<bf16_t>(p + "indexer.k"),
                                 g_.tensor<float>(p + "indexer.k_scale"), g_.tensor<float>(p + "indexer.weights"), d.logits);
  return d.logits_rule;
}

Tensor<float> Judge::judge_logits(const LayerData& d, const std::string& P) {
  const int l = d.l;
  require_indexer(d, "indexer.logits");
  golden_logits(l);  // d.logits from here on
  Tensor<float> cand_logits = cand_float(name(l, "indexer.logits"), {s_q_, s_kv_});
  // clean_logits=False (the paged indexer's default; the set's `kernel` block records it): the
  // kernel leaves unspecified values outside each row's window [ks, ke), so they are masked to
  // -inf here, as DeepGEMM's own tests do before comparing; inside the window nothing changes.
  // With clean_logits=True (or no kernel block) the -inf positions must match exactly.
  // (golden::read has checked the block: an object with a name, kwargs an object, clean_logits a bool.)
  if (const json* kb = m_.contains("kernel") ? &m_["kernel"] : nullptr;
      kb && kb->contains("kwargs") && (*kb)["kwargs"].value("clean_logits", true) == false) {
    int64_t masked = 0;
    for (int64_t t = 0; t < s_q_; ++t)
      for (int64_t s = 0; s < s_kv_; ++s)
        if ((s < d.ks[t] || s >= d.ke[t]) && !(std::isinf(cand_logits.at(t, s)) && cand_logits.at(t, s) < 0)) {
          cand_logits.at(t, s) = -std::numeric_limits<float>::infinity();
          ++masked;
        }
    res.notes.push_back(P + ": indexer.logits: " + std::to_string(masked) + " values outside the rows' windows [ks, ke) set to -inf before "
                        "judging (the set's kernel " + (*kb)["name"].get<std::string>() + " runs with clean_logits=False, which leaves them unspecified)");
  }
  // DeepGEMM's calc_diff where it is the stricter threshold. The rule's own metric is kept aside
  // for the RoPE hypothesis below (a failure's only): its per-element bound, as large as the
  // logits, is not copied.
  cmp::FloatRule strict = logits_rule(d);
  const double own_metric_max = strict.metric_max;
  const std::string own_metric_name = strict.metric_name;
  if (strict.metric_max < 0 || strict.metric_max > kDeepGemmLogitsDiff) {
    strict.metric_max = kDeepGemmLogitsDiff;
    strict.metric_name = "(DeepGEMM's fp32-logits check against the simulated reference)";
  } else {
    strict.metric_name = "(every element off by its bound; stricter than DeepGEMM's 5e-6 here)";
  }
  cmp::StructureSpec spec;
  spec.tensor = "indexer.logits";
  spec.rows = s_q_;
  spec.cols = s_kv_;
  spec.cluster_cols = 128;
  spec.lanes = true;
  spec.row_seq = row_sequences(g_, s_q_, &d.ks);
  spec.row_ids = ids_;
  spec.floor = cmp::kFloorLogits;
  cmp::StructureReport st;
  const cmp::Verdict lv = add(l, "indexer.logits", cmp::compare_structured("", d.logits, cand_logits, strict, spec, &st));
  for (const std::string& f : st.findings) symptoms_.push_back(P + ": " + f);
  pool(pools_, "indexer.logits", d.full, st, roles_, l);
  if (d.index_q8.numel()) {  // FP8 sets: the classes are emulated on the set's own FP8 inputs
    auto elems = prec::sample_logits(d.ks, d.ke, s_kv_);
    std::vector<double> gold, cand, scale;
    const Tensor<float>& cl = cand_logits;  // read only (it may be a view of the candidate's file)
    for (const auto& [t, s] : elems) {
      gold.push_back(d.logits.at(t, s));
      cand.push_back(cl.at(t, s));
      scale.push_back(d.logits_rule.bound[size_t(t * s_kv_ + s)]);
    }
    const prec::ClassValues values = prec::logits_classes(d.index_q8, d.index_k8, d.index_k_scale, d.index_weights, elems, gold);
    precision(P, "indexer.logits", gold, cand, prec::Kind::logits, values);
    tie_scale_[l] = prec::max_scaled_deviation(gold, scale, prec::Kind::logits, contract_, values);
  }
  else if (g_.get(name(l, "indexer.q")).dtype == io::DType::BF16) {  // bf16 sets: on their bf16 q and k
    // (the top-k's near-tie margin stays the logits bound's: no contract-scaled margin here yet)
    const auto elems = prec::sample_logits(d.ks, d.ke, s_kv_);
    std::vector<double> gold, cand;
    const Tensor<float>& cl = cand_logits;
    for (const auto& [t, s] : elems) {
      gold.push_back(d.logits.at(t, s));
      cand.push_back(cl.at(t, s));
    }
    const Tensor<bf16_t> q = g_.tensor<bf16_t>(name(l, "indexer.q")), k = g_.tensor<bf16_t>(name(l, "indexer.k"));
    const Tensor<float> k_scale = g_.tensor<float>(name(l, "indexer.k_scale")), w = g_.tensor<float>(name(l, "indexer.weights"));
    precision(P, "indexer.logits", gold, cand, prec::Kind::logits, prec::logits_classes(q, k, k_scale, w, elems, gold));
  }
  if (lv == cmp::Verdict::fail)
    if (const auto sw = swapped_rope(g_, l, d.ks, d.ke, k_)) {
      cmp::FloatRule rule = strict;
      rule.metric_max = own_metric_max;
      rule.metric_name = own_metric_name;
      if (passes(cmp::compare_floats("", sw->logits, cand_logits, rule)))
        res.diagnoses.push_back(P + ": indexer.logits match the indexer with its RoPE layout swapped (" + sw->layout +
                                " instead of the model's)");
    }
  // A model dump's own logits: their top-k against the golden's inputs re-rotated (a NaN anywhere
  // leaves the hypothesis out: top-k refuses NaN, and the failure is reported already).
  if (lv == cmp::Verdict::fail && candidate_is_dump()) {
    bool finite_or_inf = true;
    for (int64_t i = 0; i < cand_logits.numel() && finite_or_inf; ++i) finite_or_inf = !std::isnan(cand_logits[i]);
    if (finite_or_inf) rope_dump_hypothesis(d, P, k_.topk(cand_logits, d.ks, d.ke, topk_), "the top-k of indexer.logits");
  }
  return cand_logits;
}

void Judge::judge_topk(const LayerData& d, const std::string& P, const Tensor<float>& cand_logits, io::DiffPanel& panel) {
  const int l = d.l;
  require_indexer(d, "indexer.topk");
  const Tensor<int32_t> ct = cand_int(name(l, "indexer.topk"), {s_q_, topk_}, res.diagnoses);
  cmp::TopkOptions o;
  if (cand_logits.numel()) { o.candidate_logits = &cand_logits; o.logits_rule = &d.logits_rule; }
  // Near ties only as wide as the contract's arithmetic moves a score (twice the most it moved one
  // in the logits' sample), when the logits were judged on an FP8 set.
  if (const auto it = tie_scale_.find(l); it != tie_scale_.end() && cand_logits.numel()) o.contract_tie = 2 * it->second;
  const cmp::Verdict v = add(l, "indexer.topk", cmp::compare_topk("", logits_of(l), d.ks, d.ke, d.topk, ct, o));
  if (res.tensors.back().report.stats.wide_ties > 0)
    res.diagnoses.push_back(P + ": indexer.topk is the top-k of scores computed at a lower precision than the contract's (" +
                            contract_.logits + "): its near ties are wider than that arithmetic moves a score");
  panel.recall = rows_against(ct, d.topk, s_kv_).recall;
  panel.recall_of = "indexer.topk";
  // Unsorted output is never a failure, only a remark. A row that is the golden's slot for slot is
  // in score order (ref/topk.h writes the tie rule's order): only the other rows read the scores.
  bool sorted = true;
  for (int64_t t = 0; t < s_q_ && sorted; ++t) {
    if (std::equal(ct.ptr() + t * topk_, ct.ptr() + (t + 1) * topk_, d.topk.ptr() + t * topk_)) continue;
    const Tensor<float>& lg = golden_logits(l);
    for (int64_t j = 0; j + 1 < topk_ && sorted; ++j) {
      const int32_t a = ct.at(t, j), b = ct.at(t, j + 1);
      if (a >= 0 && b >= 0 && a < d.ke[t] - d.ks[t] && b < d.ke[t] - d.ks[t])
        sorted = lg.at(t, d.ks[t] + a) >= lg.at(t, d.ks[t] + b);
    }
  }
  if (!sorted) res.notes.push_back(P + ": indexer.topk is not in score order (fine: slot order carries no meaning)");
  if (v == cmp::Verdict::fail) topk_hypotheses(d, P, ct);
}

Judge::UsedIndices Judge::judge_indices(const LayerData& d, const std::string& P, io::DiffPanel& panel) {
  const int l = d.l;
  UsedIndices used{d.indices, ""};
  const Tensor<int32_t> ci = cand_int(name(l, "attn.indices"), {s_q_, 1, topk_}, res.diagnoses);
  const LayerData& src = layer(d.source);  // the layer whose indexer chose the positions
  cmp::Report r = indices_report(d, src, P, ci);
  if (!d.full && passes(r) && has(d.source, "attn.indices")) {
    // IndexShare: exactly the source layer's positions in the candidate's own pipeline (the
    // source layer's own check diagnoses its values).
    std::vector<std::string> ignored;
    if (!rows_against(ci, cand_int(name(d.source, "attn.indices"), {s_q_, 1, topk_}, ignored), s_kv_).same_sets) {
      r.verdict = cmp::Verdict::fail;
      r.reasons.push_back("the Shared layer's positions differ from its source layer " + std::to_string(d.source) + "'s in the candidate");
    }
  }
  const cmp::Verdict v = add(l, "attn.indices", r);
  RowsAgainst against = rows_against(ci, d.indices, s_kv_);
  panel.recall = std::move(against.recall);
  panel.recall_of = "attn.indices";
  if (v != cmp::Verdict::fail && !against.same_sets) {
    used.indices = ci;
    used.note = "expected attention recomputed on the candidate's indices (they differ from the golden's only by ties)";
  }
  if (v == cmp::Verdict::fail) indices_hypotheses(d, P, ci);
  return used;
}

cmp::Report Judge::indices_report(const LayerData& d, const LayerData& src, const std::string& P, const Tensor<int32_t>& ci) {
  if (!src.has_indexer) return cmp::compare_exact("", d.indices, ci);
  const Tensor<int32_t> local = rows_to_local(ci, src.ks, src.ke);
  Tensor<int32_t> written = ci;
  written.shape = local.shape;
  cmp::Report r = cmp::compare_topk("", logits_of(src.l), src.ks, src.ke, src.topk, local, {false, nullptr, nullptr, &written});
  if (!passes(r)) {  // raw torch.topk rows: kv rows at or past ke in rows shorter than top-k
    Tensor<int32_t> beyond = local;
    for (int64_t t = 0; t < s_q_; ++t)
      for (int64_t j = 0; j < topk_; ++j)
        if (beyond.at(t, j) == -2 && written.at(t, j) >= src.ke[t]) beyond.at(t, j) = written.at(t, j) - src.ks[t];
    if (const auto padded = pad_beyond_window(beyond, src.ks, src.ke))
      if (passes(cmp::compare_topk("", logits_of(src.l), src.ks, src.ke, src.topk, *padded, {false, nullptr, nullptr})))
        res.diagnoses.push_back(P + ": attn.indices hold " + kBeyondWindow);
  }
  return r;
}

void Judge::judge_physical(const LayerData& d, const std::string& P) {
  const int l = d.l;
  require(g_.find(name(l, "attn.indices_physical")) != nullptr,
          c_.source + ": " + name(l, "attn.indices_physical") + ": the golden set is not a decode set");
  const Tensor<int32_t> gp = g_.tensor<int32_t>(name(l, "attn.indices_physical"));
  Tensor<int32_t> cp = cand_int(name(l, "attn.indices_physical"), gp.shape, res.diagnoses);
  Tensor<int32_t> gflat = gp, cflat = cp;
  gflat.shape = cflat.shape = {s_q_, 1, topk_};
  cmp::Report r;
  r.stats.n = s_q_;
  const auto gs = row_sets(gflat, INT32_MAX), cs = row_sets(cflat, INT32_MAX);
  for (int64_t t = 0; t < s_q_; ++t) {
    ++r.stats.n_checked;
    if (gs[size_t(t)] != cs[size_t(t)]) {
      ++r.stats.n_fail;
      if (r.mismatches.size() < cmp::kMaxMismatches) r.mismatches.push_back({{t}, 0, 0, 0, 0, "physical slots differ from the golden's"});
    }
  }
  if (r.stats.n_fail) {
    r.verdict = cmp::Verdict::fail;
    r.reasons.push_back(std::to_string(r.stats.n_fail) + " row(s) whose physical slots differ (as sets) from the golden's");
    if (cs == row_sets(d.indices, s_kv_))
      res.diagnoses.push_back(P + ": attn.indices_physical are logical kv rows; physical (paged) slots were expected");
  }
  add(l, "attn.indices_physical", r);
}

void Judge::judge_attention(const LayerData& d, const std::string& P, const UsedIndices& used, io::DiffPanel& panel) {
  const int l = d.l;
  // The softmax-scale direction of the structure tests (out and lse) comes from the bounds' pass.
  const bool with_sm = has(l, "attn.out") || has(l, "attn.lse");
  // The candidate's out first: the bounds' pass folds the softmax-scale direction against it.
  phases::begin("attention: the candidate's out");
  Tensor<float> co;
  if (has(l, "attn.out")) co = cand_float(name(l, "attn.out"), {s_q_, h_q_, d_v_}, std::move(recycled_.co));
  const Tensor<float>* cop = co.numel() ? &co : nullptr;
  phases::begin("attention: expected outputs and bounds");
  Expected e;
  if (used.note.empty()) {  // the golden's own outputs, bounds and budget
    // Moved, not copied: the layer's golden outputs are not read again (see the end of judge_layer).
    e.attn.out = std::move(data_[size_t(l)].out);
    e.attn.lse = std::move(data_[size_t(l)].lse);
    e.attn.max_logits = std::move(data_[size_t(l)].max_logits);
    const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
    if (with_sm) {
      e.bounds.out = std::move(recycled_.bound);
      bounds_sm_by_blocks(k_, g_, d, d.indices, sm_, d_v_, e.attn, cop, e);
    } else {
      e.bounds = k_.attention_bounds(with_q(l).q, d.kv, d.indices, sm_, d_v_, tl, e.attn);
    }
    const json& b = m_["budgets"];
    e.budget = b.contains(name(l, "attn.out")) ? b[name(l, "attn.out")]["budget_max_abs"].get<double>() : -1;
  } else {
    e = expected_attention(g_, with_q(l), used.indices, sm_, d_v_, k_, with_sm, cop);
  }
  // Memory: q (the size of the output at d_qk 576, d_v 512) is read again only by a failure's
  // hypotheses (out_hypotheses reloads it); the passing path holds out, bound, direction and
  // the candidate's out at once without it.
  data_[size_t(l)].q = Tensor<bf16_t>();
  release_freed_memory();
  AttnCtx a{d, P, used.note, used.indices, std::move(e), {}, 0, nullptr};
  a.seqs = row_sequences(g_, s_q_, d.has_indexer ? &d.ks : layer(d.source).has_indexer ? &layer(d.source).ks : nullptr);
  a.lse_scale = lse_anchor_scale(a.e.attn.max_logits);
  a.lse_abs = kFlashMlaLseAbs * a.lse_scale;
  {
    const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
    std::vector<int64_t> rows = prec::sample_rows(a.use, tl, s_kv_, h_q_, d.kv.dim(2), d_v_);
    // q's sampled rows, read when a class is first emulated (a candidate at the f32 floor, an
    // exact copy, emulates none).
    auto q_rows = [this, l, rows]() {
      Tensor<bf16_t> read;  // q from the set, when the layer does not hold it
      const Tensor<bf16_t>& q = data_[size_t(l)].q.numel() ? data_[size_t(l)].q : (read = g_.tensor<bf16_t>(name(l, "attn.q")));
      return q_at_rows(q, rows);
    };
    a.classes = std::make_unique<prec::AttentionClasses>(std::move(rows), q_rows, d.kv, a.use, tl, d.sink ? &*d.sink : nullptr,
                                                         sm_, d_v_);
  }
  phases::begin("attention: compare and structure tests");
  if (has(l, "attn.out")) judge_out(a, co, panel);
  if (has(l, "attn.lse")) judge_lse(a);
  if (has(l, "attn.max_logits")) judge_max_logits(a);
  recycled_.out = std::move(a.e.attn.out);
  recycled_.co = std::move(co);
  if (!a.e.bounds.out.empty()) recycled_.bound = std::move(a.e.bounds.out);
}

cmp::Verdict Judge::structured(AttnCtx& a, const std::string& tensor, const Tensor<float>& expected, const Tensor<float>& got,
                               const cmp::FloatRule& rule, cmp::StructureSpec spec) {
  spec.tensor = tensor;
  spec.row_seq = a.seqs;
  spec.row_ids = ids_;
  cmp::StructureReport st;
  const cmp::Verdict v = add(a.d.l, tensor, cmp::compare_structured("", expected, got, rule, spec, &st), a.note);
  for (const std::string& f : st.findings) symptoms_.push_back(a.P + ": " + f);
  pool(pools_, tensor, a.d.full, st, roles_, a.d.l);
  return v;
}

void Judge::judge_out(AttnCtx& a, const Tensor<float>& co, io::DiffPanel& panel) {
  cmp::FloatRule rule = bound_rule(std::move(a.e.bounds.out), a.e.budget);
  const double scale = out_anchor_scale(a.d.kv, d_v_);
  rule.anchor_abs = (decode_ ? kFlashMlaDecodeOutAbs : kFlashMlaOutAbs) * scale;
  rule.anchor_rel = decode_ ? kFlashMlaDecodeOutRel : kFlashMlaOutRel;
  rule.anchor_name = anchor_named(decode_ ? "FlashMLA's decode check_is_allclose" : "FlashMLA's prefill check_is_allclose", scale);
  rule.metric_max = decode_ ? kFlashMlaDecodeOutCos : kFlashMlaOutCos;
  rule.metric_name = decode_ ? "(FlashMLA's decode cos_diff_tol)" : "(FlashMLA's prefill cos_diff_tol)";
  cmp::StructureSpec spec = out_spec(d_v_, nullptr);
  spec.sm_sums = a.e.sm_out_sums.data();
  panel.rows = s_q_;
  panel.heads = h_q_;
  if (picture_) panel.ratio = out_ratios(a.e.attn.out, co, rule.bound, d_v_);
  structured(a, "attn.out", a.e.attn.out, co, rule, spec);
  const std::vector<int64_t>& rows = a.classes->rows();
  precision(a.P, "attn.out", prec::at_rows(a.e.attn.out, rows), prec::at_rows(co, rows), prec::Kind::attention, a.classes->values(0));
  if (res.tensors.back().report.verdict == cmp::Verdict::fail) out_hypotheses(a, co);
  recycled_.bound = std::move(rule.bound);
}

void Judge::judge_lse(AttnCtx& a) {
  const LayerData& d = a.d;
  const Tensor<float> cl = cand_float(name(d.l, "attn.lse"), {s_q_, h_q_});
  cmp::FloatRule rule = bound_rule(a.e.bounds.lse);
  rule.anchor_abs = a.lse_abs;
  rule.anchor_rel = decode_ ? kFlashMlaDecodeLseRel : kFlashMlaLseRel;
  rule.anchor_name = anchor_named(decode_ ? "FlashMLA's decode lse check" : "FlashMLA's prefill lse check", a.lse_scale);
  cmp::StructureSpec spec;
  spec.rows = s_q_;
  spec.heads = h_q_;
  spec.floor = cmp::kFloorLse;
  spec.sm_dir = a.e.bounds.sm_lse.data();
  structured(a, "attn.lse", a.e.attn.lse, cl, rule, spec);
  const std::vector<int64_t>& rows = a.classes->rows();
  precision(a.P, "attn.lse", prec::at_rows(a.e.attn.lse, rows), prec::at_rows(cl, rows), prec::Kind::attention, a.classes->values(1));
  if (res.tensors.back().report.verdict != cmp::Verdict::fail) return;
  Tensor<float> conv = cl;
  for (float& v : conv.data) v = float(double(v) * std::log(2.0));
  if (passes(cmp::compare_floats("", a.e.attn.lse, conv, bound_rule(a.e.bounds.lse))))
    res.diagnoses.push_back(a.P + ": attn.lse is in base 2 (log2-sum-exp2 units): it matches the golden once multiplied by ln 2");
  key_dropped_hypothesis(a, "attn.lse", cl);
  if (d.sink) {
    Tensor<float> with = a.e.attn.lse;
    for (int64_t i = 0; i < with.numel(); ++i) {
      const double x = with[i], s = (*d.sink)[i % h_q_], mx = std::max(x, s);
      with[i] = float(mx + std::log(std::exp(x - mx) + std::exp(s - mx)));
    }
    if (passes(cmp::compare_floats("", with, cl, bound_rule(a.e.bounds.lse))))
      res.diagnoses.push_back(a.P + ": attn.lse includes the attention sink (ln(exp(lse) + exp(sink))); the golden's excludes it");
  }
}

void Judge::judge_max_logits(AttnCtx& a) {
  const Tensor<float> cm = cand_float(name(a.d.l, "attn.max_logits"), {s_q_, h_q_});
  cmp::FloatRule rule = bound_rule(a.e.bounds.max_logits);
  rule.anchor_abs = a.lse_abs;
  rule.anchor_rel = kFlashMlaLseRel;
  rule.anchor_name = anchor_named("FlashMLA's prefill max_logits check", a.lse_scale);
  cmp::StructureSpec spec;
  spec.rows = s_q_;
  spec.heads = h_q_;
  spec.floor = cmp::kFloorLse;
  spec.scale_meaning = "max_logits = sm_scale * max q.k, so sm_scale (or its log2(e) folding) is off";
  structured(a, "attn.max_logits", a.e.attn.max_logits, cm, rule, spec);
  const std::vector<int64_t>& rows = a.classes->rows();
  precision(a.P, "attn.max_logits", prec::at_rows(a.e.attn.max_logits, rows), prec::at_rows(cm, rows), prec::Kind::attention,
            a.classes->values(2));
  if (res.tensors.back().report.verdict != cmp::Verdict::fail) return;
  Tensor<float> conv = cm;
  for (float& v : conv.data) v = float(double(v) * std::log(2.0));
  if (passes(cmp::compare_floats("", a.e.attn.max_logits, conv, bound_rule(a.e.bounds.max_logits))))
    res.diagnoses.push_back(a.P + ": attn.max_logits is in base-2 units (scaled by log2 e)");
}

void Judge::precision(const std::string& P, const std::string& tensor, const std::vector<double>& golden,
                      const std::vector<double>& cand, prec::Kind kind, const prec::ClassValues& values) {
  precision_test(res, contract_, P, tensor, golden, cand, kind, values);
}

void precision_test(Result& res, const prec::Contract& contract, const std::string& P, const std::string& tensor,
                    const std::vector<double>& golden, const std::vector<double>& cand, prec::Kind kind,
                    const prec::ClassValues& values) {
  const phases::Scope s("precision test (sampled emulation of the arithmetic classes)");
  const prec::Finding f = prec::test(tensor, golden, cand, kind, contract, values);
  cmp::Report& r = res.tensors.back().report;
  r.precision_ran = f.ran;
  r.precision_rms = f.cand;
  r.precision_contract = f.contract;
  if (!f.failed) return;
  r.verdict = cmp::Verdict::fail;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2g", f.ratio);
  // A named class is a diagnosis; an error no class fits is a measurement, kept with the tensor (the
  // other hypotheses name its cause, if any does).
  r.reasons.push_back("precision: the error is " + std::string(ratio) + "x what the contract's arithmetic (" + f.contract_class +
                      ") gives; more than " + std::to_string(int64_t(prec::kPrecisionRatio)) + "x fails" +
                      (f.named.empty() ? ": " + f.sentence : ""));
  // A class is named only for an error that is mostly without structure: a systematic error (a
  // scale, an offset) is large too, but its size says nothing of the arithmetic, and the structure
  // tests name it. A flagged effect of less than half the error's relative RMS (a quarter of its
  // mean square) leaves the class the explanation: bf16 accumulation over keys every row shares
  // (MQA) leaves such a small, real offset on the columns of the heaviest values. A softmax-scale
  // direction that explains under half the error (bf16 q.k products' convex bias on lse) is no
  // structure of its own.
  const bool structured = std::any_of(r.structure_flagged.begin(), r.structure_flagged.end(), [&](const cmp::StructureNote& n) {
    return n.fits && std::fabs(n.b) >= 0.5 * f.cand;
  });
  if (!f.named.empty() && !structured) res.diagnoses.push_back(P + ": " + f.sentence);
}

void Judge::judge_model_out(const LayerData& d, const std::string& P, const UsedIndices& used, io::DiffPanel& panel) {
  const int l = d.l;
  with_q(l);
  const std::string mo = name(l, "attn.model_out");
  require(candidate_is_dump(), c_.source + ": " + mo + ": only a model dump (python -m indexshare.dump, format " +
                                   golden::kDumpFormat + ") carries a model's own attention");
  auto meta = [&](const char* key) {
    auto it = c_.metadata.find(key);
    return it == c_.metadata.end() ? std::string() : it->second;
  };
  const std::string impl = meta("attn_implementation"), dtype = meta("dtype");
  require(impl == "eager" || impl == "sdpa", c_.source + ": " + mo + ": metadata attn_implementation is '" + impl +
                                                 "'; the model-attention bound is derived for 'eager' and 'sdpa'");
  // eager rounds the logits to bf16; sdpa computes them in f32 unless the dump records that torch
  // was allowed bf16 reductions in its math path (then as eager).
  const bool rounded = impl == "eager" || meta("sdpa_bf16_reduction") == "yes";
  require(dtype == "bfloat16", c_.source + ": " + mo + ": metadata dtype is '" + dtype + "'; the bound is derived for bfloat16 models");
  require(!d.sink, c_.source + ": " + mo + ": the golden layer has an attention sink, which the dumped families do not have");
  const io::TensorView& ov = c_.get(mo);
  require(ov.shape.size() == 3 && ov.shape[0] == s_q_ && ov.shape[1] == h_q_ && ov.shape[2] > 0,
          c_.source + ": " + mo + ": shape " + shape_str(ov.shape) + ", expected [" + std::to_string(s_q_) + ", " +
              std::to_string(h_q_) + ", v_head_dim]");
  const int64_t V = ov.shape[2];
  const io::TensorView& kv_uk = c_.get(name(l, "attn.w_uk"));
  require(kv_uk.shape.size() == 3 && kv_uk.shape[0] == h_q_ && kv_uk.shape[2] == d_v_,
          c_.source + ": " + name(l, "attn.w_uk") + ": shape " + shape_str(kv_uk.shape) + ", expected [" + std::to_string(h_q_) +
              ", qk_nope_head_dim, " + std::to_string(d_v_) + "]");
  const int64_t N = kv_uk.shape[1];
  auto bf = [&](const std::string& n, const Shape& shape) {
    const io::TensorView& v = c_.get(name(l, n));
    io::expect_shape(v, shape, c_.source);
    return io::as_tensor<bf16_t>(v, c_.source);
  };
  const Tensor<bf16_t> w_uv = bf("attn.w_uv", {h_q_, V, d_v_}), w_uk = bf("attn.w_uk", {h_q_, N, d_v_}),
                       q_nope = bf("attn.q_nope", {s_q_, h_q_, N});
  const Tensor<float> co = candidate_float(c_, mo, {s_q_, h_q_, V});
  ref::AttentionOut lat;
  if (used.note.empty() && d.max_logits.numel() == d.lse.numel()) {
    lat.out = d.out;
    lat.lse = d.lse;
    lat.max_logits = d.max_logits;  // read by the bounds' pass
  } else {
    lat = k_.sparse_attention(d.q, d.kv, used.indices, sm_, d_v_, nullptr, nullptr);
  }
  const Tensor<float> expected = cmp::map_latent_output(lat.out, w_uv);
  cmp::FloatRule rule = bound_rule(cmp::model_attention_bounds(d.q, d.kv, used.indices, sm_, q_nope, w_uk, w_uv, lat.out, expected, rounded));
  rule.derivation = "per-element bound of the model's " + impl + " bf16 rounding (judge/model_bounds.h: a transformers model's own attention)";
  // The softmax-scale direction of the latent output (analytic, from the bounds' pass), mapped
  // through W_uv as the output is (linear).
  Tensor<float> lat_dir(lat.out.shape);
  {
    const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
    lat_dir.data = k_.attention_bounds_sm(d.q, d.kv, used.indices, sm_, d_v_, tl, nullptr, lat, nullptr).sm_out;
  }
  const Tensor<float> sm_dir = cmp::map_latent_output(lat_dir, w_uv);
  cmp::StructureSpec spec = out_spec(V, sm_dir.ptr());
  if (panel.rows == 0) {
    panel.rows = s_q_;
    panel.heads = h_q_;
    if (picture_) panel.ratio = out_ratios(expected, co, rule.bound, V);
  }
  AttnCtx a{d, P, used.note, used.indices, {}, row_sequences(g_, s_q_, d.has_indexer ? &d.ks : nullptr), 0, nullptr};
  if (structured(a, "attn.model_out", expected, co, rule, spec) != cmp::Verdict::fail) return;

  model_out_hypotheses(d, P, used, ModelOut{w_uv, w_uk, q_nope, co, lat, expected, rule.bound, V, N, rounded});
}

void Judge::judge_by_role() {
  for (const std::string role : {"Shared", "Full"}) {
    const std::string other = role == std::string("Shared") ? "Full" : "Shared";
    for (const auto& [key, rl] : roles_) {
      const std::string tensor = key.substr(0, key.find('|'));
      if (key.substr(key.find('|') + 1) != role || rl.second.empty() || rl.second.size() != rl.first.size()) continue;
      const auto o = roles_.find(tensor + "|" + other);
      if (o == roles_.end() || o->second.first.empty() || !o->second.second.empty()) continue;
      std::string list;
      for (int l : rl.second) list += (list.empty() ? "" : ", ") + std::to_string(l);
      res.diagnoses.push_back(tensor + ": a systematic error on every " + role + " layer (" + list + ") and on none of the " +
                              std::to_string(o->second.first.size()) + " " + other + " layer(s): an error in the " + role + "-layer path");
    }
  }
}

void Judge::judge_pooled() {
  for (const auto& [key, v] : pools_) {
    if (v.first < 2) continue;
    const std::string tensor = key.substr(0, key.find('|')), role = key.substr(key.find('|') + 1);
    cmp::StructureSpec spec;
    spec.tensor = tensor + " (" + role + " layers pooled)";
    spec.floor = tensor == "attn.out" || tensor == "attn.model_out" ? cmp::kFloorOut
                 : tensor == "indexer.logits"                          ? cmp::kFloorLogits
                                                                      : cmp::kFloorLse;
    const cmp::StructureReport st = cmp::pooled_tests(spec, v.second);
    if (!st.flagged) continue;
    cmp::Report r;
    r.tensor = spec.tensor;
    r.verdict = cmp::Verdict::fail;
    cmp::summarize(st, r);
    r.reasons.push_back("structure test pooled over the " + std::to_string(v.first) + " " + role + " layers flagged a systematic error");
    for (const std::string& f : st.findings) res.diagnoses.push_back(role + " layers: " + f);
    res.checked.push_back(spec.tensor);
    res.tensors.push_back({-1, tensor + " [" + role + "]", std::move(r), ""});
  }
}

Result judge_file(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k,
                  const io::SafetensorsIndex* lazy, const std::string& path, bool picture, const prec::Contract& contract) {
  Judge j(g, c, k, lazy, path, picture, contract);
  j.res.contract = contract;
  j.judge_layers(j.candidate_layers(wanted));
  const size_t across0 = j.res.diagnoses.size();
  phases::begin("across layers");
  j.judge_by_role();
  j.judge_pooled();
  j.res.across_layers.assign(j.res.diagnoses.begin() + long(across0), j.res.diagnoses.end());
  return std::move(j.res);
}

}  // namespace detail

using namespace detail;

Result judge(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted,
             const ref::Kernels& k, bool picture, const prec::Contract& contract) {
  if (g.manifest.value("kind", "") == "v4") return judge_v4(g, c, wanted, k);  // judge/v4.cc
  if (g.manifest.value("kind", "") == "kpool") return judge_kpool(g, c, wanted, k);  // judge/kpool.cc
  if (g.manifest.value("kind", "") == "mtp") return judge_mtp(g, c, wanted, k, picture, contract);  // judge/mtp.cc
  if (g.manifest.value("kind", "") == "hyv4") return judge_hyv4(g, c, wanted, k);  // judge/hyv4.cc
  return judge_file(g, c, wanted, k, nullptr, "", picture, contract);
}

Result judge(const golden::Loaded& g, const io::SafetensorsIndex& c, const std::string& path, const std::set<int>& wanted,
             const ref::Kernels& k, bool picture, const prec::Contract& contract) {
  if (g.manifest.value("kind", "") == "v4") return judge_v4(g, io::read_safetensors(path), wanted, k);  // whole, judge/v4.cc
  if (g.manifest.value("kind", "") == "hyv4") return judge_hyv4(g, io::read_safetensors(path), wanted, k);  // whole, judge/hyv4.cc
  if (g.manifest.value("kind", "") == "kpool") return judge_kpool(g, io::read_safetensors(path), wanted, k);  // whole, judge/kpool.cc
  if (g.manifest.value("kind", "") == "mtp")  // whole (small sets), judge/mtp.cc
    return judge_mtp(g, io::read_safetensors(path), wanted, k, picture, contract);
  return judge_file(g, c.file, wanted, k, &c, path, picture, contract);
}

}  // namespace indexshare::diff

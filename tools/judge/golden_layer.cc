// indexshare diff: a golden layer as the judge reads it, and the expected attention with its bounds.
#include "tools/judge/walk.h"
#include "tools/judge/precision.h"

namespace indexshare::diff {

namespace detail {

std::optional<Tensor<float>> float_view(const io::MappedRange& m, const Shape& shape) {
  if (!m.p || reinterpret_cast<uintptr_t>(m.p) % alignof(float) != 0) return std::nullopt;
  return BorrowedTensor<float>(shape, reinterpret_cast<const float*>(m.p), m.owner).take();
}

void bounds_sm_by_blocks(const ref::Kernels& k, const golden::Loaded& g, const LayerData& d, const Tensor<int32_t>& indices,
                         float sm, int64_t d_v, const ref::AttentionOut& exact, const Tensor<float>* co, Expected& e) {
  const std::string qname = "layers." + std::to_string(d.l) + ".attn.q";
  const io::TensorView& qv = g.get(qname);
  const int64_t s_q = qv.shape[0], h_q = qv.shape[1], d_qk = qv.shape[2], topk = indices.dim(2);
  std::optional<golden::Loaded::Stream> qs;
  Tensor<bf16_t> qbuf;
  if (d.q.numel() == 0) qs.emplace(g, qname);
  const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
  const Tensor<float>* sink = d.sink ? &*d.sink : nullptr;
  const int64_t per_row = std::max<int64_t>(1, h_q * d_v);  // output floats per query row
  const int64_t block_bytes = std::max<int64_t>(int64_t(1) << 20, 4 * s_q * per_row / 32);
  const int64_t rows = std::max<int64_t>(16, block_bytes / (4 * per_row));
  cmp::AttentionBounds& b = e.bounds;  // b.out may hold recycled memory: assigned, not appended to
  reserve_advised(b.out, size_t(s_q * per_row));
  b.out.assign(size_t(s_q * per_row), 0.0f);
  b.lse.assign(size_t(s_q * h_q), 0.0f);
  b.max_logits.assign(size_t(s_q * h_q), 0.0f);
  b.sm_lse.assign(size_t(s_q * h_q), 0.0f);
  e.sm_out_sums.assign(co ? size_t(2 * s_q * h_q) : 0, 0.0);
  // kv's shared work (simd: kv in f32 and |kv|, its exponent range) once for every block.
  const std::unique_ptr<cmp::BoundsKv> skv = k.prepare_bounds_kv ? k.prepare_bounds_kv(d.kv, d_qk) : nullptr;
  for (int64_t r0 = 0; r0 < s_q; r0 += rows) {
    const int64_t n = std::min(rows, s_q - r0);
    if (qs) {
      qbuf.shape = {n, h_q, d_qk};
      qbuf.data.resize(size_t(n * h_q * d_qk));
      qs->read(qbuf.ptr(), qbuf.data.size() * sizeof(bf16_t));
    }
    const BorrowedTensor<bf16_t> q({n, h_q, d_qk}, qs ? qbuf.ptr() : d.q.ptr() + r0 * h_q * d_qk);
    const BorrowedTensor<int32_t> ix({n, 1, topk}, indices.ptr() + r0 * topk);
    std::optional<BorrowedTensor<int32_t>> len;
    if (tl) len.emplace(Shape{n}, tl->ptr() + r0);
    // The block's rows of the exact outputs, as views (no copy).
    auto slice = [&](const Tensor<float>& t, int64_t w) {
      return BorrowedTensor<float>(w == 1 ? Shape{n, h_q} : Shape{n, h_q, w}, t.ptr() + r0 * h_q * w).take();
    };
    ref::AttentionOut views;
    views.out = slice(exact.out, d_v);
    views.lse = slice(exact.lse, 1);
    views.max_logits = slice(exact.max_logits, 1);
    const ref::AttentionOut& x = views;  // read only from here (a borrowed Storage is never written)
    const cmp::AttentionBounds bb = k.attention_bounds_sm(q, d.kv, ix, sm, d_v, len ? &len->get() : nullptr, sink, x, skv.get());
    std::copy(bb.out.begin(), bb.out.end(), b.out.begin() + r0 * per_row);
    std::copy(bb.lse.begin(), bb.lse.end(), b.lse.begin() + r0 * h_q);
    std::copy(bb.max_logits.begin(), bb.max_logits.end(), b.max_logits.begin() + r0 * h_q);
    std::copy(bb.sm_lse.begin(), bb.sm_lse.end(), b.sm_lse.begin() + r0 * h_q);
    if (co)
      cmp::sm_cluster_sums(x.out.ptr(), co->ptr() + r0 * per_row, bb.sm_out.data(), n * h_q, d_v, e.sm_out_sums.data() + 2 * r0 * h_q);
  }
  if (qs) qs->finish();
}

Expected expected_attention(const golden::Loaded& g, const LayerData& d, const Tensor<int32_t>& indices, float sm, int64_t d_v,
                            const ref::Kernels& k, bool with_sm, const Tensor<float>* co) {
  const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
  const Tensor<float>* sink = d.sink ? &*d.sink : nullptr;
  Expected e;
  e.attn = k.sparse_attention(d.q, d.kv, indices, sm, d_v, tl, sink);
  if (with_sm) bounds_sm_by_blocks(k, g, d, indices, sm, d_v, e.attn, co, e);
  else e.bounds = k.attention_bounds(d.q, d.kv, indices, sm, d_v, tl, e.attn);
  // The golden's own budget rule (ref/bounds.h budget_rows: every row, or a subset of large sets).
  e.budget = cmp::attention_budget(
      cmp::attention_budget_parts_set(k.emulate_attention_lowp, d.q, d.kv, indices, sm, d_v, tl, sink, e.attn.out));
  return e;
}

cmp::FloatRule bound_rule(std::vector<float> b, double budget) {
  cmp::FloatRule r;
  r.bound = std::move(b);
  r.budget_max_abs = budget;
  r.derivation = "per-element bound from bf16/f32 roundoffs, reduction lengths and magnitudes (ref/bounds.h)";
  return r;
}

cmp::FloatRule rule_of(std::vector<float> b, const std::string& how) {
  cmp::FloatRule r;
  r.bound = std::move(b);
  r.derivation = how;
  return r;
}

cmp::Verdict KindJudge::add(int l, const std::string& n, cmp::Report r, const std::string& note) {
  r.tensor = nm(l, n);
  res.checked.push_back(nm(l, n));
  res.tensors.push_back({l, n, std::move(r), note});
  return res.tensors.back().report.verdict;
}

cmp::Verdict KindJudge::values_topk(int l, const std::string& P, const std::string& tensor, const Tensor<float>& scores,
                                    const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<int32_t>& gold,
                                    const Tensor<int32_t>& cand, const Tensor<float>* cand_scores, const std::vector<float>& bound,
                                    const prec::ClassValues* values,
                                    const std::function<Tensor<int32_t>(const Tensor<float>&)>& select, const std::string& note) {
  const cmp::FloatRule rule = rule_of(bound, "");
  cmp::TopkOptions opt;
  if (cand_scores) {
    opt.candidate_logits = cand_scores;
    opt.logits_rule = &rule;
    // The margin is measured only when some position differs (it recomputes the scores twice).
    if (values && cand.data != gold.data) {
      const std::vector<double> g(scores.data.begin(), scores.data.end()), b(bound.begin(), bound.end());
      opt.contract_tie = 2 * prec::max_scaled_deviation(g, b, prec::Kind::values, prec::Contract(), *values);
    }
  }
  const cmp::Verdict v = add(l, tensor, cmp::compare_topk("", scores, ks, ke, gold, cand, opt), note);
  const bool wide = res.tensors.back().report.stats.wide_ties > 0;
  if (wide)
    res.diagnoses.push_back(P + ": " + tensor + " is the top-k of scores computed at a lower precision than the contract's (f32): its "
                            "near ties are wider than f32 arithmetic moves a score");
  if (v != cmp::Verdict::fail) return v;
  // The top-k of the golden scores rounded to f16 or bf16 (a kernel that scores, or sorts, at that precision).
  std::string fits;
  for (const auto& [cls, bits] : {std::pair<const char*, int>{"f16", 11}, {"bf16", 8}}) {
    Tensor<float> low = scores;
    for (float& x : low.data) x = float(prec::round_bits(double(x), bits));
    if (passes(cmp::compare_topk("", low, ks, ke, select(low), cand))) fits += std::string(fits.empty() ? "" : " or ") + cls;
  }
  if (!fits.empty())
    res.diagnoses.push_back(P + ": " + tensor + " is the top-k of the scores rounded to " + fits +
                            " (top-k from low-precision scores; the contract's scores are f32)");
  return v;
}

}  // namespace detail

using namespace detail;

void compute_golden_logits(const golden::Loaded& g, GoldenLayer& d, const ref::Kernels& k) {
  const std::string p = "layers." + std::to_string(d.l) + ".";
  auto read_f32 = [&](const char* n) { return g.tensor<float>(p + n); };
  if (d.index_q8.numel()) {  // the FP8 inputs load_golden_layer keeps
    d.logits = k.logits_fp8(d.index_q8, d.index_k8, d.index_k_scale, d.index_weights, d.ks, d.ke);
  } else if (g.get(p + "indexer.q").dtype == io::DType::F8_E4M3) {
    d.logits = k.logits_fp8(g.tensor<e4m3_t>(p + "indexer.q"), g.tensor<e4m3_t>(p + "indexer.k"), read_f32("indexer.k_scale"),
                            read_f32("indexer.weights"), d.ks, d.ke);
  } else {
    d.logits = k.logits_f32(bf16_to_f32(g.tensor<bf16_t>(p + "indexer.q")), bf16_to_f32(g.tensor<bf16_t>(p + "indexer.k")),
                            read_f32("indexer.k_scale"), read_f32("indexer.weights"), d.ks, d.ke);
  }
  d.logits_deferred = false;
}

GoldenLayer load_golden_layer(const golden::Loaded& g, int l, const ref::Kernels& k, bool with_q, Tensor<float>* reuse_out,
                              bool logits) {
  const json& m = g.manifest;
  const std::string p = "layers." + std::to_string(l) + ".";
  // attn.out, the layer's largest tensor by far, is hashed on a second thread while this one loads
  // the others (SHA-256 runs one tensor on one core); its hash is checked at the end, on this
  // thread (check_hash marks the set's state). `out` outlives the future, which waits for it.
  // Mapped from the file where it can be (a view of its page-cache pages: nothing copied, and no
  // fresh memory for the kernel to zero, which cost 53 ms a layer at hq16 on the Zen 3 VM), read
  // into `out` otherwise.
  const std::string out_name = p + "attn.out";
  Tensor<float> out = reuse_out ? std::move(*reuse_out) : Tensor<float>();
  std::future<std::string> out_hash;
  if (g.reads_lazily<float>(out_name)) {
    const Shape& shape = g.get(out_name).shape;
    const size_t bytes = size_t(shape_numel(shape)) * sizeof(float);
    std::optional<Tensor<float>> view;
    if (bytes >= io::map_read_min) {
      out = Tensor<float>();  // the previous layer's out (a mapping too) goes first: one at a time
      view = float_view(g.map(out_name), shape);
    }
    if (view) {
      out = std::move(*view);
      const uint8_t* bp = reinterpret_cast<const uint8_t*>(std::as_const(out).ptr());
      out_hash = std::async(std::launch::async, [bp, bytes] { return io::sha256_hex(bp, bytes); });
    } else {
      out_hash = std::async(std::launch::async, [&g, &out_name, &out] { return g.read_hashed(out_name, out); });
    }
  } else {
    g.tensor_into(out_name, out);
  }
  LayerData d;
  d.l = l;
  d.full = m["layers"][size_t(l)]["kind"] == "full";
  d.source = m["layers"][size_t(l)]["source"];
  d.has_indexer = g.find(p + "indexer.k_scale") != nullptr;
  if (d.has_indexer) {
    d.ks = g.tensor<int32_t>(p + "indexer.ks");
    d.ke = g.tensor<int32_t>(p + "indexer.ke");
    d.topk = g.tensor<int32_t>(p + "indexer.topk");
    if (g.get(p + "indexer.q").dtype == io::DType::F8_E4M3) {  // kept: the logits' bound reads them too
      d.index_q8 = g.tensor<e4m3_t>(p + "indexer.q");
      d.index_k8 = g.tensor<e4m3_t>(p + "indexer.k");
      d.index_k_scale = g.tensor<float>(p + "indexer.k_scale");
      d.index_weights = g.tensor<float>(p + "indexer.weights");
    }
    if (g.find(p + "indexer.logits")) d.logits = g.tensor<float>(p + "indexer.logits");
    else if (logits) compute_golden_logits(g, d, k);
    else d.logits_deferred = true;
    // d.logits_rule (the per-element logits bound, O(s_q s_kv H D)) is computed in judge, and only
    // when the candidate holds logits: for a sampled 1M-key set it costs minutes.
  }
  if (with_q) d.q = g.tensor<bf16_t>(p + "attn.q");
  d.kv = g.tensor<bf16_t>(p + "attn.kv");
  d.indices = g.tensor<int32_t>(p + "attn.indices");
  if (g.find(p + "attn.topk_length")) d.topk_length = g.tensor<int32_t>(p + "attn.topk_length");
  if (g.find(p + "attn.sink")) d.sink = g.tensor<float>(p + "attn.sink");
  d.lse = g.tensor<float>(p + "attn.lse");
  d.max_logits = g.tensor<float>(p + "attn.max_logits");
  // While attn.out is still being read: the layer's attn.out_bf16, which the judge never reads,
  // is checked against the manifest here rather than at the end (Loaded::verify_rest).
  if (out_hash.valid()) {
    g.verify(p + "attn.out_bf16");
    g.check_hash(out_name, out_hash.get());
  }
  d.out = std::move(out);
  return d;
}

}  // namespace indexshare::diff

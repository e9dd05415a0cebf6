// indexshare diff: an MTP draft-step set (kind mtp, tools/lib/golden_mtp.h). The candidate's
// layers.{l}.* names are judged as a stack set's (walk.cc: layer 0 the target's DSA layer, layer 1
// the MTP layer's draft step 0); the draft steps' names:
//   mtp.topk     [(n-1)R, topk] sequence-local   compare_topk over the MTP layer's golden logits at
//                                                each request's last accepted row (sets modulo ties)
//   mtp.indices  [(n-1)R, 1, topk] kv rows       the same, from kv rows (rows_to_local)
//   mtp.out, mtp.lse, mtp.max_logits             the draft steps' attention (mtp.q over layer 1's kv
//                and sink), recomputed on the candidate's rows when they pass but differ (ties),
//                within the per-element bounds and FlashMLA's decode anchors, plus the structure tests
// A failure is tested against the named mistakes of MTP drafting: the target layer's top-k where
// the MTP layer's own belongs (at step 0, or in the rows the later steps reuse), and compaction by
// each request's last padded row of the draft extend instead of its last accepted token's.

#include <algorithm>

#include "ref/topk.h"
#include "tools/judge/anchors.h"
#include "tools/judge/walk.h"
#include "tools/lib/golden_mtp.h"

namespace indexshare::diff {

namespace {

using namespace detail;  // the anchors, bound_rule, passes

const std::vector<std::string> kJudgedMtp = {"mtp.topk", "mtp.indices", "mtp.out", "mtp.lse", "mtp.max_logits"};
const char* kTargetTopk = "a draft step using the target's top-k";
const char* kPaddedRow = "the last padded row instead of the last accepted row";

// Rows `src` of t (along dim 0), in that order.
template <class T>
Tensor<T> gather(const Tensor<T>& t, const std::vector<int64_t>& src) {
  Shape shape = t.shape;
  shape[0] = int64_t(src.size());
  Tensor<T> out(shape);
  const int64_t w = t.numel() / t.dim(0);
  for (size_t i = 0; i < src.size(); ++i) std::copy_n(t.data.begin() + int64_t(src[i]) * w, w, out.data.begin() + int64_t(i) * w);
  return out;
}

class MtpJudge {
 public:
  MtpJudge(const golden::Loaded& g, const io::SafetensorsFile& c, const ref::Kernels& k, Result& res)
      : g_(g), c_(c), k_(k), res_(res), d_(golden::mtp_draft(g.manifest)) {
    const nlohmann::json& cfg = g.manifest["config"];
    s_kv_ = cfg["s_kv"].get<int64_t>(), topk_ = cfg["topk"].get<int64_t>(), h_q_ = cfg["h_q"].get<int64_t>();
    d_v_ = cfg["d_v"].get<int64_t>(), sm_ = cfg["sm_scale"].get<float>();
    n_ = (d_.steps - 1) * d_.requests();
    // The step-0 row each draft row reuses: the last accepted token's, and the mistake's last padded one.
    ref::mtp::Draft padded = d_;
    std::fill(padded.accepted.begin(), padded.accepted.end(), d_.rows);
    for (int64_t i = 1; i < d_.steps; ++i)
      for (int64_t r = 0; r < d_.requests(); ++r) {
        src_.push_back(ref::mtp::last_accepted_rows(d_)[size_t(r)]);
        padded_src_.push_back(ref::mtp::last_accepted_rows(padded)[size_t(r)]);
      }
  }
  void step0(const std::set<int>& judged);
  void draft_steps();

 private:
  bool has(const std::string& n) const { return c_.find(n) != nullptr; }
  cmp::Verdict add(const std::string& n, cmp::Report r, const std::string& note = "") {
    r.tensor = n;
    res_.checked.push_back(n);
    res_.tensors.push_back({1, n, std::move(r), note});
    return res_.tensors.back().report.verdict;
  }
  void rows_mistakes(const std::string& tensor, const Tensor<int32_t>& cand_rows, const detail::LayerData& mtp);
  void attention(const detail::LayerData& mtp, const Tensor<int32_t>& used, const std::string& note);

  const golden::Loaded& g_;
  const io::SafetensorsFile& c_;
  const ref::Kernels& k_;
  Result& res_;
  ref::mtp::Draft d_;
  int64_t s_kv_ = 0, topk_ = 0, h_q_ = 0, d_v_ = 0, n_ = 0;
  float sm_ = 0;
  std::vector<int64_t> src_, padded_src_;
};

// Step 0 is layer 1 of the stack: when its top-k or indices failed there, are they the target's?
void MtpJudge::step0(const std::set<int>& judged) {
  if (!judged.count(1)) return;
  for (const char* n : {"indexer.topk", "attn.indices"}) {
    const std::string name = std::string("layers.1.") + n;
    const auto failed = std::find_if(res_.tensors.begin(), res_.tensors.end(), [&](const TensorResult& t) {
      return t.layer == 1 && t.name == n && t.report.verdict == cmp::Verdict::fail;
    });
    if (!has(name) || failed == res_.tensors.end()) continue;
    const Shape shape = g_.get(name).shape;
    const Tensor<int32_t> cand = candidate_int(c_, name, shape, res_.diagnoses);
    if (detail::rows_against(cand, g_.tensor<int32_t>(std::string("layers.0.") + n), s_kv_).same_sets)
      res_.diagnoses.push_back(std::string("layer 1: ") + kTargetTopk + " at draft step 0: " + name +
                               " holds the target layer's (layer 0) top-k, not the MTP layer's own indexer's");
  }
}

// The candidate's draft rows (kv rows) against the mistakes' rows, as sets.
void MtpJudge::rows_mistakes(const std::string& tensor, const Tensor<int32_t>& cand_rows, const detail::LayerData& mtp) {
  const Tensor<int32_t> target = gather(g_.tensor<int32_t>("layers.0.attn.indices"), src_);
  if (detail::rows_against(cand_rows, target, s_kv_).same_sets)
    res_.diagnoses.push_back("draft steps: " + std::string(kTargetTopk) + ": " + tensor +
                             " holds the target layer's (layer 0) rows at each request's last accepted token, not the MTP "
                             "layer's own (layer 1): the MTP layer runs its own indexer at step 0 and later steps reuse that row");
  if (detail::rows_against(cand_rows, gather(mtp.indices, padded_src_), s_kv_).same_sets)
    res_.diagnoses.push_back("draft steps: " + std::string(kPaddedRow) + ": " + tensor +
                             " reuses each request's last draft-extend row (r * rows + rows - 1), not its last accepted "
                             "token's (r * rows + accepted[r] - 1)");
}

void MtpJudge::draft_steps() {
  detail::LayerData mtp = load_golden_layer(g_, 1, k_);
  const Tensor<float> logits = gather(mtp.logits, src_);
  const Tensor<int32_t> ks = gather(mtp.ks, src_), ke = gather(mtp.ke, src_);
  const Tensor<int32_t> gold_topk = g_.tensor<int32_t>("mtp.topk"), gold_rows = g_.tensor<int32_t>("mtp.indices");
  Tensor<int32_t> used = gold_rows;
  std::string note;
  auto judge_rows = [&](const std::string& name, const Tensor<int32_t>& kv_rows, const Tensor<int32_t>& local,
                        const Tensor<int32_t>* written) {
    cmp::TopkOptions opt;
    opt.kv_rows = written;
    if (add(name, cmp::compare_topk("", logits, ks, ke, gold_topk, local, opt)) == cmp::Verdict::fail) {
      rows_mistakes(name, kv_rows, mtp);
    } else if (kv_rows.data != gold_rows.data) {
      used = kv_rows;  // ties: the attention is judged on the rows the candidate used
      note = "expected recomputed on the candidate's draft rows (ties)";
    }
  };
  if (has("mtp.topk")) {
    const Tensor<int32_t> cand = candidate_int(c_, "mtp.topk", {n_, topk_}, res_.diagnoses);
    Tensor<int32_t> rows = ref::local_to_kv_rows(cand, ks);
    judge_rows("mtp.topk", rows, cand, nullptr);
  }
  if (has("mtp.indices")) {
    const Tensor<int32_t> cand = candidate_int(c_, "mtp.indices", {n_, 1, topk_}, res_.diagnoses);
    Tensor<int32_t> flat = cand;
    flat.shape = {n_, topk_};
    judge_rows("mtp.indices", cand, detail::rows_to_local(cand, ks, ke), &flat);
  }
  if (has("mtp.out") || has("mtp.lse") || has("mtp.max_logits")) attention(mtp, used, note);
}

void MtpJudge::attention(const detail::LayerData& mtp, const Tensor<int32_t>& used, const std::string& note) {
  detail::LayerData a;
  a.q = g_.tensor<bf16_t>("mtp.q");
  a.kv = mtp.kv;
  a.sink = mtp.sink;
  const detail::Expected e = detail::expected_attention(g_, a, used, sm_, d_v_, k_);
  struct Part {
    const char* name;
    const Tensor<float>& expected;
    const std::vector<float>& bound;
    int64_t cols;
    double floor, anchor_abs, anchor_rel, scale;
  };
  // FlashMLA's decode test's absolute tolerances, carried to the set's value scale (walk.h).
  const double out_scale = out_anchor_scale(a.kv, d_v_), lse_scale = lse_anchor_scale(e.attn.max_logits);
  const Part parts[] = {
      {"mtp.out", e.attn.out, e.bounds.out, d_v_, cmp::kFloorOut, kFlashMlaDecodeOutAbs * out_scale, kFlashMlaDecodeOutRel, out_scale},
      {"mtp.lse", e.attn.lse, e.bounds.lse, 1, cmp::kFloorLse, kFlashMlaLseAbs * lse_scale, kFlashMlaDecodeLseRel, lse_scale},
      {"mtp.max_logits", e.attn.max_logits, e.bounds.max_logits, 1, cmp::kFloorLse, kFlashMlaLseAbs * lse_scale, kFlashMlaLseRel,
       lse_scale}};
  for (const Part& p : parts) {
    if (!has(p.name)) continue;
    const Shape shape = p.cols > 1 ? Shape{n_, h_q_, p.cols} : Shape{n_, h_q_};
    const Tensor<float> cand = candidate_float(c_, p.name, shape);
    cmp::FloatRule rule = bound_rule(p.bound, std::string(p.name) == "mtp.out" ? e.budget : -1);
    rule.anchor_abs = p.anchor_abs;
    rule.anchor_rel = p.anchor_rel;
    rule.anchor_name = anchor_named("FlashMLA's decode check", p.scale);
    cmp::StructureSpec spec;
    spec.tensor = p.name;
    spec.rows = n_;
    spec.heads = h_q_;
    spec.cols = spec.cluster_cols = p.cols;
    spec.lanes = p.cols > 1;
    spec.floor = p.floor;
    if (add(p.name, cmp::compare_structured("", p.expected, cand, rule, spec), note) != cmp::Verdict::fail) continue;
    // The attention over the mistakes' rows, within the same kind of bound, names the mistake.
    const std::pair<const char*, Tensor<int32_t>> wrong[] = {
        {kTargetTopk, gather(g_.tensor<int32_t>("layers.0.attn.indices"), src_)}, {kPaddedRow, gather(mtp.indices, padded_src_)}};
    for (const auto& [what, rows] : wrong) {
      const detail::Expected w = detail::expected_attention(g_, a, rows, sm_, d_v_, k_);
      const bool out = std::string(p.name) == "mtp.out";
      const Tensor<float>& x = out ? w.attn.out : std::string(p.name) == "mtp.lse" ? w.attn.lse : w.attn.max_logits;
      const std::vector<float>& b = out ? w.bounds.out : std::string(p.name) == "mtp.lse" ? w.bounds.lse : w.bounds.max_logits;
      if (passes(cmp::compare_floats("", x, cand, bound_rule(b))))
        res_.diagnoses.push_back("draft steps: " + std::string(what) + ": " + p.name + " is the attention over " +
                                 (what == kTargetTopk ? "the target layer's (layer 0) rows" : "each request's last padded row"));
    }
  }
}

}  // namespace

bool mtp_candidate_name(const std::string& name) {
  return std::find(kJudgedMtp.begin(), kJudgedMtp.end(), name) != kJudgedMtp.end();
}

Result judge_mtp(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k,
                 bool picture, const prec::Contract& contract) {
  io::SafetensorsFile stack = c;  // the layers' names, judged as a stack set's
  stack.tensors.clear();
  bool draft = false;
  for (const io::TensorView& v : c.tensors) {
    if (mtp_candidate_name(v.name)) draft = true;
    else stack.tensors.push_back(v);
  }
  require(draft || !stack.tensors.empty(), c.source + ": no golden output names to judge");
  Result res;
  std::set<int> judged;
  if (!stack.tensors.empty()) {
    res = detail::judge_file(g, stack, wanted, k, nullptr, "", picture, contract);
    for (const TensorResult& t : res.tensors) judged.insert(t.layer);
  }
  res.contract = contract;
  MtpJudge j(g, c, k, res);
  j.step0(judged);
  if (draft && (wanted.empty() || wanted.count(1))) j.draft_steps();
  return res;
}

}  // namespace indexshare::diff

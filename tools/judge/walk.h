// indexshare diff, inside: the pieces the judge's files share (not an interface: judge/diff.h is).
// The walk over layers and tensors is class Judge (walk.cc); the golden layer and the expected
// attention (golden_layer.cc), the row sets and the structure tests' layout (rows.cc), the
// hypotheses a failure is tested against (hypotheses.cc), the anchors (anchors.h), the report
// (report.cc) and the candidate's tensors (candidate.cc).
#pragma once

#include "tools/judge/diff.h"

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include "ref/attention.h"
#include "ref/cost.h"
#include "ref/module.h"
#include "ref/indexer.h"
#include "ref/numerics.h"
#include "tools/judge/model_bounds.h"
#include "tools/judge/structure.h"
#include "ref/topk.h"
#include "tools/lib/phases.h"
#include "tools/judge/anchors.h"

namespace indexshare::diff::detail {

using nlohmann::json;

// The inputs a model dump holds beside its judged names (golden::load_stack_inputs reads them).
inline const std::set<std::string> kDumpInputs = {"indexer.q",  "indexer.k",  "indexer.k_scale", "indexer.weights",
                                           "indexer.ks", "indexer.ke", "attn.q",          "attn.kv",
                                           "attn.sink",      "attn.q_nope", "attn.w_uk",       "attn.w_uv"};

inline const std::vector<std::string> kJudged = {"indexer.logits", "indexer.topk", "attn.indices", "attn.indices_physical",
                                          "attn.out", "attn.lse", "attn.max_logits", "attn.model_out"};

// A training set's gradients (tools/lib/golden_train.h), judged after a layer's forward.
inline const std::vector<std::string> kJudgedTrain = {
    "attn_bwd.delta",   "attn_bwd.dq",        "attn_bwd.dkv",   "attn_bwd.d_sink",        "indexer_loss.p",
    "indexer_loss.log_q", "indexer_loss.kl",  "indexer_loss.loss", "indexer_loss.d_scores", "indexer_loss.dq",
    "indexer_loss.dk",  "indexer_loss.dw"};

inline constexpr const char* kBeyondWindow = "positions beyond the causal window in rows shorter than top-k: pad with -1 (raw torch.topk output, "
                            "as in transformers, keeps masked future positions there)";

// A row's positions in [0, s_kv) as a set: sorted, distinct (equal rows compare equal).
using RowSet = std::vector<int32_t>;

inline bool passes(const cmp::Report& r) { return r.verdict != cmp::Verdict::fail; }

// Does the alternative `alt` (with its bound) explain the candidate `got`: within the bound, and at
// least twice as close as the golden `gold` (hypotheses.cc)?
bool explains(const Tensor<float>& alt, const std::vector<float>& bound, const Tensor<float>& got, const Tensor<float>& gold);

// Rows of cand against gold (s_q rows of k values each, [s_q, k] or [s_q, 1, k]): per row the recall |C ∩ G| / |G| of
// their sets (row_set; 1 where G is empty: the recall strip of the picture), and whether every
// row's sets are equal. A row equal slot for slot has both at once (recall 1, the same set)
// without sorting. Rows in parallel (each its own values).
struct RowsAgainst {
  std::vector<double> recall;
  bool same_sets = true;
};

using LayerData = GoldenLayer;

// The attention a layer would compute over `indices`, with its bounds and budget (with_sm: and the
// softmax-scale direction of the structure tests, from the bounds' pass: sm_lse whole, and that of
// out as its (row, head) sums against the candidate's out, sm_out_sums; see bounds_sm_by_blocks).
struct Expected {
  ref::AttentionOut attn;
  cmp::AttentionBounds bounds;
  std::vector<double> sm_out_sums;
  double budget = -1;
};

// Module-level sets: the layer's top-k recomputed from the golden's hidden state and weights with
// the indexer RoPE layout swapped (the most common real bug: DeepSeek-V3.2's indexer rotates non-interleaved, its MLA interleaved).
// Empty when the set is not module level or the layer has no indexer weights.
struct SwappedRope {
  std::string layout;
  Tensor<float> logits;
  Tensor<int32_t> topk;
};

// Per (tensor, role): the layers judged and those whose structure tests flagged.
using RoleLayers = std::map<std::string, std::pair<std::vector<int>, std::vector<int>>>;

// ---- rows.cc ----

// kv rows [s_q, 1, k] -> sequence-local positions [s_q, k]: a negative row is padding (-1, as the
// attention ignores it), a row outside the window [ks, ke) becomes -2, which the structural check
// flags; cmp::TopkOptions::kv_rows makes its message name the row the candidate wrote.
Tensor<int32_t> rows_to_local(const Tensor<int32_t>& rows, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

// The hypothesis of raw torch.topk output (transformers): in rows whose window is shorter than
// top-k, the slots past the window hold masked future positions instead of -1. `local` holds
// sequence-local positions [s_q, k] (kv rows are converted by the caller). Returns the copy with
// those positions padded with -1 (valid slots first), or nothing when no slot was such a position.
std::optional<Tensor<int32_t>> pad_beyond_window(const Tensor<int32_t>& local, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

void row_set(const int32_t* row, int64_t k, int64_t s_kv, RowSet& out);

// Each row's set (row_set); rows in parallel (each its own vector).
std::vector<RowSet> row_sets(const Tensor<int32_t>& rows, int64_t s_kv);

// Hands the heap's free pages back to the system. glibc serves blocks under its dynamic mmap
// threshold (which grows up to 32 MiB as large blocks are freed) from the heap and keeps them
// there when freed, so a tensor the judge has finished with would still count in the peak; the
// judge calls this where it has just released one (measured at sq1024 hq16: peak RSS 212,300 -> 165,600 KiB).
// A no-op without glibc.
void release_freed_memory();

RowsAgainst rows_against(const Tensor<int32_t>& cand, const Tensor<int32_t>& gold, int64_t s_kv);

// Per (row, head): the largest |got - expected| / bound over the d_v columns (inf where a bound
// of 0 is exceeded or a non-finite value differs). Each (row, head) is one output, so the rows run
// in parallel with the same bits for any thread count.
std::vector<double> out_ratios(const Tensor<float>& expected, const Tensor<float>& got, const std::vector<float>& bound,
                               int64_t d_v);

// Closes a layer's panel: its diagnoses (without the layer prefix) and its tensors' verdicts.
void finish_panel(Result& res, io::DiffPanel panel, const std::string& prefix, size_t diagnoses0, size_t tensors0);

// ---- the structure tests' layout of each judged tensor ----

// The sequence of each query row: from cu_seqlens_q, else (sampled sets) from the distinct
// sequence starts ks of a layer with an indexer; empty when unknown or one sequence.
std::vector<int64_t> row_sequences(const golden::Loaded& g, int64_t s_q, const Tensor<int32_t>* ks);

void pool(std::map<std::string, std::pair<int, std::vector<cmp::ClusterSums>>>& pools, const std::string& tensor, bool full,
          const cmp::StructureReport& st, RoleLayers& roles, int l);

// Rows of a sampled set carry their problem row numbers (labels only).
std::vector<int64_t> row_ids(const golden::Loaded& g);

double rms_v(const Tensor<bf16_t>& kv, int64_t d_v);
// FlashMLA's absolute tolerances are stated for its test data (kv ~ N(0, 0.1^2), O(1) logits): the
// factors that carry them to a set's values, max(1, rms(V) / 0.1) for out and max(1,
// rms(max_logits)) for lse and max_logits (judge/anchors.h), and the anchor's name saying which
// applies ("..., abs scaled x12.3 to the set's values" or "..., at FlashMLA's test scale").
double out_anchor_scale(const Tensor<bf16_t>& kv, int64_t d_v);
double lse_anchor_scale(const Tensor<float>& max_logits);
std::string anchor_named(const std::string& name, double scale);
// The rows `rows` of q [s_q, h, d] (the precision test's sample), in that order.
Tensor<bf16_t> q_at_rows(const Tensor<bf16_t>& q, const std::vector<int64_t>& rows);

// ---- golden_layer.cc ----

// A mapped range (io::map_file_range) as a float tensor of `shape` that keeps the mapping alive;
// nothing where the range was not mapped or is not float-aligned (the caller reads it instead).
std::optional<Tensor<float>> float_view(const io::MappedRange& m, const Shape& shape);

// The bounds' pass with the softmax-scale direction (attention_bounds_sm) over blocks of query
// rows, so that the direction of out (a float per element, as large as the output) is never held
// whole: each block's is folded at once into its (row, head) sums against the candidate's out `co`
// (cmp::sm_cluster_sums), which is all the structure tests read of it; without `co` it is dropped.
// Every row's bounds depend on that row alone, so they are the bits of one call over every row.
// When the layer's q is not loaded (d.q empty) it is read from the set a block at a time as well
// (golden::Loaded::Stream, its SHA-256 checked at the end). Blocks of 1/32 of the output or 1 MiB,
// whichever is larger (and at least 16 rows, so the kernel's threads share each block), keep the
// temporaries small and the blocks few (each call forks the threads). kv's work shared by the blocks
// (Kernels::prepare_bounds_kv: simd converts kv to f32 once, not once per block) is made first.
void bounds_sm_by_blocks(const ref::Kernels& k, const golden::Loaded& g, const LayerData& d, const Tensor<int32_t>& indices,
                         float sm, int64_t d_v, const ref::AttentionOut& exact, const Tensor<float>* co, Expected& e);

// d.q must be loaded.
Expected expected_attention(const golden::Loaded& g, const LayerData& d, const Tensor<int32_t>& indices, float sm, int64_t d_v,
                            const ref::Kernels& k, bool with_sm = false, const Tensor<float>* co = nullptr);

cmp::FloatRule bound_rule(std::vector<float> b, double budget = -1);
// The structure tests' spec of attention tensor `name` [rows, heads, cols] (cols 1: lse,
// max_logits): clusters (row, head), column lanes when cols > 1, `floor`.
inline cmp::StructureSpec attention_spec(const char* name, int64_t rows, int64_t heads, int64_t cols, double floor) {
  cmp::StructureSpec s;
  s.tensor = name;
  s.rows = rows;
  s.heads = heads;
  s.cols = s.cluster_cols = cols;
  s.lanes = cols > 1;
  s.floor = floor;
  return s;
}
// Per-element bounds b with the derivation `how` (no budget).
cmp::FloatRule rule_of(std::vector<float> b, const std::string& how);

// ---- golden_layer.cc: the base of the judges of the kinds with their own tensor list ----

// V4Judge, HyJudge, KpoolJudge: the golden, the candidate, the kernels, and the result each judged
// tensor of a layer is added to (in the order judged). A judge J has layers(wanted) (the layers
// the candidate holds, refused per tensor as the kind's names) and layer(l); judge_layers runs it.
// The precision test (judge/precision.h) of the tensor just added to `res` (res.tensors.back()):
// a failure fails it, and a named class becomes a diagnosis when the structure tests flagged nothing.
void precision_test(Result& res, const prec::Contract& contract, const std::string& P, const std::string& tensor,
                    const std::vector<double>& golden, const std::vector<double>& cand, prec::Kind kind,
                    const prec::ClassValues& values);

class KindJudge {
 public:
  KindJudge(const golden::Loaded& g, const io::SafetensorsFile& c, const ref::Kernels& k) : g_(g), c_(c), k_(k) {}
  Result res;
  void finish() {}  // after every layer: hypotheses across layers (a judge hides it with its own)

 protected:
  static std::string nm(int l, const std::string& n) { return "layers." + std::to_string(l) + "." + n; }
  bool has(int l, const std::string& n) const { return c_.find(nm(l, n)) != nullptr; }
  cmp::Verdict add(int l, const std::string& n, cmp::Report r, const std::string& note = "");
  // precision_test with the default contract (the attention's is f32 alone).
  void precision(const std::string& P, const std::string& tensor, const std::vector<double>& golden, const std::vector<double>& cand,
                 prec::Kind kind, const prec::ClassValues& values) {
    precision_test(res, prec::Contract(), P, tensor, golden, cand, kind, values);
  }
  // The precision test of an f32 tensor computed in f32 from f32 inputs (prec::Kind::values), just
  // added: golden and candidate whole (non-finite pairs are left out), the f32 class `recompute`d
  // from moved inputs (prec::recomputed_classes; n_reduction its longest sum). Returns the classes
  // (their recomputations cached) for a top-k's near-tie margin over the same values (values_topk).
  // `recompute` may be called after this returns: what it captures must outlive the classes.
  prec::ClassValues values_precision(const std::string& P, const std::string& tensor, const Tensor<float>& golden,
                                     const Tensor<float>& cand, int64_t n_reduction,
                                     std::function<Tensor<float>(const prec::Moved&)> recompute) {
    std::vector<double> g(golden.data.begin(), golden.data.end());
    const auto values = prec::recomputed_classes(
        [recompute = std::move(recompute)](const prec::Moved& m) {
          const Tensor<float> t = recompute(m);
          return std::vector<double>(t.data.begin(), t.data.end());
        },
        n_reduction, g);
    precision(P, tensor, g, std::vector<double>(cand.data.begin(), cand.data.end()), prec::Kind::values, values);
    return values;
  }
  // A top-k over f32 scores of the values kind, held to the contract's arithmetic: compare_topk with
  // the candidate's scores (when it holds them) for near ties within `bound` and, when `values`
  // is given and the candidate's positions are not the golden's bytes, only as wide as twice the
  // most the f32 class moved a score in units of its bound (prec::max_scaled_deviation over every
  // finite score: the anchors' rule, TopkOptions::contract_tie). A row whose swaps are wider fails as
  // "top-k from low-precision scores", however the candidate's scores moved. On a failure the
  // hypotheses that the positions are the top-k of the golden scores rounded to f16 or bf16
  // (`select`: the kind's top-k of given scores) are tried, and a fit is named. Returns the verdict.
  cmp::Verdict values_topk(int l, const std::string& P, const std::string& tensor, const Tensor<float>& scores, const Tensor<int32_t>& ks,
                           const Tensor<int32_t>& ke, const Tensor<int32_t>& gold, const Tensor<int32_t>& cand,
                           const Tensor<float>* cand_scores, const std::vector<float>& bound, const prec::ClassValues* values,
                           const std::function<Tensor<int32_t>(const Tensor<float>&)>& select, const std::string& note = "");

  const golden::Loaded& g_;
  const io::SafetensorsFile& c_;
  const ref::Kernels& k_;
};

// Judges the layers J::layers(wanted) gives, ascending (a Shared layer's source, before it, first).
template <class J>
Result judge_layers(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k) {
  J j(g, c, k);
  for (int l : j.layers(wanted)) j.layer(l);
  j.finish();
  return std::move(j.res);
}

// ---- hypotheses.cc ----

std::optional<SwappedRope> swapped_rope(const golden::Loaded& g, int l, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                        const ref::Kernels& k);

// Kernel-level sets built from a model dump (golden --from), judged against the dump itself: the
// golden's indexer q/k (bf16, after RoPE) re-rotated with the other RoPE layout, and that indexer's
// top-k. The dump's metadata names the layout its q/k were rotated with (indexer_rope) and the
// rotary table (rope: dim R, inv_freq [R/2], attention_scaling). Both transformers layouts store
// the rotated pair of frequency j at (j, j + R/2) (the interleaved one returns [evens | odds]), so
// the rotation is undone with the half-split formula, the pairs are regrouped (x[2j], x[2j+1] <->
// x[j], x[j+R/2]) and rotated again; values rounded to bf16 like the model's. Approximate (the
// inputs were rounded after the first rotation): it supports a top-k diagnosis, not a logits bound.
std::optional<SwappedRope> swapped_rope_dump(const golden::Loaded& g, const io::SafetensorsFile& c, int l,
                                             const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const ref::Kernels& k);

// ---- walk.cc: the judge ----

// One judgement of a candidate against a golden set: the golden's dimensions, the layers loaded
// so far (each once), and the result being built. judge() below runs the steps in order; each
// step judges one tensor of one layer (numbered as in diff.h) and then tests its hypotheses.
class Judge {
 public:
  // lazy / path: the candidate read with read_safetensors_index (tensors without bytes are read
  // from `path` when judged, and freed after).
  Judge(const golden::Loaded& g, const io::SafetensorsFile& c, const ref::Kernels& k,
        const io::SafetensorsIndex* lazy = nullptr, std::string path = "", bool picture = true, prec::Contract contract = {})
      : g_(g), c_(c), k_(k), lazy_(lazy), path_(std::move(path)), picture_(picture), contract_(std::move(contract)), m_(g.manifest), cfg_(m_["config"]), n_layers_(int(m_["layers"].size())), s_q_(cfg_["s_q"]),
        s_kv_(cfg_["s_kv"]), topk_(cfg_["topk"]), h_q_(cfg_["h_q"]), d_v_(cfg_["d_v"]), sm_(cfg_["sm_scale"].get<float>()),
        decode_(m_.value("kind", "") == "decode" || m_.value("kind", "") == "decode-model1"), train_(m_.value("kind", "") == "train"), ids_(row_ids(g)), data_(size_t(n_layers_)), loaded_(size_t(n_layers_), false) {}

  std::set<int> candidate_layers(const std::set<int>& wanted) const;
  void judge_layer(int l);
  void judge_layers(const std::set<int>& layers) {
    judged_ = layers;
    for (int l : judged_) judge_layer(l);
  }
  void judge_by_role();
  void judge_pooled();
  Result res;

 private:
  // The indices the attention is judged on, and why when they are not the golden's.
  struct UsedIndices {
    Tensor<int32_t> indices;
    std::string note;
  };
  // What the attention steps share for one layer.
  struct AttnCtx {
    const LayerData& d;
    std::string P, note;
    const Tensor<int32_t>& use;
    Expected e;
    std::vector<int64_t> seqs;
    double lse_abs = 0;
    std::unique_ptr<prec::AttentionClasses> classes;  // the precision test's sample and classes
    double lse_scale = 1;                             // lse_anchor_scale of the expected max_logits
  };

  // The structure tests of an [s_q, h_q, cols] attention output (attn.out, attn.model_out):
  // clusters (row, head), column lanes, the out floor, regressed also on the softmax-scale direction.
  cmp::StructureSpec out_spec(int64_t cols, const float* sm_dir) const {
    cmp::StructureSpec spec;
    spec.rows = s_q_;
    spec.heads = h_q_;
    spec.cols = cols;
    spec.cluster_cols = cols;
    spec.lanes = true;
    spec.floor = cmp::kFloorOut;
    spec.sm_dir = sm_dir;
    return spec;
  }
  const LayerData& layer(int l) {
    if (!loaded_[size_t(l)]) {
      const phases::Scope load("load golden layers");
      // q on demand (with_q), the logits a set does not store on demand too (golden_logits)
      data_[size_t(l)] = load_golden_layer(g_, l, k_, false, &recycled_.out, false);
      loaded_[size_t(l)] = true;
    }
    return data_[size_t(l)];
  }
  // The layer's golden logits, computed on first use where the set does not store them: a passing
  // candidate whose positions are the golden's reads none (compare_topk's scores on demand), so
  // diff of an exact copy of a set written with --no-logits runs no indexer.
  const Tensor<float>& golden_logits(int l) {
    const LayerData& d = layer(l);
    if (d.logits_deferred) {
      const phases::Scope s("golden indexer logits (not stored; on demand)");
      compute_golden_logits(g_, data_[size_t(l)], k_);
    }
    return d.logits;
  }
  std::function<const Tensor<float>&()> logits_of(int l) {
    return [this, l]() -> const Tensor<float>& { return golden_logits(l); };
  }
  // The layer with its q (load_golden_layer leaves it out: the passing path streams it).
  const LayerData& with_q(int l) {
    const LayerData& d = layer(l);
    if (d.q.numel() == 0) data_[size_t(l)].q = g_.tensor<bf16_t>(name(l, "attn.q"));
    return d;
  }
  bool has(int l, const std::string& n) const { return c_.find(name(l, n)) != nullptr; }
  // The candidate's tensor `n` alone, its bytes read from the file, when the index left them
  // there; nothing when c_ holds them.
  std::optional<io::SafetensorsFile> lazy_one(const std::string& n) const {
    const io::TensorView* t = c_.find(n);
    if (!lazy_ || !t || !t->bytes.empty()) return std::nullopt;
    int64_t numel = 1;
    for (int64_t x : t->shape) numel *= x;
    const size_t bytes = size_t(numel) * io::dtype_size(t->dtype);
    if (bytes == 0) return std::nullopt;
    io::SafetensorsFile one;
    one.source = c_.source;
    one.tensors.push_back({t->name, t->dtype, t->shape, std::vector<uint8_t>(bytes)});
    io::read_file_range(path_, lazy_->offsets[size_t(t - c_.tensors.data())], one.tensors.back().bytes.mutable_data(), bytes);
    return one;
  }
  // `reuse`: a tensor whose memory the result may take over (recycled_ below).
  Tensor<float> cand_float(const std::string& n, const Shape& shape, Tensor<float>&& reuse = Tensor<float>()) const {
    // F32 left in the file: mapped (a view of the file's pages, as load_golden_layer maps the
    // golden's attn.out), or where that is refused read straight into the tensor (no second copy).
    if (const io::TensorView* t = c_.find(n); lazy_ && t && t->bytes.empty() && t->dtype == io::DType::F32) {
      io::expect_shape(*t, shape, c_.source);
      const uint64_t offset = lazy_->offsets[size_t(t - c_.tensors.data())];
      const size_t bytes = size_t(shape_numel(shape)) * sizeof(float);
      if (bytes >= io::map_read_min) {
        reuse = Tensor<float>();  // the previous layer's (a mapping too) goes first: one at a time
        if (std::optional<Tensor<float>> view = float_view(io::map_file_range(path_, offset, bytes), shape)) return std::move(*view);
      }
      Tensor<float> out = std::move(reuse);
      if (out.data.borrowed()) out = Tensor<float>();  // a view is dropped, never copied
      out.shape = shape;
      reserve_advised(out.data, size_t(shape_numel(shape)));
      out.data.resize(size_t(shape_numel(shape)));
      if (out.numel() > 0)
        io::read_file_range(path_, offset, out.ptr(), bytes);
      return out;
    }
    const auto one = lazy_one(n);
    return candidate_float(one ? *one : c_, n, shape);
  }
  Tensor<int32_t> cand_int(const std::string& n, const Shape& shape, std::vector<std::string>& diagnoses) const {
    const auto one = lazy_one(n);
    return candidate_int(one ? *one : c_, n, shape, diagnoses);
  }
  static std::string name(int l, const std::string& n) { return "layers." + std::to_string(l) + "." + n; }
  cmp::Verdict add(int l, const std::string& n, cmp::Report r, const std::string& note = "") {
    r.tensor = name(l, n);
    res.checked.push_back(name(l, n));
    res.tensors.push_back({l, n, std::move(r), note});
    return res.tensors.back().report.verdict;
  }
  void require_indexer(const LayerData& d, const std::string& n) const {
    if (!d.has_indexer) throw Error(c_.source + ": " + name(d.l, n) + ": layer " + std::to_string(d.l) + " has no indexer in the golden set");
  }

  Tensor<float> judge_logits(const LayerData& d, const std::string& P);
  cmp::FloatRule logits_rule(const LayerData& d);
  void judge_topk(const LayerData& d, const std::string& P, const Tensor<float>& cand_logits, io::DiffPanel& panel);
  void topk_hypotheses(const LayerData& d, const std::string& P, const Tensor<int32_t>& ct);
  void rope_dump_hypothesis(const LayerData& d, const std::string& P, const Tensor<int32_t>& ct, const char* what);
  bool candidate_is_dump() const {
    auto it = c_.metadata.find("format");
    return it != c_.metadata.end() && it->second == golden::kDumpFormat;
  }
  UsedIndices judge_indices(const LayerData& d, const std::string& P, io::DiffPanel& panel);
  cmp::Report indices_report(const LayerData& d, const LayerData& src, const std::string& P, const Tensor<int32_t>& ci);
  void indices_hypotheses(const LayerData& d, const std::string& P, const Tensor<int32_t>& ci);
  void judge_physical(const LayerData& d, const std::string& P);
  void judge_attention(const LayerData& d, const std::string& P, const UsedIndices& used, io::DiffPanel& panel);
  cmp::Verdict structured(AttnCtx& a, const std::string& tensor, const Tensor<float>& expected, const Tensor<float>& got,
                          const cmp::FloatRule& rule, cmp::StructureSpec spec);
  void judge_out(AttnCtx& a, const Tensor<float>& co, io::DiffPanel& panel);
  void out_hypotheses(AttnCtx& a, const Tensor<float>& co);
  void judge_lse(AttnCtx& a);
  void judge_model_out(const LayerData& d, const std::string& P, const UsedIndices& used, io::DiffPanel& panel);
  // What a failing attn.model_out is judged against (judge_model_out's), and its hypotheses:
  // another Full layer's positions, another head's V, one position missing from a row's mask.
  struct ModelOut {
    const Tensor<bf16_t>& w_uv;
    const Tensor<bf16_t>& w_uk;
    const Tensor<bf16_t>& q_nope;
    const Tensor<float>& co;
    const ref::AttentionOut& lat;
    const Tensor<float>& expected;
    const std::vector<float>& bound;
    int64_t V, N;
    bool rounded;
  };
  void model_out_hypotheses(const LayerData& d, const std::string& P, const UsedIndices& used, const ModelOut& m);
  void judge_max_logits(AttnCtx& a);
  // ---- gradients.cc: a training set's gradients ----
  void judge_gradients(int l, const std::string& P);
  void judge_attention_backward(int l, const std::string& P);
  void judge_indexer_loss(int l, const std::string& P);
  // One gradient tensor: per-element bounds (judge/grad_bounds.h), the structure tests over
  // [rows, heads, cols] (heads = 0: no structure tests), the precision test when `values` gives
  // its arithmetic classes (judge/precision.h, kind gradients; on the `sample` rows of dim 0 when given, else
  // on every element) and the bug hypotheses of its family.
  void judge_gradient(int l, const std::string& P, const std::string& n, const Tensor<float>& golden, std::vector<float> bound,
                      int64_t rows, int64_t heads, int64_t cols, double floor,
                      const std::vector<std::pair<std::string, Tensor<float>>>& hypotheses,
                      const prec::ClassValues* values = nullptr, const std::vector<int64_t>* sample = nullptr);
  // attn.out or attn.lse (`tensor`, the candidate's `got`) against the attention over the indices
  // used less one key per row (each row's last valid slot, then its first): a loop bound off by one.
  void key_dropped_hypothesis(AttnCtx& a, const std::string& tensor, const Tensor<float>& got);
  // attn.out rounded to bf16 toward zero (truncation) instead of to nearest.
  void rounding_hypothesis(AttnCtx& a, const Tensor<float>& co);
  // The precision test of the tensor just added (res.tensors.back()): a failure fails it and
  // becomes a diagnosis.
  void precision(const std::string& P, const std::string& tensor, const std::vector<double>& golden, const std::vector<double>& cand,
                 prec::Kind kind, const prec::ClassValues& values);

  const golden::Loaded& g_;
  const io::SafetensorsFile& c_;
  const ref::Kernels& k_;
  const io::SafetensorsIndex* lazy_;
  const std::string path_;
  const bool picture_;  // the panels' |err| / bound per (row, head), which only Result::svg draws
  const prec::Contract contract_;  // the arithmetic the precision test holds the candidate to
  // The layer's structure findings (symptoms), reported after its causes (judge_layer).
  std::vector<std::string> symptoms_;
  // Per layer, how far the contract's arithmetic moved a logit in units of its bound
  // (prec::max_scaled_deviation): compare_topk's contract_tie is twice it. -1: not measured.
  std::map<int, double> tie_scale_;
  const json& m_;
  const json& cfg_;
  const int n_layers_;
  const int64_t s_q_, s_kv_, topk_, h_q_, d_v_;
  const float sm_;
  const bool decode_;
  const bool train_;  // a training set: the gradients are judged too (gradients.cc)
  const std::vector<int64_t> ids_;
  // Whole-tensor cluster sums per (tensor, role), for the tests pooled over layers of a role.
  std::map<std::string, std::pair<int, std::vector<cmp::ClusterSums>>> pools_;
  RoleLayers roles_;
  std::vector<LayerData> data_;  // sized once: references into it stay valid
  std::vector<bool> loaded_;
  std::set<int> judged_;  // the layers judge_file judges, in order
  // Memory recycled from one layer's attention step to the next (the golden's out, the
  // candidate's, the bound: each the output's size): on this VM a fresh page costs about as much
  // as reading it (measured at sq2048 hq64 nl4), and every layer's are the same size, so the next
  // layer reads into these instead of new allocations. The peak is unchanged (all three are alive
  // together in the attention step anyway).
  struct Recycled {
    Tensor<float> out, co;
    std::vector<float> bound;
  } recycled_;

  // A layer's logits are read by its own top-k and indices checks and by the indices checks of the
  // layers whose source it is: once the last of those is past (every layer after `l` neither is it
  // nor reads it), they are freed (at sq1024 hq16 they are 4 MiB of diff's peak).
  void release_logits_after(int l) {
    for (int x = 0; x < n_layers_; ++x) {
      if (!loaded_[size_t(x)] || data_[size_t(x)].logits.numel() == 0) continue;
      bool needed = false;
      for (auto it = judged_.upper_bound(l); it != judged_.end() && !needed; ++it)
        needed = *it == x || m_["layers"][size_t(*it)]["source"].get<int>() == x;
      if (!needed) data_[size_t(x)].logits = Tensor<float>();
    }
  }
};

Result judge_file(const golden::Loaded& g, const io::SafetensorsFile& c, const std::set<int>& wanted, const ref::Kernels& k,
                  const io::SafetensorsIndex* lazy, const std::string& path, bool picture, const prec::Contract& contract);

}  // namespace indexshare::diff::detail

// indexshare: the precision test. Is a candidate's error the size the kernel's contract arithmetic
// gives, or the size of a coarser arithmetic?
//
// The per-element bounds (ref/bounds.h) are worst cases: they tell a bug from noise only when the
// bug is large. A kernel that silently computes its indexer logits in bf16, or accumulates P.V in
// bf16, stays far inside them (bf16 logits reach about 6% of the logits' bound), and rounding to
// nearest is unbiased, so the structure tests see no scale or offset either. What tells it apart is
// the error's size: bf16 arithmetic errs about 10-10^4 times more than the contract's.
//
// The test, per judged float tensor (indexer.logits, FP8 or bf16 inputs; attn.out, attn.lse, attn.max_logits of
// stack, v4 and hyv4 sets):
//   1. A deterministic sample (spaced): at most kLogitsSamples logits evenly spaced over the
//      elements inside the rows' windows, or query rows of the attention (every head) evenly
//      spaced over the rows with keys, as many as a work budget allows.
//   2. E_cand = RMS over the sample of (candidate - golden), relative to the RMS of the golden.
//   3. Each arithmetic class (below) is emulated on the golden's own inputs at the same elements
//      (judge/emulate.h: each member is a correct kernel of that class, in one of the orders
//      real kernels use); a class's E is the largest RMS error of its members.
//   4. The contract is a class; its expectation E_contract is the largest E of every class up to
//      and including it in the list's order (finer arithmetic is always allowed), floored at
//      kFloorUlps f32 ulps of each golden value (a set whose arithmetic is exact still leaves a
//      correct kernel its output rounding).
//   5. FAIL when E_cand > kPrecisionRatio * E_contract. The report names the coarser class whose E
//      is nearest to E_cand (within a factor kNameFactor) and whose error pattern the candidate's
//      repeats (correlation at least kNameCorrelation), e.g. "indexer.logits carry bf16-level
//      error (RMS 1.7e-3 relative; the contract's arithmetic, fp8mma, gives 1.2e-4)".
// Why a ratio of 4: classes are a factor 10 or more apart where it matters (bf16 logits against
// Hopper's FP8 accumulation: 14x; bf16 P.V accumulation against f32: > 100x at top-k 64), while
// correct kernels of one class differ in RMS by less than 2 (order, blocking, exp or exp2); the
// false-positive rate over `indexshare calibrate` runs is 0 (tools/judge/README.md).
//
// Classes (finest first):
//   indexer.logits  f32     exact FP8 products, f32 sums over D and heads in any order
//                   fp8mma  FP8 products summed by a tensor core that keeps about 14 bits (Hopper
//                           WGMMA, the DeepSeek-V3 report): the anchors' default (DeepGEMM's SM90
//                           fp8_mqa_logits accumulates there)
//                   f16     logits rounded to f16 (11 significant bits)
//                   bf16    logits rounded to bf16 (8 significant bits)
//   attention       f32     bf16 q/kv, f32 logits and softmax, P rounded to bf16, f32 P.V
//                           accumulation in any order (round to nearest or truncating), out in
//                           bf16 or f32: FlashMLA's arithmetic, the default
//                   bf16-logits    each q.k logit rounded to bf16 before the softmax
//                   bf16-products  each q_d k_d product rounded to bf16 before the f32 sum
//                   bf16-acc       P.V accumulated in bf16
//   gradients       bf16-p-ds  the sparse attention backward of a training set (attn_bwd.dq, dkv):
//                           f32 softmax, P and dS rounded to bf16 before their GEMMs, f32 accumulation
//                           (TileLang's sparse_mla_bwd; cmp::emulate_attention_backward_lowp), the
//                           output in the candidate's dtype
//                   bf16-acc   the same with every partial sum of dq and dkv rounded to bf16
//   values          f32     an f32 tensor computed in f32 from f32 inputs (the V4, HY V4 and KPool
//                           indexer scores, KPool's pooled keys): f32 arithmetic in any order, whose
//                           members are the golden's own computation on inputs moved by f32 rounding
//                           (recomputed_classes below)
//                   f16, bf16  the values rounded to f16 / bf16
// An indexer meant to be low precision declares its contract (`diff --precision logits=bf16`): the
// precision test and the top-k's near-tie margin then hold it to that class; the declaration is
// printed in the report and the JSON. The attention's contract is f32 alone: its per-element
// bounds and FlashMLA's anchors are f32 arithmetic's, and reject the coarser classes by themselves
// at ordinary shapes (the precision test names them).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ref/attention.h"
#include "ref/tensor.h"

namespace indexshare::prec {

enum class Kind { logits, attention, gradients, values };

struct Class {
  std::string name;        // "fp8mma"
  std::string arithmetic;  // one phrase: "FP8 products summed by a tensor core that keeps about 14 bits"
};
// The classes of a kind, finest first.
const std::vector<Class>& classes(Kind kind);
const char* kind_key(Kind kind);  // "logits", "attn"

// The declared contract of each kind (the class names); default the anchors'.
struct Contract {
  std::string logits = "fp8mma", attention = "f32", gradients = "bf16-p-ds", values = "f32";  // gradients, values: not declarable
  bool logits_declared = false, attention_declared = false;
  // Not an arithmetic but a convention the candidate declares with it (`kl=mean-of-kl`): which
  // number a served-layers indexer loss's kl and loss hold (ref/train/indexer_loss.h, kl_form);
  // empty: the set's own.
  std::string kl_form;
  const std::string& of(Kind kind) const {
    return kind == Kind::logits ? logits : kind == Kind::attention ? attention : kind == Kind::gradients ? gradients : values;
  }
  // "logits=fp8mma (default), attn=f32 (default)"
  std::string text() const;
};
// "logits=bf16" (and "attn=f32", the only attention contract; "kl=mean-of-kl" or "kl=kl-of-mean";
// empty: the defaults). Throws Error naming the bad item and the classes there are.
Contract parse_contract(const std::string& text);

constexpr double kPrecisionRatio = 4.0;
constexpr double kNameFactor = 3.0;
// A class is named only when the candidate's error correlates with a member's error at least this
// much (step 5): a kernel of that class repeats the class's roundings on the same inputs (rounding a
// logit, a product or a value to bf16 is the same rounding whatever the order around it), so the
// two errors agree; an error of another cause, however large, is uncorrelated with them. A kernel
// of the class in an order the emulation does not use (bf16 accumulation in other blocks) may fall
// below it: then the failure stands unnamed, never misnamed.
constexpr double kNameCorrelation = 0.5;
constexpr double kFloorUlps = 4.0;
constexpr int64_t kLogitsSamples = 4096;
// The attention's sample: whole query rows (every head), about this many multiply-adds per class
// member (0.1-0.3 s), at least kAttentionMinRows and at most kAttentionMaxRows rows.
constexpr int64_t kAttentionSampleWork = int64_t(1) << 27;
constexpr int64_t kAttentionMinRows = 2, kAttentionMaxRows = 64;

// Up to `max` elements evenly spaced over the list of `count` (index i * count / max).
std::vector<int64_t> spaced(int64_t count, int64_t max);

// The values of each member of a class at the sampled elements (one vector per member, each the
// sample's size). Called only for the classes the test needs: the contract's (when the candidate's
// error is above the floor) and, on a failure, the coarser ones (to name one).
using ClassValues = std::function<std::vector<std::vector<double>>(const std::string& cls)>;

struct Finding {
  bool ran = false;        // a sample with a nonzero golden
  bool failed = false;
  int64_t samples = 0;
  double cand = 0, contract = 0, ratio = 0;  // E_cand, E_contract (relative RMS), E_cand / E_contract
  std::string contract_class, named;         // named: the coarser class that fits, "" when none
  double named_e = 0;
  std::string sentence;    // a failure's sentence (empty when it passes)
};

// The test of one tensor: golden and candidate at the sampled elements (non-finite pairs are left
// out), the kind's classes and the declared contract. `tensor` names it in the sentence.
Finding test(const std::string& tensor, const std::vector<double>& golden, const std::vector<double>& cand, Kind kind,
             const Contract& contract, const ClassValues& values);

// The largest |member - golden| / scale[i] over the sample and the contract's members, where
// scale is a per-element error scale (the logits' bound): how far the contract's arithmetic moved
// a value, in units of that scale. compare_topk accepts a near tie only within twice this
// (TopkOptions::contract_tie).
double max_scaled_deviation(const std::vector<double>& golden, const std::vector<double>& scale, Kind kind,
                            const Contract& contract, const ClassValues& values);

// x rounded to nearest (ties to even) at `bits` significant bits (f16: 11, bf16: 8), range aside.
double round_bits(double x, int bits);

// ---- The classes' values, emulated on the golden's own inputs ----------------------------------
// A tensor's inputs moved by f32 rounding: each element x becomes f32(x * (1 + u r)), r uniform in
// [-1, 1) from the project's generator (stream: seed and the tensor's name), u = ulps * 2^-24.
struct Moved {
  double ulps = 0;
  uint64_t seed = 0;
  Tensor<float> operator()(const Tensor<float>& x, const std::string& name) const;
};
// The values kind's classes of a tensor the caller can recompute from moved inputs. f32: two
// members, recompute(Moved) at two seeds with ulps = kValuesSlack * sqrt(n_reduction), n_reduction
// the longest sum behind one value (H * D for indexer scores). Why that is the f32 class: a correct
// f32 kernel, in any order, computes the exact result of its inputs moved by about sqrt(n) rounding
// errors of 2^-24 in the typical case (backward error; Higham, ch. 3), so its error against the
// golden is of the size of the moved recomputation's; kValuesSlack (8) covers the orders whose
// partial sums grow (a sum of n terms of one sign rounds at up to n times its first term) and the
// kernel's own upstream rounding (a norm, a softmax, a RoPE before the sum). The coarser classes
// stay far: f16 rounding is 2^-12 relative, 80x the f32 class at n = 8192, bf16 2^-9.
// f16, bf16: `golden` rounded. `recompute` must return the values at the sampled elements, in the
// order of `golden`; it is called at most twice.
constexpr double kValuesSlack = 8.0;
ClassValues recomputed_classes(std::function<std::vector<double>(const Moved&)> recompute, int64_t n_reduction,
                               std::vector<double> golden);
// The logits' sample: up to kLogitsSamples (row, key) elements evenly spaced over the elements
// inside the rows' windows [ks, ke), rows ascending, keys ascending.
std::vector<std::pair<int64_t, int64_t>> sample_logits(const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, int64_t s_kv);
// The classes' values at those elements: f32 and fp8mma by emulating one correct kernel each
// (judge/emulate.h, heads ascending, D in one sum), f16 and bf16 by rounding the golden there
// (`golden`: its values at the elements). Each class is computed once. The calibration family's
// other orders are not members, so `calibrate` measures the test on kernels it did not emulate.
ClassValues logits_classes(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                           const Tensor<float>& weights, std::vector<std::pair<int64_t, int64_t>> elems,
                           std::vector<double> golden);
// The same on a bf16 set's indexer inputs (indexer=bf16): the classes emulated with its bf16 q and k
// (exact products in f32); the inputs must outlive the returned function, as above.
ClassValues logits_classes(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<float>& k_scale,
                           const Tensor<float>& weights, std::vector<std::pair<int64_t, int64_t>> elems,
                           std::vector<double> golden);

// The attention's sample: query rows with at least one valid key, evenly spaced, as many as
// kAttentionSampleWork allows at this shape (topk keys of d_qk + d_v multiply-adds per head).
std::vector<int64_t> sample_rows(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t s_kv,
                                 int64_t h_q, int64_t d_qk, int64_t d_v);
// The rows of a [s_q, ...] tensor, flattened, as doubles.
std::vector<double> at_rows(const Tensor<float>& t, const std::vector<int64_t>& rows);

// The attention classes' out, lse and max_logits at the sampled rows: each class's members
// emulated on the sampled rows' q (read once, through q_rows, when a class is first asked for),
// the golden's kv and the indices the attention is judged on. f32: two correct kernels (the naive
// two-pass one, and the same with truncating accumulation, the largest error of the family); the
// coarser classes: the naive kernel with that one change.
class AttentionClasses {
 public:
  AttentionClasses(std::vector<int64_t> rows, std::function<Tensor<bf16_t>()> q_rows, const Tensor<bf16_t>& kv,
                   const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, const Tensor<float>* sink,
                   float sm_scale, int64_t d_v);
  const std::vector<int64_t>& rows() const { return rows_; }
  // which: 0 out, 1 lse, 2 max_logits.
  ClassValues values(int which);

 private:
  const std::vector<ref::AttentionOut>& members(const std::string& cls);
  std::vector<int64_t> rows_;
  std::function<Tensor<bf16_t>()> q_rows_;
  Tensor<bf16_t> q_;
  const Tensor<bf16_t>& kv_;
  Tensor<int32_t> indices_, topk_length_;
  const Tensor<float>* sink_;
  float sm_;
  int64_t d_v_;
  std::map<std::string, std::vector<ref::AttentionOut>> cache_;
};

}  // namespace indexshare::prec

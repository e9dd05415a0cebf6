// indexshare: the oracle's judgement of a candidate (a GPU kernel's outputs) against a golden set.
//
// The candidate is a safetensors file holding any subset of the golden's names:
//   layers.{l}.indexer.logits  F32 [s_q, s_kv]      layers.{l}.indexer.topk  I32/I64 [s_q, topk]
//   layers.{l}.attn.indices    I32/I64 [s_q,1,topk] (the rows the candidate's attention used)
//   layers.{l}.attn.out        F32 or BF16 [s_q, h_q, d_v]
//   layers.{l}.attn.lse        F32 [s_q, h_q]       layers.{l}.attn.max_logits F32 [s_q, h_q]
// Per layer the judge
//   1. compares indexer logits (-inf positions exactly, per-element bounds, calc_diff); when the
//      golden's `kernel` block has kwargs.clean_logits = false (DeepGEMM's paged indexer), the
//      candidate's values outside each row's window [ks, ke) are unspecified and set to -inf first
//      (a note counts them); inside the windows nothing is masked;
//   2. judges top-k positions as sets modulo ties on the golden's exact logits (near ties by the
//      candidate's own logits when given);
//   3. checks the indices the attention used: a Shared layer's must be its source Full layer's
//      positions (IndexShare), a Full layer's its own top-k; when they differ from the golden's
//      only by legitimate ties, the expected attention is recomputed on the candidate's indices
//      (conditional evaluation), so a tie never becomes a false failure downstream;
//   4. compares attention out / lse / max_logits with derived per-element bounds and the
//      FlashAttention-style budget;
//   4b. a model dump's attn.model_out (python -m indexshare.dump: the model's own attention per head,
//      [s_q, h_q, v_head_dim], with attn.w_uk / attn.w_uv / attn.q_nope beside it): the golden's
//      latent out mapped through W_uv, within cmp::model_attention_bounds (HF's eager/sdpa bf16
//      rounding), plus the structure tests;
//   4c. the precision test of every judged float tensor (judge/precision.h): an error the size of
//      a coarser arithmetic than the contract's (bf16 logits, P.V accumulated in bf16, ...) fails
//      and is named, however far inside its bounds;
//   5. when something fails, tests named hypotheses and reports the ones that explain it.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tools/judge/compare.h"
#include "ref/kernels.h"
#include "tools/lib/golden.h"
#include "tools/judge/precision.h"
#include "tools/lib/safetensors.h"
#include "tools/lib/svg.h"

namespace indexshare::diff {

struct TensorResult {
  int layer = 0;
  std::string name;          // e.g. "attn.out"
  cmp::Report report;
  std::string note;          // e.g. "expected recomputed on the candidate's indices (ties)"
};

struct Result {
  std::vector<TensorResult> tensors;
  std::vector<std::string> diagnoses;   // hypotheses that explain a failure
  std::vector<std::string> notes;       // remarks that are never failures (unsorted output, ...)
  std::vector<std::string> checked;     // candidate names that were judged
  // The picture (diff --svg): one panel per layer whose attn.out or positions were judged, with
  // that layer's diagnoses; across_layers: the diagnoses of no single layer (pooled, by role).
  std::vector<io::DiffPanel> panels;
  std::vector<std::string> across_layers;
  prec::Contract contract;              // the precision test's contract (printed in the text and JSON)
  bool failed() const;
  int exit_code() const { return failed() ? 1 : 0; }
  std::string text(const std::string& replay) const;  // the human report
  nlohmann::json json() const;
  std::string svg(const std::string& title) const;    // io::diff_svg of the panels
};

// What `diff` keeps of a golden set when it reads it (golden::read's keep_bytes): larger tensors
// are read from the file when a layer is judged and freed after it (peak memory near one layer's).
inline constexpr uint64_t kGoldenKeepBytes = uint64_t{1} << 20;

// Judges `candidate` against `golden`. layers: empty = every layer the candidate covers.
// Throws Error (exit 2) for bad input: an unknown or mis-shaped tensor, a wrong dtype, a layer
// outside the golden set, a candidate with nothing to judge.
// k: the kernels that recompute expected values (ref's by default; simd::kernels() gives the same
// bits faster on large sets). picture false leaves out what only Result::svg draws, the |err| /
// bound of attn.out per (row, head) (one more pass over the layer's largest tensors; the verdicts,
// text and JSON are the same): `diff` without --svg.
// contract: the arithmetic the precision test holds float tensors to (judge/precision.h).
Result judge(const golden::Loaded& golden, const io::SafetensorsFile& candidate, const std::set<int>& layers,
             const ref::Kernels& k = {}, bool picture = true, const prec::Contract& contract = {});

// The same judgement of a candidate read with io::read_safetensors_index(path, keep_bytes): the
// tensors it left in the file are read when their layer is judged and freed after (`diff` keeps
// only small tensors in memory: kCandidateKeepBytes).
inline constexpr uint64_t kCandidateKeepBytes = uint64_t{1} << 20;
Result judge(const golden::Loaded& golden, const io::SafetensorsIndex& candidate, const std::string& path,
             const std::set<int>& layers, const ref::Kernels& k = {}, bool picture = true,
             const prec::Contract& contract = {});

// A DeepSeek-V4 set (kind v4, tools/lib/golden_v4.h; judge/v4.cc): per layer the compressor and
// indexer entries and indexer scores within judge/v4_bounds.h's bounds, the blocks as top-k sets
// (a Shared layer's equal to its source's), attn.indices (window exact, blocks + T as sets) and
// the attention (out, out_rotated, lse, max_logits) on kv_full with the sink. judge() calls it for
// such a set.
Result judge_v4(const golden::Loaded& golden, const io::SafetensorsFile& candidate, const std::set<int>& layers,
                const ref::Kernels& k = {});

// A Hunyuan HY V4 set (kind hyv4, tools/lib/golden_hyv4.h; judge/hyv4.cc): per layer the indexer's
// k_norm, q_rope, k_rope, weights and scores within judge/hyv4_bounds.h's bounds, the top-k as sets
// (tie rule), attn.indices as the source layer's top-k, the attention (out, lse, max_logits) with the
// unscaled sink, and o_v / gated through W_uv and the gate. judge() calls it for such a set.
Result judge_hyv4(const golden::Loaded& golden, const io::SafetensorsFile& candidate, const std::set<int>& layers,
                  const ref::Kernels& k = {});
// A GLM-5.3 KPool-DSA set (kind kpool, tools/lib/golden_kpool.h; judge/kpool.cc): per DSA layer the
// pool logits, pooled keys and scores within derived bounds, the pools as top-k sets (tie rule),
// the history / union lists as multisets per row (tail exact; a Shared layer's its source's) and the
// attention over the list used. judge() calls it for such a set.
Result judge_kpool(const golden::Loaded& golden, const io::SafetensorsFile& candidate, const std::set<int>& layers,
                   const ref::Kernels& k = {});

// An MTP draft-step set (kind mtp, tools/lib/golden_mtp.h; judge/mtp.cc): the candidate's layers.{l}
// names as a stack set's, then the draft steps' mtp.topk / mtp.indices (sets modulo ties over the
// MTP layer's logits at each request's last accepted row) and mtp.out / mtp.lse / mtp.max_logits
// (the attention over the rows used), a failure tested against the target layer's top-k and the
// last padded row. judge() calls it for such a set.
Result judge_mtp(const golden::Loaded& golden, const io::SafetensorsFile& candidate, const std::set<int>& layers,
                 const ref::Kernels& k = {}, bool picture = true, const prec::Contract& contract = {});
// Whether `name` is one of the draft steps' names a candidate may hold (mtp.topk, mtp.indices, ...).
bool mtp_candidate_name(const std::string& name);

// The registry of named hypotheses: every cause the judge tests a failure against (walk.cc and
// hypotheses.cc), the tensor it explains, and the planted bug of the diagnosis catalogue
// (judge/calibrate.h) that proves it names that bug first. The report's "no named hypothesis
// explains the failure" line lists them; a test checks each against the catalogue. An empty
// `planted`: the bug needs a set of its own kind (short rows, a decode set, a module-level set), and
// the fault suite (tests/test_diff.cc) plants it there.
struct Hypothesis {
  std::string name, tensor, planted;
};
const std::vector<Hypothesis>& hypotheses();

// "0,3-5" -> {0, 3, 4, 5}; throws Error naming the bad text.
std::set<int> parse_layers(const std::string& text);

// ---- pieces the judge is made of, shared with `explain` ----

// Everything the judge needs from the golden for one layer.
struct GoldenLayer {
  int l = 0;
  bool full = true, has_indexer = false;
  int source = 0;
  Tensor<float> logits;             // golden or recomputed (empty without an indexer)
  bool logits_deferred = false;     // not stored and not computed yet (load_golden_layer's `logits`)
  Tensor<int32_t> ks, ke, topk;     // indexer windows and golden top-k (empty without an indexer)
  cmp::FloatRule logits_rule;       // filled by the judge only when the candidate holds logits
  // FP8 sets: the indexer's inputs (the logits when the set does not store them, and the logits'
  // bound read them; diff frees them once the layer's logits and top-k are judged, which is the
  // only time it computes that bound).
  Tensor<e4m3_t> index_q8, index_k8;
  Tensor<float> index_k_scale, index_weights;
  Tensor<bf16_t> q, kv;
  Tensor<int32_t> indices, topk_length;
  std::optional<Tensor<float>> sink;
  Tensor<float> out, lse, max_logits;
};
// with_q false leaves q empty (diff reads it on demand, or streams it through the bounds' pass).
// reuse_out: a tensor whose memory attn.out is read into (diff recycles it from layer to layer).
// logits false leaves logits the set does not store to be computed when needed (logits_deferred;
// compute_golden_logits): diff's passing path, whose candidate positions are the golden's, reads none.
GoldenLayer load_golden_layer(const golden::Loaded& g, int l, const ref::Kernels& k = {}, bool with_q = true,
                              Tensor<float>* reuse_out = nullptr, bool logits = true);
// The layer's indexer logits recomputed from the set's indexer inputs (d's FP8 inputs when it still
// holds them, the set's otherwise); clears logits_deferred.
void compute_golden_logits(const golden::Loaded& g, GoldenLayer& d, const ref::Kernels& k = {});

// A candidate's float tensor (F32 or BF16) and integer positions (I32 or I64; I64 values outside
// int32 are clamped and named in `diagnoses`), shape-checked; Error (exit 2) naming the file and
// tensor otherwise.
Tensor<float> candidate_float(const io::SafetensorsFile& c, const std::string& name, const Shape& shape);
Tensor<int32_t> candidate_int(const io::SafetensorsFile& c, const std::string& name, const Shape& shape,
                              std::vector<std::string>& diagnoses);

// The layers a candidate covers for a set of a kind with its own tensor list (v4, hyv4): every name is
// layers.{l}.NAME with NAME among `outputs` (a model dump's names among `dump_inputs` are passed
// over), l below n_layers and the golden holding the name (else Error naming absent(l)); --layers
// (`wanted`) filters, each wanted layer held. Error (exit 2) naming the file and tensor otherwise;
// `kind` and `expected` (the names, for the message) name the kind.
std::set<int> own_list_layers(const golden::Loaded& g, const io::SafetensorsFile& c, int n_layers,
                              const std::set<std::string>& outputs, const std::set<std::string>& dump_inputs,
                              const std::string& kind, const std::string& expected,
                              const std::function<std::string(int)>& absent, const std::set<int>& wanted);

}  // namespace indexshare::diff

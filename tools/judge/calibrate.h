// indexshare: calibration and power of the judge (`indexshare calibrate`).
//
// Calibration: the judge must pass every correct kernel. A run draws a problem (h_q 16-128,
// top-k 64-2048, 1-3 sequences, sinks or none, several value distributions, some with Shared
// layers, one in three a decode set over an FP8 KV cache), writes its golden set, emulates one member of the correct-kernel family
// (judge/emulate.h) on the golden's inputs (the indexer's logits, and its top-k taken from those
// logits, so the near ties are its own) and judges it with `diff`'s own code. A false positive
// is any FAIL. Each run records, per judged tensor, how close it came to failing: the structure
// tests' largest ratio (|estimate| / floor and |t| / t_crit, the smaller of the two; >= 1 flags),
// the largest error / bound, and calc_diff over its threshold.
//
// Power: on one golden set, a systematic fault of size eps is injected into a correct
// emulation's outputs, and eps is bisected (on a log scale) down to the smallest the judge fails.
// Precision loss: the emulation's outputs rounded to `bits` significant bits (every element), the
// largest `bits` the judge fails reported as eps = 2^-bits.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ref/kernels.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/lib/golden_train.h"

namespace indexshare::calib {

struct TensorMargin {
  std::string tensor;        // "layers.0.attn.out"
  std::string verdict;
  double structure_ratio = 0, b_over_floor = 0, bound_ratio = 0, calc_diff = 0;
  // The precision test's E_cand / E_contract (judge/precision.h; it fails above
  // kPrecisionRatio), 0 where it did not run.
  double precision_ratio = 0;
  int64_t near_ties = 0;  // a top-k's rows accepted as near ties
};

struct Run {
  int index = 0;
  std::string problem, kind, attention_variant, logits_variant;  // kind: the golden kind, stack or decode
  bool passed = true;
  std::vector<TensorMargin> tensors;
  std::vector<std::string> reasons;  // of a false positive
  double seconds = 0;
};

// Every third run is a decode set (the golden's kv quantized to FlashMLA's FP8 cache and back).
bool run_is_decode(int i);
// The problem of run `i` of a calibration with `seed` (deterministic). max_work bounds the
// (query row, head, key) triples of a layer (it sets the rows; at least 2 per sequence).
constexpr int64_t kDefaultWork = int64_t(1) << 19;
std::string run_problem(int i, uint64_t seed, int64_t max_work = kDefaultWork);

// Runs `runs` calibration runs (from `first`), calling `progress` after each. `tmp` is a scratch
// folder (created, emptied).
std::vector<Run> calibrate(int first, int runs, uint64_t seed, const ref::Kernels& k, const std::string& tmp,
                           const std::function<void(const Run&)>& progress = {}, int64_t max_work = kDefaultWork);

// Fills r's verdict, margins and reasons from a diff result.
void record(Run& r, const diff::Result& res);

// Calibration of the values kind (`calibrate --values`): the f32 indexer scores of the 2026
// families, judged by the precision test's values kind (judge/precision.h) and their top-k held to
// it. Run i draws a set of one family in turn (v4, hyv4, kpool; 128-512 rows, indexer heads 2-16,
// head dims 16-128, top-k 4-64, V4 with or without the Hadamard rotation, KPool pools of 4 or 8 with
// or without the tail), scores its first Full layer with one member of the f32 scores family
// (emul::scores_f32, in turn) and takes the kind's top-k of those scores (its near ties are its
// own); the candidate holds those two tensors. A false positive is any FAIL. `kind` receives the
// family.
std::string values_problem(int i, uint64_t seed, std::string& kind);
std::vector<Run> calibrate_values(int first, int runs, uint64_t seed, const ref::Kernels& k, const std::string& tmp,
                                  const std::function<void(const Run&)>& progress = {});

// Calibration of the 2026 families and training (`calibrate --families`): run i draws a set of one
// family in turn (kFamilies: v4, hyv4, kpool, mtp, decode-model1, train; small shapes around each
// tiny preset or the MODEL1 decode preset, its seed, heads, top-k, rows and rotation, pool or cache
// blocks drawn) and hands in every attention the set holds (each layer's out, lse and max_logits,
// and MTP's draft steps) computed by one member of the correct attention family
// (emul::attention_family, in turn) from the golden's own q, kv, indices and sink. A training run
// (1-2 sequences, 3 layers, a drawn loss: family_train_spec) hands in every gradient instead
// (family_train). A false positive is any FAIL, or any diagnosis. `kind` receives the family.
inline constexpr int kFamilies = 6;
std::string family_problem(int i, uint64_t seed, std::string& kind);
std::vector<Run> calibrate_families(int first, int runs, uint64_t seed, const ref::Kernels& k, const std::string& tmp,
                                    const std::function<void(const Run&)>& progress = {});
// Calibration on a kernel preset (`calibrate --preset K`): run i writes the preset's set with its seed
// moved (preset seed * 1000 + seed * 100000 + i), hands in what the kernel writes as a member of the
// correct family computes it (attention: emul::attention_family; indexer logits: logits_family and
// the top-k of its own logits; MODEL1 decode: family_attention; training: family_train) and judges
// it. A false positive is any FAIL or any diagnosis.
std::vector<Run> calibrate_preset(const std::string& name, int first, int runs, uint64_t seed, const ref::Kernels& k,
                                  const std::string& tmp, const std::function<void(const Run&)>& progress = {});
// The training options of run i (sparse or dense, ReLU, target, loss_coeff, edge rows).
golden::TrainSpec family_train_spec(int i, uint64_t seed);
// A correct training kernel's outputs on a training set: every layer's attention backward
// (cmp::emulate_attention_backward_lowp with each row's slots in a drawn order) and every indexer
// loss (emul::indexer_loss_f32), the dq / dkv / dk / dw in f32 or as bf16 casts (drawn from seed).
struct TrainOutputs {
  std::map<std::string, Tensor<float>> f32;
  std::map<std::string, Tensor<bf16_t>> bf16;  // bf16 casts of gradients (the judge widens its bounds by their rounding)
};
// backward / loss false: that part left out (a kernel that computes only the other).
TrainOutputs family_train(const golden::Loaded& g, uint64_t seed, bool backward = true, bool loss = true);
// Every attention a set holds ("layers.{l}.attn.*" with q, kv and indices; "mtp.*"), as the variant
// computes it: {tensor name: value} for out, lse and max_logits.
std::map<std::string, Tensor<float>> family_attention(const golden::Loaded& g, const emul::AttentionVariant& v);

// Summary: runs, false positives, and per tensor kind (out, lse, max_logits, logits, topk) the
// largest of each margin over the runs.
nlohmann::json summary(const std::vector<Run>& runs);

struct PowerRow {
  std::string fault;          // "attn.out scale, every element"
  std::string tensor;
  double smallest = -1;       // smallest eps that fails (-1: none up to the largest tried)
  std::string caught_by;      // the reason at that eps: "structure", "calc_diff", "bound", "anchor"
  double named = -1;          // smallest eps that fails with the right diagnosis (-1: none)
  std::string diagnosis;      // the diagnosis at that eps
};
// The power of the judge on the golden set at `dir` (a stack with at least one layer), faults
// injected into layer `layer` on top of the naive correct emulation.
// layer -1: layer 0. On a v4, hyv4 or kpool set it measures values_power instead.
std::vector<PowerRow> power(const std::string& dir, int layer, const ref::Kernels& k, const std::string& tmp);
// The power on a v4, hyv4 or kpool set's layer `layer` (a Full layer with indexer scores; -1: the
// first such layer): faults on the f32 scores family's first member, each candidate holding the
// faulted scores and the kind's top-k of them: a scale over every score, and a precision loss
// (scores rounded to -log2(eps) bits).
std::vector<PowerRow> values_power(const std::string& dir, int layer, const ref::Kernels& k, const std::string& tmp);

// Diagnosis accuracy: a catalogue of planted kernel bugs (attention, indexer, top-k and the stack:
// scales over groups and row patterns, offsets, the softmax scale, LSE units and the sink, one key
// missing per row, truncation, coarser arithmetic, the causal bound, Shared layers' positions), each
// planted into a correct emulation's outputs on one golden set (kCatalogueProblem) and judged; a bug
// is named right when the report's first diagnosis names it. A wrong name sends an engineer to the
// wrong place and is worse than none: the catalogue counts wrong names (the first diagnosis names
// something else) apart from missing ones (a failure with no diagnosis where the bug has a
// hypothesis). Bugs no hypothesis covers are planted too (expect ""): right when they fail with no
// diagnosis at all.
constexpr const char* kCatalogueProblem =
    "sq256 skv768 hq8 dqk576 dv512 ih32 id128 k128 seed11 nseq2 sink=random nl4 sched=FSFS";
struct CatalogueRow {
  std::string bug, expect;  // expect: what the first diagnosis must say ("": that no diagnosis is made)
  std::string first;        // the report's first diagnosis
  bool failed = false, named_first = false, named = false;  // named: any diagnosis names it
  std::string not_applicable;  // catalogue_preset: why the bug cannot occur there (not judged)
  // "right", "wrong" (a first diagnosis that does not name the bug), "missing" (failed with no
  // diagnosis, where the bug has one), "passed" (the bug did not fail), "n/a".
  std::string outcome() const;
};
std::vector<CatalogueRow> catalogue(const ref::Kernels& k, const std::string& tmp,
                                    const std::function<void(const CatalogueRow&)>& progress = {});
// Power per kernel preset (`calibrate --catalogue --preset NAME`): the stack catalogue's bugs planted
// on that preset's set (a stack or decode kernel preset) and judged. A bug is "n/a" where it cannot
// occur there: it plants a tensor the kernel does not write (an attention kernel has no top-k), or
// the set lacks what it needs (rows 64-127 in a 4-row set, a sink, Shared layers). Every other bug
// must fail there.
std::vector<CatalogueRow> catalogue_preset(const std::string& name, const ref::Kernels& k, const std::string& tmp,
                                           const std::function<void(const CatalogueRow&)>& progress = {});
// One planted bug judged: `candidate` written to `path` and read back as a kernel team's file,
// judged against g; named right first when the first diagnosis holds `expect`.
CatalogueRow judge_bug(const golden::Loaded& g, const std::vector<io::TensorView>& candidate, const std::string& bug,
                       const std::string& expect, const ref::Kernels& k, const std::string& path);
// The kind-specific hypotheses' bugs (V4, HY V4, KPool, MTP), each planted into the golden's own
// tensors of its family's tiny preset (catalogue_families.cc); catalogue() ends with them.
std::vector<CatalogueRow> family_catalogue(const ref::Kernels& k, const std::string& tmp,
                                           const std::function<void(const CatalogueRow&)>& progress = {});

}  // namespace indexshare::calib

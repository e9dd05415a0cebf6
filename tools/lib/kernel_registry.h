// indexshare: the registry of the GPU kernels we validate (data, not code paths). For each kernel:
// the shape constraints it asserts, its argument list mapped to golden tensor names (dtype and the
// shape the kernel takes), its keyword values, its outputs, where its conventions part from ours,
// and where each fact comes from (the upstream file: FlashMLA, DeepGEMM).
// `golden --for KERNEL` checks a problem against an entry before computing and writes the entry's
// call into the manifest (`kernel`).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ref/problem.h"

namespace indexshare::kreg {

// A constraint on one problem field: value in `one_of`, or a multiple of `multiple_of`, applied
// only when `when_field` equals `when_value` (when given).
struct Constraint {
  std::string field;   // h_q, d_qk, d_v, topk, index_n_heads, index_head_dim, next_n, indexer
  std::vector<int64_t> one_of;
  int64_t multiple_of = 0;
  std::string when_field;
  int64_t when_value = 0;
  std::string source;  // where the fact comes from: the upstream file
};

// One kernel argument or output: the golden tensor it maps to (with {l} for the layer), the dtype
// and the shape the kernel takes, in symbols of the problem (s_q, s_kv, h_q, d_qk, d_v, topk, H,
// D, b, next_n, num_blocks, 1, 64, 656, D+4). `view` is set when the kernel's shape is a reshape of
// the golden tensor's (same bytes, e.g. q [b, next_n, h_q, d_qk] of attn.q [s_q, h_q, d_qk]).
struct Arg {
  std::string name, tensor, dtype;
  std::vector<std::string> shape;
  // view: the kernel's tensor is the set's reshaped to `shape` (the same elements in the same
  // order). transpose {i, j}: it is the set's reshaped to `shape` with dims i and j exchanged, then
  // transposed (i, j): the same elements in another order, so not a view ({-1, -1}: none).
  bool view = false, optional = false;
  std::string note;
  std::pair<int, int> transpose{-1, -1};
};

struct Kernel {
  std::string name, library, call, kind;  // kind: the golden kind its sets are (stack or decode)
  bool per_full_layer = false;            // indexer kernels: Full layers only
  std::vector<Constraint> constraints;
  std::vector<Arg> args, outputs;
  std::vector<std::pair<std::string, std::string>> kwargs;  // name -> value expression (config field or literal)
  std::vector<std::string> conventions;   // where they part from ours, and what to do
  std::string source;
};

const std::vector<Kernel>& kernels();
const Kernel& kernel(const std::string& name);  // Error naming the unknown kernel and the known ones

// The value of a problem field the constraints and shapes name (next_n = s_q / n_seqs, b = n_seqs).
int64_t field(const Problem& p, const std::string& name);
// Every violated constraint, one sentence each: "h_q 16: flashmla-sparse-prefill-sm90 takes 64 or
// 128 (..., csrc/api/sparse_fwd.h)".
std::vector<std::string> violations(const Kernel& k, const Problem& p);
// The same with the fields' values given (kernels whose sets are not described by a Problem: the
// MODEL1 decode's spec, tools/lib/golden_model1.h); Error naming a field without a value.
std::vector<std::string> violations(const Kernel& k, const std::map<std::string, int64_t>& values);
std::vector<std::string> violations(const Kernel& k, const std::function<int64_t(const std::string&)>& value);
// The manifest's `kernel` block for a set of problem p: the call, each argument and output with its
// tensor name, dtype and numeric shape, the keyword values, the conventions, the layers it applies to.
// `extra` gives symbols the problem does not hold (num_blocks: the paged pool's size).
nlohmann::json manifest_block(const Kernel& k, const Problem& p, float sm_scale, const nlohmann::json& layers,
                              const std::map<std::string, int64_t>& extra = {});

}  // namespace indexshare::kreg

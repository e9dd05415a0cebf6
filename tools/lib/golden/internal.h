// indexshare: golden sets, the pieces the golden writer's files share (tools/lib/golden/*.cc; not a
// public header: the API is tools/lib/golden.h). Where is what: tools/lib/README.md.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ref/layer.h"
#include "ref/problem.h"
#include "tools/lib/golden.h"
#include "tools/lib/impl.h"
#include "tools/lib/safetensors.h"

namespace indexshare::golden::detail {

// ---- building a set (build_stack.cc) ------------------------------------------------------------
// The set's tensors: add copies t (a temporary is adopted), take adopts t's elements.
template <class T>
void add(GoldenSet& g, const std::string& name, const Tensor<T>& t, Role role) {
  g.tensors.push_back(io::make_view(name, t));
  g.roles[name] = role;
}
// add without a copy: the view adopts t's elements and t is left empty.
template <class T>
void take(GoldenSet& g, const std::string& name, Tensor<T>& t, Role role) {
  g.tensors.push_back(io::make_view(name, std::move(t)));  // adopts t's elements (no copy)
  g.roles[name] = role;
}
// add of a temporary: adopted as take does.
template <class T>
void add(GoldenSet& g, const std::string& name, Tensor<T>&& t, Role role) {
  take(g, name, t, role);
}

// bf16 of every element (round to nearest even).
Tensor<bf16_t> to_bf16_tensor(const Tensor<float>& x);

// The decode sets' page (block) size: the paged KV cache and indexer cache.
constexpr int64_t kDecodePage = 64;

// The kernel-level stack set of `inputs` (build, build_from): the stack computed, the set's views,
// the budgets and the manifest. Memory: each layer's tensors are freed once they are in the set.
GoldenSet build_stack(const Problem& p, std::vector<ref::LayerInputs> inputs, const std::string& kind,
                      bool with_logits, const std::string& replay, Impl impl = Impl::ref,
                      const std::vector<int64_t>* rows = nullptr, const RowPart* part = nullptr);

// ---- the tensor-name catalogue (catalogue.cc) ----------------------------------------------------

// Kinds as bits, so one rule can name several.
enum KindBit : unsigned { kKindStack = 1, kKindFromFile = 2, kKindEdge = 4, kKindDecode = 8, kKindModule = 16, kKindModel1 = 32,
                          kKindTrain = 64, kKindV4 = 128,  // v4: its own tensor list and checks (tools/lib/golden_v4.h)
                          kKindMtp = 256,  // a two-layer stack and the draft steps (tools/lib/golden_mtp.h)
                          kKindKpool = 512,  // kpool: its own tensor list and checks (tools/lib/golden_kpool.h)
                          kKindHyv4 = 1024 };  // Hunyuan HY V4: its own tensor list and checks (tools/lib/golden_hyv4.h)
constexpr unsigned kKernelKinds = kKindStack | kKindFromFile | kKindEdge | kKindDecode | kKindTrain | kKindMtp;
constexpr unsigned kAllKinds = kKernelKinds | kKindModule;

// The kind's bit; 0 for an unknown kind.
unsigned kind_bit(const std::string& kind);

// When a set holds a tensor: always; on layers with an indexer (has_indexer); on those with the
// FP8 indexer; optional (on any layer, or only on layers with an indexer); in whole sets only (not
// sampled with --rows); in sampled sets only; exactly when the manifest's `kernel` block names it
// among its arguments (sets written --for a kernel that takes it); on Full layers only (a training
// set's indexer loss).
// distilled: the layers a train set's manifest lists under train.indexer_losses.
enum class Need { always, indexer, indexer_fp8, optional, optional_indexer, whole_rows, sampled, kernel_arg, full, distilled };

struct TensorRule {
  const char* name;  // per-layer rules: the part after "layers.{l}."
  bool per_layer;
  Role role;
  unsigned kinds;
  Need need;
};

// Every tensor the builders write (build_stack, add_paged, build_model), by kind.
const std::vector<TensorRule>& tensor_rules();

// Splits "layers.{l}.{rest}" (l written canonically: no sign, no leading zero); false otherwise.
bool split_layer_name(const std::string& name, int64_t& layer, std::string& rest);
// Tensor `name` of a model dump `f` (read from `file`) as f32 values: its dtype one of `dtypes` (F32
// or BF16), its shape `shape`, every value finite; Error naming the file, tensor and element otherwise.
Tensor<float> dumped_values(const io::SafetensorsFile& f, const std::string& file, const std::string& name,
                            std::initializer_list<io::DType> dtypes, const Shape& shape);

// The rule of `name` among those of `kinds`, with its layer (-1 for set-wide names); nullptr when
// no rule of those kinds names it. Layers are not bounded here.
const TensorRule* rule_of(const std::string& name, unsigned kinds, int64_t& layer);

// The dtype and shape a kernel-level tensor has under the manifest's config (-1: any size), and
// the config fields its shape comes from; module-level weights and intermediates are BF16 of the
// model config's shapes (`shape` empty, `known_shape` false).
struct Dims {
  int64_t s_q, s_kv, topk, H, D, h_q, d_qk, d_v, n_seqs;
  bool fp8;
};
struct Layout {
  io::DType dtype;
  Shape shape;
  bool known_shape;
  const char* fields;
};
Layout layout_of(const std::string& rest, const Dims& d);
// Whether `got` is `want` (-1 in want: any size).
bool shape_matches(const Shape& want, const Shape& got);
// "DTYPE [a,b,*]" (-1 written *).
std::string layout_str(io::DType dtype, const Shape& shape);

// The per-row tensors of a stack set (their rows are query rows), by name after "layers.{l}.".
bool per_row_tensor(const std::string& name);

// ---- reading a set (manifest_check.cc) ----------------------------------------------------------

// The manifest fields the tools rely on, against the tensors (read() runs it last).
void check_manifest(const Loaded& g, const std::string& mpath);

// ---- the kinds with their own tensor list (kind_common.cc: v4, mtp, hyv4, kpool) ---------------

// The manifest's head every set of those kinds (and decode-model1) opens with: format,
// format_version, generator (naming the impl), kind, problem (the canonical descriptor) and replay.
nlohmann::json manifest_head(const std::string& kind, const std::string& problem, const std::string& replay, Impl impl);

// Parses a count field of a descriptor: 1 to 9 decimal digits; Error "<what> field '<field>':
// '<text>' is not a non-negative integer" otherwise (what: "mtp", "hyv4").
int64_t descriptor_count(const std::string& what, const std::string& field, const std::string& text);

// The base of a kind's manifest check (V4Check, Hyv4Check, KpoolCheck): refusals name the manifest
// and the field; the tensor-table check of a set with its own tensor list. read() has checked the
// "tensors" list (names unique, in the file with their dtype, shape and SHA-256, roles known).
class KindCheck {
 public:
  KindCheck(const Loaded& g, const std::string& mpath);

 protected:
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;
  // config.<f> of `c`: an integer in [lo, hi].
  int64_t int_field(const nlohmann::json& c, const std::string& f, int64_t lo, int64_t hi) const;
  // The set holds `name` with `dtype` (or `also`, when given) and shape `want`, listed with `role`;
  // `holder` names the layer that holds it in the refusal ("a <holder> layer holds it").
  void expect_tensor(const std::string& name, io::DType dtype, const Shape& want, Role role, const std::string& holder,
                     std::optional<io::DType> also = std::nullopt);
  // Every tensor the manifest lists was expected: "names 'X', which <a_set> does not hold".
  void no_other_tensors(const std::string& a_set) const;

  const Loaded& g_;
  const nlohmann::json& m_;
  const std::string& mpath_;

 private:
  std::map<std::string, std::string> roles_;  // the manifest's tensors: name -> role
  std::set<std::string> expected_;
};

}  // namespace indexshare::golden::detail

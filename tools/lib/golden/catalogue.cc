// golden sets: the tensor-name catalogue. What a set of each kind holds (tensor_rules), the dtype
// and shape of each name under a manifest's config (layout_of), and the per-row names.

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <set>

#include "tools/lib/paged.h"

namespace indexshare::golden {

using namespace detail;

std::string role_name(Role r) {
  switch (r) {
    case Role::input: return "input";
    case Role::output: return "output";
    case Role::reference: return "reference";
  }
  return "?";
}

namespace detail {
// The per-row tensors of a stack set (their rows are query rows), by name after "layers.{l}.".
bool per_row_tensor(const std::string& name) {
  static const std::set<std::string> names = {
      "indexer.q", "indexer.q_scale", "indexer.weights", "indexer.ks", "indexer.ke", "indexer.logits", "indexer.topk",
      "attn.q", "attn.indices", "attn.out", "attn.out_bf16", "attn.lse", "attn.max_logits", "attn.indices_physical"};
  if (name == "rows") return true;
  if (name.rfind("layers.", 0) != 0) return false;
  const size_t dot = name.find('.', 7);
  return dot != std::string::npos && names.count(name.substr(dot + 1));
}
}  // namespace detail

namespace detail {
// ---- tensor names: what a golden set of each kind holds, and what --from reads ----------------

unsigned kind_bit(const std::string& kind) {
  if (kind == "stack") return kKindStack;
  if (kind == "stack-from-file") return kKindFromFile;
  if (kind == "attention-edge") return kKindEdge;
  if (kind == "decode") return kKindDecode;
  if (kind == "module") return kKindModule;
  if (kind == "decode-model1") return kKindModel1;
  if (kind == "train") return kKindTrain;
  if (kind == "v4") return kKindV4;
  if (kind == "mtp") return kKindMtp;
  if (kind == "hyv4") return kKindHyv4;
  if (kind == "kpool") return kKindKpool;
  return 0;
}

// Every tensor the builders above write (build_stack, add_paged, build_model), by kind. A change
// there must be mirrored here: the checked-in sets of every kind are read in the tests.
const std::vector<TensorRule>& tensor_rules() {
  using R = Role;
  static const std::vector<TensorRule> rules = {
      {"indexer.q", true, R::input, kAllKinds, Need::indexer},
      {"indexer.k", true, R::input, kAllKinds, Need::indexer},
      {"indexer.k_scale", true, R::input, kAllKinds, Need::indexer},
      {"indexer.q_scale", true, R::reference, kAllKinds, Need::indexer},
      {"indexer.weights", true, R::input, kAllKinds, Need::indexer},
      {"indexer.ks", true, R::input, kAllKinds, Need::indexer},
      {"indexer.ke", true, R::input, kAllKinds, Need::indexer},
      {"indexer.logits", true, R::output, kKernelKinds, Need::optional_indexer},  // --no-logits
      {"indexer.logits", true, R::output, kKindModule, Need::indexer},
      {"indexer.topk", true, R::output, kAllKinds, Need::indexer},
      {"attn.q", true, R::input, kAllKinds, Need::always},
      {"attn.kv", true, R::input, kAllKinds, Need::always},
      {"attn.indices", true, R::input, kAllKinds, Need::always},
      {"attn.topk_length", true, R::input, kKindEdge, Need::always},
      {"attn.topk_length", true, R::input, kKindTrain, Need::optional},  // train sets with --train-edges
      {"attn.sink", true, R::input, kKernelKinds, Need::optional},
      {"attn.out", true, R::output, kAllKinds, Need::always},
      {"attn.out_bf16", true, R::output, kAllKinds, Need::always},
      {"attn.lse", true, R::output, kAllKinds, Need::always},
      {"attn.max_logits", true, R::output, kAllKinds, Need::always},
      // decode: the paged layouts (tools/lib/paged.h)
      {"attn.kv_cache_fp8", true, R::input, kKindDecode, Need::always},
      {"indexer.k_cache", true, R::input, kKindDecode, Need::indexer_fp8},
      {"attn.indices_physical", true, R::input, kKindDecode, Need::always},
      // module level: hidden states, bf16 weights, intermediates
      {"hidden_in", true, R::input, kKindModule, Need::always},
      {"attn_norm", true, R::input, kKindModule, Need::always},
      {"mla.wq_a", true, R::input, kKindModule, Need::always},
      {"mla.q_norm", true, R::input, kKindModule, Need::always},
      {"mla.wq_b", true, R::input, kKindModule, Need::always},
      {"mla.wkv_a", true, R::input, kKindModule, Need::always},
      {"mla.kv_norm", true, R::input, kKindModule, Need::always},
      {"mla.wkv_b", true, R::input, kKindModule, Need::always},
      {"mla.wo", true, R::input, kKindModule, Need::always},
      {"attn.x", true, R::reference, kKindModule, Need::always},
      {"mla.qr", true, R::reference, kKindModule, Need::always},
      {"indexer.wq_b", true, R::input, kKindModule, Need::indexer},
      {"indexer.wk", true, R::input, kKindModule, Need::indexer},
      {"indexer.k_norm_w", true, R::input, kKindModule, Need::indexer},
      {"indexer.k_norm_b", true, R::input, kKindModule, Need::indexer},
      {"indexer.weights_proj", true, R::input, kKindModule, Need::indexer},
      {"indexer.q_proj", true, R::reference, kKindModule, Need::optional_indexer},  // written when non-empty
      {"indexer.q_rope", true, R::reference, kKindModule, Need::optional_indexer},
      {"indexer.q_hadamard", true, R::reference, kKindModule, Need::optional_indexer},
      {"indexer.k_proj", true, R::reference, kKindModule, Need::optional_indexer},
      {"indexer.k_norm", true, R::reference, kKindModule, Need::optional_indexer},
      {"indexer.k_rope", true, R::reference, kKindModule, Need::optional_indexer},
      {"indexer.k_hadamard", true, R::reference, kKindModule, Need::optional_indexer},
      {"out", true, R::reference, kKindModule, Need::always},
      // common to the set
      {"cu_seqlens_q", false, R::input, kAllKinds, Need::whole_rows},
      {"cu_seqlens_k", false, R::input, kAllKinds, Need::always},
      {"rows", false, R::reference, kKindStack, Need::sampled},
      {"block_table", false, R::input, kKindDecode, Need::always},
      {"cache_seqlens", false, R::input, kKindDecode, Need::always},
      {"context_lens", false, R::input, kKindDecode, Need::kernel_arg},  // --for the paged indexer
      {"hidden_out", false, R::output, kKindModule, Need::always},
      // decode-model1 (tools/lib/golden_model1.h): the generic attention tensors diff judges, then
      // the MODEL1 kernel's own inputs (tools/lib/paged_model1.h)
      {"attn.q", true, R::input, kKindModel1, Need::always},
      {"attn.kv", true, R::input, kKindModel1, Need::always},
      {"attn.indices", true, R::input, kKindModel1, Need::always},
      {"attn.sink", true, R::input, kKindModel1, Need::always},
      {"attn.out", true, R::output, kKindModel1, Need::always},
      {"attn.out_bf16", true, R::output, kKindModel1, Need::always},
      {"attn.lse", true, R::output, kKindModel1, Need::always},
      {"attn.max_logits", true, R::output, kKindModel1, Need::always},
      {"attn.model1.k_cache", true, R::input, kKindModel1, Need::always},
      {"attn.model1.indices", true, R::input, kKindModel1, Need::always},
      {"attn.model1.topk_length", true, R::input, kKindModel1, Need::always},
      {"attn.model1.extra_k_cache", true, R::input, kKindModel1, Need::always},
      {"attn.model1.extra_indices", true, R::input, kKindModel1, Need::always},
      {"attn.model1.extra_topk_length", true, R::input, kKindModel1, Need::always},
      {"block_table", false, R::reference, kKindModel1, Need::always},
      {"cache_seqlens", false, R::reference, kKindModel1, Need::always},
      {"extra_block_table", false, R::reference, kKindModel1, Need::always},
      {"extra_cache_seqlens", false, R::reference, kKindModel1, Need::always},
      // train: the backward (tools/lib/golden_train.h)
      {"attn.d_out", true, R::input, kKindTrain, Need::always},
      {"attn_bwd.delta", true, R::output, kKindTrain, Need::always},
      {"attn_bwd.p", true, R::reference, kKindTrain, Need::always},
      {"attn_bwd.ds", true, R::reference, kKindTrain, Need::always},
      {"attn_bwd.dq", true, R::output, kKindTrain, Need::always},
      {"attn_bwd.dq_bf16", true, R::output, kKindTrain, Need::always},
      {"attn_bwd.dkv", true, R::output, kKindTrain, Need::always},
      {"attn_bwd.dkv_bf16", true, R::output, kKindTrain, Need::always},
      {"attn_bwd.d_sink", true, R::output, kKindTrain, Need::optional},
      {"indexer_loss.p", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.log_q", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.kl", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.loss", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.d_scores", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.dq", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.dk", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.dw", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.dq_bf16", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.dk_bf16", true, R::output, kKindTrain, Need::distilled},
      {"indexer_loss.dw_bf16", true, R::output, kKindTrain, Need::distilled},
      // mtp: the draft steps (tools/lib/golden_mtp.h)
      {"mtp.accepted", false, R::input, kKindMtp, Need::always},
      {"mtp.q", false, R::input, kKindMtp, Need::always},
      {"mtp.last_rows", false, R::reference, kKindMtp, Need::always},
      {"mtp.positions", false, R::reference, kKindMtp, Need::always},
      {"mtp.topk", false, R::output, kKindMtp, Need::always},
      {"mtp.indices", false, R::output, kKindMtp, Need::always},
      {"mtp.out", false, R::output, kKindMtp, Need::always},
      {"mtp.out_bf16", false, R::output, kKindMtp, Need::always},
      {"mtp.lse", false, R::output, kKindMtp, Need::always},
      {"mtp.max_logits", false, R::output, kKindMtp, Need::always},
  };
  return rules;
}

// Splits "layers.{l}.{rest}" (l written canonically: no sign, no leading zero); false otherwise.
bool split_layer_name(const std::string& name, int64_t& layer, std::string& rest) {
  static const std::string prefix = "layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 10 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.' || (name[i] == '0' && j - i > 1)) return false;
  layer = std::stoll(name.substr(i, j - i));
  rest = name.substr(j + 1);
  return true;
}

// The rule of `name` among those of `kinds`, with its layer (-1 for set-wide names); nullptr when
// no rule of those kinds names it. Layers are not bounded here.
const TensorRule* rule_of(const std::string& name, unsigned kinds, int64_t& layer) {
  std::string rest;
  const bool per_layer = split_layer_name(name, layer, rest);
  if (!per_layer) layer = -1;
  for (const TensorRule& r : tensor_rules())
    if ((r.kinds & kinds) && r.per_layer == per_layer && (per_layer ? rest : name) == r.name) return &r;
  return nullptr;
}

Layout layout_of(const std::string& rest, const Dims& d) {
  using io::DType;
  const DType ix = d.fp8 ? DType::F8_E4M3 : DType::BF16;
  if (rest == "indexer.q") return {ix, {d.s_q, d.H, d.D}, true, "config.s_q/index_n_heads/index_head_dim/indexer"};
  if (rest == "indexer.k") return {ix, {d.s_kv, d.D}, true, "config.s_kv/index_head_dim/indexer"};
  if (rest == "indexer.k_scale") return {DType::F32, {d.s_kv}, true, "config.s_kv"};
  if (rest == "indexer.q_scale" || rest == "indexer.weights") return {DType::F32, {d.s_q, d.H}, true, "config.s_q/index_n_heads"};
  if (rest == "indexer.ks" || rest == "indexer.ke" || rest == "attn.topk_length" || rest == "rows")
    return {DType::I32, {d.s_q}, true, "config.s_q"};
  if (rest == "indexer.logits") return {DType::F32, {d.s_q, d.s_kv}, true, "config.s_q/s_kv"};
  if (rest == "indexer.topk") return {DType::I32, {d.s_q, d.topk}, true, "config.s_q/topk"};
  if (rest == "attn.q") return {DType::BF16, {d.s_q, d.h_q, d.d_qk}, true, "config.s_q/h_q/d_qk"};
  if (rest == "attn.kv") return {DType::BF16, {d.s_kv, 1, d.d_qk}, true, "config.s_kv/d_qk"};
  if (rest == "attn.indices") return {DType::I32, {d.s_q, 1, d.topk}, true, "config.s_q/topk"};
  if (rest == "attn.sink") return {DType::F32, {d.h_q}, true, "config.h_q"};
  if (rest == "attn.out") return {DType::F32, {d.s_q, d.h_q, d.d_v}, true, "config.s_q/h_q/d_v"};
  if (rest == "attn.out_bf16") return {DType::BF16, {d.s_q, d.h_q, d.d_v}, true, "config.s_q/h_q/d_v"};
  if (rest == "attn.lse" || rest == "attn.max_logits") return {DType::F32, {d.s_q, d.h_q}, true, "config.s_q/h_q"};
  if (rest == "attn.kv_cache_fp8") return {DType::U8, {-1, kDecodePage, 1, paged::kFlashMlaTokenBytes}, true, "config.d_qk"};
  if (rest == "indexer.k_cache") return {DType::U8, {-1, kDecodePage, 1, d.D + 4}, true, "config.index_head_dim"};
  if (rest == "attn.indices_physical")
    return {DType::I32, {d.n_seqs, d.s_q / d.n_seqs, d.topk}, true, "config.n_seqs/s_q/topk"};
  if (rest == "cu_seqlens_q" || rest == "cu_seqlens_k") return {DType::I32, {d.n_seqs + 1}, true, "config.n_seqs"};
  if (rest == "block_table") return {DType::I32, {d.n_seqs, -1}, true, "config.n_seqs"};
  if (rest == "cache_seqlens") return {DType::I32, {d.n_seqs}, true, "config.n_seqs"};
  if (rest == "context_lens") return {DType::I32, {d.n_seqs, d.s_q / d.n_seqs}, true, "config.n_seqs/s_q"};
  if (rest == "attn.model1.k_cache" || rest == "attn.model1.extra_k_cache") return {DType::U8, {-1, -1}, true, "model1"};
  if (rest == "attn.model1.indices" || rest == "attn.model1.extra_indices")
    return {DType::I32, {d.n_seqs, d.s_q / d.n_seqs, -1}, true, "config.n_seqs/s_q"};
  if (rest == "attn.model1.topk_length" || rest == "attn.model1.extra_topk_length" || rest == "extra_cache_seqlens")
    return {DType::I32, {d.n_seqs}, true, "config.n_seqs"};
  if (rest == "extra_block_table") return {DType::I32, {d.n_seqs, -1}, true, "config.n_seqs"};
  if (rest == "attn.d_out") return {DType::BF16, {d.s_q, d.h_q, d.d_v}, true, "config.s_q/h_q/d_v"};
  if (rest == "attn_bwd.delta") return {DType::F32, {d.s_q, d.h_q}, true, "config.s_q/h_q"};
  if (rest == "attn_bwd.p" || rest == "attn_bwd.ds") return {DType::F32, {d.s_q, d.h_q, d.topk}, true, "config.s_q/h_q/topk"};
  if (rest == "attn_bwd.dq") return {DType::F32, {d.s_q, d.h_q, d.d_qk}, true, "config.s_q/h_q/d_qk"};
  if (rest == "attn_bwd.dq_bf16") return {DType::BF16, {d.s_q, d.h_q, d.d_qk}, true, "config.s_q/h_q/d_qk"};
  if (rest == "attn_bwd.dkv") return {DType::F32, {d.s_kv, 1, d.d_qk}, true, "config.s_kv/d_qk"};
  if (rest == "attn_bwd.dkv_bf16") return {DType::BF16, {d.s_kv, 1, d.d_qk}, true, "config.s_kv/d_qk"};
  if (rest == "attn_bwd.d_sink") return {DType::F32, {d.h_q}, true, "config.h_q"};
  if (rest == "indexer_loss.p" || rest == "indexer_loss.log_q" || rest == "indexer_loss.d_scores")
    return {DType::F32, {d.s_q, d.s_kv}, true, "config.s_q/s_kv"};
  if (rest == "indexer_loss.kl") return {DType::F32, {d.s_q}, true, "config.s_q"};
  if (rest == "indexer_loss.loss") return {DType::F32, {1}, true, "kind"};
  if (rest == "indexer_loss.dq") return {DType::F32, {d.s_q, d.H, d.D}, true, "config.s_q/index_n_heads/index_head_dim"};
  if (rest == "indexer_loss.dk") return {DType::F32, {d.s_kv, d.D}, true, "config.s_kv/index_head_dim"};
  if (rest == "indexer_loss.dw") return {DType::F32, {d.s_q, d.H}, true, "config.s_q/index_n_heads"};
  if (rest == "indexer_loss.dq_bf16") return {DType::BF16, {d.s_q, d.H, d.D}, true, "config.s_q/index_n_heads/index_head_dim"};
  if (rest == "indexer_loss.dk_bf16") return {DType::BF16, {d.s_kv, d.D}, true, "config.s_kv/index_head_dim"};
  if (rest == "indexer_loss.dw_bf16") return {DType::BF16, {d.s_q, d.H}, true, "config.s_q/index_n_heads"};
  // mtp: the draft-step rows ((steps - 1) x requests, golden_mtp.cc checks the count) and the requests
  if (rest == "mtp.accepted" || rest == "mtp.last_rows") return {DType::I32, {d.n_seqs}, true, "config.n_seqs"};
  if (rest == "mtp.positions") return {DType::I32, {-1}, true, "mtp"};
  if (rest == "mtp.q") return {DType::BF16, {-1, d.h_q, d.d_qk}, true, "config.h_q/d_qk"};
  if (rest == "mtp.topk") return {DType::I32, {-1, d.topk}, true, "config.topk"};
  if (rest == "mtp.indices") return {DType::I32, {-1, 1, d.topk}, true, "config.topk"};
  if (rest == "mtp.out") return {DType::F32, {-1, d.h_q, d.d_v}, true, "config.h_q/d_v"};
  if (rest == "mtp.out_bf16") return {DType::BF16, {-1, d.h_q, d.d_v}, true, "config.h_q/d_v"};
  if (rest == "mtp.lse" || rest == "mtp.max_logits") return {DType::F32, {-1, d.h_q}, true, "config.h_q"};
  return {DType::BF16, {}, false, "kind"};  // module-level weights, hidden states and intermediates
}

bool shape_matches(const Shape& want, const Shape& got) {
  if (want.size() != got.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != -1 && want[i] != got[i]) return false;
  return true;
}

std::string layout_str(io::DType dtype, const Shape& shape) {
  std::string s = io::dtype_name(dtype) + " [";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += shape[i] == -1 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}
}  // namespace detail

}  // namespace indexshare::golden

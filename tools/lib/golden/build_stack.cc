// golden sets: the kernel-level builders (build: stack, attention-edge and decode sets; build_stack,
// the decode layouts, for_kernel).

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <algorithm>
#include <climits>
#include <set>

#include "ref/bounds.h"
#include "ref/stack.h"
#include "ref/topk.h"
#include "tools/lib/paged.h"
#include "tools/lib/phases.h"

namespace indexshare::golden {

using nlohmann::json;
using namespace detail;

namespace detail {
Tensor<bf16_t> to_bf16_tensor(const Tensor<float>& x) {
  Tensor<bf16_t> y(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
}  // namespace detail

namespace {

// The attention edge cases, applied to a layer's indices [s_q, 1, topk] (kv rows) in place:
//   row 0: every slot -1 (an all-invalid row)           row 1: two leading -1 slots
//   row 2: -1 in the middle                             row 3: indices >= s_kv and INT_MIN
//   row 4: a duplicated index                           topk_length: row 5 uses 3 slots,
//   row 6 uses 0 slots, every other row all topk slots.
void edge_indices(Tensor<int32_t>& ind, Tensor<int32_t>& topk_length, int64_t s_kv) {
  const int64_t s_q = ind.dim(0), k = ind.dim(2);
  auto at = [&](int64_t t, int64_t j) -> int32_t& { return ind[t * k + j]; };
  for (int64_t j = 0; j < k; ++j) at(0, j) = -1;
  if (s_q > 1 && k > 2) { for (int64_t j = k - 1; j >= 2; --j) at(1, j) = at(1, j - 2); at(1, 0) = at(1, 1) = -1; }
  if (s_q > 2 && k > 2) at(2, k / 2) = -1;
  if (s_q > 3 && k > 2) { at(3, 0) = int32_t(s_kv); at(3, 1) = int32_t(s_kv + 1000); at(3, 2) = INT32_MIN; }
  if (s_q > 4 && k > 2) at(4, 1) = at(4, 0);
  topk_length = Tensor<int32_t>({s_q}, int32_t(k));
  if (s_q > 5) topk_length[5] = int32_t(std::min<int64_t>(3, k));
  if (s_q > 6) topk_length[6] = 0;
}

// Rows [begin, end) along dim 0.
template <class T>
void slice_dim0(Tensor<T>& t, int64_t begin, int64_t end) {
  if (t.numel() == 0) return;
  const int64_t row = t.numel() / t.dim(0);
  Tensor<T> s = t;
  s.shape[0] = end - begin;
  s.data.assign(t.data.begin() + begin * row, t.data.begin() + end * row);
  t = std::move(s);
}
}  // namespace

void slice_rows(ref::LayerInputs& in, int64_t begin, int64_t end) {
  require(0 <= begin && begin < end && end <= in.ks.numel(),
          "slice_rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside the " +
              std::to_string(in.ks.numel()) + " query rows");
  slice_dim0(in.index_q8, begin, end);
  slice_dim0(in.index_q, begin, end);
  slice_dim0(in.index_q_scale, begin, end);
  slice_dim0(in.index_weights, begin, end);
  slice_dim0(in.ks, begin, end);
  slice_dim0(in.ke, begin, end);
  slice_dim0(in.q, begin, end);
}

GoldenSet build(const Problem& p, const std::string& kind, bool with_logits, const std::string& replay, Impl impl,
                const std::vector<int64_t>* rows, const RowPart* part, const InputEdit& edit) {
  require(kind == "stack" || kind == "attention-edge" || kind == "decode",
          "golden: unknown kind '" + kind + "' (expected stack, attention-edge or decode)");
  require(!rows || kind == "stack", "golden: --rows (sampled query rows) works with --kind stack only, not '" + kind + "'");
  const ref::Kernels kern = kernels_for(impl);  // the generator's fills
  // attention-edge sets rewrite rows 0-6 by their row number: computed whole, never in parts.
  require(!part || kind != "attention-edge", "golden: an attention-edge set is computed by one process, not in parts (MPI ranks)");
  phases::begin("inputs");
  std::vector<ref::LayerInputs> inputs;
  if (part) {  // only the part's rows are generated (the --rows machinery)
    const std::vector<int64_t> all = rows ? *rows : ref::all_rows(p);
    require(0 <= part->begin && part->begin < part->end && part->end <= int64_t(all.size()),
            "golden: part rows [" + std::to_string(part->begin) + ", " + std::to_string(part->end) + ") outside the set's " +
                std::to_string(all.size()) + " rows");
    const std::vector<int64_t> mine(all.begin() + part->begin, all.begin() + part->end);
    inputs = ref::make_stack_inputs(p, p.schedule(), mine, kern);
  } else {
    inputs = rows ? ref::make_stack_inputs(p, p.schedule(), *rows, kern) : ref::make_stack_inputs(p, p.schedule(), kern);
  }
  if (kind == "decode") {
    // The decode kernels read the FP8 KV cache: the reference attention runs on the quantized
    // then dequantized latent rows (FlashMLA's own tests do the same), identical in value to what
    // the kernels dequantize from the paged cache.
    require(p.d_qk == paged::kFlashMlaDqk, "golden decode: the V32 FP8 KV cache needs dqk576");
    for (ref::LayerInputs& in : inputs) in.kv = paged::flashmla_quant_dequant(in.kv);
  }
  if (edit) edit(inputs);
  return build_stack(p, std::move(inputs), kind, with_logits, replay, impl, rows, part);
}

namespace {
// Decode sets add the layouts the decode kernels read (tools/lib/paged.h): FlashMLA's V32 FP8 KV cache
// of the layer, DeepGEMM's paged indexer k cache (layers with an indexer), and the physical
// indices [b, next_n, topk] the attention used. Unused cache slots hold NaN.
void add_paged(GoldenSet& g, const Problem& p, const ref::LayerInputs& in, const ref::StackLayerOutputs& o,
               const std::string& pre, const paged::PagedLayout& layout, const RowPart* part) {
  const int64_t b = p.n_seqs, Lk = p.seq_kv(), k = p.index_topk;
  std::vector<Tensor<bf16_t>> kv;
  for (int64_t i = 0; i < b; ++i) {
    Tensor<bf16_t> t({Lk, 1, p.d_qk});
    std::copy(in.kv.data.begin() + i * Lk * p.d_qk, in.kv.data.begin() + (i + 1) * Lk * p.d_qk, t.data.begin());
    kv.push_back(std::move(t));
  }
  add(g, pre + "attn.kv_cache_fp8", paged::flashmla_fp8_cache(layout, kv), Role::input);
  if (in.has_indexer && p.indexer == IndexerMode::fp8) {
    std::vector<Tensor<e4m3_t>> kc;
    std::vector<Tensor<float>> sc;
    for (int64_t i = 0; i < b; ++i) {
      Tensor<e4m3_t> t({Lk, p.index_head_dim});
      std::copy(in.index_k8.data.begin() + i * Lk * p.index_head_dim, in.index_k8.data.begin() + (i + 1) * Lk * p.index_head_dim, t.data.begin());
      Tensor<float> s({Lk});
      std::copy(in.index_k_scale.data.begin() + i * Lk, in.index_k_scale.data.begin() + (i + 1) * Lk, s.data.begin());
      kc.push_back(std::move(t));
      sc.push_back(std::move(s));
    }
    add(g, pre + "indexer.k_cache", paged::deepgemm_index_cache(layout, kc, sc, p.index_head_dim), Role::input);
  }
  // A part's rows sit at their place among the whole set's (the batch entry of a row is its
  // number / next_n); the others stay -1 and are cut away after the mapping.
  Tensor<int32_t> logical({b, p.seq_q(), k}, -1);
  const int64_t first = part ? part->begin * k : 0;
  std::copy(o.used_topk.data.begin(), o.used_topk.data.end(), logical.data.begin() + first);
  Tensor<int32_t> physical = paged::logical_to_physical(layout, logical);
  if (part) {
    Tensor<int32_t> mine({part->end - part->begin, 1, k});
    std::copy(physical.data.begin() + first, physical.data.begin() + first + mine.numel(), mine.data.begin());
    g.shard.per_row[pre + "attn.indices_physical"] = physical.shape;
    physical = std::move(mine);
  }
  add(g, pre + "attn.indices_physical", physical, Role::input);
}

// A layer's indexer tensors, in the set's order: q, k, k_scale, q_scale, weights, ks, ke, logits
// (with_logits), topk. The views adopt the tensors (take) where nothing later reads them; a decode
// set's paged caches (paged_reads) read k and k_scale afterwards, so those are copied (add).
void add_indexer_tensors(GoldenSet& g, const Problem& p, ref::LayerInputs& in, ref::StackLayerOutputs& o,
                         const std::string& pre, bool with_logits, bool paged_reads) {
  if (p.indexer == IndexerMode::fp8) {
    take(g, pre + "indexer.q", in.index_q8, Role::input);
    if (paged_reads) add(g, pre + "indexer.k", in.index_k8, Role::input);
    else take(g, pre + "indexer.k", in.index_k8, Role::input);
  } else {
    add(g, pre + "indexer.q", to_bf16_tensor(in.index_q), Role::input);
    add(g, pre + "indexer.k", to_bf16_tensor(in.index_k), Role::input);
  }
  if (paged_reads) add(g, pre + "indexer.k_scale", in.index_k_scale, Role::input);
  else take(g, pre + "indexer.k_scale", in.index_k_scale, Role::input);
  take(g, pre + "indexer.q_scale", in.index_q_scale, Role::reference);
  take(g, pre + "indexer.weights", in.index_weights, Role::input);
  take(g, pre + "indexer.ks", in.ks, Role::input);
  take(g, pre + "indexer.ke", in.ke, Role::input);
  if (with_logits) take(g, pre + "indexer.logits", o.logits, Role::output);
  take(g, pre + "indexer.topk", o.own_topk, Role::output);
}

// Tolerance budget of a layer's attention output (FlashAttention style, see ref/bounds.h), the
// manifest's budgets entry: it reads q and out, so it runs before the views take them. Large sets
// emulate a row subset chosen from the whole set's rows (ref/bounds.h budget_rows; a part gathers
// every part's row maxima and keeps its own maxima in g.shard.budgets).
json attention_budget_entry(GoldenSet& g, const ref::Kernels& kern, const Problem& p, const ref::LayerInputs& in,
                            const Tensor<int32_t>& indices, const Tensor<int32_t>* tl, const Tensor<float>* sink,
                            const ref::AttentionOut& attn, const std::string& pre, int64_t s_q_set, const RowPart* part) {
  double emu_err = 0, budget = 0;
  int64_t emulated = 0;
  {
    double ref_round = 0;
    const std::vector<double> mine = cmp::budget_row_max(attn.out, &ref_round);
    const std::vector<double> all = part && part->gather_rows ? part->gather_rows(mine) : mine;
    require(int64_t(all.size()) == s_q_set, "golden: the budget's row maxima cover " + std::to_string(all.size()) +
                                                " rows, not the set's " + std::to_string(s_q_set));
    const int64_t b = part ? part->begin : 0, e = part ? part->end : s_q_set;
    std::vector<int64_t> local;
    for (int64_t t : cmp::budget_rows(all)) {
      emulated += 1;
      if (t >= b && t < e) local.push_back(t - b);
    }
    const cmp::BudgetParts parts =
        cmp::attention_budget_parts_rows(kern.emulate_attention_lowp, in.q, in.kv, indices, p.sm_scale(), p.d_v, tl,
                                         sink, attn.out, local, s_q_set > cmp::kBudgetAllRows, &emu_err, ref_round);
    budget = cmp::attention_budget(parts);
    if (part) g.shard.budgets[pre + "attn.out"] = {parts.emul, parts.ref_round, emu_err};
  }
  json entry = {{"budget_max_abs", budget},
                {"emulation_max_abs", emu_err},
                {"multiple", cmp::kBudgetMultiple},
                {"emulation", "f32 logits and softmax, P rounded to bf16, f32 accumulation, bf16 out"}};
  if (s_q_set > cmp::kBudgetAllRows) entry["emulation_rows"] = cmp::budget_rows_text(emulated, s_q_set);
  return entry;
}

// A layer's attention tensors, in the set's order: q, kv, indices, topk_length (tl), sink, out,
// out_bf16, lse, max_logits. The views adopt them (take), but for kv in a decode set (paged_reads:
// the paged cache reads it afterwards) and the sink (copied).
void add_attention_tensors(GoldenSet& g, ref::LayerInputs& in, Tensor<int32_t>& indices, Tensor<int32_t>& topk_length,
                           const Tensor<int32_t>* tl, const Tensor<float>* sink, ref::AttentionOut& attn,
                           const std::string& pre, bool paged_reads) {
  take(g, pre + "attn.q", in.q, Role::input);
  if (paged_reads) add(g, pre + "attn.kv", in.kv, Role::input);
  else take(g, pre + "attn.kv", in.kv, Role::input);
  take(g, pre + "attn.indices", indices, Role::input);
  if (tl) take(g, pre + "attn.topk_length", topk_length, Role::input);
  if (sink) add(g, pre + "attn.sink", *sink, Role::input);
  take(g, pre + "attn.out", attn.out, Role::output);
  take(g, pre + "attn.out_bf16", attn.out_bf16, Role::output);
  take(g, pre + "attn.lse", attn.lse, Role::output);
  take(g, pre + "attn.max_logits", attn.max_logits, Role::output);
}

// The set-wide tensors after the layers: the sequence boundaries of the flattened rows (FlashMLA /
// varlen style) and a sampled set's `rows`. A sampled set's query rows are not whole sequences: no
// cu_seqlens_q (ks/ke hold each row's window), and `rows` maps each of its rows to the problem's
// row number. A part: every per-row tensor holds the part's rows, and is that many rows of the
// whole set's (recorded in g.shard.per_row).
void add_set_tensors(GoldenSet& g, const Problem& p, const std::vector<int64_t>* rows, const RowPart* part,
                     int64_t s_q_set) {
  Tensor<int32_t> cu_q({p.n_seqs + 1}), cu_k({p.n_seqs + 1});
  for (int64_t i = 0; i <= p.n_seqs; ++i) { cu_q[i] = int32_t(i * p.seq_q()); cu_k[i] = int32_t(i * p.seq_kv()); }
  if (!rows) add(g, "cu_seqlens_q", cu_q, Role::input);
  add(g, "cu_seqlens_k", cu_k, Role::input);
  if (rows) {
    const int64_t b = part ? part->begin : 0, e = part ? part->end : s_q_set;
    Tensor<int32_t> rt({e - b});
    for (int64_t i = b; i < e; ++i) rt[i - b] = int32_t((*rows)[size_t(i)]);
    add(g, "rows", rt, Role::reference);
  }
  if (part) {
    const int64_t n = part->end - part->begin;
    for (const io::TensorView& v : g.tensors) {
      if (!per_row_tensor(v.name) || g.shard.per_row.count(v.name)) continue;
      require(!v.shape.empty() && v.shape[0] == n, "golden: part: tensor '" + v.name + "' " + shape_str(v.shape) +
                                                       " does not hold the part's " + std::to_string(n) + " rows");
      Shape whole = v.shape;
      whole[0] = s_q_set;
      g.shard.per_row[v.name] = whole;
    }
  }
}

// The manifest of a kernel-level stack set (without its "tensors" list, which write() adds).
json stack_manifest(const Problem& p, const std::string& kind, Impl impl, const std::string& replay, int64_t s_q_set,
                    json layers, json budgets, const std::vector<int64_t>* rows) {
  const float sm = p.sm_scale();
  json manifest = manifest_head(kind, to_string(p), replay, impl);
  manifest.update(json{
      {"config",
       {{"s_q", s_q_set}, {"s_kv", p.s_kv}, {"topk", p.index_topk}, {"index_n_heads", p.index_n_heads},
        {"index_head_dim", p.index_head_dim}, {"h_q", p.h_q}, {"d_qk", p.d_qk}, {"d_v", p.d_v},
        {"sm_scale", sm}, {"n_layers", p.n_layers}, {"seed", p.seed}, {"start_pos", p.start_pos()}, {"n_seqs", p.n_seqs},
        {"indexer", indexer_mode_name(p.indexer)}}},
      {"conventions",
       {{"lse_base", "e"},
        {"lse_includes_sink", false},
        {"sink", "out *= 1 / (1 + exp(sink - lse)); lse and max_logits exclude it"},
        {"empty_row", "out 0, lse +inf, max_logits -inf"},
        {"scale_rule", scale_rule_name(p.scale)},
        {"fp8_format", "e4m3fn, round to nearest even, saturating to +-448"},
        {"tie_rule", "score descending, then index ascending"},
        {"topk_index_space", "indexer.topk: sequence-local positions s - ks[t]"},
        {"attn_index_space", "attn.indices: rows of attn.kv (logical, unpaged)"},
        {"padding", -1},
        {"invalid_index", "any index < 0 or >= s_kv is ignored wherever it sits"},
        {"sequences", "n_seqs sequences flattened: sequence i owns query rows [cu_seqlens_q[i], cu_seqlens_q[i+1]) "
                      "and kv rows [cu_seqlens_k[i], cu_seqlens_k[i+1])"},
        {"causal_rule", "the j-th query row of a sequence with Lq queries and Lk keys is position Lk - Lq + j and "
                        "sees that sequence's keys [0, Lk - Lq + j]"},
        {"indexer_logits", "k_scale[s] * sum_h w[t,h] * relu(q[t,h] . k[s]); -inf outside [ks, ke)"},
        {"rope_layout", "not applicable (kernel-level set)"},
        {"decode",
         kind == "decode"
             ? "batch b = n_seqs, next_n = s_q / b; attn.kv holds the FP8-quantized-then-dequantized latent rows "
               "(FlashMLA V32: 4 tiles of 128, scale 2^ceil(log2(max(amax/448, 1e-4)))); attn.kv_cache_fp8 "
               "[num_blocks, page, 1, 656] = 512 e4m3 + 4 f32 scales + 64 bf16 rope per token; "
               "indexer.k_cache [num_blocks, page, 1, D + 4] = per block all fp8 bytes then the f32 scales; "
               "attn.indices_physical = block_table[b, pos / page] * page + pos % page; unused slots NaN"
             : "not a decode set"}}},
      {"layers", std::move(layers)},
      {"budgets", std::move(budgets)},
  });
  if (rows) {
    manifest["rows"] = {{"count", s_q_set}, {"problem_s_q", p.s_q}, {"list", ref::format_rows(*rows)}, {"tensor", "rows"},
                        {"meaning", "sampled query rows: row r of every per-row tensor (indexer q, q_scale, weights, "
                                    "ks, ke, logits, topk; attn q, indices, out, out_bf16, lse, max_logits) is the "
                                    "problem's query row rows[r]; key-side tensors (indexer k, k_scale, attn kv) are "
                                    "whole; config.s_q is the number of rows in the set"}};
  }
  return manifest;
}
}  // namespace

namespace detail {
// Memory: the set's views copy the tensors; each large one (attention q, out, out_bf16, the logits)
// is freed as soon as it is copied (take), and the rest of a layer's inputs and outputs once the
// layer is done, so the peak stays near the stack's own.
GoldenSet build_stack(const Problem& p, std::vector<ref::LayerInputs> inputs, const std::string& kind,
                      bool with_logits, const std::string& replay, Impl impl, const std::vector<int64_t>* rows,
                      const RowPart* part) {
  const Schedule sched = p.schedule();
  const ref::Kernels kern = kernels_for(impl);  // the stack and the budget's emulation
  phases::begin("compute");
  // Without logits in the set, simd's stack streams the indexer into the top-k (the same
  // positions, never the [s_q, s_kv] logits), as `run` does.
  std::vector<ref::StackLayerOutputs> outs = ref::run_stack(p, sched, inputs, with_logits, kern);
  phases::begin("assemble (budget emulation, the set's views)");
  GoldenSet g;
  const int64_t s_q_set = rows ? int64_t(rows->size()) : p.s_q;
  if (part) {
    g.shard.active = true;
    g.shard.begin = part->begin;
    g.shard.end = part->end;
    g.shard.total = s_q_set;
  }
  json layers = json::array(), budgets = json::object();
  paged::PagedLayout layout;
  if (kind == "decode") {
    layout = paged::make_layout(std::vector<int64_t>(size_t(p.n_seqs), p.seq_kv()), kDecodePage, p.seed);
    add(g, "block_table", layout.block_table, Role::input);
    add(g, "cache_seqlens", layout.cache_seqlens, Role::input);
  }
  for (int l = 0; l < sched.n_layers(); ++l) {
    ref::LayerInputs& in = inputs[size_t(l)];
    ref::StackLayerOutputs& o = outs[size_t(l)];
    const std::string pre = "layers." + std::to_string(l) + ".";
    layers.push_back({{"index", l}, {"kind", sched.is_full(l) ? "full" : "shared"}, {"source", o.source},
                      {"has_indexer", in.has_indexer}});
    // The set's views adopt the layer's tensors (take) where nothing later reads them: a decode
    // set's paged caches (add_paged) read the key side and the used positions.
    const bool paged_reads = kind == "decode";
    if (in.has_indexer) add_indexer_tensors(g, p, in, o, pre, with_logits, paged_reads);
    // Attention: the indices the layer used (edge cases rewrite them for attention-edge sets).
    Tensor<int32_t> indices = o.indices, topk_length;
    ref::AttentionOut attn;
    const Tensor<float>* sink = in.sink ? &*in.sink : nullptr;
    if (kind == "attention-edge") {
      edge_indices(indices, topk_length, p.s_kv);
      attn = ref::sparse_attention(in.q, in.kv, indices, p.sm_scale(), p.d_v, &topk_length, sink);
    } else {
      attn = std::move(o.attn);
    }
    const Tensor<int32_t>* tl = topk_length.numel() ? &topk_length : nullptr;
    budgets[pre + "attn.out"] = attention_budget_entry(g, kern, p, in, indices, tl, sink, attn, pre, s_q_set, part);
    add_attention_tensors(g, in, indices, topk_length, tl, sink, attn, pre, paged_reads);
    if (kind == "decode") add_paged(g, p, in, o, pre, layout, part);
    // The layer's inputs and outputs live in the set's views from here on (the next layers read
    // neither), so they are freed now: the peak holds at most one layer's tensors twice.
    in = ref::LayerInputs();
    o = ref::StackLayerOutputs();
  }
  add_set_tensors(g, p, rows, part, s_q_set);
  g.manifest = stack_manifest(p, kind, impl, replay, s_q_set, std::move(layers), std::move(budgets), rows);
  return g;
}
}  // namespace detail

void for_kernel(GoldenSet& set, const kreg::Kernel& k, const Problem& p) {
  std::map<std::string, int64_t> extra;  // the symbols the problem does not hold: the paged pool's sizes
  const io::TensorView* cache_seqlens = nullptr;
  for (const io::TensorView& v : set.tensors) {
    if (v.name == "layers.0.attn.kv_cache_fp8") extra["num_blocks"] = v.shape[0];
    if (v.name == "block_table") extra["max_blocks"] = v.shape[1];
    if (v.name == "cache_seqlens") cache_seqlens = &v;
  }
  for (const kreg::Arg& a : k.args) {
    if (a.tensor != "context_lens") continue;
    // The paged indexer's 2-D form: row b * next_n + j sees the keys [0, context_lens[b, j]).
    require(cache_seqlens != nullptr, "golden --for " + k.name + ": the set has no cache_seqlens (a decode set holds it)");
    const Tensor<int32_t> lens = io::as_tensor<int32_t>(*cache_seqlens, "cache_seqlens");
    const int64_t b = p.n_seqs, next_n = p.seq_q();
    Tensor<int32_t> cl({b, next_n});
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < next_n; ++j) cl[i * next_n + j] = paged::next_n_key_end(lens[i], next_n, j);
    add(set, "context_lens", cl, Role::input);
  }
  set.manifest["kernel"] = kreg::manifest_block(k, p, set.manifest["config"]["sm_scale"].get<float>(), set.manifest["layers"], extra);
}

}  // namespace indexshare::golden

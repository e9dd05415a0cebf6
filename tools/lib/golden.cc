#include "tools/lib/golden.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/golden/internal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "ref/bounds.h"
#include "ref/config.h"
#include "ref/cost.h"
#include "ref/model.h"
#include "ref/numerics.h"
#include "ref/stack.h"
#include "ref/topk.h"
#include "tools/lib/golden_model1.h"
#include "tools/lib/json_io.h"
#include "tools/lib/options.h"
#include "tools/lib/paged.h"
#include "tools/lib/phases.h"

namespace indexshare::golden {

namespace fs = std::filesystem;
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
                const std::vector<int64_t>* rows, const RowPart* part) {
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
    if (in.has_indexer) {
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
    // Tolerance budget of the attention output (FlashAttention style, see ref/bounds.h), first:
    // it reads q and out, which the views below take. Large sets emulate a row subset chosen from
    // the whole set's rows (ref/bounds.h budget_rows; a part gathers every part's row maxima).
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
    budgets[pre + "attn.out"] = {{"budget_max_abs", budget},
                                 {"emulation_max_abs", emu_err},
                                 {"multiple", cmp::kBudgetMultiple},
                                 {"emulation", "f32 logits and softmax, P rounded to bf16, f32 accumulation, bf16 out"}};
    if (s_q_set > cmp::kBudgetAllRows) budgets[pre + "attn.out"]["emulation_rows"] = cmp::budget_rows_text(emulated, s_q_set);
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
    if (kind == "decode") add_paged(g, p, in, o, pre, layout, part);
    // The layer's inputs and outputs live in the set's views from here on (the next layers read
    // neither), so they are freed now: the peak holds at most one layer's tensors twice.
    in = ref::LayerInputs();
    o = ref::StackLayerOutputs();
  }
  // Sequence boundaries of the flattened rows, FlashMLA / varlen style.
  // A sampled set's query rows are not whole sequences: no cu_seqlens_q (ks/ke hold each row's
  // window), and `rows` maps each of its rows to the problem's row number.
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
  // A part: every per-row tensor holds the part's rows, and is that many rows of the whole set's.
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
  const float sm = p.sm_scale();
  g.manifest = {
      {"format", "indexshare-golden"},
      {"format_version", kFormatVersion},
      {"generator", std::string("indexshare ") + INDEXSHARE_VERSION + " (" + impl_name(impl) + ")"},
      {"kind", kind},
      {"problem", to_string(p)},
      {"replay", replay},
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
      {"layers", layers},
      {"budgets", budgets},
  };
  if (rows) {
    g.manifest["rows"] = {{"count", s_q_set}, {"problem_s_q", p.s_q}, {"list", ref::format_rows(*rows)}, {"tensor", "rows"},
                          {"meaning", "sampled query rows: row r of every per-row tensor (indexer q, q_scale, weights, "
                                      "ks, ke, logits, topk; attn q, indices, out, out_bf16, lse, max_logits) is the "
                                      "problem's query row rows[r]; key-side tensors (indexer k, k_scale, attn kv) are "
                                      "whole; config.s_q is the number of rows in the set"}};
  }
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

namespace {
Tensor<bf16_t> bf16_of(const Tensor<float>& x) { return to_bf16_tensor(x); }
}  // namespace

namespace {
Problem dump_shapes(const io::SafetensorsFile& f, const std::string& file, Problem p);
io::SafetensorsFile read_dump(const std::string& file, const RowPart* part, bool header_only = false);
// The problem a dump is read under: problem_text, else the one the dump records (a model dump),
// else "sq1 skv1" (the shapes come from the tensors); without an "nl" field, the file's layer count.
// A problem token's field name: "k32" -> "k", "sched=FS" -> "sched".
std::string token_field(const std::string& tok) {
  const size_t eq = tok.find('=');
  if (eq != std::string::npos) return tok.substr(0, eq);
  size_t n = 0;
  while (n < tok.size() && std::isalpha(static_cast<unsigned char>(tok[n]))) ++n;
  return tok.substr(0, n);
}

// The dump's recorded problem completed by the fields of --problem it does not give. A field both
// give must mean the same (compared as parsed values, so "sm=0.5" equals "sm=0.500000000"); a
// contradiction is refused with both values, since either silently winning computes a set the
// model did not run (a dump's softmax scale, schedule and indexer mode are the model's).
std::string merge_dump_problem(const std::string& recorded, const std::string& given, const std::string& file) {
  std::map<std::string, std::string> rec;
  std::istringstream rs(recorded);
  for (std::string tok; rs >> tok;) rec[token_field(tok)] = tok;
  std::string text = recorded;
  std::istringstream gs(given);
  for (std::string tok; gs >> tok;) {
    const auto it = rec.find(token_field(tok));
    if (it == rec.end()) {
      text += " " + tok;
      continue;
    }
    if (to_string(parse_problem(it->second)) != to_string(parse_problem(tok)))
      throw Error("golden: --problem gives '" + tok + "' but the dump " + file + " records '" + it->second +
                  "' (the model's own value): leave the field out of --problem, or dump again with the value wanted");
  }
  return text;
}

Problem dump_text_problem(const io::SafetensorsFile& f, const std::string& file, const std::string& problem_text) {
  const std::string recorded = dump_problem(f, file);
  std::string text = recorded.empty() ? (problem_text.empty() ? "sq1 skv1" : problem_text)
                                      : merge_dump_problem(recorded, problem_text, file);
  if (text.find("nl") == std::string::npos) {
    int L = 0;
    while (f.find("layers." + std::to_string(L) + ".attn.q")) ++L;
    text += " nl" + std::to_string(std::max(L, 1));
  }
  return parse_problem(text);
}
}  // namespace

StackInputs load_dump(const std::string& file, const std::string& problem_text, const RowPart* part) {
  const io::SafetensorsFile f = read_dump(file, part);
  StackInputs si = load_stack_inputs(f, file, dump_text_problem(f, file, problem_text), part);
  si.part_rows = part != nullptr;
  return si;
}

DumpRows dump_rows(const std::string& file, const std::string& problem_text) {
  const io::SafetensorsFile f = read_dump(file, nullptr, true);
  DumpRows d;
  d.problem = dump_shapes(f, file, dump_text_problem(f, file, problem_text));
  for (int l = 0; l < d.problem.n_layers; ++l) d.indexer_layers += f.find("layers." + std::to_string(l) + ".indexer.q") != nullptr;
  const Tensor<int32_t> ks = io::as_tensor<int32_t>(f.get("layers.0.indexer.ks"), file);
  const Tensor<int32_t> ke = io::as_tensor<int32_t>(f.get("layers.0.indexer.ke"), file);
  require(ks.numel() == d.problem.s_q && ke.numel() == d.problem.s_q,
          file + ": layers.0.indexer.ks / ke must hold s_q = " + std::to_string(d.problem.s_q) + " rows");
  d.windows.resize(size_t(d.problem.s_q));
  for (int64_t t = 0; t < d.problem.s_q; ++t) d.windows[size_t(t)] = int64_t(ke[t]) - int64_t(ks[t]);
  return d;
}

std::string from_replay(const std::string& file, const Problem& p, bool with_logits) {
  return "indexshare golden --from " + file + " --problem \"" + to_string(p) + "\"" + (with_logits ? "" : " --no-logits");
}

std::string model_replay(const ModelSpec& spec) {
  char sim[32];
  std::snprintf(sim, sizeof sim, "%.9g", double(spec.sim));
  std::string replay = "indexshare golden --model " + spec.preset + " --seed " + std::to_string(spec.seed) + " --sim " + sim +
                       " --variant " + spec.variant;
  if (spec.layers) replay += " --layers " + std::to_string(spec.layers);
  if (spec.seq) replay += " --seq " + std::to_string(spec.seq);
  if (!spec.schedule.empty()) replay += " --schedule " + spec.schedule;
  if (spec.impl != Impl::ref) replay += " --impl " + impl_name(spec.impl);
  return replay;
}

GoldenSet build_model(const ModelSpec& spec, const std::string& replay) {
  ModelConfig cfg = model_preset(spec.preset);
  if (spec.layers > 0) cfg.n_layers = spec.layers;
  if (spec.seq > 0) cfg.seq = spec.seq;
  const Schedule sched = spec.schedule.empty() ? cfg.resolve_schedule() : parse_schedule(spec.schedule, cfg.n_layers);
  cfg.schedule = ScheduleSpec{};
  cfg.schedule.pattern = sched.pattern();
  cfg.validate();
  require(spec.sim >= 0 && spec.sim <= 1, "golden: --sim must be in [0, 1]");
  const ref::IndexerVariant variant = ref::parse_indexer_variant(spec.variant);
  const ref::ToyModel m = ref::make_toy_model(cfg, sched, spec.seed, spec.sim, variant, true);
  const int64_t S = cfg.seq;
  const Tensor<float> h0 = ref::toy_hidden(cfg, spec.seed, 0, S);
  ref::ToyCache cache;
  const ref::Kernels kern = kernels_for(spec.impl);
  const ref::ToyForward f = ref::forward(m, cache, h0, kern);
  GoldenSet g;
  json layers = json::array(), budgets = json::object();
  Tensor<int32_t> ks({S}, 0), ke({S});
  for (int64_t t = 0; t < S; ++t) ke[t] = int32_t(t + 1);
  const float sm = float(cfg.softmax_scale());
  Tensor<float> h = h0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const ref::ToyLayer& w = m.layers[size_t(l)];
    const ref::ToyLayerTrace& tr = f.layers[size_t(l)];
    const std::string pre = "layers." + std::to_string(l) + ".";
    layers.push_back({{"index", l}, {"kind", sched.is_full(l) ? "full" : "shared"}, {"source", sched.source(l)},
                      {"has_indexer", w.has_indexer}});
    // Inputs of the module level: the hidden state and the layer's bf16 weights.
    add(g, pre + "hidden_in", bf16_of(h), Role::input);
    add(g, pre + "attn_norm", bf16_of(w.attn_norm), Role::input);
    const std::pair<const char*, const Tensor<float>*> mla[] = {
        {"mla.wq_a", &w.mla.wq_a}, {"mla.q_norm", &w.mla.q_norm}, {"mla.wq_b", &w.mla.wq_b}, {"mla.wkv_a", &w.mla.wkv_a},
        {"mla.kv_norm", &w.mla.kv_norm}, {"mla.wkv_b", &w.mla.wkv_b}, {"mla.wo", &w.mla.wo}};
    for (const auto& [n, t] : mla) add(g, pre + n, bf16_of(*t), Role::input);
    add(g, pre + "attn.x", bf16_of(tr.x), Role::reference);
    add(g, pre + "mla.qr", bf16_of(tr.qr), Role::reference);
    if (w.has_indexer) {
      const std::pair<const char*, const Tensor<float>*> iw[] = {
          {"indexer.wq_b", &w.indexer.wq_b}, {"indexer.wk", &w.indexer.wk}, {"indexer.k_norm_w", &w.indexer.k_norm_w},
          {"indexer.k_norm_b", &w.indexer.k_norm_b}, {"indexer.weights_proj", &w.indexer.weights_proj}};
      for (const auto& [n, t] : iw) add(g, pre + n, bf16_of(*t), Role::input);
      const ref::IndexerModuleOut& io_ = tr.indexer;
      const std::pair<const char*, const Tensor<float>*> inter[] = {
          {"indexer.q_proj", &io_.q_proj}, {"indexer.q_rope", &io_.q_rope}, {"indexer.q_hadamard", &io_.q_hadamard},
          {"indexer.k_proj", &io_.k_proj}, {"indexer.k_norm", &io_.k_norm}, {"indexer.k_rope", &io_.k_rope},
          {"indexer.k_hadamard", &io_.k_hadamard}};
      for (const auto& [n, t] : inter)
        if (t->numel()) add(g, pre + n, bf16_of(*t), Role::reference);
      if (variant == ref::IndexerVariant::deepseek_fp8) {
        add(g, pre + "indexer.q", io_.q8, Role::input);
        add(g, pre + "indexer.k", cache.index_keys[size_t(l)].k8, Role::input);
      } else {
        add(g, pre + "indexer.q", bf16_of(io_.q), Role::input);
        add(g, pre + "indexer.k", bf16_of(cache.index_keys[size_t(l)].k), Role::input);
      }
      add(g, pre + "indexer.k_scale", cache.index_keys[size_t(l)].k_scale, Role::input);
      add(g, pre + "indexer.q_scale", io_.q_scale, Role::reference);
      add(g, pre + "indexer.weights", io_.weights, Role::input);
      add(g, pre + "indexer.ks", ks, Role::input);
      add(g, pre + "indexer.ke", ke, Role::input);
      add(g, pre + "indexer.logits", tr.logits, Role::output);
      add(g, pre + "indexer.topk", tr.own_topk, Role::output);
    }
    const Tensor<int32_t> indices = ref::local_to_kv_rows(tr.used_topk, ks);
    add(g, pre + "attn.q", tr.q, Role::input);
    add(g, pre + "attn.kv", cache.kv[size_t(l)], Role::input);
    add(g, pre + "attn.indices", indices, Role::input);
    add(g, pre + "attn.out", tr.attn.out, Role::output);
    add(g, pre + "attn.out_bf16", tr.attn.out_bf16, Role::output);
    add(g, pre + "attn.lse", tr.attn.lse, Role::output);
    add(g, pre + "attn.max_logits", tr.attn.max_logits, Role::output);
    add(g, pre + "out", bf16_of(tr.out), Role::reference);
    int64_t emulated = 0;
    const cmp::BudgetParts bparts = cmp::attention_budget_parts_set(kern.emulate_attention_lowp, tr.q, cache.kv[size_t(l)],
                                                                    indices, sm, cfg.d_v(), nullptr, nullptr, tr.attn.out, &emulated);
    budgets[pre + "attn.out"] = {{"budget_max_abs", cmp::attention_budget(bparts)},
                                 {"multiple", cmp::kBudgetMultiple},
                                 {"emulation", "f32 logits and softmax, P rounded to bf16, f32 accumulation, bf16 out"}};
    if (S > cmp::kBudgetAllRows)
      budgets[pre + "attn.out"]["emulation_rows"] = cmp::budget_rows_text(emulated, S);
    for (int64_t i = 0; i < h.numel(); ++i) h[i] = round_bf16(h[i] + tr.out[i]);
  }
  add(g, "hidden_out", bf16_of(f.h_out), Role::output);
  Tensor<int32_t> cu({2});
  cu.data = {0, int32_t(S)};
  add(g, "cu_seqlens_q", cu, Role::input);
  add(g, "cu_seqlens_k", cu, Role::input);
  char simbuf[32];
  std::snprintf(simbuf, sizeof simbuf, "%.9g", double(spec.sim));
  const std::string problem = "model=" + spec.preset + " layers=" + std::to_string(cfg.n_layers) + " seq=" + std::to_string(S) +
                              " seed=" + std::to_string(spec.seed) + " sim=" + simbuf + " variant=" + spec.variant +
                              " schedule=" + sched.pattern();
  g.manifest = {
      {"format", "indexshare-golden"},
      {"format_version", kFormatVersion},
      {"generator", std::string("indexshare ") + INDEXSHARE_VERSION},
      {"kind", "module"},
      {"problem", problem},
      {"replay", replay},
      {"config",
       {{"s_q", S}, {"s_kv", S}, {"topk", cfg.index_topk}, {"index_n_heads", cfg.index_n_heads},
        {"index_head_dim", cfg.index_head_dim}, {"h_q", cfg.n_heads}, {"d_qk", cfg.d_qk()}, {"d_v", cfg.d_v()},
        {"sm_scale", sm}, {"n_layers", cfg.n_layers}, {"seed", spec.seed}, {"start_pos", 0}, {"n_seqs", 1},
        {"indexer", variant == ref::IndexerVariant::deepseek_fp8 ? "fp8" : "bf16"}}},
      {"model_config", json::parse(config_json_text(cfg))},
      {"conventions",
       {{"lse_base", "e"},
        {"lse_includes_sink", false},
        {"empty_row", "out 0, lse +inf, max_logits -inf"},
        {"scale_rule", scale_rule_name(cfg.index_scale_rule)},
        {"fp8_format", "e4m3fn, round to nearest even, saturating to +-448"},
        {"tie_rule", "score descending, then index ascending"},
        {"topk_index_space", "indexer.topk: sequence-local positions"},
        {"attn_index_space", "attn.indices: rows of attn.kv (logical, unpaged)"},
        {"padding", -1},
        {"causal_rule", "row t is position t and sees keys [0, t]"},
        {"rope_layout", "indexer: " + ref::rope_layout_name(cfg.indexer_rope) + " on dims [0, rope) of [pe | nope]; MLA: interleaved"},
        {"indexer_variant", spec.variant},
        {"weights", "bf16 values (not the checkpoints' FP8 block-quantized linears)"},
        {"model", "attention-only residual stack h <- bf16(h + out), out = wo . MLA(bf16(RMSNorm(h)))"}}},
      {"layers", layers},
      {"budgets", budgets},
  };
  return g;
}

namespace {
// Refuses NaN (and +-inf unless allowed) in a float input, naming the file, the tensor and the
// first bad element. Classified from the bits: bf16 exponent all ones; e4m3fn has no inf, its NaN
// is S.1111.111.
bool nonfinite(float x, bool allow_inf) { return std::isnan(x) || (!allow_inf && std::isinf(x)); }
bool nonfinite(bf16_t x, bool allow_inf) {
  return (x.bits & 0x7F80u) == 0x7F80u && ((x.bits & 0x007Fu) != 0 || !allow_inf);
}
bool nonfinite(e4m3_t x, bool) { return (x.bits & 0x7Fu) == 0x7Fu; }
float value_of(float x) { return x; }
float value_of(bf16_t x) { return bf16_to_f32(x); }
float value_of(e4m3_t x) { return e4m3_to_f32(x); }
template <class T>
void require_finite(const Tensor<T>& t, const std::string& file, const std::string& name, bool allow_inf = false) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!nonfinite(t[i], allow_inf)) continue;
    const float v = value_of(t[i]);
    throw Error(file + ": tensor '" + name + "': element " + shape_str(unflatten(i, t.shape)) + " is " +
                (std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf") +
                (allow_inf ? " (NaN is not a valid value here)" : " (inputs must be finite)"));
  }
}

// The names load_stack_inputs reads, for layers [0, L): layers.{l}.indexer.{q,k,k_scale,weights,
// ks,ke}, layers.{l}.attn.{q,kv,sink}, and cu_seqlens_q / cu_seqlens_k. Anything else in a dump is
// refused, not ignored: a misspelt `attn.sinks`, a layer after a gap, an `attn.topk_length` or
// `indexer.q_scale` the stack would not apply.
//
// One exception, and only that one: a golden set's own tensors file may be read as a dump
// (overlap --golden reads a set through here, and `golden --from DIR/tensors.safetensors` /
// `overlap --from` take it). Such a file is recognised by the metadata golden::write gives it
// (format = "indexshare-golden"); in it the other names a golden set holds (outputs, references,
// the decode, attention-edge and module extras), exactly as tensor_rules() spells them and for
// layers [0, L), are known and ignored. A sampled set (tensor `rows`) is refused: its query rows
// are not whole sequences.
void check_dump_names(const io::SafetensorsFile& f, const std::string& file, int L) {
  static const std::set<std::string> kRead = {"indexer.q",  "indexer.k",  "indexer.k_scale", "indexer.weights",
                                              "indexer.ks", "indexer.ke", "attn.q",          "attn.kv",
                                              "attn.sink"};
  auto it = f.metadata.find("format");
  const bool golden_file = it != f.metadata.end() && it->second == "indexshare-golden";
  const bool model_dump = it != f.metadata.end() && it->second == kDumpFormat;
  const std::string expected = "layers.{l}.indexer.{q,k,k_scale,weights,ks,ke} and layers.{l}.attn.{q,kv,sink} for l in [0, " +
                               std::to_string(L) + "), cu_seqlens_q, cu_seqlens_k";
  for (const io::TensorView& v : f.tensors) {
    int64_t l = -1;
    std::string rest;
    const bool per_layer = split_layer_name(v.name, l, rest);
    if (per_layer && l >= L)
      throw Error(file + ": tensor '" + v.name + "': layer " + std::to_string(l) + " is not read: layers must be numbered 0, 1, ... "
                  "without gaps, and 'layers." + std::to_string(L) + ".attn.q' is missing (the file's layers are 0 to " +
                  std::to_string(L - 1) + ")");
    if (per_layer ? kRead.count(rest) : (v.name == "cu_seqlens_q" || v.name == "cu_seqlens_k")) continue;
    // A model dump (python -m indexshare.dump) carries the model's own choices under the names diff
    // judges; --from does not read them.
    if (model_dump && per_layer && kDumpReferences.count(rest)) continue;
    if (v.name == "rows")
      throw Error(file + ": tensor 'rows': the file holds sampled query rows (a golden set made with --rows), not whole "
                  "sequences; give the inputs of every query row");
    int64_t rl = -1;
    if (golden_file && rule_of(v.name, kAllKinds, rl)) continue;  // a golden set's own output, reference or extra
    throw Error(file + ": tensor '" + v.name + "' is not an input this reader takes (it reads " + expected +
                (golden_file ? "; in a golden set's own file also the set's other tensors" : "") +
                (model_dump ? "; in a model dump also layers.{l}.indexer.{topk,logits} and layers.{l}.attn.indices" : "") + ")");
  }
}

// Sequences of a dump: cu_seqlens_q / cu_seqlens_k (I32 [n_seqs + 1]) when given, else one. The
// number only: the boundaries are checked against it once the problem is validated.
int64_t dump_n_seqs(const io::SafetensorsFile& f, const std::string& file) {
  int64_t n_seqs = 0;
  std::string from;
  for (const char* name : {"cu_seqlens_q", "cu_seqlens_k"}) {
    const io::TensorView* cu = f.find(name);
    if (!cu) continue;
    if (cu->dtype != io::DType::I32 || cu->shape.size() != 1 || cu->shape[0] < 2)
      throw Error(file + ": tensor '" + name + "': expected I32 [n_seqs + 1] with n_seqs >= 1, got " +
                  layout_str(cu->dtype, cu->shape));
    if (n_seqs && cu->shape[0] - 1 != n_seqs)
      throw Error(file + ": tensor '" + name + "' " + shape_str(cu->shape) + " and tensor '" + from + "' [" +
                  std::to_string(n_seqs + 1) + "] disagree on the number of sequences");
    n_seqs = cu->shape[0] - 1;
    from = name;
  }
  return n_seqs ? n_seqs : 1;
}

// The boundaries must be those of the stack's flattened sequences of equal length: i * total / n.
void check_boundaries(const io::SafetensorsFile& f, const std::string& file, const char* name, int64_t total, int64_t n_seqs) {
  const io::TensorView* cu = f.find(name);
  if (!cu) return;
  const Tensor<int32_t> t = io::as_tensor<int32_t>(*cu, file);
  for (int64_t i = 0; i <= n_seqs; ++i)
    if (int64_t(t[i]) != i * (total / n_seqs))
      throw Error(file + ": tensor '" + name + "': element [" + std::to_string(i) + "] is " + std::to_string(t[i]) +
                  ", expected " + std::to_string(i * (total / n_seqs)) + " (the stack takes " + std::to_string(n_seqs) +
                  " sequences of equal length: " + std::to_string(total / n_seqs) + " rows each)");
}
}  // namespace

std::string dump_problem(const io::SafetensorsFile& f, const std::string& file) {
  auto it = f.metadata.find("format");
  if (it == f.metadata.end() || it->second != kDumpFormat) return "";
  auto p = f.metadata.find("problem");
  require(p != f.metadata.end() && !p->second.empty(),
          file + ": metadata 'problem' is missing: a model dump (format " + kDumpFormat +
              ") records the top-k, dv, sm and schedule it was taken with");
  try {  // checked here to name the file; the layer count comes from the file, as the CLI does
    int L = 0;
    while (f.find("layers." + std::to_string(L) + ".attn.q")) ++L;
    (void)parse_problem(p->second.find("nl") == std::string::npos ? p->second + " nl" + std::to_string(std::max(L, 1)) : p->second);
  } catch (const Error& e) {
    throw Error(file + ": metadata 'problem': " + e.what());
  }
  return p->second;
}

namespace {
// The problem of a dump's inputs: its shapes (from the headers of layers.0.attn.q, attn.kv and
// indexer.q, and cu_seqlens) replace p's; the layer count is the file's.
Problem dump_shapes(const io::SafetensorsFile& f, const std::string& file, Problem p) {
  int L = 0;
  while (f.find("layers." + std::to_string(L) + ".attn.q")) ++L;
  require(L > 0, file + ": no tensor 'layers.0.attn.q': expected per-layer inputs under the golden tensor names");
  check_dump_names(f, file, L);
  const io::TensorView& q0 = f.get("layers.0.attn.q");
  const io::TensorView& kv0 = f.get("layers.0.attn.kv");
  require(q0.shape.size() == 3 && kv0.shape.size() == 3, file + ": layers.0.attn.q / attn.kv must be rank 3");
  p.n_layers = L;
  p.s_q = q0.shape[0];
  p.h_q = q0.shape[1];
  p.d_qk = q0.shape[2];
  p.s_kv = kv0.shape[0];
  const io::TensorView& iq0 = f.get("layers.0.indexer.q");
  require(iq0.shape.size() == 3, file + ": layers.0.indexer.q must be [s_q, H, D]");
  p.index_n_heads = iq0.shape[1];
  p.index_head_dim = iq0.shape[2];
  p.indexer = iq0.dtype == io::DType::F8_E4M3 ? IndexerMode::fp8 : IndexerMode::bf16;
  p.n_seqs = dump_n_seqs(f, file);
  try {
    p.validate();
  } catch (const Error& e) {
    throw Error(file + ": " + e.what() + " (shapes from the file's layers.0.attn.q, attn.kv, indexer.q and cu_seqlens)");
  }
  check_boundaries(f, file, "cu_seqlens_q", p.s_q, p.n_seqs);
  check_boundaries(f, file, "cu_seqlens_k", p.s_kv, p.n_seqs);
  return p;
}

// A dump's tensors as load_stack_inputs reads them: with `part`, each per-row tensor's view keeps
// its whole shape but holds only rows [part->begin, part->end) (read from their offsets, pread),
// the other tensors whole; header_only: no bytes but those of cu_seqlens and indexer.ks / ke.
io::SafetensorsFile read_dump(const std::string& file, const RowPart* part, bool header_only) {
  if (!part && !header_only) return io::read_safetensors(file);
  io::SafetensorsIndex idx = io::read_safetensors_index(file, 0);
  for (size_t i = 0; i < idx.file.tensors.size(); ++i) {
    io::TensorView& v = idx.file.tensors[i];
    const uint64_t size = uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype);
    const bool rows = per_row_tensor(v.name) && !v.shape.empty() && v.shape[0] > 0;
    const bool window = v.name.size() > 11 && (v.name.ends_with(".indexer.ks") || v.name.ends_with(".indexer.ke"));
    if (header_only) {
      if (!window && v.name.rfind("cu_seqlens_", 0) != 0) continue;
      v.bytes.resize(size);
      io::read_file_range(file, idx.offsets[i], v.bytes.mutable_data(), size);
    } else if (rows) {
      require(part->end <= v.shape[0], file + ": tensor '" + v.name + "' " + shape_str(v.shape) + " has fewer than the " +
                                           std::to_string(part->end) + " query rows of this part");
      const uint64_t row = size / uint64_t(v.shape[0]);
      v.bytes.resize(row * uint64_t(part->end - part->begin));
      io::read_file_range(file, idx.offsets[i] + row * uint64_t(part->begin), v.bytes.mutable_data(), v.bytes.size());
    } else {
      v.bytes.resize(size);
      io::read_file_range(file, idx.offsets[i], v.bytes.mutable_data(), size);
    }
  }
  return std::move(idx.file);
}
}  // namespace

StackInputs load_stack_inputs(const io::SafetensorsFile& f, const std::string& file, Problem p) {
  return load_stack_inputs(f, file, std::move(p), nullptr);
}

StackInputs load_stack_inputs(const io::SafetensorsFile& f, const std::string& file, Problem p, const RowPart* part) {
  p = dump_shapes(f, file, std::move(p));
  const int L = int(p.n_layers);
  const Schedule sched = p.schedule();
  std::vector<ref::LayerInputs> inputs(static_cast<size_t>(L));
  const int64_t s_kv = p.s_kv, H = p.index_n_heads, D = p.index_head_dim;
  // With a part, the per-row tensors' views hold its rows only (read_dump): s_q of them.
  const int64_t s_q = part ? part->end - part->begin : p.s_q;
  auto bf16_to_f = [](const Tensor<bf16_t>& b) {
    Tensor<float> x(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) x[i] = bf16_to_f32(b[i]);
    return x;
  };
  for (int l = 0; l < L; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ref::LayerInputs& in = inputs[size_t(l)];
    in.has_indexer = f.find(pre + "indexer.q") != nullptr;
    require(in.has_indexer || !sched.is_full(l), file + ": Full layer " + std::to_string(l) + " has no '" + pre + "indexer.q'");
    io::TensorView rows_view;  // a per-row tensor's view with the part's row count
    auto get = [&](const std::string& n, const Shape& shape) -> const io::TensorView& {
      const io::TensorView& v = f.get(pre + n);
      if (!part || shape.empty() || shape[0] != s_q || !per_row_tensor(pre + n)) {
        io::expect_shape(v, shape, file);
        return v;
      }
      Shape whole = shape;
      whole[0] = p.s_q;
      io::expect_shape(v, whole, file);
      rows_view = io::TensorView{v.name, v.dtype, shape, v.bytes};
      return rows_view;
    };
    // Every float input must be finite (attn.sink may be +-inf: the sink rule defines both): a NaN
    // would otherwise reach the golden outputs, or surface late without the file and tensor.
    if (in.has_indexer) {
      if (p.indexer == IndexerMode::fp8) {
        in.index_q8 = io::as_tensor<e4m3_t>(get("indexer.q", {s_q, H, D}), file);
        in.index_k8 = io::as_tensor<e4m3_t>(get("indexer.k", {s_kv, D}), file);
        require_finite(in.index_q8, file, pre + "indexer.q");
        require_finite(in.index_k8, file, pre + "indexer.k");
      } else {
        const Tensor<bf16_t> q = io::as_tensor<bf16_t>(get("indexer.q", {s_q, H, D}), file);
        const Tensor<bf16_t> k = io::as_tensor<bf16_t>(get("indexer.k", {s_kv, D}), file);
        require_finite(q, file, pre + "indexer.q");
        require_finite(k, file, pre + "indexer.k");
        in.index_q = bf16_to_f(q);
        in.index_k = bf16_to_f(k);
      }
      in.index_k_scale = io::as_tensor<float>(get("indexer.k_scale", {s_kv}), file);
      in.index_weights = io::as_tensor<float>(get("indexer.weights", {s_q, H}), file);
      require_finite(in.index_k_scale, file, pre + "indexer.k_scale");
      require_finite(in.index_weights, file, pre + "indexer.weights");
      in.index_q_scale = Tensor<float>({s_q, H}, 1.0f);  // folded into the weights upstream
      in.ks = io::as_tensor<int32_t>(get("indexer.ks", {s_q}), file);
      in.ke = io::as_tensor<int32_t>(get("indexer.ke", {s_q}), file);
      for (int64_t t = 0; t < s_q; ++t)
        require(0 <= in.ks[t] && in.ks[t] <= in.ke[t] && in.ke[t] <= s_kv,
                file + ": " + pre + "indexer.ks/ke: row " + std::to_string(t) + " outside 0 <= ks <= ke <= s_kv");
    } else {
      in.ks = inputs[size_t(sched.source(l))].ks;
      in.ke = inputs[size_t(sched.source(l))].ke;
    }
    in.q = io::as_tensor<bf16_t>(get("attn.q", {s_q, p.h_q, p.d_qk}), file);
    in.kv = io::as_tensor<bf16_t>(get("attn.kv", {s_kv, 1, p.d_qk}), file);
    require_finite(in.q, file, pre + "attn.q");
    require_finite(in.kv, file, pre + "attn.kv");
    if (f.find(pre + "attn.sink")) {
      in.sink = io::as_tensor<float>(get("attn.sink", {p.h_q}), file);
      require_finite(*in.sink, file, pre + "attn.sink", /*allow_inf=*/true);
    }
  }
  return StackInputs{p, std::move(inputs)};
}

GoldenSet build_from(const std::string& file, Problem p, bool with_logits, const std::string& replay) {
  return build_from(file, load_stack_inputs(io::read_safetensors(file), file, std::move(p)), with_logits, replay);
}

GoldenSet build_from(const std::string& file, StackInputs si, bool with_logits, const std::string& replay,
                     const RowPart* part, Impl impl) {
  const Problem& q = si.problem;
  if (part && !si.part_rows)
    for (ref::LayerInputs& in : si.inputs) slice_rows(in, part->begin, part->end);
  GoldenSet g = build_stack(q, std::move(si.inputs), "stack", with_logits, replay, impl, nullptr, part);
  g.manifest["kind"] = "stack-from-file";
  g.manifest["source_file"] = file;
  return g;
}

StackInputs stack_inputs_of(const Loaded& g) {
  const json& c = g.manifest["config"];
  const std::string where = g.dir + "/manifest.json";
  require(!g.manifest.contains("rows"), where + ": field 'rows': the set holds sampled query rows (--rows); overlap "
                                        "statistics and position buckets need every row: use --problem with its problem");
  Problem p;
  try {
    p.d_v = c.at("d_v").get<int64_t>();
    p.index_topk = c.at("topk").get<int64_t>();
    p.sm = c.at("sm_scale").get<float>();
    if (!c.at("seed").is_number_integer() || c.at("seed").get<int64_t>() < 0) throw Error(where + ": field 'config.seed' is not an integer >= 0");
    p.seed = c.at("seed").get<uint64_t>();
    std::string pattern;
    for (const json& l : g.manifest.at("layers")) pattern += l.at("kind") == "full" ? 'F' : 'S';
    p.sched = pattern;
    p.n_layers = int64_t(pattern.size());
  } catch (const json::exception& e) {
    throw Error(where + ": config or layers: " + e.what());
  }
  p.s_q = p.s_kv = 1;  // replaced from the tensors
  return load_stack_inputs(g.data, g.dir + "/" + kTensorFile, p);
}

}  // namespace indexshare::golden

#include "tools/lib/golden_model1.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "ref/bounds.h"
#include "ref/error.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "tools/lib/golden/internal.h"
#include "tools/lib/paged_model1.h"

namespace indexshare::golden {

using nlohmann::json;
using detail::manifest_head;

namespace {

// The spec's fields, in text order: prefix -> member.
struct Field {
  const char* prefix;
  int64_t Model1DecodeSpec::*member;
};
const Field kFields[] = {{"b", &Model1DecodeSpec::b},         {"nextn", &Model1DecodeSpec::next_n},
                         {"hq", &Model1DecodeSpec::h_q},      {"len", &Model1DecodeSpec::len},
                         {"win", &Model1DecodeSpec::window},  {"blk", &Model1DecodeSpec::block},
                         {"ek", &Model1DecodeSpec::extra_topk}, {"eblk", &Model1DecodeSpec::extra_block},
                         {"elen", &Model1DecodeSpec::extra_len}};

bool all_digits(const std::string& s) { return !s.empty() && s.size() <= 12 && std::all_of(s.begin(), s.end(), ::isdigit); }

float sm_scale_of() { return float(std::pow(512.0, -0.55)); }  // FlashMLA's decode tests: d_qk^-0.55

// Values from the project's generator: normal * scale, clamped to [-1, 1], rounded to bf16.
Tensor<bf16_t> clamped_normal(const Shape& shape, float scale, uint64_t seed, const std::string& tag) {
  Tensor<float> f(shape);
  fill(f.ptr(), f.numel(), Dist::normal, scale, seed, stream_tag(tag));
  Tensor<bf16_t> out(shape);
  for (int64_t i = 0; i < f.numel(); ++i) out[i] = f32_to_bf16(std::clamp(f[i], -1.0f, 1.0f));
  return out;
}

// Main scope: the sliding window, logical positions -> physical slots.
Tensor<int32_t> window_indices(const Model1DecodeSpec& s, const paged::PagedLayout& l) {
  Tensor<int32_t> ix({s.b, s.next_n, s.window}, -1);
  for (int64_t i = 0; i < s.b; ++i)
    for (int64_t t = 0; t < s.next_n; ++t) {
      const int64_t pos = l.cache_seqlens[i] - s.next_n + t;
      for (int64_t j = 0; j < s.window && pos - j >= 0; ++j) ix.at(i, t, j) = paged::physical_index(l, i, pos - j);
    }
  return ix;
}

// Extra scope: a seeded choice of distinct compressed entries per row, valid slots first.
Tensor<int32_t> compressed_indices(const Model1DecodeSpec& s, const paged::PagedLayout& l) {
  Tensor<int32_t> ix({s.b, s.next_n, s.extra_topk}, -1);
  for (int64_t i = 0; i < s.b; ++i)
    for (int64_t t = 0; t < s.next_n; ++t) {
      const int64_t avail = std::max<int64_t>(0, l.cache_seqlens[i] - (s.next_n - 1 - t));
      std::vector<int64_t> pool(static_cast<size_t>(avail));
      for (int64_t e = 0; e < avail; ++e) pool[size_t(e)] = e;
      Xoshiro256 g(s.seed ^ stream_tag("model1.extra_indices." + std::to_string(i) + "." + std::to_string(t)));
      const int64_t n = std::min(s.extra_topk, avail);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = j + int64_t(g.below(uint64_t(avail - j)));
        std::swap(pool[size_t(j)], pool[size_t(k)]);
        ix.at(i, t, j) = paged::physical_index(l, i, pool[size_t(j)]);
      }
    }
  return ix;
}

std::vector<Tensor<bf16_t>> per_sequence_kv(const paged::PagedLayout& l, float scale, uint64_t seed, const std::string& tag) {
  std::vector<Tensor<bf16_t>> kv;
  for (int64_t i = 0; i < l.batch(); ++i)
    kv.push_back(clamped_normal({l.cache_seqlens[i], 1, paged::kModel1Dqk}, scale, seed, tag + "." + std::to_string(i)));
  return kv;
}

}  // namespace

bool is_model1_spec(const std::string& text) {
  std::istringstream in(text);
  std::string w;
  return (in >> w) && w == "model1";
}

Model1DecodeSpec parse_model1_spec(const std::string& text) {
  std::istringstream in(text);
  std::string w;
  require((in >> w) && w == "model1", "model1 spec '" + text + "': must start with the word model1");
  Model1DecodeSpec s;
  while (in >> w) {
    bool done = false;
    if (w.rfind("seed", 0) == 0 && all_digits(w.substr(4))) {
      s.seed = std::stoull(w.substr(4));
      continue;
    }
    if (w.rfind("sink=", 0) == 0) {
      s.sink = w.substr(5);
      require(s.sink == "normal" || s.sink == "strong" || s.sink == "pinf" || s.sink == "ninf",
              "model1 spec: '" + w + "': expected sink=normal, strong, pinf or ninf");
      continue;
    }
    if (w.rfind("kv=", 0) == 0) {
      s.kv = w.substr(3);
      char* end = nullptr;
      const double v = std::strtod(s.kv.c_str(), &end);
      require(!s.kv.empty() && end && *end == 0 && v > 0 && v <= 100,
              "model1 spec: '" + w + "': expected kv=<standard deviation in (0, 100]>");
      continue;
    }
    if (w == "empty") {
      s.empty = true;
      continue;
    }
    // Longest prefix first (eblk before b...): the digits must follow the prefix exactly.
    for (const Field& f : kFields) {
      const std::string p = f.prefix;
      if (w.size() > p.size() && w.compare(0, p.size(), p) == 0 && all_digits(w.substr(p.size()))) {
        s.*f.member = std::stoll(w.substr(p.size()));
        done = true;
        break;
      }
    }
    require(done, "model1 spec: unknown token '" + w + "' (expected b, nextn, hq, len, win, blk, ek, eblk, elen, seed + digits, "
                  "sink=normal|strong|pinf|ninf or empty)");
  }
  require(s.b >= 1 && s.next_n >= 1 && s.h_q >= 1 && s.window >= 1 && s.block >= 1 && s.extra_topk >= 1 && s.extra_block >= 1,
          "model1 spec '" + text + "': b, nextn, hq, win, blk, ek and eblk must be >= 1");
  require(s.len >= s.next_n, "model1 spec: len (" + std::to_string(s.len) + ") must be >= nextn");
  require(s.extra_len - 200 * (s.b - 1) >= s.next_n,
          "model1 spec: elen - 200 (b - 1) (the last sequence's compressed entries) must be >= nextn");
  require(s.window > 32 && s.extra_topk > 64, "model1 spec: win must be > 32 and ek > 64 (odd sequences drop 32 and 64 slots)");
  return s;
}

std::string to_string(const Model1DecodeSpec& s) {
  std::ostringstream out;
  out << "model1";
  for (const Field& f : kFields) out << ' ' << f.prefix << s.*f.member;
  out << " seed" << s.seed;
  if (s.sink != "normal") out << " sink=" << s.sink;
  if (s.kv != "0.1") out << " kv=" << s.kv;
  if (s.empty) out << " empty";
  return out.str();
}

std::vector<std::string> model1_violations(const Model1DecodeSpec& s) {
  return kreg::violations(kreg::kernel("flashmla-sparse-decode-model1"),
                          std::map<std::string, int64_t>{{"h_q", s.h_q}, {"topk", s.window}, {"extra_topk", s.extra_topk}});
}

std::string model1_replay(const Model1DecodeSpec& s, const std::string& for_kernel, Impl impl) {
  return "indexshare golden --problem \"" + to_string(s) + "\" --kind decode-model1" +
         (for_kernel.empty() ? "" : " --for " + for_kernel) + " --impl " + impl_name(impl);
}

GoldenSet build_model1_decode(const Model1DecodeSpec& s, const std::string& replay, Impl impl) {
  const ref::Kernels kern = kernels_for(impl);
  const float kv_scale = std::strtof(s.kv.c_str(), nullptr);
  std::vector<int64_t> lens, elens;
  for (int64_t i = 0; i < s.b; ++i) {
    lens.push_back(s.len - 37 * i > s.next_n ? s.len - 37 * i : s.len);
    elens.push_back(s.extra_len - 200 * i);
  }
  const paged::PagedLayout main_l = paged::make_layout(lens, s.block, s.seed);
  const paged::PagedLayout extra_l = paged::make_layout(elens, s.extra_block, s.seed ^ stream_tag("model1.extra"));
  paged::Model1Scope main{"k_cache", paged::model1_fp8_cache(main_l, per_sequence_kv(main_l, kv_scale, s.seed, "model1.kv"), "k_cache"),
                          s.block, window_indices(s, main_l), Tensor<int32_t>({s.b})};
  paged::Model1Scope extra{"extra_k_cache",
                           paged::model1_fp8_cache(extra_l, per_sequence_kv(extra_l, kv_scale, s.seed, "model1.extra_kv"), "extra_k_cache"),
                           s.extra_block, compressed_indices(s, extra_l), Tensor<int32_t>({s.b})};
  for (int64_t i = 0; i < s.b; ++i) {
    main.topk_length[i] = int32_t(i % 2 ? s.window - 32 : s.window);
    extra.topk_length[i] = int32_t(i % 2 ? s.extra_topk - 64 : s.extra_topk);
  }
  if (s.empty) main.topk_length[s.b - 1] = extra.topk_length[s.b - 1] = 0;
  const Tensor<bf16_t> q = clamped_normal({s.b * s.next_n, s.h_q, paged::kModel1Dqk}, 1.0f, s.seed, "model1.q");
  Tensor<float> sink({s.h_q});
  fill(sink.ptr(), s.h_q, Dist::normal, 1.0f, s.seed, stream_tag("model1.sink"));
  for (float& v : sink.data)
    v = s.sink == "pinf"     ? INFINITY
        : s.sink == "ninf"   ? -INFINITY
        : s.sink == "strong" ? float(double(v) + std::log(double(s.window + s.extra_topk)))
                             : v;
  const float sm = sm_scale_of();
  paged::Model1Gathered cat = paged::model1_gather(main, &extra);
  ref::AttentionOut attn = kern.sparse_attention(q, cat.kv, cat.indices, sm, paged::kModel1Dqk, nullptr, &sink);
  int64_t emulated = 0;
  const cmp::BudgetParts parts = cmp::attention_budget_parts_set(kern.emulate_attention_lowp, q, cat.kv, cat.indices, sm,
                                                                 paged::kModel1Dqk, nullptr, &sink, attn.out, &emulated);
  GoldenSet g;
  const std::string pre = "layers.0.";
  const int64_t s_q = s.b * s.next_n, s_kv = cat.kv.dim(0), topk = cat.indices.dim(2);
  g.add(pre + "attn.q", q, Role::input);
  g.add(pre + "attn.kv", std::move(cat.kv), Role::input);
  g.add(pre + "attn.indices", std::move(cat.indices), Role::input);
  g.add(pre + "attn.sink", sink, Role::input);
  g.add(pre + "attn.out", std::move(attn.out), Role::output);
  g.add(pre + "attn.out_bf16", std::move(attn.out_bf16), Role::output);
  g.add(pre + "attn.lse", std::move(attn.lse), Role::output);
  g.add(pre + "attn.max_logits", std::move(attn.max_logits), Role::output);
  g.add(pre + "attn.model1.k_cache", main.cache, Role::input);
  g.add(pre + "attn.model1.indices", main.indices, Role::input);
  g.add(pre + "attn.model1.topk_length", main.topk_length, Role::input);
  g.add(pre + "attn.model1.extra_k_cache", extra.cache, Role::input);
  g.add(pre + "attn.model1.extra_indices", extra.indices, Role::input);
  g.add(pre + "attn.model1.extra_topk_length", extra.topk_length, Role::input);
  g.add("block_table", main_l.block_table, Role::reference);
  g.add("cache_seqlens", main_l.cache_seqlens, Role::reference);
  g.add("extra_block_table", extra_l.block_table, Role::reference);
  g.add("extra_cache_seqlens", extra_l.cache_seqlens, Role::reference);
  const double budget = cmp::attention_budget(parts);
  g.manifest = manifest_head("decode-model1", to_string(s), replay, impl);
  g.manifest.update(json{
      {"config",
       {{"s_q", s_q}, {"s_kv", s_kv}, {"topk", topk}, {"index_n_heads", 1}, {"index_head_dim", 1}, {"h_q", s.h_q},
        {"d_qk", paged::kModel1Dqk}, {"d_v", paged::kModel1Dqk}, {"sm_scale", sm}, {"n_layers", 1}, {"seed", s.seed},
        {"start_pos", 0}, {"n_seqs", s.b}, {"indexer", "bf16"}}},
      {"model1",
       {{"b", s.b}, {"next_n", s.next_n}, {"window", s.window}, {"block", s.block}, {"block_bytes", paged::model1_block_bytes(s.block)},
        {"main_slots", main.cache.dim(0) * s.block}, {"extra_topk", s.extra_topk}, {"extra_block", s.extra_block},
        {"extra_block_bytes", paged::model1_block_bytes(s.extra_block)}, {"extra_slots", extra.cache.dim(0) * s.extra_block},
        {"sink", s.sink}, {"kv_std", s.kv}, {"empty_rows", s.empty ? s.next_n : 0}}},
      {"conventions",
       {{"lse_base", "e"},
        {"lse_includes_sink", false},
        {"sink", "out *= 1 / (1 + exp(sink - lse)); lse and max_logits exclude it"},
        {"empty_row", "out 0, lse +inf, max_logits -inf"},
        {"scale_rule", "flashmla_pow2, tile 64, stored as e8m0"},
        {"fp8_format", "e4m3fn, round to nearest even, saturating to +-448"},
        {"attn_index_space", "attn.indices: rows of attn.kv = [main cache slots | extra cache slots] (model1.main_slots rows first)"},
        {"padding", -1},
        {"invalid_index", "a kernel index is invalid when it is -1 or its slot j >= (extra_)topk_length[b]; attn.indices holds -1 there"},
        {"decode_model1",
         "two scopes, one softmax: attn.kv = dequant(model1.k_cache) then dequant(model1.extra_k_cache), NaN -> 0; attn.indices "
         "row b * next_n + t = model1.indices[b, t] then main_slots + model1.extra_indices[b, t]; MODEL1 cache per block of B: "
         "token t at byte 576 t (448 e4m3 NoPE, 64 bf16 RoPE), 7 e8m0 scales + 1 pad at 576 B + 8 t, block padded to "
         "ceil(584 B / 576) * 576 bytes; unused slots NaN (0x7F, RoPE 0x7FC0, scales 0xFF)"}}},
      {"layers", json::array({{{"index", 0}, {"kind", "full"}, {"source", 0}, {"has_indexer", false}}})},
      {"budgets",
       {{pre + "attn.out",
         {{"budget_max_abs", budget},
          {"emulation_max_abs", parts.emul},
          {"multiple", cmp::kBudgetMultiple},
          {"emulation", "f32 logits and softmax, P rounded to bf16, f32 accumulation, bf16 out"}}}}},
  });
  if (s_q > cmp::kBudgetAllRows) g.manifest["budgets"][pre + "attn.out"]["emulation_rows"] = cmp::budget_rows_text(emulated, s_q);
  return g;
}

namespace {

// A set written for the kernel (--for) records the strided views [num_blocks, B, 1, 584] a caller
// passes FlashMLA; their shape and byte strides must be those of the caches it holds.
void check_model1_views(const json& m, const paged::Model1Scope& main, const paged::Model1Scope& extra, const std::string& mpath) {
  if (!m.contains("kernel") || !m["kernel"].is_object() || !m["kernel"].contains("views")) return;
  const json& views = m["kernel"]["views"];
  for (const paged::Model1Scope* s : {&main, &extra}) {
    const std::string field = "kernel.views." + s->name;
    if (!views.is_object() || !views.contains(s->name) || !views[s->name].is_object())
      throw Error(mpath + ": field '" + field + "' is missing (the set records its caches' views)");
    const paged::Model1View want = paged::model1_view(s->cache.dim(0), s->block);
    for (const auto& [key, expect] : {std::pair{"shape", want.shape}, std::pair{"strides_bytes", want.strides}}) {
      const json& got = views[s->name].contains(key) ? views[s->name][key] : json();
      if (!got.is_array() || got != json(expect))
        throw Error(mpath + ": field '" + field + "." + key + "' is " + got.dump() + ", but tensor 'layers.0.attn.model1." + s->name +
                    "' (block " + std::to_string(s->block) + ") gives " + json(expect).dump());
    }
  }
}

}  // namespace

void check_model1_set(const Loaded& g, const std::string& mpath) {
  const json& m = g.manifest;
  auto num = [&](const char* f) {
    if (!m.contains("model1") || !m["model1"].is_object() || !m["model1"].contains(f) || !m["model1"][f].is_number_integer() ||
        m["model1"][f].get<int64_t>() < 1)
      throw Error(mpath + ": field 'model1." + f + "' is missing or not an integer >= 1 (a decode-model1 set)");
    return m["model1"][f].get<int64_t>();
  };
  const std::string pre = "layers.0.attn.model1.";
  auto scope = [&](const std::string& cache, int64_t block, const std::string& indices, const std::string& length,
                   const std::string& table, const std::string& lens, const char* name) {
    paged::Model1Scope s{name, g.tensor<uint8_t>(pre + cache), block, g.tensor<int32_t>(pre + indices), g.tensor<int32_t>(pre + length)};
    paged::PagedLayout l;
    l.page = block;
    l.block_table = g.tensor<int32_t>(table);
    l.cache_seqlens = g.tensor<int32_t>(lens);
    l.num_blocks = s.cache.rank() == 2 ? s.cache.dim(0) : 0;
    paged::model1_check_cache(s.cache, l, mpath + ": tensor '" + pre + cache + "'");
    return s;
  };
  const paged::Model1Scope main = scope("k_cache", num("block"), "indices", "topk_length", "block_table", "cache_seqlens", "k_cache");
  const paged::Model1Scope extra = scope("extra_k_cache", num("extra_block"), "extra_indices", "extra_topk_length", "extra_block_table",
                                         "extra_cache_seqlens", "extra_k_cache");
  check_model1_views(m, main, extra, mpath);
  paged::Model1Gathered cat;
  try {
    cat = paged::model1_gather(main, &extra);
  } catch (const Error& e) {
    throw Error(mpath + ": the set's MODEL1 inputs: " + e.what());
  }
  if (cat.main_slots != num("main_slots")) throw Error(mpath + ": field 'model1.main_slots' disagrees with tensor '" + pre + "k_cache'");
  if (cat.indices.data != g.tensor<int32_t>("layers.0.attn.indices").data)
    throw Error(mpath + ": tensor 'layers.0.attn.indices' is not the two scopes' mapping of " + pre + "indices and " + pre + "extra_indices");
  const Tensor<bf16_t> kv = g.tensor<bf16_t>("layers.0.attn.kv");
  if (kv.numel() != cat.kv.numel() || (kv.numel() > 0 && std::memcmp(kv.ptr(), cat.kv.ptr(), size_t(kv.numel()) * sizeof(bf16_t)) != 0))
    throw Error(mpath + ": tensor 'layers.0.attn.kv' is not the dequantized slots of " + pre + "k_cache and " + pre + "extra_k_cache");
}

Tensor<int32_t> model1_attn_indices(const Loaded& g, const Model1Mapping& m) {
  const std::string pre = "layers.0.attn.model1.";
  const Tensor<int32_t> mi = g.tensor<int32_t>(pre + "indices"), ei = g.tensor<int32_t>(pre + "extra_indices");
  const Tensor<int32_t> ml = g.tensor<int32_t>(pre + "topk_length"), el = g.tensor<int32_t>(pre + "extra_topk_length");
  const int64_t B = mi.dim(0), N = mi.dim(1), W = mi.dim(2), E = ei.dim(2);
  const int32_t main_slots = g.manifest["model1"]["main_slots"].get<int32_t>();
  Tensor<int32_t> ix({B * N, 1, W + E}, -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < N; ++t) {
      int32_t* row = ix.ptr() + (b * N + t) * (W + E);
      for (int64_t j = 0; j < W; ++j)
        if (!m.main_length || j < ml[b]) row[j] = mi.at(b, t, j);
      for (int64_t j = 0; m.extra_scope && j < E; ++j)
        if ((!m.extra_length || j < el[b]) && ei.at(b, t, j) >= 0) row[W + j] = ei.at(b, t, j) + (m.extra_offset ? main_slots : 0);
    }
  return ix;
}

void for_kernel_model1(GoldenSet& set, const kreg::Kernel& k, const Model1DecodeSpec& s) {
  int64_t nb = 0, enb = 0;
  for (const io::TensorView& v : set.tensors) {
    if (v.name == "layers.0.attn.model1.k_cache") nb = v.shape[0];
    if (v.name == "layers.0.attn.model1.extra_k_cache") enb = v.shape[0];
  }
  const std::map<std::string, int64_t> sym = {
      {"b", s.b}, {"next_n", s.next_n}, {"h_q", s.h_q}, {"d_qk", paged::kModel1Dqk}, {"d_v", paged::kModel1Dqk},
      {"s_q", s.b * s.next_n}, {"topk", s.window}, {"extra_topk", s.extra_topk}, {"num_blocks", nb},
      {"block_bytes", paged::model1_block_bytes(s.block)}, {"extra_num_blocks", enb},
      {"extra_block_bytes", paged::model1_block_bytes(s.extra_block)}};
  set.manifest["kernel"] = kreg::manifest_block(k, Problem(), set.manifest["config"]["sm_scale"].get<float>(), set.manifest["layers"], sym);
  auto view = [](int64_t n, int64_t B) {
    const paged::Model1View v = paged::model1_view(n, B);
    return json{{"shape", v.shape}, {"strides_bytes", v.strides},
                {"torch", "cache.as_strided((" + std::to_string(v.shape[0]) + ", " + std::to_string(B) + ", 1, 584), (" +
                              std::to_string(v.strides[0]) + ", 584, 584, 1))"}};
  };
  set.manifest["kernel"]["views"] = {{"k_cache", view(nb, s.block)}, {"extra_k_cache", view(enb, s.extra_block)}};
}

}  // namespace indexshare::golden

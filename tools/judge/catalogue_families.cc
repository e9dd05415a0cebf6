// The diagnosis catalogue's planted bugs on the 2026 families' tiny presets (calibrate.h,
// family_catalogue): the mistakes of the kind-specific hypotheses (judge/hypotheses.cc), each planted
// the way a kernel would make it, into the golden's own tensors of one preset, then judged.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ref/attention.h"
#include "ref/hyv4/layer.h"
#include "ref/kpool/select.h"
#include "ref/numerics.h"
#include "ref/v4/compressor.h"
#include "ref/v4/layer.h"
#include "tools/judge/calibrate.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_hyv4.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/golden_mtp.h"
#include "tools/lib/golden_v4.h"

namespace indexshare::calib {

namespace {

// A candidate file's tensors, written and read back as a kernel team's file would be.
struct Tensors {
  std::vector<io::TensorView> views;
  template <class T>
  void set(const std::string& name, const Tensor<T>& t) { views.push_back(io::make_view(name, t)); }
};

struct FamilyBug {
  std::string name, expect;  // expect: what the first diagnosis must say
  std::function<void(Tensors&)> plant;
};

std::string L(int l) { return "layers." + std::to_string(l) + "."; }

// A selection bug no hypothesis names: in each row, the best selected item (of `sel`, [rows, k],
// -1 padded) replaced by the worst visible unselected one (finite in `scores`, [rows, n]). Rows with
// no unselected visible item keep theirs. Returns the pairs (row, replaced item -> new item).
std::vector<std::pair<int32_t, int32_t>> swap_best_for_worst(const Tensor<float>& scores, Tensor<int32_t>& sel) {
  const int64_t R = sel.dim(0), K = sel.numel() / R, N = scores.dim(1);
  std::vector<std::pair<int32_t, int32_t>> swaps(size_t(R), {-1, -1});
  for (int64_t t = 0; t < R; ++t) {
    int64_t best = -1, worst = -1;
    for (int64_t i = 0; i < K; ++i) {
      const int32_t x = sel[t * K + i];
      if (x >= 0 && (best < 0 || scores.at(t, x) > scores.at(t, sel[t * K + best]))) best = i;
    }
    for (int64_t x = 0; x < N; ++x) {
      if (!std::isfinite(scores.at(t, x)) || std::find(&sel[t * K], &sel[t * K] + K, int32_t(x)) != &sel[t * K] + K) continue;
      if (worst < 0 || scores.at(t, x) < scores.at(t, worst)) worst = x;
    }
    if (best < 0 || worst < 0 || scores.at(t, worst) == scores.at(t, sel[t * K + best])) continue;
    swaps[size_t(t)] = {sel[t * K + best], int32_t(worst)};
    sel[t * K + best] = int32_t(worst);
  }
  return swaps;
}

// The attention outputs of a V4 or HY V4 layer over `idx` at `sm`, as a kernel hands them in.
void set_attention(Tensors& c, const golden::Loaded& g, const ref::Kernels& k, int l, const Tensor<int32_t>& idx, float sm,
                   int64_t d_v, const Tensor<float>* sink) {
  const ref::AttentionOut o = k.sparse_attention(g.tensor<bf16_t>(L(l) + "attn.q"), g.tensor<bf16_t>(L(l) + "attn.kv"), idx, sm, d_v,
                                                 nullptr, sink);
  c.set(L(l) + "attn.out", o.out);
  c.set(L(l) + "attn.lse", o.lse);
  c.set(L(l) + "attn.max_logits", o.max_logits);
}

// DeepSeek-V4 (v4-tiny: layers S C H C C, the C4A layers F S F; 48 tokens, D 64, top-4 of 12 blocks).
std::vector<FamilyBug> v4_bugs(const golden::Loaded& g, const golden::V4Spec& s, const ref::Kernels& k) {
  using ref::v4::LayerType;
  return {
      {"V4: blocks off by one block", "shifted by 1 block", [&g](Tensors& c) {
         Tensor<int32_t> b = g.tensor<int32_t>(L(1) + "indexer.blocks");
         for (int32_t& x : b.data) x = x >= 0 ? x + 1 : x;
         c.set(L(1) + "indexer.blocks", b); }},
      {"V4: out_rotated without the inverse RoPE", "without the inverse RoPE", [&g](Tensors& c) {
         c.set(L(2) + "attn.out_rotated", g.tensor<float>(L(2) + "attn.out")); }},
      {"V4: compressor without its RMSNorm weight", "norm_weight ignored", [&g, &s](Tensors& c) {
         const std::string p = L(2) + "compressor.";
         const Tensor<float> ones({s.cfg.head_dim}, 1.0f);
         c.set(p + "entries", ref::v4::compress(g.tensor<float>(p + "kv"), g.tensor<float>(p + "gate"), g.tensor<float>(p + "position_bias"),
                                                ones, ref::v4::compressor_params(s.cfg, LayerType::hca))); }},
      {"V4: CSA windows' halves swapped", "halves swapped", [&g, &s](Tensors& c) {
         // A kernel reading Cb from the previous window and Ca from its own: the column halves exchanged.
         const std::string p = L(1) + "compressor.";
         const int64_t D = s.cfg.head_dim;
         Tensor<float> kv = g.tensor<float>(p + "kv"), gate = g.tensor<float>(p + "gate"), bias = g.tensor<float>(p + "position_bias");
         for (Tensor<float>* x : {&kv, &gate, &bias})
           for (int64_t r = 0; r < x->dim(0); ++r)
             for (int64_t ch = 0; ch < D; ++ch) std::swap(x->at(r, ch), x->at(r, D + ch));
         c.set(p + "entries", ref::v4::compress(kv, gate, bias, g.tensor<float>(p + "norm_weight"),
                                                ref::v4::compressor_params(s.cfg, LayerType::csa))); }},
      {"V4: a Shared C4A layer running its own indexer", "a Shared C4A layer whose blocks are not its source", [&s](Tensors& c) {
         const ref::v4::LayerOutputs own = ref::v4::run_layer(s.cfg, ref::v4::make_layer_inputs(s.cfg, 3, LayerType::csa, true));
         c.set(L(3) + "indexer.blocks", own.blocks); }},
      // The bugs an independent review planted (no kind-specific hypothesis needed, or one added for them):
      {"V4: a Full C4A layer's blocks wrong, its Shared layer following them", "", [&g](Tensors& c) {
         Tensor<int32_t> b = g.tensor<int32_t>(L(1) + "indexer.blocks");
         swap_best_for_worst(g.tensor<float>(L(1) + "indexer.scores"), b);
         c.set(L(1) + "indexer.blocks", b);
         c.set(L(3) + "indexer.blocks", b); }},
      {"V4: attention skipping each row's oldest slot", "one key missing per row", [&g, &s, &k](Tensors& c) {
         const Tensor<int32_t> idx = g.tensor<int32_t>(L(0) + "attn.indices");
         const Tensor<float> sink = g.tensor<float>(L(0) + "attn.sink");
         set_attention(c, g, k, 0, emul::drop_one_key(idx, nullptr, g.get(L(0) + "attn.kv").shape[0], false), s.cfg.sm_scale(),
                       s.cfg.head_dim, &sink); }},
      {"V4: softmax scale (D + D/8)^-1/2 (576^-1/2 on a 512 set)", "a wrong softmax scale", [&g, &s, &k](Tensors& c) {
         const float sm = float(1.0 / std::sqrt(double(s.cfg.head_dim + s.cfg.head_dim / 8)));
         for (int l : {0, 2}) {
           const Tensor<float> sink = g.tensor<float>(L(l) + "attn.sink");
           set_attention(c, g, k, l, g.tensor<int32_t>(L(l) + "attn.indices"), sm, s.cfg.head_dim, &sink);
         } }},
      {"V4: compressor RMSNorm with eps 1e-5 (the set's 1e-6)", "RMSNorm with eps", [&g, &s](Tensors& c) {
         const std::string p = L(2) + "compressor.";
         ref::v4::CompressorParams cp = ref::v4::compressor_params(s.cfg, LayerType::hca);
         cp.eps = 1e-5f;
         c.set(p + "entries", ref::v4::compress(g.tensor<float>(p + "kv"), g.tensor<float>(p + "gate"), g.tensor<float>(p + "position_bias"),
                                                g.tensor<float>(p + "norm_weight"), cp)); }},
  };
}

// Hunyuan HY V4 (hy-v4-tiny: 6 layers F F S S S F, indexer RoPE on the trailing 8 of 16 dims).
std::vector<FamilyBug> hyv4_bugs(const golden::Loaded& g, const golden::Hyv4Spec& s) {
  namespace hy = ref::hyv4;
  const hy::Config cfg = s.cfg;
  // Layer 1's attn.out as a kernel computes it with `sink` in place of the set's.
  const auto with_sink = [&g, cfg](Tensors& c, const Tensor<float>& sink) {
    Tensor<int32_t> idx = g.tensor<int32_t>(L(1) + "attn.indices");
    idx.shape = {idx.dim(0), idx.numel() / idx.dim(0)};
    const Tensor<float> w_uv = bf16_to_f32(g.tensor<bf16_t>(L(1) + "attn.w_uv"));
    c.set(L(1) + "attn.out", hy::gated_attention(g.tensor<bf16_t>(L(1) + "attn.q"), g.tensor<bf16_t>(L(1) + "attn.kv"), idx, sink,
                                                 cfg.sm_scale, cfg.kv_lora, &w_uv, bf16_to_f32(g.tensor<bf16_t>(L(1) + "attn.gate")))
                                 .attn.out);
  };
  return {
      {"HY V4: the indexer's RoPE on the leading dims", "RoPE on the leading", [&g, cfg](Tensors& c) {
         hy::IndexerParams p = hy::indexer_params(cfg);
         p.slice = hy::RopeSlice::leading;
         const hy::IndexerOutputs o = hy::run_indexer(bf16_to_f32(g.tensor<bf16_t>(L(0) + "indexer.q")), bf16_to_f32(g.tensor<bf16_t>(L(0) + "indexer.k")),
                                                      g.tensor<float>(L(0) + "indexer.k_norm_w"), g.tensor<float>(L(0) + "indexer.k_norm_b"),
                                                      g.tensor<float>(L(0) + "indexer.weights_raw"), p);
         c.set(L(0) + "indexer.scores", o.scores); }},
      {"HY V4: the sink scaled by sm_scale", "the sink scaled by sm_scale", [&g, cfg, with_sink](Tensors& c) {
         Tensor<float> sink = g.tensor<float>(L(1) + "attn.sink");
         for (float& x : sink.data) x *= cfg.sm_scale;
         with_sink(c, sink); }},
      {"HY V4: attn.gated without the output gate", "without the output gate", [&g](Tensors& c) {
         c.set(L(2) + "attn.gated", g.tensor<float>(L(2) + "attn.o_v")); }},
      {"HY V4: the sinks permuted across heads", "", [&g, with_sink](Tensors& c) {
         Tensor<float> sink = g.tensor<float>(L(1) + "attn.sink");
         std::reverse(sink.data.begin(), sink.data.end());
         with_sink(c, sink); }},
  };
}

// GLM-5.3 KPool (kpool-tiny: DSA layers 3, 7, 11 of 12 F S F; P 4, top-16 = 4 pools + the tail).
std::vector<FamilyBug> kpool_bugs(const golden::Loaded& g, const golden::KpoolSpec& s) {
  return {
      {"KPool: pooled keys by max", "pools scored with max", [&g, &s](Tensors& c) {
         const Tensor<float> k = g.tensor<float>(L(3) + "indexer.k");
         const int64_t P = s.cfg.pool, D = s.cfg.dim, n = s.cfg.s_kv / P;
         Tensor<float> kbar({n, D});
         for (int64_t p = 0; p < n; ++p)
           for (int64_t d = 0; d < D; ++d) {
             float m = k.at(P * p, d);
             for (int64_t j = 1; j < P; ++j) m = std::max(m, k.at(P * p + j, d));
             kbar.at(p, d) = m;
           }
         c.set(L(3) + "indexer.pool_keys", kbar); }},
      {"KPool: a Shared layer off its source's list", "a Shared layer off its source's list", [&g](Tensors& c) {
         c.set(L(7) + "attn.indices", g.tensor<int32_t>(L(11) + "attn.indices")); }},
      {"KPool: a Full layer's list wrong, its Shared layer following it", "", [&g, &s](Tensors& c) {
         // The best selected pool's tokens replaced by the worst visible unselected pool's.
         Tensor<int32_t> pools = g.tensor<int32_t>(L(3) + "indexer.pools");
         const auto swaps = swap_best_for_worst(g.tensor<float>(L(3) + "indexer.scores"), pools);
         Tensor<int32_t> list = g.tensor<int32_t>(L(3) + "attn.indices");
         const int64_t W = list.numel() / list.dim(0), P = s.cfg.pool;
         for (int64_t t = 0; t < list.dim(0); ++t)
           for (int64_t i = 0; i < W && swaps[size_t(t)].first >= 0; ++i) {
             int32_t& x = list[t * W + i];
             if (x >= 0 && x / P == swaps[size_t(t)].first) x = int32_t(swaps[size_t(t)].second * P + x % P);
           }
         c.set(L(3) + "attn.indices", list);
         c.set(L(7) + "attn.indices", list); }},
  };
}

// MTP (mtp-tiny: layer 0 the target's DSA layer, layer 1 the MTP layer with its own indexer).
std::vector<FamilyBug> mtp_bugs(const golden::Loaded& g) {
  return {
      {"MTP: draft step 0 with the target's top-k", "a draft step using the target's top-k", [&g](Tensors& c) {
         c.set(L(1) + "indexer.topk", g.tensor<int32_t>(L(0) + "indexer.topk"));
         c.set(L(1) + "attn.indices", g.tensor<int32_t>(L(0) + "attn.indices")); }},
  };
}

}  // namespace

std::vector<CatalogueRow> family_catalogue(const ref::Kernels& k, const std::string& tmp,
                                           const std::function<void(const CatalogueRow&)>& progress) {
  std::vector<CatalogueRow> out;
  // One preset's set written and read back, then each of its bugs planted and judged.
  auto judge_all = [&](const std::string& preset, golden::GoldenSet set,
                       const std::function<std::vector<FamilyBug>(const golden::Loaded&)>& bugs_of) {
    const std::string dir = tmp + "/" + preset;
    golden::write(dir, std::move(set), true);
    const golden::Loaded g = golden::read(dir);
    for (const FamilyBug& b : bugs_of(g)) {
      Tensors c;
      b.plant(c);
      out.push_back(judge_bug(g, c.views, b.name, b.expect, k, tmp + "/family-candidate.safetensors"));
      if (progress) progress(out.back());
    }
  };
  const std::string replay = "indexshare calibrate --catalogue";
  const golden::V4Spec v4 = golden::parse_v4_spec(golden::preset("v4-tiny").problem);
  judge_all("v4-tiny", golden::build_v4(v4, replay, Impl::simd), [&](const golden::Loaded& g) { return v4_bugs(g, v4, k); });
  const golden::Hyv4Spec hy = golden::parse_hyv4_spec(golden::preset("hy-v4-tiny").problem);
  judge_all("hy-v4-tiny", golden::build_hyv4(hy, replay, Impl::simd), [&](const golden::Loaded& g) { return hyv4_bugs(g, hy); });
  const golden::KpoolSpec kp = golden::parse_kpool_spec(golden::preset("kpool-tiny").problem);
  judge_all("kpool-tiny", golden::build_kpool(kp, replay, Impl::simd), [&](const golden::Loaded& g) { return kpool_bugs(g, kp); });
  const golden::MtpSpec mtp = golden::parse_mtp_spec(golden::preset("mtp-tiny").problem);
  judge_all("mtp-tiny", golden::build_mtp(mtp, replay, Impl::simd), [](const golden::Loaded& g) { return mtp_bugs(g); });
  return out;
}

}  // namespace indexshare::calib

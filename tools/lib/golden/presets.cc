// golden sets: the presets, and the rules the front ends share to plan a kernel-level set (plan_stack,
// stack_replay).

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <algorithm>

#include "ref/layer.h"
#include "tools/lib/options.h"

namespace indexshare::golden {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"deepseek-v3.2",
       "sq16 skv256 hq4 dqk576 dv512 ih64 id128 k32 seed1 nl3 sim=0.85 recency=0.25 sinks=2 nseq2", "stack",
       "DeepSeek-V3.2 kernel shapes (576/512 MLA, 64x128 indexer), 3 Full layers, 2 sequences of 128 keys, top-32", ""},
      {"glm-5.2",
       "sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed2 nl8 sched=glm-5.2 sim=0.85 recency=0.25 sinks=2",
       "stack", "GLM-5.2 kernel shapes (32x128 indexer), 8 layers with its schedule FFFSSSFS", ""},
      {"glm-5.2-drift",
       "sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed8 nl8 sched=glm-5.2 sim=0 drift=0.98 jumps=0.15 recency=0.25 "
       "sinks=2",
       "stack",
       "glm-5.2 with indexer inputs that drift from layer to layer as in real models (adjacent overlap ~0.87, "
       "decaying with distance; one jump, before the Full layer 6)", ""},
      {"ties", "sq16 skv96 hq2 dqk576 dv512 ih4 id16 k16 seed3 dist=ties sim=1", "stack",
       "tie-heavy indexer: 4-level inputs, 4 x 16 heads: 13 of 16 rows tie at the k-th score", ""},
      {"short-rows", "sq16 skv40 hq2 dqk576 dv512 ih8 id128 k64 seed4", "stack",
       "topk >= every row's length: top-k selects everything, sparse equals dense", ""},
      {"module-tiny-glm", "tiny-glm", "module",
       "module level: the toy GLM-style model (interleaved indexer RoPE, 8 layers FFFSSSFS, 64 tokens) with "
       "hidden states, bf16 weights and every indexer / MLA intermediate", ""},
      {"decode", "sq4 skv320 hq4 dqk576 dv512 ih16 id128 k32 seed6 nseq2 nl2 sched=FS recency=0.25", "decode",
       "decode, next_n = 2, two sequences of 160 tokens in a paged FP8 KV cache (page 64, shuffled blocks, "
       "NaN in unused slots), physical indices, DeepGEMM paged indexer cache", ""},
      {"attention-edge", "sq8 skv64 hq4 dqk576 dv512 ih8 id128 k16 seed5 sink=random", "attention-edge",
       "attention edge cases: an all-invalid row, leading and middle -1, indices >= s_kv, "
       "duplicates, topk_length, random attention sinks", ""},
      // Kernel presets: one per registered kernel (tools/lib/kernel_registry.h), at its real shapes,
      // few query rows (the sets stay quick to compute; only their manifests are checked in, under
      // golden/kernels/NAME/). Written as `golden --for NAME`: the manifest holds the kernel's call.
      // Attention presets have 16 query rows: a fault confined to one head needs 10 clusters (rows)
      // for the structure tests to place it.
      {"flashmla-sparse-prefill-sm90", "sq16 skv8192 hq64 dqk576 dv512 ih64 id128 k2048 seed21", "stack",
       "FlashMLA sparse prefill (SM90) at h_q 64: top-2048 over 8192 keys, 16 query rows", "flashmla-sparse-prefill-sm90"},
      {"flashmla-sparse-prefill-sm100", "sq16 skv8192 hq128 dqk576 dv512 ih64 id128 k2048 seed22", "stack",
       "FlashMLA sparse prefill (SM100) at h_q 128: top-2048 over 8192 keys, 16 query rows", "flashmla-sparse-prefill-sm100"},
      {"flashmla-sparse-decode", "sq16 skv32768 hq64 dqk576 dv512 ih64 id128 k2048 seed23 nseq8 sink=strong", "decode",
       "FlashMLA sparse decode, V32 FP8 cache, h_q 64: next_n 2 for 8 sequences of 4096 tokens (paged, page 64), top-2048, "
       "a strong per-head sink",
       "flashmla-sparse-decode"},
      {"deepgemm-fp8-mqa-logits-sm90", "sq4 skv8192 hq4 dqk576 dv512 ih64 id128 k2048 seed24", "stack",
       "DeepGEMM fp8_mqa_logits (SM90) at H 64, D 128 over 8192 keys, 4 query rows", "deepgemm-fp8-mqa-logits-sm90"},
      {"deepgemm-fp8-mqa-logits-sm100", "sq4 skv8192 hq4 dqk576 dv512 ih64 id128 k2048 seed25", "stack",
       "DeepGEMM fp8_mqa_logits (SM100) at H 64, D 128 over 8192 keys, 4 query rows", "deepgemm-fp8-mqa-logits-sm100"},
      {"deepgemm-fp8-paged-mqa-logits", "sq8 skv16384 hq4 dqk576 dv512 ih64 id128 k2048 seed26 nseq4", "decode",
       "DeepGEMM fp8_paged_mqa_logits at H 64, D 128: next_n 2 for 4 sequences of 4096 tokens (paged, block 64), "
       "2-D context_lens", "deepgemm-fp8-paged-mqa-logits"},
      {"flashmla-sparse-prefill-model1", "sq16 skv8192 hq64 dqk512 dv512 ih64 id128 k2048 seed27 sink=strong", "stack",
       "FlashMLA sparse prefill, MODEL1 (DeepSeek-V4) shapes: d_qk 512 = d_v 512 with a strong per-head sink (random + "
       "ln 2048: worth a row's mass, so a dropped sink shows), h_q 64, top-2048 over 8192 keys, 16 query rows", "flashmla-sparse-prefill-model1"},
      {"flashmla-sparse-decode-model1", "model1 b8 nextn2 hq64 len1024 win128 blk256 ek512 eblk64 elen2048 seed31 sink=strong kv=1 empty",
       "decode-model1",
       "FlashMLA sparse decode, MODEL1 FP8 cache, two scopes in one softmax: a 128-token window (block 256) and top-512 "
       "compressed entries (block 64), h_q 64, next_n 2, 8 sequences (16 query rows), topk_length and extra_topk_length, "
       "a strong per-head sink, kv ~ N(0, 1) clamped (logits large enough to show a bf16 rounding), the last sequence's rows empty",
       "flashmla-sparse-decode-model1"},
      // Training kernel presets (kind train, tools/lib/golden_train.h): the kernels' real head and
      // latent sizes, one sequence of 256 tokens as query rows (both kernels mask causally with the
      // queries aligned to the keys at 0), the bf16 indexer.
      {"tilelang-sparse-mla-bwd", "sq256 skv256 hq64 dqk576 dv512 ih64 id128 k128 seed41 indexer=bf16", "train",
       "TileLang sparse MLA backward at h_q 64, d_qk 576, d_v 512: top-128 over one sequence of 256 tokens, 1 layer",
       "tilelang-sparse-mla-bwd"},
      {"megatron-dsa-indexer-loss", "sq256 skv256 hq64 dqk576 dv512 ih64 id128 k64 seed42 indexer=bf16 nl2 sched=FS", "train",
       "Megatron-LM DSA indexer KL loss (sparse, own-layer teacher, ReLU) with its gradients: indexer 64 x 128, h_q 64, "
       "top-64 over one sequence of 256 tokens, layers FS",
       "megatron-dsa-indexer-loss"},
      // DeepSeek-V4 sets (kind v4, tools/lib/golden_v4.h): the descriptor is a V4 spec.
      {"v4-tiny", "t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=SCHCC sched=FSF rot=hf seed=31", "v4",
       "DeepSeek-V4 layers at tiny shapes: SWA, C4A Full, HCA, C4A Shared, C4A Full; 48 tokens, top-4 of 12 blocks", ""},
      {"deepseek-v4-flash",
       "t=2176 h=64 d=512 w=128 csa=4 hca=128 ih=64 id=128 k=512 rope=64 ctx=65536 types=SCHCC freq=2 rule=j%f==0 rot=hf "
       "seed=32",
       "v4",
       "DeepSeek-V4-Flash attention shapes (H 64, D 512, W 128, top-512 over 4:1 blocks, indexer 64 x 128, HCA 128), "
       "2176 tokens (544 blocks: top-512 selects from row 2051 on), layers SCHCC with the C4A layers Full/Shared by freq 2",
       ""},
      // MTP draft steps (kind mtp, tools/lib/golden_mtp.h): a problem with the draft's steps and accepted lengths.
      {"mtp-tiny", "sq16 skv128 hq4 dqk64 dv32 ih4 id32 k8 seed61 nseq4 steps=4 accept=4,1,3,2", "mtp",
       "MTP chain drafting: 4 requests of 32 keys, a draft extend of 4 rows each with 4, 1, 3 and 2 accepted; "
       "layer 0 the target's DSA layer, layer 1 the MTP layer; 3 draft steps reuse each request's last accepted row (top-8)",
       ""},
      // Hunyuan HY V4 (kind hyv4, tools/lib/golden_hyv4.h): a problem with the indexer's rope dims and vd.
      {"hy-v4-tiny", "sq16 skv16 hq2 dqk40 dv32 ih4 id16 k8 seed71 sm=0.0625 sink=random nl6 sched=hy-v4 rope=8 vd=16", "hyv4",
       "Hunyuan HY V4 layers at tiny shapes: 6 layers F F S S S F (hy-v4), indexer 4 x 16 with RoPE on its trailing 8 dims, "
       "top-8 of 16 keys, 2 heads with the unscaled sink (sm_scale 1/16 as HY V4's), W_uv to 16 dims and the sigmoid gate",
       ""},
      // GLM-5.3 KPool-DSA (kind kpool, tools/lib/golden_kpool.h): the descriptor is a kpool spec.
      {"kpool-tiny", "sq=30 skv=30 h=4 d=16 pool=4 k=16 tail=yes rounding=f32 hq=2 dqk=64 dv=32 nl=12 dsa=glm53 sched=FSF fp8=amax seed=71",
       "kpool",
       "GLM-5.3 pooled indexer (P 4, top-16 tokens = 4 pools + the tail) over 30 tokens (7 complete pools), DSA layers 3, 7, 11 "
       "of 12 (KDA elsewhere) Full, Shared, Full; rows 0-14 see fewer than 4 complete pools, every 4th row an empty tail; "
       "SGLang's FP8 pooled-key pages",
       ""},
  };
  return p;
}

const Preset& preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return p;
  std::string names;
  for (const Preset& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
  throw Error("unknown golden preset '" + name + "' (expected " + names + ")");
}

StackPlan plan_stack(const StackRequest& r) {
  require(r.preset.empty() != r.problem.empty(), "golden: give exactly one of --preset, --problem, --model and --from");
  if (!r.for_kernel.empty())
    require(!r.rows_given, "golden: --for writes whole sets: --rows (sampled query rows) is not a kernel's input layout");
  StackPlan plan;
  std::string desc = r.problem, for_kernel = r.for_kernel;
  plan.kind = r.kind;
  if (!r.preset.empty()) {
    const Preset& pr = preset(r.preset);
    require(pr.kind != "module", "golden: preset '" + pr.name + "' is a module-level set (--model), not a kernel-level one");
    require(pr.kind != "v4", "golden: preset '" + pr.name + "' is a DeepSeek-V4 set: write it with the CLI's golden --preset");
    require(pr.kind != "hyv4", "golden: preset '" + pr.name + "' is a HY V4 set: write it with the CLI's golden --preset");
    require(pr.kind != "mtp", "golden: preset '" + pr.name + "' is an MTP draft-step set: write it with the CLI's golden --preset");
    require(pr.kind != "kpool", "golden: preset '" + pr.name + "' is a KPool-DSA set: write it with the CLI's golden --preset");
    desc = pr.problem;
    plan.kind = pr.kind;
    // A kernel preset is written for its kernel (as --for); another --for is refused.
    require(pr.kernel.empty() || r.for_kernel.empty() || r.for_kernel == pr.kernel,
            "golden: preset '" + pr.name + "' is written for " + pr.kernel + ", not --for " + r.for_kernel);
    require(pr.kernel.empty() || !r.rows_given,
            "golden: preset '" + pr.name + "' is written for " + pr.kernel + ": --rows (sampled query rows) is not a kernel's input layout");
    if (for_kernel.empty()) for_kernel = pr.kernel;
    plan.kernel_preset = !pr.kernel.empty();
  }
  // train sets (tools/lib/golden_train.h) have their own builder and options.
  require(plan.kind != "train" && (for_kernel.empty() || kreg::kernel(for_kernel).kind != "train"),
          "golden: " + (r.preset.empty() ? "--for " + for_kernel : "preset '" + r.preset + "'") +
              " is a train set, built by golden::build_train (the CLI's golden --kind train, Python's kind=\"train\")");
  // decode-model1 sets (tools/lib/golden_model1.h) take a model1 spec, not a problem descriptor.
  require(plan.kind != "decode-model1" && (for_kernel.empty() || kreg::kernel(for_kernel).kind != "decode-model1"),
          "golden: " + (r.preset.empty() ? "--for " + for_kernel : "preset '" + r.preset + "'") +
              " is a decode-model1 set, built from a model1 spec by golden::build_model1_decode (the CLI's golden)");
  Problem& p = plan.problem;
  p = parse_problem(desc);
  if (r.layers > 0) p.n_layers = r.layers;
  if (r.seq > 0) {
    p.s_kv = r.seq;
    p.s_q = std::min(p.s_q, r.seq);
  }
  if (r.seed >= 0) p.seed = uint64_t(r.seed);
  p.validate();
  // --for KERNEL: the problem must fit the kernel's constraints (tools/lib/kernel_registry.h), checked
  // before anything is computed; the set is the kernel's kind.
  if (!for_kernel.empty()) {
    const kreg::Kernel& k = kreg::kernel(for_kernel);
    require(!r.kind_given || r.kind == k.kind, "golden: --for " + k.name + " writes a " + k.kind + " set, not --kind " + r.kind);
    require(r.preset.empty() || plan.kind == k.kind,
            "golden: --for " + k.name + " needs a " + k.kind + " set; preset '" + r.preset + "' is " + plan.kind);
    plan.kind = k.kind;
    std::string msg;
    for (const std::string& b : kreg::violations(k, p)) msg += (msg.empty() ? "" : "; ") + b;
    require(msg.empty(), "golden --for: " + msg);
    plan.kernel = &k;
  }
  // --rows: a sampled set of those query rows; the replay line carries the list.
  plan.rows_given = r.rows_given;
  if (r.rows_given) {
    require(plan.kind == "stack", "--rows: sampled sets are kind stack only, not '" + plan.kind + "'");
    plan.rows = parse_rows(r.rows, p);
  }
  return plan;
}

std::string stack_replay(const Problem& p, const std::string& kind, const std::string& for_kernel,
                         const std::vector<int64_t>* rows, Impl impl, bool with_logits, const std::string& max_memory) {
  return "indexshare golden --problem \"" + to_string(p) + "\" --kind " + kind +
         (for_kernel.empty() ? "" : " --for " + for_kernel) + (rows ? " --rows " + ref::format_rows(*rows) : "") +
         (impl == Impl::ref ? "" : " --impl " + impl_name(impl)) + (with_logits ? "" : " --no-logits") +
         (max_memory != "8G" ? " --max-memory " + max_memory : "");
}

}  // namespace indexshare::golden

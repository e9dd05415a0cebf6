// indexshare: Hunyuan HY V4 golden sets (kind "hyv4"): a HY V4 DSA stack with index sharing
// (ref/hyv4/layer.h run_stack) on generated inputs, with every tensor a kernel reads and every
// intermediate a kernel team compares.
//
// The descriptor is a kernel-level problem (ref/problem.h) plus two fields, printed canonically as
// to_string(problem) rope= vd= (sched= always printed):
//   rope=R   the indexer's RoPE dims, the TRAILING R of each head (HY V4 64 of 128; default id / 2)
//   vd=V     the value dims per head after W_uv (HY V4 256; default dv / 2)
// and the problem's fields mean: sq, skv (query rows the last sq of skv positions), ih x id the
// indexer heads, k the top-k, hq the attention heads, dv the latent (kv_lora, the kernel's d_v),
// dqk = dv + the attention's rope dims, sm (default dqk^-1/2; HY V4's is 256^-1/2 = 0.0625), seed,
// dist, nl, sched (default hy-v4: Full iff l == 0 or (l - 1) % 4 == 0), sink=none|random (random:
// HY V4's learnable per-head sink, an unscaled logit). The problem's other fields (indexer, scale,
// sim, drift, jumps, jumprho, recency, sinks, own, nseq) are refused, naming the field.
// e.g. "sq16 skv16 hq2 dqk48 dv32 ih4 id32 k8 seed71 sink=random nl6 sched=hy-v4 rope=16 vd=16".
//
// Tensors, per layer l (prefix "layers.{l}."); roles in brackets. Full layers (their own indexer):
//   indexer.q [s_q, H, D] BF16 [input]: wq_b(q_resid), before RoPE (F32 when its values are not all
//     bf16 values: a model dump's f32 projections; likewise indexer.k)
//   indexer.k [s_kv, D] BF16 [input]: wk(x), before the LayerNorm
//   indexer.k_norm_w, indexer.k_norm_b [D] F32 [input]   indexer.weights_raw [s_q, H] F32 [input]
//   indexer.ks, indexer.ke [s_q] I32 [reference]: the causal window [0, p + 1) of row t, p = s_kv - s_q + t
//   indexer.k_norm [s_kv, D] F32 [output]: the LayerNorm (f32)
//   indexer.q_rope [s_q, H, D], indexer.k_rope [s_kv, D] F32 [output]: after the RoPE of the trailing
//     rope dims (interleaved pairs, in place): what the scoring kernel reads
//   indexer.weights [s_q, H] F32 [output]: (raw * f32(H^-1/2)) * f32(D^-1/2), what the kernel reads
//   indexer.scores [s_q, s_kv] F32 [output]: sum_h w ReLU(q_rope . k_rope), -inf outside the window
//   indexer.topk [s_q, k] I32 [output]: score descending, key ascending; -1 past the p + 1 keys
// Every layer:
//   attn.q [s_q, h_q, dqk] BF16, attn.kv [s_kv, 1, dqk] BF16 [input] (absorbed MLA: latent | rope)
//   attn.sink [h_q] F32 [input] (sink=random only)   attn.w_uv [h_q, V, dv] BF16 [input]
//   attn.gate [s_q, h_q, V] BF16 [input]: linear_gate(x)
//   attn.indices [s_q, 1, k] I32 [input]: the kv rows the attention reads, the layer's own top-k
//     (Full) or its source Full layer's (Shared)
//   attn.out [s_q, h_q, dv] F32, attn.out_bf16 BF16, attn.lse / attn.max_logits [s_q, h_q] F32
//     [output]: the sparse attention kernel's (lse and max_logits without the sink)
//   attn.o_v [s_q, h_q, V] F32 [output]: W_uv out (double sum, one rounding)
//   attn.gated [s_q, h_q, V] F32, attn.gated_bf16 BF16 [output]: o_v * sigmoid(gate), o_proj's input
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ref/hyv4/layer.h"
#include "ref/problem.h"
#include "tools/lib/golden.h"
#include "tools/lib/impl.h"

namespace indexshare::golden {

struct Hyv4Spec {
  Problem problem;
  ref::hyv4::Config cfg;  // the problem's shapes, rope and vd as ref::hyv4's config
};
// Parses the descriptor; Error naming the field ("hyv4 field 'rope': ...", or the problem's).
Hyv4Spec parse_hyv4_spec(const std::string& text);
std::string to_string(const Hyv4Spec& s);  // canonical

// The set; replay: the command recorded in the manifest. given: every layer's inputs (a model dump,
// load_hyv4_dump) instead of generated ones; consumed.
GoldenSet build_hyv4(const Hyv4Spec& s, const std::string& replay, Impl impl = Impl::ref,
                     std::vector<ref::hyv4::LayerInputs>* given = nullptr);
// "indexshare golden --kind hyv4 --problem \"SPEC\"" (+ --impl), without --out.
std::string hyv4_replay(const Hyv4Spec& s, Impl impl);

// Checks a hyv4 set's manifest and tensors (golden::read calls it for kind "hyv4"): the problem
// against the config, layers and schedule, every tensor's name, role, dtype and shape; Error
// naming the manifest field.
void check_hyv4_manifest(const Loaded& g, const std::string& mpath);

// ---- A hy_v4 model dump (python -m indexshare.dump; metadata format "indexshare-dump", kind "hyv4"):
// per layer, under the golden names above, the inputs (hyv4_dump_inputs: indexer.q, k, k_norm_w,
// k_norm_b, weights_raw on Full layers, F32 or BF16 for q and k; attn.q, kv, sink, w_uv, gate as the
// kernel reads them) and the model's own outputs under the names diff judges (hyv4_outputs), which
// --from passes over. The metadata's `problem` is the dumped layers' hyv4 descriptor.
bool is_hyv4_dump(const std::string& file);  // reads the header only; false if it cannot
struct Hyv4Dump {
  Hyv4Spec spec;
  std::vector<ref::hyv4::LayerInputs> inputs;
};
// Error naming the file, tensor and field (a missing, misshapen or non-finite input, an unknown name,
// a layer outside the descriptor, a descriptor that does not parse).
Hyv4Dump load_hyv4_dump(const std::string& file);
// The same inputs read from a hyv4 golden set (its problem, every layer's attention inputs, its
// Full layers' indexer inputs).
Hyv4Dump hyv4_set_inputs(const Loaded& g);
const std::set<std::string>& hyv4_dump_inputs();  // "indexer.q", ..., "attn.gate"
const std::set<std::string>& hyv4_outputs();      // the names a candidate (or a dump's model) may hold: "indexer.k_norm", ...

// What the judge reads of a hyv4 manifest (its problem, re-parsed, and the schedule).
struct Hyv4Layout {
  Hyv4Spec spec;
  Schedule schedule;
};
Hyv4Layout hyv4_layout(const nlohmann::json& manifest);

}  // namespace indexshare::golden

// indexshare: GLM-5.3 KPool-DSA golden sets (kind "kpool"): the pooled indexer, its selection and
// the attention of every DSA layer of a hybrid stack (ref/kpool/layer.h), on generated inputs.
//
// The descriptor (KpoolSpec), space separated key=value as the v4 kind's, printed canonically in
// this order (the manifest's `problem` and the replay line):
//   sq=30 skv=30 h=4 d=16 pool=4 k=16 tail=yes rounding=f32 hq=2 dqk=64 dv=32 nl=12 dsa=glm53 sched=FSF seed=71
//   sq, skv   query rows (the last sq of skv positions) and keys      h, d   indexer heads H and dim D
//   pool      P, tokens per pool (>= 1)                               k      index_topk, a multiple of P
//   tail      yes / no: index_kpool_always_select_tail                hq, dqk, dv   the NoPE MLA attention
//   rounding  the pooled keys' rounding points: f32 (the specification) or hf-bf16 (transformers in a
//             bf16 model: bf16 probabilities, bf16 products; ref/kpool/pool.h)
//   nl        model layers; dsa=glm53: layer i is DSA iff i % 4 == 3 (GLM-5.3's layer_types, the others
//             KDA), dsa=all: every layer is DSA
//   sched     F/S per DSA layer in order (first F; default all F)            seed   the generator's seed
//   fp8       amax / pow2: add SGLang's FP8 pooled-key cache pages (below) with its scale rule
//             max(amax, 1e-4) / 448, or its power-of-two ceiling (`scale_fmt`); d a power of two
// Required: sq skv h d pool k nl; defaults tail=yes rounding=f32 hq=2 dqk=512 dv=512 dsa=glm53, all
// Full, no fp8 pages, seed=1. sm_scale is GLM-5.3's 256^-1/2.
//
// Tensors, per DSA layer l (its model layer number; prefix "layers.{l}."), n = floor(skv / P),
// select_k = min(k / P, n), width = k + P - 1 (k without the tail); roles in brackets:
//   Full layers:  indexer.q [sq, H, D], indexer.k, indexer.gate [skv, D], indexer.ape [P, D],
//     indexer.weights [sq, H] f32 [input]; indexer.ke I32 [sq] [reference] (the pools visible to
//     each row); indexer.pool_logits [n, P, D] (z = g + ape), indexer.pool_keys [n, D] (Kbar),
//     indexer.scores [sq, n] (-inf where not visible) f32, indexer.pools I32 [sq, select_k] (score
//     descending, pool ascending, -1 padded), indexer.history I32 [sq, select_k P] (each pool's
//     tokens ascending), indexer.tail I32 [sq, P - 1] (with tail only), indexer.indices I32
//     [sq, width] (history | tail | -1: the union list) [output]; with fp8: indexer.pool_keys_fp8 U8
//     [ceil(n / 64), 64 (D + 4)] (SGLang's pages of ref::kpool::sglang_pooled_fp8's codes and scales
//     of the pooled keys, kpool_fp8_pages) [output]
//   every layer:  attn.q BF16 [sq, hq, dqk], attn.kv BF16 [skv, 1, dqk], attn.indices I32 [sq, 1, width]
//     (the union list the layer attends over: its own, or a Shared layer's source's) [input];
//     attn.out F32 / attn.out_bf16 BF16 [sq, hq, dv], attn.lse, attn.max_logits F32 [sq, hq] [output]
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ref/kpool/layer.h"
#include "ref/overlap.h"
#include "tools/lib/golden.h"
#include "tools/lib/impl.h"

namespace indexshare::golden {

struct KpoolSpec {
  ref::kpool::KpoolConfig cfg;
  int n_layers = 0;         // model layers
  bool all_dsa = false;     // dsa=all (else glm53)
  std::string pattern;      // F/S per DSA layer
  std::string fp8 = "none"; // none, amax or pow2: SGLang's FP8 pages and their scale rule
  std::vector<bool> dsa() const;  // per model layer
  std::vector<int> dsa_layers() const;  // the DSA layers' model numbers, ascending
};
// SGLang's FP8 pooled-key cache (kpool_fp8_index): pages of 64 pooled slots, each
// [64 x D e4m3 codes, slot-major][64 f32 scales, little-endian] = 64 (D + 4) bytes (132 B per key at
// D 128); pooled key p in page p / 64, slot p % 64; the slots past the last key hold 0 bytes.
constexpr int64_t kKpoolFp8Page = 64;
Tensor<uint8_t> kpool_fp8_pages(const Tensor<e4m3_t>& codes, const Tensor<float>& scale);
// The codes [n, D] and scales [n] of the first n slots of pages [*, 64 (D + 4)]; Error unless the shape fits.
void kpool_fp8_unpage(const Tensor<uint8_t>& pages, int64_t n, int64_t D, Tensor<e4m3_t>& codes, Tensor<float>& scale);

// Parses the descriptor; Error naming the field (e.g. "kpool spec field 'k': ...").
KpoolSpec parse_kpool_spec(const std::string& text);
std::string to_string(const KpoolSpec& s);  // canonical

// The set; replay: the command recorded in the manifest. given: one entry per DSA layer (a model dump,
// load_kpool_dump; a Shared layer's without indexer inputs) instead of generated inputs; consumed.
GoldenSet build_kpool(const KpoolSpec& s, const std::string& replay, Impl impl = Impl::ref,
                      std::vector<ref::kpool::KpoolLayerInputs>* given = nullptr);
// The set computed DSA layer by DSA layer, each tensor handed to `put` as soon as it is final (in
// kpool_plan's order); returns the manifest without its tensor list. build_kpool and write_kpool
// are this with a collecting and a writing `put` (the types of golden_v4.h's emit_v4).
nlohmann::json emit_kpool(const KpoolSpec& s, const std::string& replay, Impl impl,
                          std::vector<ref::kpool::KpoolLayerInputs>* given, const PutTensor& put);
// build_kpool's set written to `dir` as it is computed (write_v4's scheme and rules; the same bytes
// as golden::write of build_kpool's set); inputs_note, when given, is conventions.inputs.
nlohmann::json write_kpool(const std::string& dir, bool force, const KpoolSpec& s, const std::string& replay, Impl impl = Impl::ref,
                           std::vector<ref::kpool::KpoolLayerInputs>* given = nullptr, const std::string& inputs_note = "");
// The set's tensors in file order (names, dtypes, shapes from the config, roles): write_kpool's plan.
std::vector<SetWriter::Planned> kpool_plan(const KpoolSpec& s);
// "indexshare golden --kind kpool --problem \"SPEC\"" (+ --impl), without --out.
std::string kpool_replay(const KpoolSpec& s, Impl impl);

// Checks a kpool set's manifest and tensors (golden::read calls it for kind "kpool"): config,
// layers, schedule, conventions, every tensor's name, role, dtype and shape; Error naming the field.
void check_kpool_manifest(const Loaded& g, const std::string& mpath);

// ---- A glm5_next model dump (python -m indexshare.dump; metadata format "indexshare-dump", kind
// "kpool"): per DSA layer, under the golden names above, the inputs (kpool_dump_inputs: indexer.q, k,
// gate, ape, weights F32 on Full layers; attn.q, attn.kv BF16 on every layer) and the model's own
// outputs under the names diff judges (kpool_outputs), which --from passes over. The metadata's
// `problem` is the model's kpool descriptor (seed unused).
bool is_kpool_dump(const std::string& file);  // reads the header only; false if it cannot
struct KpoolDump {
  KpoolSpec spec;
  std::vector<ref::kpool::KpoolLayerInputs> inputs;  // one per DSA layer, ascending
};
// Error naming the file, tensor and field (a missing, misshapen or non-finite input, an unknown name,
// a layer that is not a DSA layer of the descriptor, a descriptor that does not parse).
KpoolDump load_kpool_dump(const std::string& file);
// The same inputs read from a kpool golden set (its problem, its Full layers' indexer inputs).
KpoolDump kpool_set_inputs(const Loaded& g);
// overlap over a stack's DSA layers' own pools (ref/kpool/sharing.h); dsa_layers receives their model
// layer numbers. Every Full DSA layer needs its indexer inputs (a set's or a dump's have them).
ref::OverlapReport kpool_overlap(const KpoolDump& d, int n_buckets, const ref::Kernels& kern, std::vector<int>& dsa_layers);
const std::set<std::string>& kpool_dump_inputs();  // "indexer.q", ..., "attn.kv"
const std::set<std::string>& kpool_outputs();      // the names a candidate (or a dump's model) may hold

// What the judge reads of a kpool manifest (checked by read).
struct KpoolLayer {
  int layer = 0;            // model layer number
  bool full = true;
  int source = 0;           // model layer whose list it uses
};
struct KpoolLayout {
  ref::kpool::KpoolConfig cfg;
  std::vector<KpoolLayer> layers;  // the DSA layers, ascending
  int64_t select_k = 0;
  std::string fp8 = "none";        // config.fp8
  const KpoolLayer* find(int layer) const;  // nullptr when not a DSA layer of the set
};
KpoolLayout kpool_layout(const nlohmann::json& manifest);

}  // namespace indexshare::golden

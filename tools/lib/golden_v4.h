// indexshare: DeepSeek-V4 golden sets (kind "v4"): a V4 attention stack (ref/v4/stack.h) on
// generated inputs, with every tensor a kernel reads and every intermediate a kernel team compares.
//
// The descriptor (V4Spec), a `--problem`-like text, space separated key=value, printed canonically
// in this order (the manifest's `problem` and the replay line):
//   t=48 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=SCHCC sched=FSF rot=hf seed=1
//   t     tokens T (one sequence, a prefill from position 0)     h, d   heads H, head_dim D
//   w     sliding window W                                       csa, hca  compression ratios m, m'
//   ih, id  indexer heads H_I and head_dim D_I                   k      index top-k
//   rope  rope_dim of both RoPEs (V4 64)                         ctx    the compress RoPE's YaRN
//                                                                       original_max_position (V4 65536)
//   types one of S / C / H per layer (SWA, C4A, HCA)
//   sched the C4A layers' Full/Shared pattern (F/S per C4A layer, first F), or
//   freq=F rule=R  the frequency rule by name: "j%f==0" or "max(j-1,0)%f" (ref/v4/stack.h)
//   rot   hf (no rotation) or megatron (Hadamard)                seed   the generator's seed
// Every key is required except ctx (65536), rot (hf), seed (1) and sched/freq (all Full).
//
// Tensors, per layer l (prefix "layers.{l}."); n_c = floor(T / m) (C4A) or floor(T / m') (HCA),
// n_b = floor(T / m), k_eff = min(k, n_b); roles in brackets:
//   attn.q [T, H, D] bf16 [input]   attn.kv [T + n_c, 1, D] bf16 [input]: kv_full, the T token rows
//   then bf16(compressor.entries) (rows T ..)   attn.sink [H] f32 [input]
//   attn.indices [T, 1, W + width] i32 [input]: the window (slot i of row t is t - W + 1 + i, -1
//     below 0), then T + block per selected block (C4A, width k_eff, -1 kept) or T + j for every
//     entry j < floor((t + 1) / m') (HCA, width n_c, -1 past it); SWA: width 0
//   attn.out [T, H, D] f32 [output]: the sparse attention kernel's output (FlashMLA's sparse
//     prefill with the sink, d_v = D), BEFORE the inverse RoPE; attn.out_bf16 its bf16 [output]
//   attn.out_rotated [T, H, D] f32 [output]: attn.out with the inverse RoPE at the query position
//     on the trailing rope_dim channels (what ref::v4::run_layer returns)
//   attn.lse, attn.max_logits [T, H] f32 [output] (lse without the sink)
//   C4A and HCA: compressor.kv, compressor.gate [T, 2D or D], compressor.position_bias [m, width],
//     compressor.norm_weight [D] f32 [input]; compressor.entries [n_c, D] f32 [output]
//   Full C4A: indexer.kv, indexer.gate [T, 2 D_I], indexer.position_bias [m, 2 D_I],
//     indexer.norm_weight [D_I], indexer.q [T, H_I, D_I], indexer.weights [T, H_I] f32 [input];
//     indexer.entries [n_b, D_I], indexer.scores [T, n_b] f32, indexer.blocks [T, k_eff] i32 [output]
//   C4A (Full or Shared): indexer.blocks (a Shared layer's are its source's) [output]
#pragma once

#include <cstdint>
#include <set>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ref/v4/sharing.h"
#include "ref/v4/stack.h"
#include "tools/lib/golden.h"
#include "tools/lib/impl.h"

namespace indexshare::golden {

struct V4Spec {
  ref::v4::Config cfg;
  std::string types;        // "SCHCC"
  std::string pattern;      // F/S per C4A layer, or empty with freq
  int freq = 0;             // > 0: the freq rule
  ref::v4::FreqRule rule = ref::v4::FreqRule::modulo;
  ref::v4::Schedule schedule() const;
};
// F / S per C4A layer of a schedule (a descriptor's sched=, the V4 overlap report's pattern).
std::string csa_pattern(const ref::v4::Schedule& s);
// Parses the descriptor; Error naming the key (e.g. "v4 spec field 'h': ...").
V4Spec parse_v4_spec(const std::string& text);
std::string to_string(const V4Spec& s);  // canonical

// The set; replay: the command recorded in the manifest. given: every layer's inputs (a model
// dump, load_v4_dump) instead of generated ones; consumed.
GoldenSet build_v4(const V4Spec& s, const std::string& replay, Impl impl = Impl::ref,
                   std::vector<ref::v4::LayerInputs>* given = nullptr);
// The set computed layer by layer, each tensor handed to `put` as soon as it is final (a layer's
// inputs and outputs after the layer, in v4_plan's order); returns the manifest without its tensor
// list. build_v4 and write_v4 are this with a collecting and a writing `put`.
nlohmann::json emit_v4(const V4Spec& s, const std::string& replay, Impl impl, std::vector<ref::v4::LayerInputs>* given,
                       const PutTensor& put);
// build_v4's set written to `dir` as it is computed (golden::write's rules and bytes): each layer's
// tensors are written and hashed on two threads while the next layer computes, and then freed, so
// memory holds about two layers' tensors instead of the set (golden --kind v4). inputs_note, when
// given, is the manifest's conventions.inputs (where given inputs came from).
nlohmann::json write_v4(const std::string& dir, bool force, const V4Spec& s, const std::string& replay, Impl impl = Impl::ref,
                        std::vector<ref::v4::LayerInputs>* given = nullptr, const std::string& inputs_note = "");
// The set's tensors in file order (names, dtypes, shapes from the config, roles): write_v4's plan.
std::vector<SetWriter::Planned> v4_plan(const V4Spec& s);
// One layer l of a v4 stack as the set records it (golden's and run's step): the compressor's
// entries, a Full C4A layer's indexer entries, scores and blocks (stored in blocks[l]; a Shared C4A
// layer copies blocks[source]), the attention indices, kv_full, the attention and attn.out_rotated
// (keep_unrotated false: attn.out is rotated in place, and attn.out and out_bf16 are left empty;
// true: attn.out is kept and `rotated` left empty, for the caller to make with rotate_v4_rows).
struct V4LayerResult {
  Tensor<float> entries, index_entries, scores, rotated;
  Tensor<int32_t> indices;
  Tensor<bf16_t> kv_full;
  ref::AttentionOut attn;
};
// Rows [first, first + n) of attn.out_rotated: out's rows (the whole [T, H, D] attn.out of a layer
// of type `type`) copied to dst (n rows) and rotated back (ref::v4::apply_rope_inverse at each row's
// position on the trailing rope_dim channels); dst may be out + first * H * D (in place). parallel:
// OpenMP over the rows (the same bits either way).
void rotate_v4_rows(const ref::v4::Config& cfg, ref::v4::LayerType type, const float* out, int64_t first, int64_t n, float* dst,
                    bool parallel);
V4LayerResult compute_v4_layer(const ref::v4::Config& cfg, const ref::v4::Schedule& sch, size_t l, const ref::v4::LayerInputs& in,
                               std::vector<Tensor<int32_t>>& blocks, const ref::Kernels& kern, bool keep_unrotated = true);

// "indexshare golden --kind v4 --problem \"SPEC\"" (+ --impl), without --out.
std::string v4_replay(const V4Spec& s, Impl impl);

// Checks a v4 set's manifest and tensors (golden::read calls it for kind "v4"): config, layers,
// schedule, conventions, every tensor's name, role, dtype and shape against the config; Error
// naming the manifest field.
void check_v4_manifest(const Loaded& g, const std::string& mpath);

// The shape of tensor `rest` ("attn.q", "indexer.blocks", ...) in a v4 set of config c on a layer of
// type t (the table of the header).
Shape v4_tensor_shape(const std::string& rest, const ref::v4::Config& c, ref::v4::LayerType t);

// ---- A deepseek_v4 model dump (python -m indexshare.dump; metadata format "indexshare-dump",
// kind "v4"): per layer, under the golden names above, the inputs attn.q, attn.kv [T, 1, D] (the
// token rows only), attn.sink, compressor.* and (C4A) indexer.* inputs, plus the model's own
// outputs (v4_dump_outputs), which the judge reads and --from does not. The metadata's `problem` is
// the dumped layers' V4 descriptor; `main_inv_freq` / `compress_inv_freq` the model's RoPE inverse
// frequencies, which must equal ref's for the descriptor (else the set would rotate by other angles).
bool is_v4_dump(const std::string& file);  // reads the header only; false if it cannot
struct V4Dump {
  V4Spec spec;
  std::vector<ref::v4::LayerInputs> inputs;
};
// Error naming the file, tensor and field (a missing, misshapen or non-finite input, an unknown
// name, a layer outside the descriptor, a RoPE the descriptor does not give).
V4Dump load_v4_dump(const std::string& file);
// A v4 golden set's descriptor and inputs (attn.kv cut to its T token rows), as load_v4_dump's.
V4Dump v4_set_inputs(const Loaded& g);
// The overlap report of a V4 stack's C4A block indices (ref/v4/sharing.h) and the model layer of
// each C4A rank (`c4a_layers`), with kernels kern: what `overlap` and indexshare.overlap report.
ref::OverlapReport v4_overlap(const V4Dump& d, int n_buckets, const ref::Kernels& kern, std::vector<int>& c4a_layers);
const std::set<std::string>& v4_dump_inputs();   // "attn.q", ..., "indexer.weights"
const std::set<std::string>& v4_dump_outputs();  // "compressor.entries", ..., "attn.out_rotated"
// "indexshare golden --from FILE" (+ --impl), without --out.
std::string v4_from_replay(const std::string& file, Impl impl);

// What the judge reads of a v4 manifest.
struct V4Layout {
  ref::v4::Config cfg;
  ref::v4::Schedule schedule;
  std::vector<int64_t> n_c;  // per layer
};
V4Layout v4_layout(const nlohmann::json& manifest);

}  // namespace indexshare::golden

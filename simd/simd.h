// indexshare: the Highway + OpenMP path. It mirrors ref/ function for function (same names,
// same argument order, same errors), and each function picks its Highway target once per call.
//
// Agreement with ref/ (checked by tests/test_simd.cc on every compiled target, 1 and 2 threads):
//   indexer_logits_fp8 / _f32   bit-identical (the same per-(t, s) operation sequence; see
//                               simd/indexer-inl.h for why the vector order is the ref order)
//   topk, indexer_topk_fp8      identical output (exact selection under a total order)
//   sparse/dense_attention      bit-identical: ref fixes every operation (the 8-part dot order,
//                               exp_portable, fused P.V accumulation; ref/attention.h) and the
//                               kernels perform the same ones (simd/attention.cc)
//   exp_portable                bit-identical
//   emulate_attention_lowp,     bit-identical (ref/bounds.h: the budget's emulation, the
//   attention_bounds,           per-element bounds; simd/compare.cc)
//   indexer_logits_rule         (simd/compare_logits.cc)
//   fill_range, fill_range_bf16 bit-identical (the generator's streams in lanes; simd/rng.cc)
//   quantize_rows, f32_to_e4m3  identical bytes (FP8 codes and scales in lanes; simd/numerics.cc)
// NaN outputs are NaN at the same positions as in ref; the sign and payload bits of a NaN are
// whatever the hardware propagates and are not part of the contract.
//
// OpenMP splits only over query rows (independent outputs), so the thread count never changes a
// bit. Errors are thrown from the calling thread with ref's messages, for the same first fault.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/bounds.h"
#include "ref/kernels.h"
#include "ref/kpool/pool.h"
#include "ref/module.h"
#include "ref/stack.h"
#include "ref/tensor.h"
#include "ref/train/attention_bwd.h"
#include "ref/train/indexer_loss.h"
#include "ref/v4/compressor.h"

namespace indexshare::simd {

using AttentionOut = ref::AttentionOut;

// ---- dispatch (simd/dispatch.cc) -------------------------------------------------------------
// Names (hwy::TargetName) of the targets that are both compiled in and supported by this CPU,
// best first, e.g. {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"}.
std::vector<std::string> compiled_targets();
// "best" restores Highway's own choice; otherwise one of compiled_targets(). Throws Error for an
// unknown or unsupported name. Process-wide (hwy::SetSupportedTargetsForTest).
void set_target(const std::string& name);
// The target the next simd call will run on.
std::string current_target();

// ---- indexer (simd/indexer.cc) ---------------------------------------------------------------
Tensor<float> indexer_logits_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);
Tensor<float> indexer_logits_f32(const Tensor<float>& q, const Tensor<float>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

// ---- top-k (simd/topk.cc) --------------------------------------------------------------------
Tensor<int32_t> topk(const Tensor<float>& logits, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, int64_t topk);

// Fused, streaming indexer + top-k: equals ref::topk(ref::indexer_logits_fp8(q, k, k_scale,
// weights, ks, ke), ks, ke, topk) exactly (ties and errors included), without materialising the
// [s_q, s_kv] logits. Keys are walked in blocks of `key_block` columns; memory is
// O(s_q * topk + key_block * D) plus per-thread scratch of O(key_block + H * D).
Tensor<int32_t> indexer_topk_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, int64_t topk,
                                 int64_t key_block = 4096);

// ---- attention (simd/attention.cc) -----------------------------------------------------------
// Where the time of one attention call goes, in seconds summed over the threads (so the parts add
// up to `total`, which is thread count x wall time when the threads are evenly loaded). Filled when
// a call is given one; the timing (a steady_clock read at each phase boundary) costs about 1-3 %
// of the call and is off otherwise. `qk_tiles` and `pv_tiles` are the matrix part: the register
// tiles of Q.K^T (with the fold of the 8 parts and the scale) and of P.V, on operands already
// decoded to doubles in L1/L2.
struct AttentionPhases {
  double qk_tiles = 0;  // pass 1 register tiles
  double pv_tiles = 0;  // pass 3 register tiles
  double k_gather = 0;  // pass 1: gathering the kv rows and decoding them (bf16 -> f64)
  double v_gather = 0;  // pass 3: gathering V again and decoding it, slice by slice
  double q_decode = 0;  // each query row's q to f64 head tiles
  double softmax = 0;   // max, exp_portable, the sums, lse and the sink factor
  double total = 0;     // every chunk of rows, start to end (the rest: row lists, output)
  AttentionPhases& operator+=(const AttentionPhases& o);
};

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length = nullptr,
                              const Tensor<float>* attn_sink = nullptr, AttentionPhases* phases = nullptr);
AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink = nullptr, AttentionPhases* phases = nullptr);

// ---- attention backward (simd/attention_bwd.cc) ----------------------------------------------
// ref::sparse_attention_backward (ref/train/attention_bwd.h), bit-identical on every target and
// thread count: OpenMP over query rows for everything per (t, h), then over kv rows for dkv through
// an inverted index built in a fixed order (no atomics).
ref::AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                    const Tensor<bf16_t>& d_out,
                                                    const Tensor<int32_t>* topk_length = nullptr,
                                                    const Tensor<float>* attn_sink = nullptr);
// The same with the per-slot p and ds only when `slots` (ref's overload): chunks of query rows, all
// heads at once in register tiles (simd/attention_bwd.cc).
ref::AttentionBackwardOut sparse_attention_backward(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                    const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                    const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                    const Tensor<float>* attn_sink, bool slots);
// cmp::attention_backward_bounds (ref/train/attention_bwd.h), bit-identical: OpenMP over query rows
// (all heads in lanes), then over blocks of dkv columns (simd/attention_bwd_bounds.cc).
cmp::AttentionBackwardBounds attention_backward_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                                                       const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                                                       const Tensor<bf16_t>& d_out, const Tensor<int32_t>* topk_length,
                                                       const ref::AttentionBackwardOut& exact, bool delta_from_bf16_out);
// Query rows per chunk of the backward and of its bounds (tests cross chunk boundaries with it): 0,
// the default, sizes chunks by memory; any value gives the same bits.
void set_attention_backward_chunk_rows(int64_t rows);
int64_t attention_backward_chunk_rows();  // the value set

// y[i] = ref's exp_portable(x[i]) for i < n, lane by lane (the softmax exponential of attention).
void exp_portable(const double* x, double* y, int64_t n);

// ---- the oracle's computations (simd/compare.cc; indexer_logits_rule: simd/compare_logits.cc) ---
// cmp::emulate_attention_lowp, cmp::attention_bounds and cmp::indexer_logits_rule (ref/bounds.h),
// bit-identical (every sequential sum of ref's kept in one lane, in its order; ref's scalar exp /
// log calls per element). OpenMP over query rows.
AttentionOut emulate_attention_lowp(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                    float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                    const Tensor<float>* attn_sink);
cmp::AttentionBounds attention_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                      float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                      const AttentionOut& exact);
cmp::AttentionBounds attention_bounds_sm(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                         float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                                         const Tensor<float>* attn_sink, const AttentionOut& exact,
                                         const cmp::BoundsKv* shared = nullptr);
// cmp::BoundsKv for attention_bounds_sm over blocks of query rows of one kv: kv's exponent range,
// and kv in f32 and |kv| (when they take at most bounds_shared_kv_max_bytes). A call given one made
// from another kv (pointer or shape) is refused.
std::unique_ptr<cmp::BoundsKv> prepare_bounds_kv(const Tensor<bf16_t>& kv, int64_t d_qk);
cmp::FloatRule indexer_logits_rule(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                                   const Tensor<float>& weights, const Tensor<float>& exact_logits);
// attention_bounds converts kv to f32 (and |kv|) once, shared by every query row, when the rows'
// keys (s_q x topk) are at least s_kv (or a prepared BoundsKv holds them) and the two copies take
// at most this many bytes; otherwise each query row converts its own keys. The same bits either
// way; the tests set 0 to cover both.
inline int64_t bounds_shared_kv_max_bytes = int64_t(256) << 20;

// ---- the generator (simd/rng.cc) ---------------------------------------------------------------
// indexshare::fill_range and fill_range_bf16 (ref/rng.h), the same values: the whole chunks of
// the range in groups of vector lanes (one chunk's xoshiro256** stream per 64-bit lane), OpenMP
// over the groups; uniform and normal draws (the others, drawn by rejection, take ref's fill).
void fill_range(float* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag);
void fill_range_bf16(bf16_t* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag);

// ---- FP8 quantization (simd/numerics.cc) --------------------------------------------------------
// codes[i] = ref's f32_to_e4m3(x[i]) for i < n, lane by lane (every f32, NaN and infinity included).
void f32_to_e4m3(const float* x, int64_t n, e4m3_t* codes);
// indexshare::quantize_rows (ref/numerics.h), the same codes and scales and the same errors (a
// non-finite value: ref's message for the first one); OpenMP over rows.
void quantize_rows(const float* x, int64_t rows, int64_t cols, int block, ScaleRule rule, e4m3_t* codes,
                   float* scales, const std::string& what);

// ---- module level (simd/linear.cc) ------------------------------------------------------------
// y = x W^T, bit-identical to ref::linear (the register tile of the indexer with output features
// as lanes; f32 x f32 products are exact in double and the sum runs k ascending, as in ref).
Tensor<float> linear(const Tensor<float>& x, const Tensor<float>& w);
// ref::head_linear, bit-identical: the same tile per head (x rows strided by heads * in, weights
// read in place through their strides); OpenMP over heads.
Tensor<float> head_linear(const Tensor<float>& x, const ref::HeadWeights& w);
// ref::indexer_module with every projection through simd::linear: the same bits.
ref::IndexerModuleOut indexer_module(const ModelConfig& cfg, const ref::IndexerWeights& w, const Tensor<float>& x,
                                     const Tensor<float>& qr, int64_t start_pos, ref::IndexerVariant v);
// The kernel table (ref/kernels.h) of this path: linear, head_linear, logits, top-k, the fused
// streaming indexer + top-k, sparse and dense attention, the oracle's computations, the generator's
// fills and the FP8 quantization.
ref::Kernels kernels();

// ---- GLM-5.3's pooled indexer keys (simd/kpool.cc) --------------------------------------------
// ref::kpool::pool_keys, bit-identical: channels in double lanes performing ref's pool_channel
// sequence (exp_portable in lanes), OpenMP over pools; the hf_bf16 rounding runs ref's scalar
// sequence per channel. The scores, top-k and attention of a KPool layer are the existing kernels.
Tensor<float> kpool_pool_keys(const Tensor<float>& k, const Tensor<float>& z, ref::kpool::PoolRounding rounding);

// ---- stack (simd/stack.cc) -------------------------------------------------------------------
// ref::run_stack on these kernels, step for step. keep_logits = false in FP8 mode uses the
// streaming fused indexer + top-k. Logits and positions are bit-identical to ref; attention is
// bit-identical too.
std::vector<ref::StackLayerOutputs> run_stack(const Problem& p, const Schedule& schedule,
                                              const std::vector<ref::LayerInputs>& inputs, bool keep_logits = true);

// ---- training: the indexer's distillation loss (simd/indexer_loss.cc) ---------------------------
// ref::train::indexer_loss, bit-identical: OpenMP over query rows (ref's row step), dk over blocks
// of key rows with each term added across D in vector lanes (multiply then add, ref's order).
ref::train::IndexerLossOut indexer_loss(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                                        const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                        const Tensor<int32_t>* topk,
                                        const std::vector<ref::train::TeacherLayer>& teachers,
                                        const ref::train::IndexerLossOptions& o);

// ---- measurement (simd/probe.cc) --------------------------------------------------------------
// This machine's double-precision FMA peak in GFLOP/s (2 flops per lane per FMA) with `threads`
// OpenMP threads, measured now by independent FMA chains on the best target.
double fma_peak_gflops(int threads);

// ---- DeepSeek-V4 (simd/v4.cc) ------------------------------------------------------------------
// ref::v4::compress (ref/v4/compressor.h), bit-identical: one channel per double lane, OpenMP over
// windows.
Tensor<float> v4_compress(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                          const Tensor<float>& norm_weight, const ref::v4::CompressorParams& p);

}  // namespace indexshare::simd

// indexshare: the problem descriptor. One struct holds every option that changes numbers, and
// has one canonical string, so two runs differ only if their descriptors differ.
//
// Grammar: whitespace-separated tokens, each either NAME<integer> for the shape fields or
// NAME=VALUE for the options. Order is free when parsing; printing uses the order below and
// leaves out options at their default value. Every field may appear at most once.
//
//   sq    s_q            query rows (the last s_q positions of the sequence)       default 128
//   skv   s_kv           key rows; s_kv >= s_q; row t sees keys [0, s_kv - s_q + t]  default 128
//   hq    h_q            attention query heads                                      default 16
//   dqk   d_qk           attention q/k head dim (576 = 512 latent + 64 rope)        default 576
//   dv    d_v            attention value dim (the first d_v columns of kv)          default 512
//   ih    index_n_heads  indexer heads H                                            default 8
//   id    index_head_dim indexer head dim D                                         default 128
//   k     index_topk     top-k                                                      default 64
//   seed  seed           generator seed                                             default 1
//   indexer=fp8|bf16     FP8 (DeepGEMM, exact) or unquantized (HF transformers)     default fp8
//   scale=deepseek_ue8m0|flashmla_pow2|fp32_amax   scale rule of the indexer q/k    default deepseek_ue8m0
//   dist=normal|uniform|int|dyadic|ties|narrow     value distribution               default normal
//   sm=<float>           softmax scale (exact: see float_text)                      default d_qk^-0.5
//   sink=none|random|strong|pinf|ninf   attention sink per head                     default none
//                        random: drawn like the inputs; strong: the same draw plus ln(topk), so
//                        exp(sink) is about a row's whole mass of top-k near-uniform keys and
//                        leaving the sink out moves every output (a random sink holds ~1/k of it)
//   nl    n_layers       layers of the stack                                        default 1
//   sched=<schedule>     layer schedule: a preset (all-full, glm-5.2, one-full-three-shared, hy-v4),
//                        an F/S pattern, freq:N[,offset:M] or list:full,shared,...  default all-full
//   sim=<float>          cross-layer similarity of the indexer inputs, in [0, 1]    default 0.8
//   drift=<float>        layer-to-layer correlation of the layers' own indexer inputs, in
//                        [0, 1]: an AR(1) chain across layers (ref/layer.h); 0 = off, each
//                        layer's own draw independent                              default 0
//   jumps=<float>        with drift: the probability, per layer, of a larger jump   default 0
//   jumprho=<float>      with jumps: the correlation across a jump, in [0, 1]       default 0.5
//   recency=<float>      indexer bias towards recent keys, >= 0                     default 0
//   sinks=<int>          leading "attention sink" tokens the indexer favours        default 0
//   own=yes|no           Shared layers carry their own (unused) indexer inputs      default yes
//   nseq  n_seqs         sequences flattened into the s_q / s_kv rows (FlashMLA varlen
//                        style); each holds s_q/nseq queries and s_kv/nseq keys     default 1
//
// Floats print in their shortest round-trip form (float_text): sim=0.85, not 0.850000024.
//
// Example: "sq1024 skv1024 hq64 dqk576 dv512 ih64 id128 k256 seed7".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ref/rng.h"
#include "ref/numerics.h"
#include "ref/schedule.h"

namespace indexshare {

enum class IndexerMode { fp8, bf16 };
enum class SinkMode { none, random, pinf, ninf, strong };

struct Problem {
  int64_t s_q = 128;
  int64_t s_kv = 128;
  int64_t h_q = 16;
  int64_t d_qk = 576;
  int64_t d_v = 512;
  int64_t index_n_heads = 8;
  int64_t index_head_dim = 128;
  int64_t index_topk = 64;
  uint64_t seed = 1;
  IndexerMode indexer = IndexerMode::fp8;
  ScaleRule scale = ScaleRule::deepseek_ue8m0;
  Dist dist = Dist::normal;
  std::optional<float> sm;  // unset: d_qk^-0.5
  SinkMode sink = SinkMode::none;
  int64_t n_layers = 1;
  std::string sched = "all-full";
  float sim = 0.8f;
  float drift = 0.0f;
  float jumps = 0.0f;
  float jump_rho = 0.5f;
  float recency = 0.0f;
  int64_t sinks = 0;
  bool own = true;
  int64_t n_seqs = 1;

  float sm_scale() const;                  // sm, or float(1 / sqrt(d_qk))
  // Per sequence: queries, keys, and the position of the first query row.
  int64_t seq_q() const { return s_q / n_seqs; }
  int64_t seq_kv() const { return s_kv / n_seqs; }
  int64_t start_pos() const { return seq_kv() - seq_q(); }
  void validate() const;                   // throws Error naming the field
  Schedule schedule() const;               // parse_schedule(sched, n_layers)
  friend bool operator==(const Problem&, const Problem&) = default;
};

std::string to_string(const Problem& p);
Problem parse_problem(const std::string& text);  // throws Error naming the bad token

// The shortest decimal that strtof reads back as exactly v (std::to_chars' shortest form):
// problem strings, module-level descriptors and replay lines print their floats with it.
std::string float_text(float v);
// x itself, unless x is exactly an f32 value: then the double nearest float_text(float(x)), which a
// JSON writer prints as that shortest text (0.041666668, not 0.0416666679084301) and which reads
// back as the same f32. Manifests and reports write their f32 fields through it.
double f32_json(double x);

std::string indexer_mode_name(IndexerMode m);
std::string sink_mode_name(SinkMode m);

}  // namespace indexshare

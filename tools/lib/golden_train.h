// indexshare: training golden sets (kind "train"): a kernel-level stack with index sharing, its
// forward (as a "stack" set holds it) and the exact backward a training step needs.
//
// Per layer l (prefix "layers.{l}."), besides the stack set's tensors (tools/lib/golden.h):
//   attn.d_out           input   bf16 [s_q, h_q, d_v]  the gradient of the loss w.r.t. attn.out,
//                                drawn from the stream "layers.{l}.attn.d_out" (dist normal)
//   attn_bwd.delta       output  f32 [s_q, h_q]       sum_c O_c dO_c from the exact O
//   attn_bwd.p           reference f32 [s_q, h_q, topk]  P per slot (sink folded in), 0 on ignored slots
//   attn_bwd.ds          reference f32 [s_q, h_q, topk]  dS per slot (w.r.t. the scaled logit)
//   attn_bwd.dq, dq_bf16 output  f32 / bf16 [s_q, h_q, d_qk]
//   attn_bwd.dkv, dkv_bf16 output f32 / bf16 [s_kv, 1, d_qk]  K part and V part of the shared latent
//   attn_bwd.d_sink      output  f32 [h_q]             (sets with a sink)
// (ref/train/attention_bwd.h: the policies for -1, out-of-range and duplicated indices.)
// On each layer whose indexer is distilled (Full layers; ref/train/indexer_loss.h):
//   indexer_loss.p       output  f32 [s_q, s_kv]  the target (own-layer or served-layers), 0 off the support
//   indexer_loss.log_q   output  f32 [s_q, s_kv]  the student's log-softmax, 0 off the support
//   indexer_loss.kl      output  f32 [s_q]
//   indexer_loss.loss    output  f32 [1]
//   indexer_loss.d_scores output f32 [s_q, s_kv]  dI, 0 off the support
//   indexer_loss.dq      output  f32 [s_q, H, D]
//   indexer_loss.dk      output  f32 [s_kv, D]
//   indexer_loss.dw      output  f32 [s_q, H]    w.r.t. indexer.weights (H^-1/2 D^-1/2 folded in)
// The student's scores are indexer.logits (the same f32 bits: ReLU on). Shared layers carry no loss:
// their attention's gradients flow through the shared positions only (Megatron); with the
// served-layers target the Full layer's loss is distilled against the mean of its own and its
// Shared layers' teachers (IndexCache's training-aware rule).
#pragma once

#include <string>
#include <vector>

#include "ref/problem.h"
#include "tools/lib/golden.h"
#include "tools/lib/impl.h"
#include "tools/lib/kernel_registry.h"

namespace indexshare::golden {

struct TrainSpec {
  bool sparse = true;                // the loss over top-k and valid keys (else every valid key)
  std::string target = "own-layer";  // or "served-layers"
  // served-layers: what indexer_loss.kl and .loss hold (ref/train/indexer_loss.h): "kl-of-mean"
  // (KL(mean_j p_j || q), the default) or "mean-of-kl" (mean_j KL(p_j || q)); the manifest names it.
  std::string kl_form = "kl-of-mean";
  bool relu = true;                  // ReLU on the indexer's head scores (GLM-5: off)
  double loss_coeff = 1.0;
  // The policies' edge cases in every layer (--train-edges yes): the attention's indices rewritten
  // as an attention-edge set's rows 0-6 (an all -1 row, leading and middle -1, indices >= s_kv and
  // INT_MIN, a duplicated index, attn.topk_length 3 and 0), and the indexer's window emptied on
  // rows kEdgeEmptyRows (ke = ks: no valid key, so the loss's N counts s_q - 2 rows and those rows'
  // own top-k, and hence their attention, are all -1). Needs s_q >= 9 and top-k >= 3.
  bool edges = false;
  // The layers whose indexer is distilled (--loss-layers): empty, every Full layer. A Shared layer
  // is refused with the own-layer target (it has no indexer of its own: its positions are its
  // source's); with served-layers it stands for its source, whose loss it teaches.
  std::vector<int> loss_layers;
  // The upstream gradients (--d-out FILE): a safetensors file holding layers.{l}.attn.d_out, BF16
  // [s_q, h_q, d_v], for every layer and nothing else; empty: drawn from the generator. Read and
  // checked before anything is computed (Error naming the file, the tensor and the field).
  std::string d_out_file;
};
// "0,2" -> {0, 2}; Error naming the token otherwise.
std::vector<int> parse_loss_layers(const std::string& text);
inline constexpr int64_t kEdgeEmptyRows[] = {7, 8};

// The train options as the CLI spells them: " --loss dense --train-target served-layers" (defaults left out).
std::string train_options_text(const TrainSpec& t);

// The set. p: a kernel-level problem with the bf16 indexer (indexer=bf16): the loss is defined on
// the indexer's unquantized q and k; Error otherwise. The manifest's "train" block records the spec
// and the policies.
GoldenSet build_train(const Problem& p, const TrainSpec& t, const std::string& replay, Impl impl = Impl::ref);

// `golden --kind train --for KERNEL`: the registered training kernel `name` (kind "train",
// tools/lib/kernel_registry.h), after checking problem p and spec t against it (kreg::violations;
// megatron-dsa-indexer-loss also needs the own-layer target): Error listing every broken
// constraint, before anything is computed. Error for an unknown kernel or one of another kind.
const kreg::Kernel& check_train_kernel(const std::string& name, const Problem& p, const TrainSpec& t);
// The manifest's `kernel` block of a train set built from p and t (kreg::manifest_block), its
// loss_coeff and sparse_loss keyword values from t.
void for_train_kernel(GoldenSet& set, const kreg::Kernel& k, const Problem& p, const TrainSpec& t);

}  // namespace indexshare::golden

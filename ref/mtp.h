// indexshare: MTP draft steps that share the top-k (speculative decoding, chain drafting:
// vLLM's index_share_for_mtp_iteration, SGLang's skip_topk, TensorRT-LLM's MTP with DSA).
//
// A batch of R requests (the problem's sequences, nseq) runs the MTP layer's draft extend: request
// r holds `rows` query rows, the tokens the target model has just verified (the previous round's
// drafted tokens and the bonus token), at sequence positions start + j, j < rows (start =
// seq_kv - seq_q); the target accepted the first accepted[r] of them, 1 <= accepted[r] <= rows,
// and the rows after them are padding. Then, per request:
//   step 0      the MTP layer's OWN indexer, top-k and sparse attention over every row of the
//               extend, with its own weights: the MTP layer is always Full (SGLang's
//               dsa_layer_skips_topk is false for it), and a step 0 that reuses the target
//               model's top-k is a known bug (ROCm ATOM);
//   compaction  the step-0 row of the LAST ACCEPTED token is kept:
//                   last[r] = r * rows + accepted[r] - 1
//               (vLLM's buffer[:n_req] = buffer[last_token_indices]); the last PADDED row,
//               r * rows + rows - 1, is wrong whenever a request accepts fewer than `rows`;
//   step i      1 <= i < steps: skip_topk, the kept row is reused UNCHANGED (its -1 padding too)
//               and the query of the token at position p_r + i, p_r = start + accepted[r] - 1
//               (the last accepted token's), attends over it: positions <= p_r only. No source
//               adds the draft tokens p_r + 1, ... to the row, and neither does this one.
// The draft steps' tensors are stacked step-major: row (i - 1) * R + r is step i of request r.
// The attention is ref/attention.h's sparse_attention (the decode conventions: kv rows, -1
// padding, lse without the sink), taken from the kernel table so simd/ gives the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "ref/attention.h"
#include "ref/kernels.h"
#include "ref/tensor.h"

namespace indexshare::ref::mtp {

struct Draft {
  int64_t rows = 1;               // query rows per request in the draft extend (seq_q)
  int64_t start = 0;              // sequence position of each request's first extend row
  std::vector<int64_t> accepted;  // per request, in [1, rows]
  int64_t steps = 2;              // draft steps: step 0 and steps - 1 that reuse its row (>= 2)
  int64_t requests() const { return int64_t(accepted.size()); }
};

// Error naming the field ("mtp field 'accept': ...", "'steps'") unless: steps >= 2, one accepted
// length per request (n_seqs of them), each in [1, rows] (a length beyond the drafted tokens
// would compact a row the extend does not hold).
void check_draft(const Draft& d, int64_t n_seqs);

// last[r] = r * rows + accepted[r] - 1: the step-0 row of request r's last accepted token.
std::vector<int64_t> last_accepted_rows(const Draft& d);

// The rows the draft steps reuse: [(steps - 1) * R, rest...] from step0 [R * rows, rest...] (any
// trailing shape: the top-k [.., topk] or the attention's kv rows [.., 1, topk]), row
// (i - 1) * R + r a copy of step0's row last[r].
Tensor<int32_t> draft_rows(const Tensor<int32_t>& step0, const Draft& d);

// The sequence position of each draft step's query, [(steps - 1) * R]: p_r + i.
Tensor<int32_t> draft_positions(const Draft& d);

// The draft steps' attention: q [(steps - 1) * R, h_q, d_qk] over kv [s_kv, 1, d_qk] at the kv
// rows draft_rows(step-0 indices) [(steps - 1) * R, 1, topk], with the MTP layer's sink.
AttentionOut draft_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& step0_indices,
                             const Draft& d, float sm_scale, int64_t d_v, const Tensor<float>* sink,
                             const Kernels& k = {});

}  // namespace indexshare::ref::mtp

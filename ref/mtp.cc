#include "ref/mtp.h"

#include <algorithm>

#include "ref/error.h"

namespace indexshare::ref::mtp {

void check_draft(const Draft& d, int64_t n_seqs) {
  require(d.steps >= 2, "mtp field 'steps': " + std::to_string(d.steps) +
                            " draft steps: give at least 2 (step 0 runs the MTP layer's indexer, later steps reuse its row)");
  require(d.steps <= 64, "mtp field 'steps': " + std::to_string(d.steps) + " draft steps is more than 64");
  require(d.rows >= 1, "mtp: the draft extend holds no query row per request");
  require(d.requests() == n_seqs, "mtp field 'accept': " + std::to_string(d.requests()) + " accepted lengths for " +
                                      std::to_string(n_seqs) + " requests (nseq): give one per request");
  for (int64_t r = 0; r < d.requests(); ++r) {
    const int64_t a = d.accepted[size_t(r)];
    require(a >= 1, "mtp field 'accept': request " + std::to_string(r) + " accepts " + std::to_string(a) +
                        " tokens: at least 1 (the bonus token is always accepted)");
    require(a <= d.rows, "mtp field 'accept': request " + std::to_string(r) + " accepts " + std::to_string(a) +
                             " tokens, beyond the " + std::to_string(d.rows) +
                             " drafted tokens its draft extend holds (sq / nseq rows per request)");
  }
}

std::vector<int64_t> last_accepted_rows(const Draft& d) {
  std::vector<int64_t> last;
  for (int64_t r = 0; r < d.requests(); ++r) last.push_back(r * d.rows + d.accepted[size_t(r)] - 1);
  return last;
}

Tensor<int32_t> draft_rows(const Tensor<int32_t>& step0, const Draft& d) {
  const int64_t R = d.requests();
  require(step0.rank() >= 1 && step0.dim(0) == R * d.rows,
          "mtp: the step-0 rows hold " + std::to_string(step0.rank() ? step0.dim(0) : 0) + " rows, expected " +
              std::to_string(R * d.rows) + " (requests x rows)");
  const int64_t width = step0.numel() / step0.dim(0);
  Shape shape = step0.shape;
  shape[0] = (d.steps - 1) * R;
  Tensor<int32_t> out(shape);
  const std::vector<int64_t> last = last_accepted_rows(d);
  for (int64_t i = 1; i < d.steps; ++i)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < width; ++j) out[((i - 1) * R + r) * width + j] = step0[last[size_t(r)] * width + j];
  return out;
}

Tensor<int32_t> draft_positions(const Draft& d) {
  const int64_t R = d.requests();
  Tensor<int32_t> pos({(d.steps - 1) * R});
  for (int64_t i = 1; i < d.steps; ++i)
    for (int64_t r = 0; r < R; ++r) pos[(i - 1) * R + r] = int32_t(d.start + d.accepted[size_t(r)] - 1 + i);
  return pos;
}

AttentionOut draft_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& step0_indices,
                             const Draft& d, float sm_scale, int64_t d_v, const Tensor<float>* sink, const Kernels& k) {
  const Tensor<int32_t> rows = draft_rows(step0_indices, d);
  require(q.rank() == 3 && q.dim(0) == rows.dim(0), "mtp: the draft steps' q must be [(steps - 1) * requests, h_q, d_qk] = [" +
                                                        std::to_string(rows.dim(0)) + ", h_q, d_qk]");
  return k.sparse_attention(q, kv, rows, sm_scale, d_v, nullptr, sink);
}

}  // namespace indexshare::ref::mtp

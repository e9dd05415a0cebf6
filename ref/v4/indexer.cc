#include "ref/v4/indexer.h"

#include <algorithm>
#include <cmath>

#include "ref/error.h"
#include "ref/module_ops.h"

namespace indexshare::ref::v4 {

std::string rotation_name(IndexerRotation r) { return r == IndexerRotation::hadamard ? "megatron" : "hf"; }

IndexerRotation parse_rotation(const std::string& name) {
  if (name == "hf" || name == "none") return IndexerRotation::none;
  if (name == "megatron" || name == "hadamard") return IndexerRotation::hadamard;
  throw Error("indexer rotation: unknown value '" + name + "' (expected hf, none, megatron or hadamard)");
}

Tensor<int32_t> causal_block_end(int64_t T, int64_t ratio, int64_t n_blocks) {
  require(ratio >= 1, "causal_block_end: ratio must be >= 1");
  Tensor<int32_t> ke({T});
  for (int64_t t = 0; t < T; ++t) ke[t] = int32_t(std::min((t + 1) / ratio, n_blocks));
  return ke;
}

Tensor<float> index_scores(const Tensor<float>& q, const Tensor<float>& k_comp, const Tensor<float>& weights,
                           int64_t ratio, IndexerRotation rotation, const Kernels& kern) {
  require(q.rank() == 3, "v4 indexer q: expected rank 3 [T, H, D], got " + shape_str(q.shape));
  require(k_comp.rank() == 2 && k_comp.dim(1) == q.dim(2),
          "v4 indexer k_comp: expected [n_blocks, D = " + std::to_string(q.dim(2)) + "], got " + shape_str(k_comp.shape));
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), n_b = k_comp.dim(0);
  require_shape(weights, Shape{T, H}, "v4 indexer weights");
  require(D >= 1, "v4 indexer q: head dim must be >= 1");
  Tensor<int32_t> ks({T}, 0);
  const Tensor<int32_t> ke = causal_block_end(T, ratio, n_b);
  const Tensor<float> k_scale({n_b}, float(1.0 / std::sqrt(double(D))));
  if (rotation == IndexerRotation::none) return kern.logits_f32(q, k_comp, k_scale, weights, ks, ke);
  require(D <= (int64_t(1) << 30) && (D & (D - 1)) == 0,
          "v4 indexer q: the Hadamard rotation needs a power-of-two head dim, got " + std::to_string(D));
  Tensor<float> qr(q), kr(k_comp);
  for (int64_t i = 0; i < T * H; ++i) hadamard_transform(qr.ptr() + i * D, int(D));
  for (int64_t s = 0; s < n_b; ++s) hadamard_transform(kr.ptr() + s * D, int(D));
  return kern.logits_f32(qr, kr, k_scale, weights, ks, ke);
}

Tensor<int32_t> select_blocks(const Tensor<float>& scores, int64_t ratio, int64_t index_topk, const Kernels& kern) {
  require(scores.rank() == 2, "v4 indexer scores: expected rank 2 [T, n_blocks], got " + shape_str(scores.shape));
  require(index_topk >= 1, "v4 indexer index_topk: must be >= 1, got " + std::to_string(index_topk));
  const int64_t T = scores.dim(0), n_b = scores.dim(1), k = std::min(index_topk, n_b);
  if (k == 0) return Tensor<int32_t>({T, 0});
  const Tensor<int32_t> ks({T}, 0);
  return kern.topk(scores, ks, causal_block_end(T, ratio, n_b), k);
}

}  // namespace indexshare::ref::v4

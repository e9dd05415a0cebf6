// indexshare: correct training kernels in other arithmetic, the calibration set of the gradient
// judge (judge/gradients.cc): what `calibrate --families` hands in on training sets and what the
// training tests judge.
//
// Indexer loss (ref/train/indexer_loss.h semantics, Megatron's arithmetic in f32): for layer l of a
// training set, per query row t over its support R(t) (the set's rule: the valid keys, or the top-k
// among them) the student scores I = sum_h w'[t,h] ReLU(q . k) (or without ReLU), the teacher p
// (each teacher layer's head softmaxes summed, normalised by max(sum, 1e-10), averaged over the
// teachers), log q = I - logsumexp(I), kl, the loss over the N valid rows, d_scores, dw, dq, dk.
// Every sum runs in f32, in an order drawn from `seed` (keys, heads, dimensions, rows); exp and
// log are std::exp and std::log in f32. It returns the layer's indexer_loss.{p, log_q, kl, loss,
// d_scores, dq, dk, dw}, keyed by that suffix. The KL is that of the averaged target (the set's
// kl-of-mean form; a set in the other form is refused).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ref/tensor.h"
#include "tools/lib/golden.h"

namespace indexshare::emul {

std::map<std::string, Tensor<float>> indexer_loss_f32(const golden::Loaded& g, int l, uint64_t seed);

}  // namespace indexshare::emul

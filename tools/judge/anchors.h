// indexshare diff: the anchors' tolerances, how the GPU kernels we validate test themselves, in one
// place with their sources. The judge applies them on top of its derived bounds (walk.cc).
#pragma once

namespace indexshare::diff::detail {

// The anchors (FlashMLA's tests/test_flash_mla_sparse_prefill.py and test_flash_mla_sparse_decoding.py,
// DeepGEMM's tests/test_attention.py with deep_gemm/testing/numeric.py) applied on top of the
// derived bounds, so the judge is never looser than the kernels' own tests on the same data.
//   attn.out   FlashMLA check_is_allclose: |err| < abs_tol or |err| / (|ref| + 1e-6) < rel_tol per
//              element, and cos_diff (= calc_diff) <= 7e-6 (prefill; decode: abs 1e-3, rel 2.01/128,
//              cos_diff 5e-6). FlashMLA's abs_tol 8e-4 is stated for its test data, kv ~ N(0, 0.1^2):
//              an absolute tolerance is in units of the data, so ours is abs_tol * max(1, rms(V) / 0.1)
//              (looser than the anchor's number only when our values are larger, equal in meaning).
//   lse, max_logits  abs 1e-6 or rel 2.01/65536 (decode lse: rel 8.01/65536); FlashMLA's logits
//              are O(1), so the absolute part is scaled by max(1, rms(max_logits)) likewise.
//   indexer.logits   DeepGEMM: calc_diff < 5e-6 against the simulated (quantize-dequantized)
//              reference, which our exact logits are.
constexpr double kFlashMlaOutAbs = 8e-4, kFlashMlaOutRel = 3.01 / 128, kFlashMlaOutCos = 7e-6;
constexpr double kFlashMlaDecodeOutAbs = 1e-3, kFlashMlaDecodeOutRel = 2.01 / 128, kFlashMlaDecodeOutCos = 5e-6;
constexpr double kFlashMlaLseAbs = 1e-6, kFlashMlaLseRel = 2.01 / 65536, kFlashMlaDecodeLseRel = 8.01 / 65536;
constexpr double kFlashMlaDataRms = 0.1;
constexpr double kDeepGemmLogitsDiff = 5e-6;

}  // namespace indexshare::diff::detail

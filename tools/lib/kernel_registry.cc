#include "tools/lib/kernel_registry.h"

#include <algorithm>

#include "ref/error.h"

namespace indexshare::kreg {

namespace {

using S = std::vector<std::string>;

// FlashMLA's sparse prefill (its README and tests/test_flash_mla_sparse_prefill.py): the same call on SM90 and SM100, different top-k
// divisibility.
Kernel flashmla_prefill(const std::string& name, std::vector<Constraint> topk_rules) {
  Kernel k;
  k.name = name;
  k.library = "FlashMLA";
  k.call = "out, max_logits, lse = flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)";
  k.kind = "stack";
  k.constraints = {{"h_q", {64, 128}, 0, "", 0, "FlashMLA tests/test_flash_mla_sparse_prefill.py; csrc/api/sparse_fwd.h"},
                   {"d_qk", {576, 512}, 0, "", 0, "FlashMLA tests/test_flash_mla_sparse_prefill.py (576: V3.2, 512: MODEL1)"},
                   {"d_v", {512}, 0, "", 0, "FlashMLA tests/test_flash_mla_sparse_prefill.py"}};
  for (Constraint& c : topk_rules) k.constraints.push_back(std::move(c));
  k.args = {{"q", "layers.{l}.attn.q", "BF16", S{"s_q", "h_q", "d_qk"}, false, false, ""},
            {"kv", "layers.{l}.attn.kv", "BF16", S{"s_kv", "1", "d_qk"}, false, false, "h_kv = 1"},
            {"indices", "layers.{l}.attn.indices", "I32", S{"s_q", "1", "topk"}, false, false, "absolute kv rows, -1 padded"},
            {"attn_sink", "layers.{l}.attn.sink", "F32", S{"h_q"}, false, true, "only in sets with sink="},
            {"topk_length", "layers.{l}.attn.topk_length", "I32", S{"s_q"}, false, true, "only in attention-edge sets"}};
  k.outputs = {{"out", "layers.{l}.attn.out", "BF16", S{"s_q", "h_q", "d_v"}, false, false, "diff reads BF16 or F32"},
               {"max_logits", "layers.{l}.attn.max_logits", "F32", S{"s_q", "h_q"}, false, false, ""},
               {"lse", "layers.{l}.attn.lse", "F32", S{"s_q", "h_q"}, false, false, "natural log, without the sink"}};
  k.kwargs = {{"sm_scale", "config.sm_scale"}, {"d_v", "512"}};
  k.conventions = {"invalid index: FlashMLA ignores -1 and any value >= s_kv; we ignore every index outside [0, s_kv) (the same "
                   "outputs for every index the kernel accepts)",
                   "lse and max_logits in natural-log units (HEAD); the V3.2 release (1858932) wrote them in base 2: diff names it",
                   "empty rows: out 0, lse +inf, max_logits -inf, as HEAD"};
  k.source = "FlashMLA tests/test_flash_mla_sparse_prefill.py, flash_mla/flash_mla_interface.py, csrc/api/sparse_fwd.h";
  return k;
}

// The training kernels (kind "train", tools/lib/golden_train.h): TileLang's sparse MLA backward and
// Megatron-LM's indexer KL loss. Both mask causally with the queries aligned to the keys at 0
// (query row s sees keys <= s): the set's rows must be the whole sequence (q_offset = s_kv - s_q = 0).
void add_train_kernels(std::vector<Kernel>& v) {
  {
    Kernel k;
    k.name = "tilelang-sparse-mla-bwd";
    k.library = "TileLang";
    k.call = "dq, dkv = sparse_mla_bwd(q, kv, o, do, indices, lse, sm_scale=sm_scale, is_casual=True)";
    k.kind = "train";
    const std::string src = "tile-ai/tilelang examples/deepseek_v32/sparse_mla_bwd.py";
    k.constraints = {{"h_q", {64, 128}, 0, "", 0, src + " (CI: H 64 and 128)"},
                     {"d_qk", {576}, 0, "", 0, src + " (D 512 + D_tail 64)"},
                     {"d_v", {512}, 0, "", 0, src + " (D = 512)"},
                     {"topk", {}, 64, "", 0, src + " (topk in blocks; test_tilelang_example_deepseek_v32.py)"},
                     {"q_offset", {0}, 0, "", 0, src + " (causal only: index <= query row, queries aligned with keys at 0)"}};
    k.args = {{"q", "layers.{l}.attn.q", "BF16", S{"1", "s_q", "h_q", "d_qk"}, true, false, "attn.q [s_q, h_q, d_qk] viewed with B = 1"},
              {"kv", "layers.{l}.attn.kv", "BF16", S{"1", "s_kv", "1", "d_qk"}, true, false, "kv_group 1"},
              {"o", "layers.{l}.attn.out_bf16", "BF16", S{"1", "s_q", "h_q", "d_v"}, true, false,
               "Delta = sum_c o * do is computed from it in f32"},
              {"do", "layers.{l}.attn.d_out", "BF16", S{"1", "s_q", "h_q", "d_v"}, true, false, ""},
              {"indices", "layers.{l}.attn.indices", "I32", S{"1", "s_q", "1", "topk"}, true, false,
               "-1 padded: replace -1 with s_kv before the call (see conventions)"},
              {"lse", "layers.{l}.attn.lse", "F32", S{"1", "s_q", "h_q"}, true, false,
               "natural log here; the kernel takes base 2: lse * log2(e)"}};
    k.outputs = {{"dq", "layers.{l}.attn_bwd.dq", "F32", S{"1", "s_q", "h_q", "d_qk"}, true, false,
                  "the kernel writes bf16: compare with attn_bwd.dq (f32) or attn_bwd.dq_bf16"},
                 {"dkv", "layers.{l}.attn_bwd.dkv", "F32", S{"1", "s_kv", "1", "d_qk"}, true, false,
                  "f32 atomics cast to bf16 at the end: compare with attn_bwd.dkv or attn_bwd.dkv_bf16"}};
    k.kwargs = {{"sm_scale", "config.sm_scale"}, {"is_casual", "True"}};
    k.conventions = {
        "lse: TileLang's forward writes it in base 2 (log2 sum exp2(...)); the set's attn.lse is natural log: pass "
        "attn.lse * log2(e) (1.4426950408889634), and read a TileLang lse back as lse_2 * ln(2)",
        "dS: the set's attn_bwd.ds is dL/d(scaled logit); TileLang's dS is sm_scale times it",
        "duplicated indices: each occurrence is one softmax term and adds its own dkv contribution, as the kernel's "
        "atomics do",
        "invalid index: the set ignores every index outside [0, s_kv) (no gradient). TileLang's deepseek_v32 example "
        "masks only index > query row, so -1 passes as a key (and reads kv[-1]): replace -1 with s_kv (its padding "
        "value) before the call; the dsa_sparse_finetune variant excludes -1 itself",
        "causal: the kernel masks index > query row, queries aligned with keys at 0: the set's rows are the whole "
        "sequence (s_q = s_kv)",
        "similarity: dq and dkv pass TileLang's test when 1 - 2 sum(x y) / sum(x^2 + y^2) <= 1e-4 (utils.py "
        "assert_tensors_similar)"};
    k.source = "tile-ai/tilelang examples/deepseek_v32/sparse_mla_bwd.py (sparse_mla_bwd, ref_sparse_mla_bwd_interface), "
               "examples/deepseek_v32/sparse_mla_fwd.py, examples/deepseek_v32/utils.py, "
               "examples/deepseek_v32/test_tilelang_example_deepseek_v32.py";
    v.push_back(k);
  }
  {
    Kernel k;
    k.name = "megatron-dsa-indexer-loss";
    k.library = "Megatron-LM";
    k.call = "index_scores = sum_h weights[s, h] * relu(q[s, h] . k[t]); loss = compute_dsa_indexer_loss(index_scores, "
             "topk_indices, query, key, softmax_scale, loss_coeff, sparse_loss=True, pg_collection); loss.backward()";
    k.kind = "train";
    k.per_full_layer = true;
    const std::string src = "NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/dsa_indexer_loss.py";
    k.constraints = {{"indexer_bf16", {1}, 0, "", 0, src + " (the loss on the indexer's unquantized q and k)"},
                     {"q_offset", {0}, 0, "", 0, src + " (causal mask over [sq, skv], queries aligned with keys at 0)"}};
    k.args = {{"q", "layers.{l}.indexer.q", "BF16", S{"s_q", "H", "D"}, false, false, "the indexer's query (requires_grad)"},
              {"k", "layers.{l}.indexer.k", "BF16", S{"s_kv", "D"}, false, false, "the indexer's key, shared by its heads"},
              {"weights", "layers.{l}.indexer.weights", "F32", S{"s_q", "H"}, false, false,
               "w' with H^-1/2 D^-1/2 folded in"},
              {"query", "layers.{l}.attn.q", "BF16", S{"s_q", "1", "h_q", "d_qk"}, true, false,
               "the teacher: this Full layer's own attention query, detached ([sq, b, np, hn])"},
              {"key", "layers.{l}.attn.kv", "BF16", S{"s_kv", "1", "1", "d_qk"}, true, false,
               "the teacher's key: the shared latent, detached"},
              {"topk_indices", "layers.{l}.indexer.topk", "I32", S{"1", "s_q", "topk"}, true, false,
               "-1 padded; Megatron's scatter_ rejects -1: replace each -1 by its row's slot 0 before the call (see "
               "conventions)"}};
    k.outputs = {{"loss", "layers.{l}.indexer_loss.loss", "F32", S{"1"}, false, false, ""},
                 {"dq", "layers.{l}.indexer_loss.dq", "F32", S{"s_q", "H", "D"}, false, false, "q.grad"},
                 {"dk", "layers.{l}.indexer_loss.dk", "F32", S{"s_kv", "D"}, false, false, "k.grad"},
                 {"dw", "layers.{l}.indexer_loss.dw", "F32", S{"s_q", "H"}, false, false, "weights.grad"}};
    k.kwargs = {{"softmax_scale", "config.sm_scale"}, {"loss_coeff", "1.0"}, {"sparse_loss", "True"}};
    k.conventions = {
        "N = the query rows with at least one valid key, at least 1: loss = loss_coeff * sum_rows KL / N",
        "sparse support = top-k intersected with the valid (causal) keys; a duplicated index counts once (the "
        "scatter mask); dense sets (--loss dense) use every valid key",
        "-1 substitution: topk_indices' -1 slots (rows shorter than top-k) must become a valid index before the call, "
        "since torch's scatter_ rejects -1; replace each by its row's slot 0 (always a valid key: causal rows see key 0): "
        "a duplicate, which the scatter mask counts once, so the support and the loss are unchanged",
        "ReLU on the head scores (dsa_indexer_scoring_relu; GLM-5 turns it off: sets written with --relu no)",
        "teacher: the Full layer's own attention only (p = sum_h softmax(scale q k^T) renormalized); Shared layers "
        "carry no loss; the served-layers target is not Megatron's",
        "tolerance: Megatron's TileLang tests use rtol = atol = 2e-2 for the forward and 5e-2 for the backward"};
    k.source = "NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/dsa_indexer_loss.py "
               "(compute_dsa_indexer_loss), experimental_attention_variant/dsa.py, experimental_attention_variant/dsa_masking.py";
    v.push_back(k);
  }
}

// FlashMLA's sparse decode on the V32 FP8 cache (page 64, 656 bytes a token).
Kernel flashmla_decode() {
  Kernel k;
  k.name = "flashmla-sparse-decode";
  k.library = "FlashMLA";
  k.call = "sched_meta, _ = get_mla_metadata(); out, lse = flash_mla_with_kvcache(q, k_cache, None, None, 512, sched_meta, None, "
           "softmax_scale=softmax_scale, causal=False, is_fp8_kvcache=True, indices=indices, attn_sink=attn_sink)";
  k.kind = "decode";
  k.constraints = {{"d_qk", {576}, 0, "", 0, "FlashMLA tests/test_flash_mla_sparse_decoding.py (the V32 FP8 cache, 656 B/token)"},
                   {"d_v", {512}, 0, "", 0, "FlashMLA tests/test_flash_mla_sparse_decoding.py"},
                   {"topk", {}, 64, "", 0, "FlashMLA tests/test_flash_mla_sparse_decoding.py (TOPK_BLOCK_SIZE 64 on SM90 and SM100)"}};
  k.args = {{"q", "layers.{l}.attn.q", "BF16", S{"b", "next_n", "h_q", "d_qk"}, true, false, "attn.q [b * next_n, h_q, d_qk] viewed"},
            {"k_cache", "layers.{l}.attn.kv_cache_fp8", "U8", S{"num_blocks", "64", "1", "656"}, false, false, "V32_FP8Sparse, page 64"},
            {"indices", "layers.{l}.attn.indices_physical", "I32", S{"b", "next_n", "topk"}, false, false, "physical slots, -1 padded"},
            {"attn_sink", "layers.{l}.attn.sink", "F32", S{"h_q"}, false, true, "only in sets with sink="}};
  k.outputs = {{"out", "layers.{l}.attn.out", "BF16", S{"b", "next_n", "h_q", "d_v"}, true, false, "reshape to [s_q, h_q, d_v]"},
               {"lse", "layers.{l}.attn.lse", "F32", S{"b", "h_q", "next_n"}, true, false,
                "the kernel's lse is [b, h_q, next_n]: transpose(1, 2) then reshape to [s_q, h_q]"}};
  k.kwargs = {{"softmax_scale", "config.sm_scale"}, {"head_dim_v", "512"}, {"is_fp8_kvcache", "True"}, {"causal", "False"}};
  k.conventions = {"invalid index: FlashMLA's decode reference treats only -1 as invalid (other negative values are clamped to slot "
                   "0 and attended); we ignore every index outside [0, s_kv): the checked-in decode sets use -1 only",
                   "topk_length is per batch [b] in the kernel, per query row [s_q] in our sets",
                   "the reference attention runs on the FP8-dequantized latent (attn.kv), as FlashMLA's tests do"};
  k.source = "FlashMLA tests/test_flash_mla_sparse_decoding.py, flash_mla/flash_mla_interface.py, csrc/api/sparse_decode.h, tests/quant.py";
  return k;
}

// FlashMLA's sparse prefill at MODEL1's shapes: d_qk 512 = d_v 512 with the per-head sink.
Kernel flashmla_prefill_model1() {
  Kernel k = flashmla_prefill("flashmla-sparse-prefill-model1",
                              {{"topk", {}, 128, "", 0, "csrc/sm90/prefill/sparse/phase1.cuh (128; SM100 needs 64 or 128)"}});
  k.constraints[1] = {"d_qk", {512}, 0, "", 0, "flash_mla/flash_mla_interface.py (MODEL1: d_qk 512 = [NoPE 448 | RoPE 64])"};
  k.constraints.push_back({"sink", {1}, 0, "", 0, "tests/test_flash_mla_sparse_prefill.py (MODEL1 runs with attn_sink)"});
  for (Constraint& c : k.constraints)
    if (c.source.rfind("FlashMLA tests/test_flash_mla_sparse_prefill.py", 0) == 0) c.source = "flash_mla/flash_mla_interface.py, csrc/api/sparse_fwd.h";
  k.args[3].optional = false;
  k.args[3].note = "per-head sink [h_q] f32: out *= 1 / (1 + exp(sink - lse))";
  k.conventions.push_back("d_qk 512 = d_v 512: V is all 512 columns of kv (K = V)");
  k.conventions.push_back("lse [s_q, h_q] natural log WITHOUT the sink; the sink scales out only");
  k.source = "flash_mla/flash_mla_interface.py (flash_mla_sparse_fwd), tests/ref.py (ref_sparse_attn_fwd), "
             "tests/test_flash_mla_sparse_prefill.py";
  return k;
}

// FlashMLA's two-scope sparse decode on the MODEL1 FP8 cache (the window and the compressed entries).
Kernel flashmla_decode_model1() {
  Kernel k;
  k.name = "flashmla-sparse-decode-model1";
  k.library = "FlashMLA";
  k.call = "sched_meta, _ = get_mla_metadata(); out, lse = flash_mla_with_kvcache(q, k_cache_view, None, None, 512, sched_meta, "
           "None, softmax_scale=softmax_scale, causal=False, is_fp8_kvcache=True, indices=indices, attn_sink=attn_sink, "
           "extra_k_cache=extra_k_cache_view, extra_indices_in_kvcache=extra_indices, topk_length=topk_length, "
           "extra_topk_length=extra_topk_length)";
  k.kind = "decode-model1";
  // Checked on the model1 spec (golden::model1_violations: topk = the window, extra_topk).
  k.constraints = {{"h_q", {64, 128}, 0, "", 0, "csrc/api/sparse_decode.h"},
                   {"topk", {}, 64, "", 0, "csrc/api/sparse_decode.h (TOPK_BLOCK_SIZE 64 on SM90 and SM100)"},
                   {"extra_topk", {}, 64, "", 0, "csrc/api/sparse_decode.h (the extra scope's top-k, same blocks)"}};
  k.args = {{"q", "layers.{l}.attn.q", "BF16", S{"b", "next_n", "h_q", "d_qk"}, true, false, "attn.q [b * next_n, h_q, 512] viewed"},
            {"k_cache", "layers.{l}.attn.model1.k_cache", "U8", S{"num_blocks", "block_bytes"}, false, false,
             "the real bytes; the kernel takes the view kernel.views.k_cache: [num_blocks, B, 1, 584] with byte strides "
             "(block_bytes, 584, 584, 1)"},
            {"indices", "layers.{l}.attn.model1.indices", "I32", S{"b", "next_n", "topk"}, false, false,
             "physical slots of k_cache (the sliding window), -1 padded"},
            {"topk_length", "layers.{l}.attn.model1.topk_length", "I32", S{"b"}, false, false, "per batch: slots j >= it are ignored"},
            {"extra_k_cache", "layers.{l}.attn.model1.extra_k_cache", "U8", S{"extra_num_blocks", "extra_block_bytes"}, false, false,
             "the real bytes; the view kernel.views.extra_k_cache (its own block size)"},
            {"extra_indices_in_kvcache", "layers.{l}.attn.model1.extra_indices", "I32", S{"b", "next_n", "extra_topk"}, false, false,
             "physical slots of extra_k_cache (the compressed entries), -1 padded"},
            {"extra_topk_length", "layers.{l}.attn.model1.extra_topk_length", "I32", S{"b"}, false, false, "per batch"},
            {"attn_sink", "layers.{l}.attn.sink", "F32", S{"h_q"}, false, false, "per-head sink"}};
  k.outputs = {{"out", "layers.{l}.attn.out", "BF16", S{"b", "next_n", "h_q", "d_v"}, true, false, "reshape to [b * next_n, h_q, 512]"},
               {"lse", "layers.{l}.attn.lse", "F32", S{"b", "h_q", "next_n"}, false, false,
                "the kernel's lse is [b, h_q, next_n]: transpose(1, 2) then reshape to [b * next_n, h_q]", {1, 2}}};
  k.kwargs = {{"softmax_scale", "config.sm_scale"}, {"head_dim_v", "512"}, {"is_fp8_kvcache", "True"}, {"causal", "False"}};
  k.conventions = {"both scopes join ONE softmax with the per-head sink; lse [b, h_q, s_q] natural log WITHOUT the sink",
                   "invalid slot: index -1, or slot j >= topk_length[b] (extra: extra_topk_length[b]); NaN in a gathered kv row "
                   "counts as 0 (FlashMLA's ref)",
                   "V = all 512 columns (K = V); empty rows: out 0, lse +inf",
                   "the reference runs on the FP8-dequantized kv (bf16(e4m3) * bf16(e8m0), exact): attn.kv is both caches' "
                   "dequantized slots, attn.indices the combined index list (tools/lib/paged_model1.h)"};
  k.source = "flash_mla/flash_mla_interface.py (flash_mla_with_kvcache), tests/quant.py (MODEL1_FP8Sparse quantize_k_cache, "
             "dequantize_k_cache), tests/ref.py (ref_sparse_attn_decode), tests/test_flash_mla_sparse_decoding.py";
  return k;
}

// DeepGEMM's fp8_mqa_logits with the head counts and head dims its tests run (src names them).
Kernel deepgemm_mqa(const std::string& name, std::vector<int64_t> heads, std::vector<int64_t> dims, const std::string& src) {
  Kernel k;
  k.name = name;
  k.library = "DeepGEMM";
  k.call = "logits = fp8_mqa_logits(q, (kv, kv_scale), weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True)";
  k.kind = "stack";
  k.per_full_layer = true;
  k.constraints = {{"index_n_heads", std::move(heads), 0, "", 0, src},
                   {"index_head_dim", std::move(dims), 0, "", 0, src},
                   {"indexer_fp8", {1}, 0, "", 0, "DeepGEMM tests/test_attention.py (e4m3 q and k)"}};
  k.args = {{"q", "layers.{l}.indexer.q", "F8_E4M3", S{"s_q", "H", "D"}, false, false, "no scale: folded into weights"},
            {"kv", "layers.{l}.indexer.k", "F8_E4M3", S{"s_kv", "D"}, false, false, ""},
            {"kv_scale", "layers.{l}.indexer.k_scale", "F32", S{"s_kv"}, false, false, ""},
            {"weights", "layers.{l}.indexer.weights", "F32", S{"s_q", "H"}, false, false, ""},
            {"cu_seq_len_k_start", "layers.{l}.indexer.ks", "I32", S{"s_q"}, false, false, "half-open window [ks, ke)"},
            {"cu_seq_len_k_end", "layers.{l}.indexer.ke", "I32", S{"s_q"}, false, false, ""}};
  k.outputs = {{"logits", "layers.{l}.indexer.logits", "F32", S{"s_q", "s_kv"}, false, true,
                "the kernel's output has a padded row stride: .contiguous() before saving; not in sets written with "
                "--no-logits (diff computes them)"}};
  k.kwargs = {{"clean_logits", "True"}};
  k.conventions = {"with clean_logits=False the entries outside [ks, ke) are garbage: write -inf there before diff"};
  k.source = "DeepGEMM tests/test_attention.py, csrc/apis/attention.hpp";
  return k;
}

// DeepGEMM's fp8_paged_mqa_logits on the paged indexer cache, with the 2-D context_lens.
Kernel deepgemm_paged_mqa() {
  Kernel k;
  k.name = "deepgemm-fp8-paged-mqa-logits";
  k.library = "DeepGEMM";
  k.call = "schedule_meta = get_paged_mqa_logits_metadata(context_lens, 64, get_num_sms()); logits = fp8_paged_mqa_logits(q, "
           "kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits=False)";
  k.kind = "decode";
  k.per_full_layer = true;
  k.constraints = {{"index_n_heads", {32, 64}, 0, "", 0, "DeepGEMM tests/test_attention.py (SM90)"},
                   {"index_head_dim", {128}, 0, "", 0, "DeepGEMM tests/test_attention.py"},
                   {"next_n", {1, 2}, 0, "", 0, "DeepGEMM tests/test_attention.py (SM90 next_n 1 or 2)"},
                   {"indexer_fp8", {1}, 0, "", 0, "DeepGEMM tests/test_attention.py"}};
  k.args = {{"q", "layers.{l}.indexer.q", "F8_E4M3", S{"b", "next_n", "H", "D"}, true, false, "indexer.q [b * next_n, H, D] viewed"},
            {"kv_cache", "layers.{l}.indexer.k_cache", "U8", S{"num_blocks", "64", "1", "D+4"}, false, false,
             "per block all 64 x D fp8 bytes, then the 64 f32 scales"},
            {"weights", "layers.{l}.indexer.weights", "F32", S{"s_q", "H"}, false, false, "[b * next_n, H]"},
            {"context_lens", "context_lens", "I32", S{"b", "next_n"}, false, false,
             "2-D: context_lens[b, j] = cache_seqlens[b] - next_n + j + 1, row b * next_n + j sees keys [0, context_lens[b, j])"},
            {"block_table", "block_table", "I32", S{"b", "max_blocks"}, false, false, ""}};
  k.outputs = {{"logits", "layers.{l}.indexer.logits", "F32", S{"s_q", "s_kv"}, false, true,
                "the kernel's [b * next_n, max_context_len] over each sequence's own keys: place row r's columns at ks[r] + c, "
                "-inf elsewhere; not in sets written with --no-logits (diff computes them)"}};
  k.kwargs = {{"max_context_len", "max_context_len"}, {"clean_logits", "False"}};
  k.conventions = {"clean_logits=False leaves the values outside each row's window unspecified: diff sets them to -inf itself "
                   "for a set with this block (mask them before diff against any other set)",
                   "context_lens is the 2-D [b, next_n] form (tensor context_lens); the 1-D form cache_seqlens [b] means the "
                   "same windows (cache_seqlens[b] - next_n + j + 1 for row j)",
                   "schedule_meta = get_paged_mqa_logits_metadata(context_lens, 64, num_sms): scheduling only, not in the set"};
  k.source = "DeepGEMM tests/test_attention.py; csrc/apis/attention.hpp";
  return k;
}

std::vector<Kernel> make() {
  std::vector<Kernel> v;
  v.push_back(flashmla_prefill("flashmla-sparse-prefill-sm90",
                               {{"topk", {}, 128, "", 0, "FlashMLA tests/test_flash_mla_sparse_prefill.py; csrc/sm90/prefill/sparse/phase1.cuh"}}));
  v.push_back(flashmla_prefill("flashmla-sparse-prefill-sm100",
                               {{"topk", {}, 64, "", 0, "FlashMLA tests/test_flash_mla_sparse_prefill.py (head64 and small-topk path)"},
                                {"topk", {}, 128, "h_q", 128, "FlashMLA tests/test_flash_mla_sparse_prefill.py (head128 regular path)"}}));
  v.push_back(flashmla_decode());
  // MODEL1 (DeepSeek-V4): the prefill at d_qk 512 = d_v 512 with the per-head sink, and the two-scope
  // decode on the MODEL1 FP8 cache (tools/lib/paged_model1.h, tools/lib/golden_model1.h).
  v.push_back(flashmla_prefill_model1());
  v.push_back(flashmla_decode_model1());
  v.push_back(deepgemm_mqa("deepgemm-fp8-mqa-logits-sm90", {32, 64}, {128}, "DeepGEMM tests/test_attention.py (SM90 tests: H 32 or 64, D 128)"));
  v.push_back(deepgemm_mqa("deepgemm-fp8-mqa-logits-sm100", {8, 16, 32, 64}, {32, 64, 128}, "DeepGEMM tests/test_attention.py (SM100 tests: H 8-64, D 32-128)"));
  v.push_back(deepgemm_paged_mqa());
  add_train_kernels(v);
  return v;
}

}  // namespace

const std::vector<Kernel>& kernels() {
  static const std::vector<Kernel> v = make();
  return v;
}

const Kernel& kernel(const std::string& name) {
  std::string names;
  for (const Kernel& k : kernels()) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  throw Error("--for: unknown kernel '" + name + "' (expected one of " + names + ")");
}

int64_t field(const Problem& p, const std::string& f) {
  if (f == "h_q") return p.h_q;
  if (f == "d_qk") return p.d_qk;
  if (f == "d_v") return p.d_v;
  if (f == "topk") return p.index_topk;
  if (f == "index_n_heads" || f == "H") return p.index_n_heads;
  if (f == "index_head_dim" || f == "D") return p.index_head_dim;
  if (f == "s_q") return p.s_q;
  if (f == "s_kv") return p.s_kv;
  if (f == "b") return p.n_seqs;
  if (f == "next_n") return p.seq_q();
  if (f == "indexer_fp8") return p.indexer == IndexerMode::fp8 ? 1 : 0;
  if (f == "sink") return p.sink == SinkMode::random || p.sink == SinkMode::strong ? 1 : 0;  // a finite sink per head
  if (f == "indexer_bf16") return p.indexer == IndexerMode::bf16 ? 1 : 0;
  if (f == "q_offset") return p.s_kv - p.s_q;  // one sequence: query row i sits at key position q_offset + i
  throw Error("kernel registry: unknown field '" + f + "'");
}

std::vector<std::string> violations(const Kernel& k, const Problem& p) {
  return violations(k, [&](const std::string& f) { return field(p, f); });
}

std::vector<std::string> violations(const Kernel& k, const std::map<std::string, int64_t>& values) {
  return violations(k, [&](const std::string& f) {
    const auto it = values.find(f);
    if (it == values.end()) throw Error("kernel registry: " + k.name + ": no value for field '" + f + "'");
    return it->second;
  });
}

std::vector<std::string> violations(const Kernel& k, const std::function<int64_t(const std::string&)>& value) {
  std::vector<std::string> out;
  for (const Constraint& c : k.constraints) {
    if (!c.when_field.empty() && value(c.when_field) != c.when_value) continue;
    const int64_t v = value(c.field);
    std::string need;
    if (!c.one_of.empty() && std::find(c.one_of.begin(), c.one_of.end(), v) == c.one_of.end()) {
      if (c.field == "indexer_fp8") need = "the FP8 indexer (indexer=fp8)";
      else if (c.field == "sink") need = "a per-head attention sink (sink=random)";
      else if (c.field == "indexer_bf16") need = "the bf16 indexer (indexer=bf16)";
      else if (c.field == "q_offset") need = "the whole sequence as query rows (s_q = s_kv)";
      else
        for (size_t i = 0; i < c.one_of.size(); ++i)
          need += (i == 0 ? "" : i + 1 == c.one_of.size() ? " or " : ", ") + std::to_string(c.one_of[i]);
    }
    if (c.multiple_of && v % c.multiple_of != 0) need = "a multiple of " + std::to_string(c.multiple_of);
    if (need.empty()) continue;
    const std::string when = c.when_field.empty() ? "" : " when " + c.when_field + " is " + std::to_string(c.when_value);
    const std::string what = c.field == "indexer_fp8"    ? std::string("indexer=bf16")
                             : c.field == "indexer_bf16" ? std::string("indexer=fp8")
                                                         : c.field + " " + std::to_string(v);
    out.push_back(what + ": " + k.name + " takes " + need + when + " (" + c.source + ")");
  }
  return out;
}

nlohmann::json manifest_block(const Kernel& k, const Problem& p, float sm_scale, const nlohmann::json& layers,
                              const std::map<std::string, int64_t>& extra) {
  auto dim = [&](const std::string& s) -> int64_t {
    if (const auto it = extra.find(s); it != extra.end()) return it->second;
    if (s == "D+4") return p.index_head_dim + 4;
    if (!s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return std::stoll(s);
    return field(p, s);
  };
  auto arg_json = [&](const Arg& a) {
    nlohmann::json shape = nlohmann::json::array();
    for (const std::string& s : a.shape) shape.push_back(dim(s));
    nlohmann::json j = {{"name", a.name}, {"tensor", a.tensor}, {"dtype", a.dtype}, {"shape", shape}, {"shape_symbols", a.shape},
                        {"view", a.view}, {"optional", a.optional}};
    if (a.transpose.first >= 0) j["transpose"] = {a.transpose.first, a.transpose.second};
    if (!a.note.empty()) j["note"] = a.note;
    return j;
  };
  nlohmann::json args = nlohmann::json::array(), outs = nlohmann::json::array(), kw = nlohmann::json::object(), ls = nlohmann::json::array();
  for (const Arg& a : k.args) args.push_back(arg_json(a));
  for (const Arg& a : k.outputs) outs.push_back(arg_json(a));
  for (const auto& [n, v] : k.kwargs) {
    if (v == "config.sm_scale") kw[n] = sm_scale;
    else if (v == "512") kw[n] = 512;
    else if (v == "max_context_len") kw[n] = p.seq_kv();  // every sequence of a decode set holds seq_kv tokens
    else if (v == "True" || v == "False") kw[n] = v == "True";
    else if (v == "1.0") kw[n] = 1.0;
    else kw[n] = v;  // any other expression, as written
  }
  for (const nlohmann::json& l : layers)
    if (!k.per_full_layer || l["kind"] == "full") ls.push_back(l["index"]);
  return {{"name", k.name}, {"library", k.library}, {"call", k.call}, {"layers", ls}, {"args", args}, {"outputs", outs},
          {"kwargs", kw}, {"conventions", k.conventions}, {"source", k.source}};
}

}  // namespace indexshare::kreg

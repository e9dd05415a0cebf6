"""indexshare: the CPU reference and correctness oracle for DeepSeek Sparse Attention with cross-layer
index sharing, as a Python package (the C++ library the ``indexshare`` CLI stands on, bound with nanobind).

    import indexshare
    g = indexshare.golden(problem="sq64 skv256 hq16 k32 nl4 sched=FSFS")   # a golden set in memory
    g.save("golden-dir")                                                    # the CLI's bytes
    report = indexshare.diff(g, {"layers.0.attn.out": my_out})              # the CLI's judgement
    indexshare.testing.assert_matches(g, candidate)                         # in a pytest
    indexshare.module.indexer_module("tiny-glm", w, x, qr)                  # module-level steps
    indexshare.train.assert_attention_backward(MyMLA.apply, train_set)      # a training kernel's gradients

See README.md "Python" and tools/README.md "Validate your kernel".
"""
from ._core_loader import core as _load_core
from ._golden import GoldenSet, LoadedGolden, Problem, cost, golden, load_golden, options, overlap, presets
from ._diff import Report, diff, save_candidate
from .kernels import (Attention, dense_attention, get_num_threads, indexer_logits, indexer_topk, run_stack,
                      set_num_threads, sparse_attention, topk)
from . import module, testing, train
from .kernels import AttentionBackward, sparse_attention_backward

__version__ = _load_core().version

__all__ = ["Problem", "GoldenSet", "LoadedGolden", "golden", "load_golden", "options", "overlap", "cost", "presets", "Report", "diff",
           "save_candidate", "Attention", "indexer_logits", "topk", "indexer_topk", "sparse_attention",
           "dense_attention", "run_stack", "set_num_threads", "get_num_threads", "module", "testing"]
__all__ += ["AttentionBackward", "sparse_attention_backward", "train"]

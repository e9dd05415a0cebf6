// indexshare: MTP draft-step golden sets (kind "mtp"): speculative decoding's chain drafting, where
// the draft steps after the first share the top-k of the MTP layer's step 0 (ref/mtp.h).
//
// The descriptor is a kernel-level problem (ref/problem.h) plus two fields:
//   steps=N        draft steps (>= 2): step 0, then N - 1 steps that reuse its row
//   accept=a,b,..  per request (one per sequence, nseq of them) the tokens the target accepted,
//                  each in [1, sq / nseq] (the draft extend's rows per request)
// e.g. "sq16 skv64 hq2 dqk64 dv32 ih2 id32 k8 nseq4 seed61 steps=3 accept=4,1,3,2". Without nl the
// set has 2 layers; it must have exactly 2, both Full:
//   layer 0   the target model's last DSA layer over the same rows (its own indexer and weights):
//             the top-k a draft step must NOT use
//   layer 1   the MTP layer: step 0 (its own indexer, top-k and attention over every extend row)
// Both hold the stack set's tensors (tools/lib/golden.h, with their logits), and the set adds
// (R requests, n = steps; draft-step rows step-major, row (i - 1) * R + r):
//   mtp.accepted   I32 [R]                   input      the accepted lengths
//   mtp.q          BF16 [(n-1)R, h_q, d_qk]  input      the draft steps' queries (stream "mtp.q")
//   mtp.last_rows  I32 [R]                   reference  the step-0 row of each request's last accepted token
//   mtp.positions  I32 [(n-1)R]              reference  the sequence position of each draft query, p_r + i
//   mtp.topk       I32 [(n-1)R, topk]        output     the reused row (sequence-local, -1 padded)
//   mtp.indices    I32 [(n-1)R, 1, topk]     output     the kv rows the draft step's attention reads
//   mtp.out F32 / mtp.out_bf16 BF16 [(n-1)R, h_q, d_v], mtp.lse / mtp.max_logits F32 [(n-1)R, h_q]  output
// The manifest's "mtp" block records steps, accepted, rows_per_request, the layers and last_rows.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "ref/mtp.h"
#include "ref/problem.h"
#include "tools/lib/golden.h"
#include "tools/lib/impl.h"

namespace indexshare::golden {

struct MtpSpec {
  Problem problem;
  ref::mtp::Draft draft;
};
// Parses the descriptor and checks the draft against the problem (ref::mtp::check_draft); Error
// naming the field otherwise.
MtpSpec parse_mtp_spec(const std::string& text);
std::string to_string(const MtpSpec& s);  // canonical: to_string(problem) steps= accept=

// The set; replay: the command recorded in the manifest.
GoldenSet build_mtp(const MtpSpec& s, const std::string& replay, Impl impl = Impl::ref);
// "indexshare golden --kind mtp --problem \"SPEC\"" (+ --impl), without --out.
std::string mtp_replay(const MtpSpec& s, Impl impl);

// The "mtp" block of an mtp set against its config and tensors (golden::read calls it for kind
// "mtp"); Error naming the manifest field.
void check_mtp_manifest(const Loaded& g, const std::string& mpath);
// The draft an mtp set's manifest records (checked by read).
ref::mtp::Draft mtp_draft(const nlohmann::json& manifest);

}  // namespace indexshare::golden

// golden sets: MTP draft steps (kind "mtp", tools/lib/golden_mtp.h).

#include "tools/lib/golden_mtp.h"

#include <cctype>
#include <optional>
#include <sstream>

#include "ref/layer.h"
#include "tools/lib/golden/internal.h"

namespace indexshare::golden {

using nlohmann::json;
using namespace detail;

namespace {

const io::TensorView& view_of(const GoldenSet& g, const std::string& name) {
  for (const io::TensorView& v : g.tensors)
    if (v.name == name) return v;
  throw Error("golden mtp: the stack holds no tensor '" + name + "'");
}
}  // namespace

MtpSpec parse_mtp_spec(const std::string& text) {
  MtpSpec s;
  std::string rest, steps, accept;
  bool has_nl = false;
  std::istringstream is(text);
  for (std::string tok; is >> tok;) {
    if (tok.rfind("steps=", 0) == 0) {
      require(steps.empty(), "mtp field 'steps' given twice");
      steps = tok.substr(6);
    } else if (tok.rfind("accept=", 0) == 0) {
      require(accept.empty(), "mtp field 'accept' given twice");
      accept = tok.substr(7);
    } else {
      has_nl = has_nl || (tok.rfind("nl", 0) == 0 && tok.size() > 2 && std::isdigit(static_cast<unsigned char>(tok[2])));
      rest += tok + " ";
    }
  }
  require(!steps.empty(), "mtp field 'steps' is missing (the draft steps, e.g. steps=3)");
  require(!accept.empty(), "mtp field 'accept' is missing (the accepted length of each request, e.g. accept=4,1,3,2)");
  s.problem = parse_problem(rest + (has_nl ? "" : "nl2"));
  const Problem& p = s.problem;
  require(p.n_layers == 2 && p.schedule().pattern() == "FF",
          "mtp: the set holds 2 Full layers (layer 0 the target model's last DSA layer, layer 1 the MTP layer, always Full), "
          "got nl" + std::to_string(p.n_layers) + " sched=" + p.sched);
  s.draft.steps = descriptor_count("mtp", "steps", steps);
  std::istringstream as(accept);
  for (std::string a; std::getline(as, a, ',');) s.draft.accepted.push_back(descriptor_count("mtp", "accept", a));
  s.draft.rows = p.seq_q();
  s.draft.start = p.start_pos();
  ref::mtp::check_draft(s.draft, p.n_seqs);
  return s;
}

std::string to_string(const MtpSpec& s) {
  std::string a;
  for (int64_t x : s.draft.accepted) {
    if (!a.empty()) a.push_back(',');
    a.append(std::to_string(x));
  }
  return to_string(s.problem) + " steps=" + std::to_string(s.draft.steps) + " accept=" + a;
}

std::string mtp_replay(const MtpSpec& s, Impl impl) {
  return "indexshare golden --kind mtp --problem \"" + to_string(s) + "\"" + (impl == Impl::ref ? "" : " --impl " + impl_name(impl));
}

GoldenSet build_mtp(const MtpSpec& s, const std::string& replay, Impl impl) {
  const Problem& p = s.problem;
  const ref::mtp::Draft& d = s.draft;
  ref::mtp::check_draft(d, p.n_seqs);
  const ref::Kernels k = kernels_for(impl);
  GoldenSet g = build(p, "stack", true, replay, impl);  // layer 0 the target's, layer 1 the MTP layer's step 0
  g.manifest["kind"] = "mtp";
  g.manifest["problem"] = to_string(s);
  const std::string file = "the MTP layer's step 0";
  const Tensor<int32_t> topk = io::as_tensor<int32_t>(view_of(g, "layers.1.indexer.topk"), file);
  const Tensor<int32_t> indices = io::as_tensor<int32_t>(view_of(g, "layers.1.attn.indices"), file);
  const Tensor<bf16_t> kv = io::as_tensor<bf16_t>(view_of(g, "layers.1.attn.kv"), file);
  std::optional<Tensor<float>> sink;
  for (const io::TensorView& v : g.tensors)
    if (v.name == "layers.1.attn.sink") sink = io::as_tensor<float>(v, file);
  const int64_t R = d.requests(), n = (d.steps - 1) * R;
  Tensor<bf16_t> q = to_bf16_tensor(ref::generate(p, "mtp.q", {n, p.h_q, p.d_qk}));
  ref::AttentionOut a = ref::mtp::draft_attention(q, kv, indices, d, p.sm_scale(), p.d_v, sink ? &*sink : nullptr, k);
  Tensor<int32_t> accepted({R}), last({R});
  const std::vector<int64_t> last_rows = ref::mtp::last_accepted_rows(d);
  for (int64_t r = 0; r < R; ++r) {
    accepted[r] = int32_t(d.accepted[size_t(r)]);
    last[r] = int32_t(last_rows[size_t(r)]);
  }
  add(g, "mtp.accepted", std::move(accepted), Role::input);
  add(g, "mtp.q", std::move(q), Role::input);
  add(g, "mtp.last_rows", std::move(last), Role::reference);
  add(g, "mtp.positions", ref::mtp::draft_positions(d), Role::reference);
  add(g, "mtp.topk", ref::mtp::draft_rows(topk, d), Role::output);
  add(g, "mtp.indices", ref::mtp::draft_rows(indices, d), Role::output);
  add(g, "mtp.out", std::move(a.out), Role::output);
  add(g, "mtp.out_bf16", std::move(a.out_bf16), Role::output);
  add(g, "mtp.lse", std::move(a.lse), Role::output);
  add(g, "mtp.max_logits", std::move(a.max_logits), Role::output);
  g.manifest["mtp"] = {
      {"steps", d.steps},
      {"accepted", d.accepted},
      {"rows_per_request", d.rows},
      {"target_layer", 0},
      {"mtp_layer", 1},
      {"last_rows", last_rows},
      {"rule", "step 0: the MTP layer's own indexer over every extend row (layer 1); compaction: each request keeps the "
               "step-0 row of its last accepted token, last[r] = r * rows_per_request + accepted[r] - 1; step i >= 1: "
               "that row unchanged (positions <= p_r, p_r = start_pos + accepted[r] - 1) and the attention of mtp.q's "
               "row (i - 1) * R + r (position p_r + i) over it"}};
  return g;
}

ref::mtp::Draft mtp_draft(const json& m) {
  ref::mtp::Draft d;
  const json& b = m.at("mtp");
  d.steps = b.at("steps").get<int64_t>();
  d.accepted = b.at("accepted").get<std::vector<int64_t>>();
  d.rows = b.at("rows_per_request").get<int64_t>();
  d.start = m.at("config").at("start_pos").get<int64_t>();
  return d;
}

void check_mtp_manifest(const Loaded& g, const std::string& mpath) {
  const json& m = g.manifest;
  auto fail = [&](const std::string& field, const std::string& what) { throw Error(mpath + ": field '" + field + "' " + what); };
  if (!m.contains("mtp") || !m["mtp"].is_object()) fail("mtp", "is missing or not an object (kind mtp)");
  const json& b = m["mtp"];
  for (const char* f : {"steps", "rows_per_request", "target_layer", "mtp_layer"})
    if (!b.contains(f) || !b[f].is_number_integer()) fail(std::string("mtp.") + f, "is missing or not an integer");
  for (const char* f : {"accepted", "last_rows"})
    if (!b.contains(f) || !b[f].is_array()) fail(std::string("mtp.") + f, "is missing or not an array");
  for (const char* f : {"accepted", "last_rows"})
    for (const json& x : b[f])
      if (!x.is_number_integer()) fail(std::string("mtp.") + f, "holds " + x.dump() + ", not an integer");
  if (b["target_layer"] != 0 || b["mtp_layer"] != 1) fail("mtp.target_layer", "and mtp.mtp_layer must be 0 and 1");
  const json& c = m["config"];
  if (c["n_layers"] != 2) fail("config.n_layers", "is " + c["n_layers"].dump() + ", but an mtp set holds 2 layers");
  for (const json& l : m["layers"])
    if (l["kind"] != "full") fail("layers", "hold a Shared layer, but both layers of an mtp set are Full");
  const ref::mtp::Draft d = mtp_draft(m);
  const int64_t n_seqs = c["n_seqs"].get<int64_t>();
  if (d.rows != c["s_q"].get<int64_t>() / n_seqs)
    fail("mtp.rows_per_request", "is " + std::to_string(d.rows) + ", but config.s_q / n_seqs is " +
                                     std::to_string(c["s_q"].get<int64_t>() / n_seqs));
  try {
    ref::mtp::check_draft(d, n_seqs);
  } catch (const Error& e) {
    fail("mtp", e.what());
  }
  if (b["last_rows"].get<std::vector<int64_t>>() != ref::mtp::last_accepted_rows(d))
    fail("mtp.last_rows", "is not r * rows_per_request + accepted[r] - 1 per request");
  const int64_t rows = (d.steps - 1) * d.requests();
  for (const io::TensorView& v : g.data.tensors) {
    if (v.name.rfind("mtp.", 0) != 0) continue;
    const bool per_request = v.name == "mtp.accepted" || v.name == "mtp.last_rows";
    if (v.shape.empty() || v.shape[0] != (per_request ? d.requests() : rows))
      fail("mtp.steps", "and mtp.accepted give " + std::to_string(per_request ? d.requests() : rows) + " rows, but tensor '" +
                            v.name + "' is " + shape_str(v.shape));
  }
  const Tensor<int32_t> acc = g.tensor<int32_t>("mtp.accepted");
  for (int64_t r = 0; r < d.requests(); ++r)
    if (acc[r] != d.accepted[size_t(r)])
      fail("mtp.accepted", "disagrees with tensor 'mtp.accepted' at request " + std::to_string(r));
}

}  // namespace indexshare::golden

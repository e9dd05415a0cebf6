#include "ref/problem.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "ref/error.h"

namespace indexshare {

namespace {
float parse_float(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const float v = std::strtof(value.c_str(), &end);
  if (value.empty() || *end) throw Error("expected a number");
  if (errno == ERANGE)  // finite as written, but not a float (1e300, 1e-60)
    throw Error(std::isinf(v) ? "outside the float range (magnitude above 3.4e38)"
                              : "too small for a float (nonzero magnitude below 1.2e-38)");
  if (errno || !std::isfinite(v)) throw Error("expected a finite number");
  return v;
}
}  // namespace

// The shortest decimal that reads back as the same float (std::to_chars without a precision:
// the shortest round-trip form, the nearer one on a tie, fixed or scientific whichever is shorter):
// drift=0.98, not 0.980000019. Text written with more digits by an older version (9 significant
// digits, which also round-trip) parses to the same float, so it replays to the same bytes.
std::string float_text(float v) {
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
  require(r.ec == std::errc(), "float_text: no room for a float");  // 32 chars hold any float
  return std::string(buf, r.ptr);
}

double f32_json(double x) {
  if (!std::isfinite(x) || double(float(x)) != x) return x;
  const double y = std::strtod(float_text(float(x)).c_str(), nullptr);
  return float(y) == float(x) ? y : x;  // (a shortest text at the edge of the f32's interval: kept as is)
}

std::string indexer_mode_name(IndexerMode m) { return m == IndexerMode::fp8 ? "fp8" : "bf16"; }

std::string sink_mode_name(SinkMode m) {
  switch (m) {
    case SinkMode::none: return "none";
    case SinkMode::random: return "random";
    case SinkMode::pinf: return "pinf";
    case SinkMode::ninf: return "ninf";
    case SinkMode::strong: return "strong";
  }
  return "?";
}

float Problem::sm_scale() const {
  return sm ? *sm : float(1.0 / std::sqrt(double(d_qk)));
}

void Problem::validate() const {
  auto pos = [](int64_t v, const char* name) {
    require(v >= 1, std::string("problem field ") + name + " must be >= 1, got " + std::to_string(v));
  };
  pos(s_q, "sq"); pos(s_kv, "skv"); pos(h_q, "hq"); pos(d_qk, "dqk"); pos(d_v, "dv");
  pos(index_n_heads, "ih"); pos(index_head_dim, "id"); pos(index_topk, "k");
  require(s_kv >= s_q, "problem field skv (" + std::to_string(s_kv) + ") must be >= sq (" +
                           std::to_string(s_q) + "): queries are the last sq positions");
  require(d_v <= d_qk, "problem field dv (" + std::to_string(d_v) + ") must be <= dqk (" +
                           std::to_string(d_qk) + ")");
  require(s_kv <= (int64_t(1) << 31) - 1, "problem field skv must fit int32 indices");
  require(index_head_dim <= (int64_t(1) << 17), "problem field id must be <= 131072 (exact FP8 dots)");
  if (sm) require(std::isfinite(*sm), "problem field sm must be finite");
  pos(n_layers, "nl");
  pos(n_seqs, "nseq");
  // Size limits: int32 indices everywhere, and a layer count a schedule (int) can hold.
  const int64_t kMaxDim = (int64_t(1) << 31) - 1;
  const std::pair<int64_t, const char*> dims[] = {{s_q, "sq"}, {h_q, "hq"}, {d_qk, "dqk"}, {d_v, "dv"},
                                                  {index_n_heads, "ih"}, {index_topk, "k"}, {n_seqs, "nseq"}};
  for (const auto& [v, name] : dims)
    require(v <= kMaxDim, std::string("problem field ") + name + " must be <= 2^31 - 1, got " + std::to_string(v));
  require(n_layers <= 1000000, "problem field nl must be <= 1000000, got " + std::to_string(n_layers));
  require(s_q % n_seqs == 0 && s_kv % n_seqs == 0,
          "problem field nseq (" + std::to_string(n_seqs) + ") must divide sq and skv");
  require(sim >= 0.0f && sim <= 1.0f, "problem field sim must be in [0, 1], got " + std::to_string(sim));
  require(drift >= 0.0f && drift <= 1.0f, "problem field drift must be in [0, 1], got " + std::to_string(drift));
  require(jumps >= 0.0f && jumps <= 1.0f, "problem field jumps must be in [0, 1], got " + std::to_string(jumps));
  require(jump_rho >= 0.0f && jump_rho <= 1.0f, "problem field jumprho must be in [0, 1], got " + std::to_string(jump_rho));
  require(jumps == 0.0f || drift > 0.0f, "problem field jumps applies with drift > 0 only (a jump is a step of the drift)");
  require(jump_rho == 0.5f || jumps > 0.0f, "problem field jumprho applies with jumps > 0 only");
  require(recency >= 0.0f && std::isfinite(recency), "problem field recency must be finite and >= 0");
  require(sinks >= 0 && sinks <= s_kv, "problem field sinks must be in [0, skv]");
  // Fields the generator would not read are refused rather than ignored: the recency and sink
  // dims are the last two of each indexer head (ref/layer.cc), and the scale rule quantizes FP8.
  require((recency == 0.0f && sinks == 0) || index_head_dim >= 2,
          "problem fields recency and sinks need id >= 2 (they bias the last two indexer dims), got id" +
              std::to_string(index_head_dim));
  require(indexer == IndexerMode::fp8 || scale == ScaleRule::deepseek_ue8m0,
          "problem field scale applies to indexer=fp8 only (the bf16 indexer is not quantized)");
  (void)schedule();
}

Schedule Problem::schedule() const { return parse_schedule(sched, int(n_layers)); }

std::string to_string(const Problem& p) {
  std::ostringstream os;
  os << "sq" << p.s_q << " skv" << p.s_kv << " hq" << p.h_q << " dqk" << p.d_qk << " dv" << p.d_v
     << " ih" << p.index_n_heads << " id" << p.index_head_dim << " k" << p.index_topk << " seed"
     << p.seed;
  const Problem d;
  if (p.indexer != d.indexer) os << " indexer=" << indexer_mode_name(p.indexer);
  if (p.scale != d.scale) os << " scale=" << scale_rule_name(p.scale);
  if (p.dist != d.dist) os << " dist=" << dist_name(p.dist);
  if (p.sm) os << " sm=" << float_text(*p.sm);
  if (p.sink != d.sink) os << " sink=" << sink_mode_name(p.sink);
  if (p.n_layers != d.n_layers) os << " nl" << p.n_layers;
  if (p.sched != d.sched) os << " sched=" << p.sched;
  if (p.sim != d.sim) os << " sim=" << float_text(p.sim);
  if (p.drift != d.drift) os << " drift=" << float_text(p.drift);
  if (p.jumps != d.jumps) os << " jumps=" << float_text(p.jumps);
  if (p.jump_rho != d.jump_rho) os << " jumprho=" << float_text(p.jump_rho);
  if (p.recency != d.recency) os << " recency=" << float_text(p.recency);
  if (p.sinks != d.sinks) os << " sinks=" << p.sinks;
  if (p.own != d.own) os << " own=" << (p.own ? "yes" : "no");
  if (p.n_seqs != d.n_seqs) os << " nseq" << p.n_seqs;
  return os.str();
}

namespace {

int64_t parse_int(const std::string& tok, const std::string& digits) {
  bool ok = !digits.empty() && digits.size() <= 18;
  for (char c : digits) ok = ok && c >= '0' && c <= '9';
  if (!ok) throw Error("problem token '" + tok + "': expected a non-negative integer after the name");
  return std::stoll(digits);
}

}  // namespace

Problem parse_problem(const std::string& text) {
  Problem p;
  std::istringstream is(text);
  std::string tok;
  std::set<std::string> seen;
  while (is >> tok) {
    const auto eq = tok.find('=');
    if (eq != std::string::npos) {
      const std::string name = tok.substr(0, eq), value = tok.substr(eq + 1);
      if (!seen.insert(name).second) throw Error("problem token '" + tok + "': '" + name + "' given twice");
      try {
        if (name == "indexer") {
          if (value == "fp8") p.indexer = IndexerMode::fp8;
          else if (value == "bf16") p.indexer = IndexerMode::bf16;
          else throw Error("expected fp8 or bf16");
        } else if (name == "scale") {
          p.scale = parse_scale_rule(value);
        } else if (name == "dist") {
          p.dist = parse_dist(value);
        } else if (name == "sm") {
          p.sm = parse_float(value);
        } else if (name == "sched") {
          if (value.empty()) throw Error("expected a schedule");
          p.sched = value;
        } else if (name == "sim") {
          p.sim = parse_float(value);
        } else if (name == "drift") {
          p.drift = parse_float(value);
        } else if (name == "jumps") {
          p.jumps = parse_float(value);
        } else if (name == "jumprho") {
          p.jump_rho = parse_float(value);
        } else if (name == "recency") {
          p.recency = parse_float(value);
        } else if (name == "sinks") {
          if (value.empty() || value.size() > 12 || value.find_first_not_of("0123456789") != std::string::npos)
            throw Error("expected a non-negative integer");
          p.sinks = std::stoll(value);
        } else if (name == "own") {
          if (value != "yes" && value != "no") throw Error("expected yes or no");
          p.own = value == "yes";
        } else if (name == "sink") {
          bool found = false;
          for (SinkMode m : {SinkMode::none, SinkMode::random, SinkMode::strong, SinkMode::pinf, SinkMode::ninf})
            if (sink_mode_name(m) == value) { p.sink = m; found = true; }
          if (!found) throw Error("expected none, random, strong, pinf or ninf");
        } else {
          throw Error("unknown option (expected indexer, scale, dist, sm, sink, sched, sim, drift, jumps, jumprho, recency, sinks or own)");
        }
      } catch (const Error& e) {
        throw Error("problem token '" + tok + "': " + e.what());
      }
      continue;
    }
    size_t n = 0;
    while (n < tok.size() && std::isalpha(static_cast<unsigned char>(tok[n]))) ++n;
    const std::string name = tok.substr(0, n), digits = tok.substr(n);
    struct Field { const char* name; int64_t* i; };
    int64_t seed_tmp = 0;
    const Field fields[] = {{"sq", &p.s_q}, {"skv", &p.s_kv}, {"hq", &p.h_q}, {"dqk", &p.d_qk},
                            {"dv", &p.d_v}, {"ih", &p.index_n_heads}, {"id", &p.index_head_dim},
                            {"k", &p.index_topk}, {"seed", &seed_tmp}, {"nl", &p.n_layers},
                            {"nseq", &p.n_seqs}};
    bool matched = false;
    for (const Field& f : fields) {
      if (name != f.name) continue;
      if (!seen.insert(name).second) throw Error("problem token '" + tok + "': '" + name + "' given twice");
      *f.i = parse_int(tok, digits);
      if (name == "seed") p.seed = uint64_t(seed_tmp);
      matched = true;
    }
    if (!matched)
      throw Error("problem token '" + tok + "': unknown field '" + name +
                  "' (expected sq, skv, hq, dqk, dv, ih, id, k, seed, nl, nseq or NAME=VALUE)");
  }
  p.validate();
  return p;
}

}  // namespace indexshare

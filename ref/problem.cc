#include "ref/problem.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "ref/error.h"

namespace indexshare {

std::string indexer_mode_name(IndexerMode m) { return m == IndexerMode::fp8 ? "fp8" : "bf16"; }

std::string sink_mode_name(SinkMode m) {
  switch (m) {
    case SinkMode::none: return "none";
    case SinkMode::random: return "random";
    case SinkMode::pinf: return "pinf";
    case SinkMode::ninf: return "ninf";
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
}

std::string to_string(const Problem& p) {
  std::ostringstream os;
  os << "sq" << p.s_q << " skv" << p.s_kv << " hq" << p.h_q << " dqk" << p.d_qk << " dv" << p.d_v
     << " ih" << p.index_n_heads << " id" << p.index_head_dim << " k" << p.index_topk << " seed"
     << p.seed;
  const Problem d;
  if (p.indexer != d.indexer) os << " indexer=" << indexer_mode_name(p.indexer);
  if (p.scale != d.scale) os << " scale=" << scale_rule_name(p.scale);
  if (p.dist != d.dist) os << " dist=" << dist_name(p.dist);
  if (p.sm) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", double(*p.sm));  // 9 digits round-trip any float
    os << " sm=" << buf;
  }
  if (p.sink != d.sink) os << " sink=" << sink_mode_name(p.sink);
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
          errno = 0;
          char* end = nullptr;
          const float v = std::strtof(value.c_str(), &end);
          if (value.empty() || *end || errno || !std::isfinite(v)) throw Error("expected a finite number");
          p.sm = v;
        } else if (name == "sink") {
          bool found = false;
          for (SinkMode m : {SinkMode::none, SinkMode::random, SinkMode::pinf, SinkMode::ninf})
            if (sink_mode_name(m) == value) { p.sink = m; found = true; }
          if (!found) throw Error("expected none, random, pinf or ninf");
        } else {
          throw Error("unknown option (expected indexer, scale, dist, sm or sink)");
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
                            {"k", &p.index_topk}, {"seed", &seed_tmp}};
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
                  "' (expected sq, skv, hq, dqk, dv, ih, id, k, seed or NAME=VALUE)");
  }
  p.validate();
  return p;
}

}  // namespace indexshare

#include <unistd.h>
#include <filesystem>
#include "tools/lib/svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ref/error.h"
#include "tools/lib/safetensors.h"

namespace indexshare::io {

namespace {

using nlohmann::json;

// printf into a std::string (C locale: '.' decimal point).
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  const int n = std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  if (n < 0) return {};
  if (size_t(n) < sizeof buf) return std::string(buf, size_t(n));
  std::string s(size_t(n) + 1, '\0');
  va_start(ap, f);
  std::vsnprintf(s.data(), s.size(), f, ap);
  va_end(ap);
  s.resize(size_t(n));
  return s;
}

// A number for tables and CSV: "nan" / "inf" / "-inf" spelled out, else printf `f`.
std::string num(double v, const char* f = "%.4f") {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt(f, v);
}

json jnum(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

const char* kind_name(LayerKind k) { return k == LayerKind::full ? "full" : "shared"; }

// ---- SVG primitives --------------------------------------------------------------------------

constexpr const char* kFont = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";
constexpr const char* kFullColour = "#c0392b";
constexpr const char* kSharedColour = "#2e86c1";

std::string px(double v) { return fmt("%.2f", v); }

class Svg {
 public:
  Svg(double width, double height) : w_(width), h_(height) {}

  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra = "",
            const std::string& tooltip = "") {
    body_ += "<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" + px(h) +
             "\" fill=\"" + fill + "\"" + (extra.empty() ? "" : " " + extra);
    body_ += tooltip.empty() ? "/>\n" : "><title>" + xml_escape(tooltip) + "</title></rect>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
            const std::string& extra = "") {
    body_ += "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) +
             "\" stroke=\"" + stroke + "\" stroke-width=\"" + px(width) + "\"" +
             (extra.empty() ? "" : " " + extra) + "/>\n";
  }
  // anchor: start | middle | end. rotate: degrees about (x, y).
  void text(double x, double y, const std::string& s, double size, const std::string& anchor = "start",
            const std::string& fill = "#222222", const std::string& extra = "", double rotate = 0) {
    // The default font unless `extra` names one (an attribute may appear only once).
    const std::string font = extra.find("font-family=") == std::string::npos ? std::string(" ") + kFont : "";
    body_ += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) + "\"" + font +
             " text-anchor=\"" + anchor + "\" fill=\"" + fill + "\"";
    if (rotate != 0) body_ += " transform=\"rotate(" + px(rotate) + " " + px(x) + " " + px(y) + ")\"";
    body_ += (extra.empty() ? "" : " " + extra) + ">" + xml_escape(s) + "</text>\n";
  }
  void polyline(const std::vector<std::array<double, 2>>& pts, const std::string& stroke, double width,
                const std::string& extra = "") {
    body_ += "<polyline fill=\"none\" stroke=\"" + stroke + "\" stroke-width=\"" + px(width) + "\"" +
             (extra.empty() ? "" : " " + extra) + " points=\"" + points(pts) + "\"/>\n";
  }
  void polygon(const std::vector<std::array<double, 2>>& pts, const std::string& fill, double opacity) {
    body_ += "<polygon fill=\"" + fill + "\" fill-opacity=\"" + fmt("%.3f", opacity) + "\" stroke=\"none\" points=\"" +
             points(pts) + "\"/>\n";
  }
  void circle(double x, double y, double r, const std::string& fill, const std::string& tooltip = "") {
    body_ += "<circle cx=\"" + px(x) + "\" cy=\"" + px(y) + "\" r=\"" + px(r) + "\" fill=\"" + fill + "\"";
    body_ += tooltip.empty() ? "/>\n" : "><title>" + xml_escape(tooltip) + "</title></circle>\n";
  }
  void raw(const std::string& s) { body_ += s; }

  std::string finish(const std::string& title) const {
    std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    s += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + px(w_) + "\" height=\"" + px(h_) +
         "\" viewBox=\"0 0 " + px(w_) + " " + px(h_) + "\">\n";
    s += "<title>" + xml_escape(title) + "</title>\n";
    s += "<rect x=\"0\" y=\"0\" width=\"" + px(w_) + "\" height=\"" + px(h_) + "\" fill=\"#ffffff\"/>\n";
    s += body_;
    s += "</svg>\n";
    return s;
  }

 private:
  static std::string points(const std::vector<std::array<double, 2>>& pts) {
    std::string s;
    for (const auto& p : pts) {
      if (!s.empty()) s += ' ';
      s += px(p[0]);
      s += ',';
      s += px(p[1]);
    }
    return s;
  }
  double w_, h_;
  std::string body_;
};

// Viridis, 9 stops, linear in sRGB between stops; v in [0, 1].
std::string viridis(double v) {
  static const int stops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},   {44, 113, 142}, {33, 144, 141},
                                  {39, 173, 129}, {92, 200, 99},  {170, 220, 50},  {253, 231, 37}};
  v = std::clamp(v, 0.0, 1.0) * 8.0;
  const int i = std::min(7, int(v));
  const double f = v - i;
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = int(std::lround(stops[i][k] + f * (stops[i + 1][k] - stops[i][k])));
  return fmt("#%02x%02x%02x", c[0], c[1], c[2]);
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` intervals.
double nice_step(double range, int target) {
  if (!(range > 0)) return 1.0;
  const double raw = range / target, p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m < 1.5 ? 1.0 : m < 3.5 ? 2.0 : m < 7.5 ? 5.0 : 10.0) * p;
}

// Every `step`-th integer label, step in {1, 2, 5, 10, ...} so that labels are >= min_gap apart.
int label_step(double cell, double min_gap) {
  for (int s : {1, 2, 5, 10, 20, 50, 100, 200, 500})
    if (cell * s >= min_gap) return s;
  return 1000;
}

std::string tick_label(double v, double step) {
  const int decimals = step >= 1 ? 0 : std::min(6, int(std::ceil(-std::log10(step) - 1e-9)));
  return fmt("%.*f", decimals, v);
}

// Axes frame with y ticks; returns nothing, draws into svg. (x0, y0) top-left of the plot area.
void y_axis(Svg& svg, double x0, double y0, double w, double h, double lo, double hi, const std::string& label) {
  const double step = nice_step(hi - lo, 5);
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    const double y = y0 + h - (v - lo) / (hi - lo) * h;
    svg.line(x0, y, x0 + w, y, "#e6e6e6", 1);
    svg.line(x0 - 4, y, x0, y, "#444444", 1);
    svg.text(x0 - 7, y + 4, tick_label(std::abs(v) < step * 1e-9 ? 0.0 : v, step), 11, "end");
  }
  svg.text(x0 - 48, y0 + h / 2, label, 13, "middle", "#222222", "", -90);
}

// Width needed by the header lines (~6.2 px per char at 11 px, the monospace pattern ~6.7 px,
// the problem ~6 px at 10 px).
double header_width(const std::string& line, const std::string& pattern, const std::string& problem) {
  return std::max({16 + 6.2 * double(line.size()), 16 + 90 + 6.7 * double(pattern.size()),
                   16 + 6.0 * double(problem.size())}) + 24;
}

// Title (bold), a description line, the schedule in monospace, and the problem descriptor.
void header(Svg& svg, const std::string& title, const std::string& line, const std::string& label,
            const std::string& pattern, const std::string& problem) {
  svg.text(16, 26, title, 17, "start", "#111111", "font-weight=\"bold\"");
  svg.text(16, 46, line, 11, "start", "#444444");
  svg.text(16, 62, label, 11, "start", "#444444");
  svg.text(16 + 6.5 * double(label.size()) + 6, 62, pattern, 11, "start", "#222222",
           "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\"");
  svg.text(16, 78, problem, 10, "start", "#666666");
}

}  // namespace

// ---- Escaping, JSON ----------------------------------------------------------------------------

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += c;
    }
  }
  return o;
}

json dist_to_json(const ref::DistSummary& d) {
  return json{{"count", d.count}, {"mean", jnum(d.mean)}, {"min", jnum(d.min)}, {"p10", jnum(d.p10)},
              {"p50", jnum(d.p50)}, {"p90", jnum(d.p90)},  {"max", jnum(d.max)}};
}

json overlap_to_json(const ref::OverlapReport& r) {
  json j;
  j["problem"] = r.problem;
  j["schedule"] = r.pattern;
  j["n_layers"] = r.n_layers;
  j["s_q"] = r.s_q;
  j["s_kv"] = r.s_kv;
  j["topk"] = r.topk;
  j["start_pos"] = r.start_pos;
  j["rows"] = r.rows;
  j["trivial_rows"] = r.trivial_rows;
  j["metric"] = "overlap = |A and B| / |A| (= /topk), jaccard = |A and B| / |A or B|, non-trivial rows only";
  j["percentile_rule"] = "nearest-rank: x_r, r = max(1, ceil(p n / 100))";
  json layers = json::array();
  for (const auto& l : r.layers)
    layers.push_back({{"layer", l.layer}, {"kind", kind_name(l.kind)}, {"source", l.source}, {"has_own_topk", l.has_own_topk}});
  j["layers"] = layers;
  json buckets = json::array();
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    const auto& q = r.buckets[b];
    buckets.push_back({{"bucket", b}, {"t_begin", q.t_begin}, {"t_end", q.t_end}, {"pos_begin", q.pos_begin},
                       {"pos_end", q.pos_end}, {"overlap", dist_to_json(r.adjacent_by_bucket.at(b))}});
  }
  json pairs = json::array();
  for (const auto& p : r.adjacent) {
    json by = json::array();
    for (const auto& d : p.overlap_by_bucket) by.push_back(dist_to_json(d));
    pairs.push_back({{"a", p.a}, {"b", p.b}, {"rows", p.rows}, {"trivial_rows", p.trivial_rows},
                     {"overlap", dist_to_json(p.overlap)}, {"jaccard", dist_to_json(p.jaccard)}, {"overlap_by_bucket", by}});
  }
  j["adjacent"] = {{"overlap", dist_to_json(r.adjacent_overlap)}, {"jaccard", dist_to_json(r.adjacent_jaccard)},
                   {"by_bucket", buckets}, {"pairs", pairs}};
  json mo = json::array(), mj = json::array();
  for (int a = 0; a < r.n_layers; ++a) {
    json ro = json::array(), rj = json::array();
    for (int b = 0; b < r.n_layers; ++b) ro.push_back(jnum(r.overlap_at(a, b))), rj.push_back(jnum(r.jaccard_at(a, b)));
    mo.push_back(ro);
    mj.push_back(rj);
  }
  j["matrix"] = {{"overlap", mo}, {"jaccard", mj}, {"offdiag_overlap", dist_to_json(r.offdiag_overlap)}};
  json shared = json::array();
  for (const auto& s : r.shared)
    shared.push_back({{"layer", s.layer}, {"source", s.source}, {"rows", s.rows}, {"trivial_rows", s.trivial_rows},
                      {"recall", dist_to_json(s.recall)}, {"mass_used", dist_to_json(s.mass_used)},
                      {"mass_own", dist_to_json(s.mass_own)}, {"mass_recall", dist_to_json(s.mass_recall)},
                      {"out_rel_error", jnum(s.out_rel_error)}});
  j["shared"] = shared;
  return j;
}

json search_to_json(const ref::SearchResult& r) {
  json j;
  j["problem"] = r.problem;
  j["loss"] = ref::search_loss_name(r.loss);
  j["n_layers"] = r.n_layers;
  j["n_full"] = r.n_full;
  j["initial_loss"] = jnum(r.initial_loss);
  json steps = json::array();
  for (const auto& s : r.steps) {
    json cand = json::array();
    for (size_t i = 0; i < s.candidates.size(); ++i)
      cand.push_back({{"layer", s.candidates[i]}, {"loss", jnum(s.candidate_losses[i])}});
    steps.push_back({{"flipped", s.flipped}, {"loss", jnum(s.loss)}, {"pattern", s.pattern}, {"candidates", cand}});
  }
  j["steps"] = steps;
  j["flips"] = r.flips;
  json losses = json::array();
  for (double v : r.losses) losses.push_back(jnum(v));
  j["losses"] = losses;
  j["pattern"] = r.pattern;
  json costs = json::array();
  for (double v : r.layer_costs) costs.push_back(jnum(v));
  j["layer_costs"] = costs;
  return j;
}

// ---- Tables -----------------------------------------------------------------------------------

namespace {

std::string dist_cells(const ref::DistSummary& d) {
  return fmt("%7lld", (long long)d.count) + "  " + fmt("%8s %8s %8s %8s %8s %8s", num(d.mean).c_str(), num(d.min).c_str(),
                                                          num(d.p10).c_str(), num(d.p50).c_str(), num(d.p90).c_str(),
                                                          num(d.max).c_str());
}
const char* kDistHeader = "  count      mean      min      p10      p50      p90      max";

}  // namespace

std::string overlap_table(const ref::OverlapReport& r) {
  std::string s;
  s += "problem   " + r.problem + "\n";
  s += "schedule  " + r.pattern + "   (" + std::to_string(r.n_layers) + " layers, topk " + std::to_string(r.topk) + ")\n";
  s += "rows      " + std::to_string(r.rows) + " query rows per layer pair; " + std::to_string(r.trivial_rows) +
       " trivial (ke - ks <= topk: every key selected), excluded from every figure below\n";
  s += "metric    overlap = |A n B| / topk, jaccard = |A n B| / |A u B|; percentiles nearest-rank\n\n";
  s += "adjacent own-top-k overlap\n";
  s += fmt("%-10s", "pair") + kDistHeader + "   jaccard\n";
  for (const auto& p : r.adjacent)
    s += fmt("%-10s", (std::to_string(p.a) + "-" + std::to_string(p.b)).c_str()) + dist_cells(p.overlap) + fmt(" %9s", num(p.jaccard.mean).c_str()) + "\n";
  s += fmt("%-10s", "all") + dist_cells(r.adjacent_overlap) + fmt(" %9s", num(r.adjacent_jaccard.mean).c_str()) + "\n\n";
  s += "adjacent overlap by query position (all pairs pooled)\n";
  s += fmt("%-14s", "positions") + kDistHeader + "\n";
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    const auto& q = r.buckets[b];
    const std::string range = q.t_end > q.t_begin ? fmt("%lld-%lld", (long long)q.pos_begin, (long long)q.pos_end - 1) : "-";
    s += fmt("%-14s", range.c_str()) + dist_cells(r.adjacent_by_bucket[b]) + "\n";
  }
  s += "\nall pairs (i < j) mean overlap\n" + fmt("%-10s", "pairs") + kDistHeader + "\n" + fmt("%-10s", "i<j") + dist_cells(r.offdiag_overlap) + "\n";
  if (r.n_layers <= 16) {
    s += "\n      ";
    for (int b = 0; b < r.n_layers; ++b) s += fmt(" %5d", b);
    s += "\n";
    for (int a = 0; a < r.n_layers; ++a) {
      s += fmt("%3d %c ", a, r.layers[size_t(a)].kind == LayerKind::full ? 'F' : 'S');
      for (int b = 0; b < r.n_layers; ++b) s += fmt(" %5s", num(r.overlap_at(a, b), "%.3f").c_str());
      s += "\n";
    }
  }
  if (!r.shared.empty()) {
    s += "\nshared layers: U = the source's positions (used), O = the layer's own top-k (unused)\n";
    s += "layer  src   recall.mean  recall.p10  mass_used  mass_own  mass_recall.mean  mass_recall.p10  out_rel_error\n";
    for (const auto& x : r.shared)
      s += fmt("%5d %4d  %12s %11s %10s %9s %17s %16s %14s\n", x.layer, x.source, num(x.recall.mean).c_str(),
               num(x.recall.p10).c_str(), num(x.mass_used.mean).c_str(), num(x.mass_own.mean).c_str(),
               num(x.mass_recall.mean).c_str(), num(x.mass_recall.p10).c_str(), num(x.out_rel_error, "%.3e").c_str());
  }
  return s;
}

std::string search_table(const ref::SearchResult& r) {
  std::string s;
  s += "problem   " + r.problem + "\n";
  s += "loss      " + ref::search_loss_name(r.loss) + "   target " + std::to_string(r.n_full) + " Full of " +
       std::to_string(r.n_layers) + " layers\n";
  s += fmt("%-6s %-8s %-7s %-13s %s\n", "step", "flipped", "n_full", "loss", "pattern");
  s += fmt("%-6d %-8s %-7d %-13s %s\n", 0, "-", r.n_layers, num(r.initial_loss, "%.6e").c_str(), std::string(size_t(r.n_layers), 'F').c_str());
  for (size_t i = 0; i < r.steps.size(); ++i)
    s += fmt("%-6zu %-8d %-7d %-13s %s\n", i + 1, r.steps[i].flipped, r.n_layers - int(i) - 1,
             num(r.steps[i].loss, "%.6e").c_str(), r.steps[i].pattern.c_str());
  s += "pattern   " + r.pattern + "\n";
  return s;
}

// ---- CSV --------------------------------------------------------------------------------------

namespace {

std::string csv_dist(const ref::DistSummary& d) {
  return std::to_string(d.count) + "," + num(d.mean, "%.9g") + "," + num(d.min, "%.9g") + "," + num(d.p10, "%.9g") +
         "," + num(d.p50, "%.9g") + "," + num(d.p90, "%.9g") + "," + num(d.max, "%.9g");
}
std::string csv_mean_only(double v) {  // count empty, mean, the rest empty
  std::string s = ",";
  s += num(v, "%.9g");
  s += ",,,,,";
  return s;
}

}  // namespace

std::string overlap_csv(const ref::OverlapReport& r) {
  std::string s = "section,a,b,bucket,pos_begin,pos_end,metric,count,mean,min,p10,p50,p90,max\n";
  auto bucket_cols = [&](size_t b) {
    const auto& q = r.buckets[b];
    return std::to_string(b) + "," + std::to_string(q.pos_begin) + "," + std::to_string(q.pos_end);
  };
  for (const auto& p : r.adjacent) {
    const std::string ab = std::to_string(p.a) + "," + std::to_string(p.b);
    s += "adjacent," + ab + ",,,,overlap," + csv_dist(p.overlap) + "\n";
    s += "adjacent," + ab + ",,,,jaccard," + csv_dist(p.jaccard) + "\n";
    for (size_t b = 0; b < p.overlap_by_bucket.size(); ++b)
      s += "adjacent_bucket," + ab + "," + bucket_cols(b) + ",overlap," + csv_dist(p.overlap_by_bucket[b]) + "\n";
  }
  s += "pooled,,,,,,overlap," + csv_dist(r.adjacent_overlap) + "\n";
  s += "pooled,,,,,,jaccard," + csv_dist(r.adjacent_jaccard) + "\n";
  for (size_t b = 0; b < r.adjacent_by_bucket.size(); ++b)
    s += "pooled_bucket,,," + bucket_cols(b) + ",overlap," + csv_dist(r.adjacent_by_bucket[b]) + "\n";
  for (int a = 0; a < r.n_layers; ++a)
    for (int b = 0; b < r.n_layers; ++b) {
      const std::string ab = std::to_string(a) + "," + std::to_string(b);
      s += "matrix," + ab + ",,,,overlap," + csv_mean_only(r.overlap_at(a, b)) + "\n";
      s += "matrix," + ab + ",,,,jaccard," + csv_mean_only(r.jaccard_at(a, b)) + "\n";
    }
  for (const auto& x : r.shared) {
    const std::string ab = std::to_string(x.layer) + "," + std::to_string(x.source);
    s += "shared," + ab + ",,,,recall," + csv_dist(x.recall) + "\n";
    s += "shared," + ab + ",,,,mass_used," + csv_dist(x.mass_used) + "\n";
    s += "shared," + ab + ",,,,mass_own," + csv_dist(x.mass_own) + "\n";
    s += "shared," + ab + ",,,,mass_recall," + csv_dist(x.mass_recall) + "\n";
    s += "shared," + ab + ",,,,out_rel_error," + csv_mean_only(x.out_rel_error) + "\n";
  }
  return s;
}

std::string search_csv(const ref::SearchResult& r) {
  std::string s = "step,flipped,n_full,loss,pattern\n";
  s += "0,-1," + std::to_string(r.n_layers) + "," + num(r.initial_loss, "%.9g") + "," + std::string(size_t(r.n_layers), 'F') + "\n";
  for (size_t i = 0; i < r.steps.size(); ++i)
    s += std::to_string(i + 1) + "," + std::to_string(r.steps[i].flipped) + "," + std::to_string(r.n_layers - int(i) - 1) +
         "," + num(r.steps[i].loss, "%.9g") + "," + r.steps[i].pattern + "\n";
  return s;
}

// ---- SVG figures ----------------------------------------------------------------------------

std::string overlap_heatmap_svg(const ref::OverlapReport& r, const HeatmapOptions& opt) {
  require(opt.vmax > opt.vmin, "heatmap: vmax must exceed vmin");
  const int n = r.n_layers;
  const double cell = std::clamp(std::floor(560.0 / std::max(n, 1)), 6.0, 48.0), plot = cell * n;
  const double strip = std::max(10.0, std::min(cell, 16.0));  // F/S strip thickness
  const double left = 96, top = 94, x0 = left + strip + 4, y0 = top + strip + 4;
  const double legend_x = x0 + plot + 36, height = y0 + plot + 78;
  const std::string line = "topk " + std::to_string(r.topk) + "   " + std::to_string(r.rows - r.trivial_rows) +
                           " non-trivial query rows (" + std::to_string(r.trivial_rows) +
                           " trivial, ke - ks <= topk, excluded)   cell = mean over rows, own top-k";
  const double width = std::max({legend_x + 150, header_width(line, r.pattern, r.problem), x0 + 480});
  const std::string metric = opt.jaccard ? "Jaccard |A\u2229B| / |A\u222aB|" : "overlap |A\u2229B| / k";
  const std::string title = opt.title.empty() ? "Top-k " + metric + " between layers" : opt.title;
  Svg svg(width, height);

  // 1. Title and subtitle.
  header(svg, title, line, "schedule", r.pattern, r.problem);

  // 2. Cells.
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const double v = opt.jaccard ? r.jaccard_at(a, b) : r.overlap_at(a, b);
      const double x = x0 + b * cell, y = y0 + a * cell;
      const std::string tip = "layer " + std::to_string(a) + " vs layer " + std::to_string(b) + ": " + num(v);
      const std::string fill = std::isnan(v) ? "#d9d9d9" : viridis((v - opt.vmin) / (opt.vmax - opt.vmin));
      svg.rect(x, y, cell, cell, fill, "", tip);
      if (cell >= 30 && !std::isnan(v))
        svg.text(x + cell / 2, y + cell / 2 + 4, num(v, "%.2f"), std::min(12.0, cell / 3), "middle",
                 (v - opt.vmin) / (opt.vmax - opt.vmin) > 0.6 ? "#111111" : "#ffffff");
    }

  // 3. Group outlines: each Full layer with the Shared layers that use its positions.
  for (int a = 0; a < n; ++a) {
    if (r.layers[size_t(a)].kind != LayerKind::full) continue;
    int e = a + 1;
    while (e < n && r.layers[size_t(e)].kind == LayerKind::shared) ++e;
    svg.rect(x0 + a * cell, y0 + a * cell, (e - a) * cell, (e - a) * cell, "none",
             "stroke=\"#e31a1c\" stroke-width=\"2\"", "group of Full layer " + std::to_string(a) + ": layers " +
                                                         std::to_string(a) + "-" + std::to_string(e - 1));
  }

  // 4. F/S strips on both axes and layer index labels.
  // Label every step-th layer: x labels need room for their digits, y labels for their height.
  const int x_step = label_step(cell, n > 99 ? 26 : 20), y_step = label_step(cell, 13);
  for (int l = 0; l < n; ++l) {
    const bool full = r.layers[size_t(l)].kind == LayerKind::full;
    const std::string c = full ? kFullColour : kSharedColour, k = full ? "F" : "S";
    const std::string tip = "layer " + std::to_string(l) + ": " + (full ? "Full" : "Shared, source " + std::to_string(r.layers[size_t(l)].source));
    svg.rect(x0 + l * cell, top, cell, strip, c, "stroke=\"#ffffff\" stroke-width=\"0.5\"", tip);
    svg.rect(left, y0 + l * cell, strip, cell, c, "stroke=\"#ffffff\" stroke-width=\"0.5\"", tip);
    if (cell >= 10) {
      const double fs = std::min(10.0, strip - 2);
      svg.text(x0 + l * cell + cell / 2, top + strip / 2 + fs / 2 - 1, k, fs, "middle", "#ffffff");
      svg.text(left + strip / 2, y0 + l * cell + cell / 2 + fs / 2 - 1, k, fs, "middle", "#ffffff");
    }
    if (l % x_step == 0) svg.text(x0 + l * cell + cell / 2, y0 + plot + 16, std::to_string(l), 10, "middle");
    if (l % y_step == 0) svg.text(left - 5, y0 + l * cell + cell / 2 + 4, std::to_string(l), 10, "end");
  }
  svg.rect(x0, y0, plot, plot, "none", "stroke=\"#444444\" stroke-width=\"1\"");
  svg.text(x0 + plot / 2, y0 + plot + 38, "layer j", 13, "middle");
  svg.text(left - 36, y0 + plot / 2, "layer i", 13, "middle", "#222222", "", -90);

  // 5. Key: kinds and groups, below the plot.
  const double ky = y0 + plot + 58;
  svg.rect(x0, ky - 10, 12, 12, kFullColour);
  svg.text(x0 + 16, ky, "F = Full (own indexer)", 11);
  svg.rect(x0 + 160, ky - 10, 12, 12, kSharedColour);
  svg.text(x0 + 176, ky, "S = Shared (reuses source)", 11);
  svg.rect(x0 + 350, ky - 10, 12, 12, "none", "stroke=\"#e31a1c\" stroke-width=\"2\"");
  svg.text(x0 + 366, ky, "source group", 11);

  // 6. Colour scale legend: 5 gradient stops per quarter, ticks at quarters.
  const double lh = std::max(plot, 160.0), lw = 18;
  std::string grad = "<defs><linearGradient id=\"cmap\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n";
  for (int i = 0; i <= 16; ++i)
    grad += "<stop offset=\"" + fmt("%.4f", i / 16.0) + "\" stop-color=\"" + viridis(i / 16.0) + "\"/>\n";
  grad += "</linearGradient></defs>\n";
  svg.raw(grad);
  svg.rect(legend_x, y0, lw, lh, "url(#cmap)", "stroke=\"#444444\" stroke-width=\"1\"");
  for (int i = 0; i <= 4; ++i) {
    const double v = opt.vmin + (opt.vmax - opt.vmin) * i / 4.0, y = y0 + lh - lh * i / 4.0;
    svg.line(legend_x + lw, y, legend_x + lw + 4, y, "#444444", 1);
    svg.text(legend_x + lw + 7, y + 4, fmt("%.2f", v), 11);
  }
  svg.text(legend_x + lw / 2, y0 - 8, opt.jaccard ? "Jaccard" : "overlap", 11, "middle");
  svg.rect(legend_x, y0 + lh + 10, lw, 12, "#d9d9d9");
  svg.text(legend_x + lw + 6, y0 + lh + 20, "no data", 11);
  return svg.finish(title);
}

std::string overlap_by_position_svg(const ref::OverlapReport& r, const std::string& title_in) {
  const std::string title = title_in.empty() ? "Adjacent-layer top-k overlap vs query position" : title_in;
  const double x0 = 80, y0 = 100, w = 600, h = 320, height = y0 + h + 70;
  const std::string line = "topk " + std::to_string(r.topk) + "   " + std::to_string(r.trivial_rows) +
                           " trivial rows (ke - ks <= topk) excluded   band = p10-p90 over all adjacent pairs' rows";
  const double width = std::max(x0 + w + 190, header_width(line, r.pattern, r.problem));
  Svg svg(width, height);
  header(svg, title, line, "schedule", r.pattern, r.problem);

  // 1. Ranges: x over the query positions, y from a rounded-down minimum to 1.
  const size_t nb = r.buckets.size();
  double lo = 1.0;
  for (const auto& d : r.adjacent_by_bucket)
    if (d.count > 0) lo = std::min(lo, d.p10);
  for (const auto& p : r.adjacent)
    for (const auto& d : p.overlap_by_bucket)
      if (d.count > 0) lo = std::min(lo, d.mean);
  lo = std::max(0.0, std::floor((lo - 0.02) * 10.0) / 10.0);
  const double hi = 1.0;
  const double pos_lo = double(r.start_pos), pos_hi = double(r.start_pos + std::max<int64_t>(r.s_q, 1));
  auto X = [&](double pos) { return x0 + (pos - pos_lo) / (pos_hi - pos_lo) * w; };
  auto Y = [&](double v) { return y0 + h - (std::clamp(v, lo, hi) - lo) / (hi - lo) * h; };
  auto centre = [&](size_t b) { return 0.5 * double(r.buckets[b].pos_begin + r.buckets[b].pos_end); };
  y_axis(svg, x0, y0, w, h, lo, hi, "overlap |A\u2229B| / k");

  // 2. x ticks at bucket boundaries.
  for (size_t b = 0; b <= nb; ++b) {
    const double pos = b < nb ? double(r.buckets[b].pos_begin) : pos_hi;
    if (b > 0 && b < nb && r.buckets[b].pos_begin == r.buckets[b - 1].pos_begin) continue;
    svg.line(X(pos), y0 + h, X(pos), y0 + h + 4, "#444444", 1);
    svg.text(X(pos), y0 + h + 17, fmt("%.0f", pos), 11, "middle");
  }
  svg.text(x0 + w / 2, y0 + h + 42, "query position (bucket boundaries; points at bucket centres)", 13, "middle");

  // 3. Band and mean of the pooled rows; lines break at empty buckets.
  auto segments = [&](auto value_of, auto has) {
    std::vector<std::vector<std::array<double, 2>>> segs(1);
    for (size_t b = 0; b < nb; ++b) {
      if (!has(b)) {
        if (!segs.back().empty()) segs.emplace_back();
        continue;
      }
      segs.back().push_back({X(centre(b)), Y(value_of(b))});
    }
    return segs;
  };
  auto pooled_has = [&](size_t b) { return r.adjacent_by_bucket[b].count > 0; };
  {
    std::vector<std::array<double, 2>> band, lower;
    for (size_t b = 0; b < nb; ++b) {
      if (!pooled_has(b)) continue;
      band.push_back({X(centre(b)), Y(r.adjacent_by_bucket[b].p90)});
      lower.push_back({X(centre(b)), Y(r.adjacent_by_bucket[b].p10)});
    }
    band.insert(band.end(), lower.rbegin(), lower.rend());
    if (!band.empty()) svg.polygon(band, "#555555", 0.18);
  }
  // 4. Per-pair lines (at most 12 pairs).
  static const char* palette[12] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"};
  const bool per_pair = !r.adjacent.empty() && r.adjacent.size() <= 12;
  if (per_pair)
    for (size_t i = 0; i < r.adjacent.size(); ++i) {
      const auto& p = r.adjacent[i];
      for (const auto& seg : segments([&](size_t b) { return p.overlap_by_bucket[b].mean; },
                                      [&](size_t b) { return p.overlap_by_bucket[b].count > 0; }))
        if (!seg.empty()) svg.polyline(seg, palette[i], 1.3, "stroke-opacity=\"0.85\"");
    }
  for (const auto& seg : segments([&](size_t b) { return r.adjacent_by_bucket[b].mean; }, pooled_has))
    if (!seg.empty()) svg.polyline(seg, "#111111", 2.6);
  for (size_t b = 0; b < nb; ++b)
    if (pooled_has(b)) {
      const auto& d = r.adjacent_by_bucket[b];
      svg.circle(X(centre(b)), Y(d.mean), 3.5, "#111111",
                 fmt("positions %lld-%lld: mean %.4f, p10 %.4f, p90 %.4f, %lld rows", (long long)r.buckets[b].pos_begin,
                     (long long)r.buckets[b].pos_end - 1, d.mean, d.p10, d.p90, (long long)d.count));
    }
  svg.rect(x0, y0, w, h, "none", "stroke=\"#444444\" stroke-width=\"1\"");

  // 5. Legend.
  const double lx = x0 + w + 20;
  double ly = y0 + 8;
  svg.line(lx, ly, lx + 24, ly, "#111111", 2.6);
  svg.text(lx + 30, ly + 4, "mean, all pairs", 11);
  ly += 20;
  svg.rect(lx, ly - 6, 24, 12, "#555555", "fill-opacity=\"0.18\"");
  svg.text(lx + 30, ly + 4, "p10-p90, all pairs", 11);
  ly += 22;
  if (per_pair) {
    for (size_t i = 0; i < r.adjacent.size(); ++i, ly += 17) {
      svg.line(lx, ly, lx + 24, ly, palette[i], 1.6);
      svg.text(lx + 30, ly + 4, "layers " + std::to_string(r.adjacent[i].a) + "-" + std::to_string(r.adjacent[i].b), 11);
    }
  } else {
    svg.text(lx, ly + 4, std::to_string(r.adjacent.size()) + " adjacent pairs pooled", 11);
  }
  if (r.adjacent.empty()) svg.text(x0 + w / 2, y0 + h / 2, "no adjacent pair with own top-k", 14, "middle");
  return svg.finish(title);
}

std::string search_loss_svg(const ref::SearchResult& r, const std::string& title_in) {
  const std::string title =
      title_in.empty() ? "Greedy pattern search: " + ref::search_loss_name(r.loss) + " loss after each flip" : title_in;
  const double x0 = 90, y0 = 100, w = 620, h = 300, height = y0 + h + 78;
  const std::string line = std::to_string(r.n_full) + " Full of " + std::to_string(r.n_layers) +
                           " layers; step 0 = all Full; each point labelled with the layer flipped to Shared";
  const double width = std::max(x0 + w + 40, header_width(line, r.pattern, r.problem));
  Svg svg(width, height);
  header(svg, title, line, "final pattern", r.pattern, r.problem);

  // 1. Points: (0, initial), (i + 1, losses[i]).
  std::vector<double> ys = {r.initial_loss};
  ys.insert(ys.end(), r.losses.begin(), r.losses.end());
  double hi = 0.0;
  for (double v : ys)
    if (std::isfinite(v)) hi = std::max(hi, v);
  hi = hi > 0 ? hi * 1.12 : 1.0;
  const double lo = 0.0;
  const int m = int(ys.size()) - 1;
  auto X = [&](double i) { return x0 + (m > 0 ? i / m : 0.5) * w; };
  auto Y = [&](double v) { return y0 + h - (std::clamp(v, lo, hi) - lo) / (hi - lo) * h; };
  y_axis(svg, x0, y0, w, h, lo, hi, "loss (" + ref::search_loss_name(r.loss) + ")");

  // 2. x ticks: step number and the Full count after it.
  const int step = label_step(m > 0 ? w / m : w, 28);
  for (int i = 0; i <= m; ++i) {
    if (i % step != 0 && i != m) continue;
    svg.line(X(i), y0 + h, X(i), y0 + h + 4, "#444444", 1);
    svg.text(X(i), y0 + h + 17, std::to_string(i), 11, "middle");
    svg.text(X(i), y0 + h + 31, std::to_string(r.n_layers - i) + "F", 10, "middle", "#666666");
  }
  svg.text(x0 + w / 2, y0 + h + 54, "step (number of Full layers below)", 13, "middle");

  // 3. Curve, points, flip labels.
  std::vector<std::array<double, 2>> pts;
  for (int i = 0; i <= m; ++i) pts.push_back({X(i), Y(ys[size_t(i)])});
  svg.polyline(pts, "#1f77b4", 2.2);
  const bool labels = m <= 40;
  for (int i = 0; i <= m; ++i) {
    const std::string tip = i == 0 ? "all Full: loss " + num(ys[0], "%.6g")
                                   : "step " + std::to_string(i) + ": flip layer " + std::to_string(r.flips[size_t(i - 1)]) +
                                         " -> " + r.steps[size_t(i - 1)].pattern + ", loss " + num(ys[size_t(i)], "%.6g");
    svg.circle(X(i), Y(ys[size_t(i)]), 3.5, "#1f77b4", tip);
    if (labels && i > 0)
      svg.text(X(i), Y(ys[size_t(i)]) - 8, "L" + std::to_string(r.flips[size_t(i - 1)]), 10, "middle", "#333333");
  }
  svg.rect(x0, y0, w, h, "none", "stroke=\"#444444\" stroke-width=\"1\"");
  return svg.finish(title);
}

void write_text_files(const std::vector<std::pair<std::string, std::string>>& files) {
  // Written to PATH.tmp.PID, then renamed, so a reader never sees a half-written file, and a
  // failure on one output leaves none: every temporary is written before the first rename.
  for (size_t i = 0; i < files.size(); ++i) {
    check_output_path(files[i].first);
    for (size_t j = 0; j < i; ++j)
      require(std::filesystem::path(files[i].first).lexically_normal() !=
                  std::filesystem::path(files[j].first).lexically_normal(),
              files[i].first + ": named for two outputs");
  }
  std::vector<std::string> tmps;
  std::error_code ec;
  const auto remove_tmps = [&] {
    for (const std::string& t : tmps) std::filesystem::remove(t, ec);
  };
  for (const auto& [path, text] : files) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      remove_tmps();
      throw Error(path + ": cannot write '" + tmp + "'");
    }
    tmps.push_back(tmp);
    f << text;
    f.close();
    if (!f) {
      remove_tmps();
      throw Error(path + ": cannot write '" + tmp + "'");
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::filesystem::rename(tmps[i], files[i].first, ec);
    if (ec) {  // a rename that fails after the checks above (a race): the rest are not published
      for (size_t j = i; j < tmps.size(); ++j) std::filesystem::remove(tmps[j], ec);
      throw Error(files[i].first + ": cannot rename '" + tmps[i] + "' into place");
    }
  }
}

void write_text_file(const std::string& path, const std::string& text) { write_text_files({{path, text}}); }

}  // namespace indexshare::io

// ---- diff --svg ---------------------------------------------------------------------------------

namespace indexshare::io {

namespace {

// Splits `s` into lines of at most `width` characters at spaces (a longer word stays whole).
std::vector<std::string> wrap(const std::string& s, size_t width) {
  std::vector<std::string> out;
  std::string line, word;
  auto flush_word = [&]() {
    if (word.empty()) return;
    if (!line.empty() && line.size() + 1 + word.size() > width) { out.push_back(line); line = "   "; }
    line += (line.empty() || line == "   " ? "" : " ") + word;
    word.clear();
  };
  for (char ch : s) {
    if (ch == ' ') flush_word(); else word += ch;
  }
  flush_word();
  if (!line.empty()) out.push_back(line);
  return out;
}

constexpr double kRatioFloor = 1e-3;  // the colour scale's low end (log scale up to 1)
constexpr const char* kFailColour = "#d7191c";
constexpr const char* kNoData = "#d9d9d9";
constexpr size_t kWrap = 130, kMaxFindingLines = 14;

std::string ratio_colour(double r) {
  if (std::isnan(r)) return kNoData;
  if (r > 1) return kFailColour;
  return viridis((std::log10(std::max(r, kRatioFloor)) - std::log10(kRatioFloor)) / -std::log10(kRatioFloor));
}

// Rows shown: at most 256 bins, each the max ratio / min recall over its rows.
struct Bins {
  int64_t n = 0, rows = 0;
  int64_t begin(int64_t b) const { return b * rows / n; }
  int64_t end(int64_t b) const { return (b + 1) * rows / n; }
};

double panel_height(double cell_h, int64_t bins, size_t finding_lines) {
  return 24 + std::max(60.0, cell_h * double(bins)) + 44 + 14.0 * double(finding_lines) + 16;
}

std::vector<std::string> finding_lines(const DiffPanel& p) {
  std::vector<std::string> lines;
  if (p.findings.empty()) lines.push_back("no finding");
  for (const std::string& f : p.findings)
    for (const std::string& l : wrap("- " + f, kWrap)) lines.push_back(l);
  if (lines.size() > kMaxFindingLines) {
    const size_t more = lines.size() - (kMaxFindingLines - 1);
    lines.resize(kMaxFindingLines - 1);
    lines.push_back("... " + std::to_string(more) + " more line(s): see the text report");
  }
  return lines;
}

// diff_svg's legend at x: the log colour scale of |err| / bound, failures, no data, the recall bars.
void diff_legend(Svg& svg, double legend_x, double top) {
  const double ly = top + 20, lh = 180, lw = 18;
  std::string grad = "<defs><linearGradient id=\"ratio\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n";
  for (int i = 0; i <= 16; ++i) grad += "<stop offset=\"" + fmt("%.4f", i / 16.0) + "\" stop-color=\"" + viridis(i / 16.0) + "\"/>\n";
  grad += "</linearGradient></defs>\n";
  svg.raw(grad);
  svg.text(legend_x, ly - 14, "|err| / bound", 11);
  svg.rect(legend_x, ly, lw, lh, "url(#ratio)", "stroke=\"#444444\" stroke-width=\"1\"");
  const char* ticks[] = {"0.001", "0.01", "0.1", "1"};
  for (int i = 0; i <= 3; ++i) {
    const double y = ly + lh - lh * i / 3.0;
    svg.line(legend_x + lw, y, legend_x + lw + 4, y, "#444444", 1);
    svg.text(legend_x + lw + 7, y + 4, i == 0 ? std::string("\u2264 0.001") : std::string(ticks[i]), 11);
  }
  svg.rect(legend_x, ly + lh + 12, lw, 12, kFailColour);
  svg.line(legend_x, ly + lh + 12, legend_x + lw, ly + lh + 24, "#ffffff", 1);
  svg.line(legend_x + lw, ly + lh + 12, legend_x, ly + lh + 24, "#ffffff", 1);
  svg.text(legend_x + lw + 6, ly + lh + 22, "> 1: outside the bound", 11);
  svg.rect(legend_x, ly + lh + 32, lw, 12, kNoData);
  svg.text(legend_x + lw + 6, ly + lh + 42, "not judged", 11);
  svg.rect(legend_x, ly + lh + 52, lw, 12, "#1a9850");
  svg.text(legend_x + lw + 6, ly + lh + 62, "recall 1", 11);
  svg.rect(legend_x, ly + lh + 72, lw, 12, "#fdae61");
  svg.text(legend_x + lw + 6, ly + lh + 82, "recall < 1", 11);
}

}  // namespace

std::string diff_svg(const std::vector<DiffPanel>& panels, const std::vector<std::string>& general, const std::string& title) {
  const double x0 = 96, top = 92;
  int64_t max_heads = 1;
  for (const DiffPanel& p : panels) max_heads = std::max(max_heads, p.heads);
  const double cell_w = std::clamp(std::floor(360.0 / double(max_heads)), 6.0, 40.0);
  const double plot_w = cell_w * double(max_heads), bars_x = x0 + plot_w + 40, bars_w = 110;
  const double legend_x = bars_x + bars_w + 60;
  std::vector<std::string> gen;
  for (const std::string& f : general)
    for (const std::string& l : wrap("- " + f, kWrap)) gen.push_back(l);
  // Heights first (the document's size comes before its content).
  double height = top;
  std::vector<Bins> bins;
  std::vector<double> cell_hs;
  std::vector<std::vector<std::string>> texts;
  for (const DiffPanel& p : panels) {
    const int64_t rows = p.rows ? p.rows : int64_t(p.recall.size());
    Bins b{std::min<int64_t>(std::max<int64_t>(rows, 1), 256), std::max<int64_t>(rows, 1)};
    const double cell_h = std::clamp(std::floor(320.0 / double(b.n)), 2.0, 18.0);
    bins.push_back(b);
    cell_hs.push_back(cell_h);
    texts.push_back(finding_lines(p));
    height += panel_height(cell_h, b.n, texts.back().size());
  }
  if (!gen.empty()) height += 24 + 14.0 * double(gen.size());
  height = std::max(height + 16, top + 260);
  const double width = std::max(legend_x + 200, 32 + 6.1 * double(kWrap + 4));
  Svg svg(width, height);
  svg.text(16, 26, title, 17, "start", "#111111", "font-weight=\"bold\"");
  svg.text(16, 46, "colour: the largest |err| / bound of attn.out over the d_v columns, per (query row, head)", 11, "start", "#444444");
  svg.text(16, 60, "bars: per-row recall of the candidate's positions against the golden's; under each panel: its findings", 11,
           "start", "#444444");
  svg.text(16, 74, "a kernel bug tends to sit at a tile or split boundary, in some heads, or in late rows: look for the shape "
                   "of the red and bright cells", 11, "start", "#444444");
  diff_legend(svg, legend_x, top);
  double y = top;
  for (size_t i = 0; i < panels.size(); ++i) {
    const DiffPanel& p = panels[i];
    const Bins& b = bins[i];
    const double cell_h = cell_hs[i], plot_h = cell_h * double(b.n), y0 = y + 24;
    svg.text(16, y + 14, p.label, 13, "start", "#111111", "font-weight=\"bold\"");
    svg.text(16 + 7.4 * double(p.label.size()) + 10, y + 14, p.verdict, 11, "start", "#444444");
    auto row_name = [&](int64_t r) { return std::to_string(p.row_ids.empty() ? r : p.row_ids[size_t(r)]); };
    auto bin_name = [&](int64_t k) {
      const int64_t a = b.begin(k), e = b.end(k) - 1;
      return a == e ? "row " + row_name(a) : "rows " + row_name(a) + "-" + row_name(e);
    };
    // Heatmap.
    if (p.rows > 0) {
      const double w = cell_w * double(p.heads);
      for (int64_t k = 0; k < b.n; ++k)
        for (int64_t h = 0; h < p.heads; ++h) {
          double r = std::nan("");
          for (int64_t t = b.begin(k); t < b.end(k); ++t) {
            const double v = p.ratio[size_t(t * p.heads + h)];
            if (!std::isnan(v) && (std::isnan(r) || v > r)) r = v;
          }
          const double x = x0 + double(h) * cell_w, yy = y0 + double(k) * cell_h;
          svg.rect(x, yy, cell_w, cell_h, ratio_colour(r), "",
                   bin_name(k) + ", head " + std::to_string(h) + ": |err| / bound = " + (std::isnan(r) ? "n/a" : fmt("%.4g", r)));
          if (r > 1 && cell_h >= 6 && cell_w >= 6) {
            svg.line(x + 1, yy + 1, x + cell_w - 1, yy + cell_h - 1, "#ffffff", 1);
            svg.line(x + cell_w - 1, yy + 1, x + 1, yy + cell_h - 1, "#ffffff", 1);
          }
        }
      svg.rect(x0, y0, w, plot_h, "none", "stroke=\"#444444\" stroke-width=\"1\"");
      const int hs = label_step(cell_w, 14);
      for (int64_t h = 0; h < p.heads; h += hs) svg.text(x0 + (double(h) + 0.5) * cell_w, y0 + plot_h + 14, std::to_string(h), 10, "middle");
      svg.text(x0 + w / 2, y0 + plot_h + 30, "head", 12, "middle");
    } else {
      svg.rect(x0, y0, plot_w, std::max(plot_h, 20.0), kNoData);
      svg.text(x0 + 6, y0 + 14, "attn.out not judged", 11);
    }
    const int rs = label_step(cell_h, 12);
    for (int64_t k = 0; k < b.n; k += rs) svg.text(x0 - 5, y0 + (double(k) + 0.5) * cell_h + 4, row_name(b.begin(k)), 10, "end");
    svg.text(x0 - 44, y0 + plot_h / 2, "query row", 12, "middle", "#222222", "", -90);
    // Recall bars.
    if (!p.recall.empty()) {
      for (int64_t k = 0; k < b.n; ++k) {
        double r = 1;
        for (int64_t t = b.begin(k); t < b.end(k); ++t) r = std::min(r, p.recall[size_t(t)]);
        svg.rect(bars_x, y0 + double(k) * cell_h, std::max(0.5, bars_w * r), std::max(1.0, cell_h - (cell_h >= 4 ? 1 : 0)),
                 r >= 1 ? "#1a9850" : "#fdae61", "", bin_name(k) + ": recall " + fmt("%.4g", r));
      }
      svg.line(bars_x, y0, bars_x, y0 + plot_h, "#444444", 1);
      for (int i = 0; i <= 2; ++i) {
        const double x = bars_x + bars_w * i / 2.0;
        svg.line(x, y0 + plot_h, x, y0 + plot_h + 4, "#444444", 1);
        svg.text(x, y0 + plot_h + 14, i == 0 ? "0" : i == 1 ? "0.5" : "1", 10, "middle");
      }
      svg.text(bars_x + bars_w / 2, y0 + plot_h + 30, "recall (" + p.recall_of + ")", 12, "middle");
    }
    // Findings.
    double ty = y0 + std::max(60.0, plot_h) + 44;
    for (const std::string& l : texts[i]) {
      svg.text(24, ty, l, 11, "start", l.rfind("no finding", 0) == 0 ? "#888888" : "#222222");
      ty += 14;
    }
    y += panel_height(cell_h, b.n, texts[i].size());
  }
  if (!gen.empty()) {
    svg.text(16, y + 14, "across layers", 13, "start", "#111111", "font-weight=\"bold\"");
    y += 30;
    for (const std::string& l : gen) { svg.text(24, y, l, 11); y += 14; }
  }
  return svg.finish(title);
}

}  // namespace indexshare::io

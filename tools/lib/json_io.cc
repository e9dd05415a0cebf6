// indexshare tools/: reading text files and strict JSON (see json_io.h).
#include "tools/lib/json_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "ref/error.h"

namespace indexshare::io {

using json = nlohmann::json;

std::string read_text_file(const std::string& path) {
  // A regular file only: a folder opens and reads as empty ("unexpected end of input"), a FIFO
  // would block the reader.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot read: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw Error(path + ": not a regular file (" + (S_ISDIR(st.st_mode) ? "a folder" : "a FIFO, socket or device") + ")");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": cannot read: " + std::strerror(errno));
  return ss.str();
}

namespace {
// nlohmann's own DOM builder driven through SAX, refusing a duplicate key at any depth (the DOM
// builder keeps the last one silently, and JSON readers disagree on which counts) with its path,
// and nesting deeper than 64 levels. (The safetensors header reader has its own handler, with
// messages in that format's terms.)
class StrictSax {
 public:
  StrictSax(json& root, const std::string& file) : dom_(root, /*allow_exceptions=*/true), file_(file) {}

  bool null() { element(); return dom_.null(); }
  bool boolean(bool v) { element(); return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { element(); return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { element(); return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { element(); return dom_.number_float(v, s); }
  bool string(json::string_t& v) { element(); return dom_.string(v); }
  bool binary(json::binary_t& v) { element(); return dom_.binary(v); }
  bool start_object(std::size_t n) { element(); open(false); return dom_.start_object(n); }
  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    if (!f.keys.insert(k).second) throw Error(file_ + ": duplicate key '" + path() + k + "' (each key may appear once)");
    f.key = k;
    return dom_.key(k);
  }
  bool end_object() { stack_.pop_back(); return dom_.end_object(); }
  bool start_array(std::size_t n) { element(); open(true); return dom_.start_array(n); }
  bool end_array() { stack_.pop_back(); return dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& ex) {
    return dom_.parse_error(position, token, ex);  // throws ex
  }

 private:
  struct Frame {  // an open object or array; `label` is how its parent names it
    bool array = false;
    std::set<std::string> keys;
    std::string key, label;
    size_t next = 0;
  };
  void element() {
    if (!stack_.empty() && stack_.back().array) ++stack_.back().next;
  }
  void open(bool array) {
    if (stack_.size() >= 64) throw Error(file_ + ": invalid JSON: nested deeper than 64 levels");
    Frame f;
    f.array = array;
    if (!stack_.empty()) {
      if (stack_.back().array) {  // appended piecewise: GCC 12 warns (-Wrestrict) on "[" + to_string(...)
        f.label.push_back('[');
        f.label.append(std::to_string(stack_.back().next - 1));
        f.label.push_back(']');
      } else {
        f.label = stack_.back().key;
      }
    }
    stack_.push_back(std::move(f));
  }
  std::string path() const {  // of the innermost open object, "config." or "tensors[3]."
    std::string p;
    for (size_t i = 1; i < stack_.size(); ++i)
      p += (stack_[i].label.rfind('[', 0) == 0 || p.empty() ? "" : ".") + stack_[i].label;
    return p.empty() ? p : p + ".";
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const std::string& file_;
  std::vector<Frame> stack_;
};

}  // namespace

json parse_json_strict(const std::string& text, const std::string& name) {
  json root;
  StrictSax sax(root, name);
  try {
    json::sax_parse(text, &sax, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw Error(name + ": invalid JSON: " + e.what());
  }
  return root;
}

}  // namespace indexshare::io

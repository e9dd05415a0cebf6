// Test helper: a minimal XML well-formedness check for the SVG figures.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace indexshare::testing {

// Minimal XML well-formedness check: declarations/comments skipped, every start tag closed by
// the matching end tag, attribute quotes balanced, and '&' only as one of the five entities or
// a character reference. Returns an empty string when fine, else what is wrong.
inline std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0;
  auto entity_ok = [&](size_t at) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
      if (s.compare(at, std::string(e).size(), e) == 0) return true;
    if (s.compare(at, 2, "&#") == 0) return s.find(';', at) != std::string::npos;
    return false;
  };
  int roots = 0;
  while (i < s.size()) {
    if (s[i] == '&' && !entity_ok(i)) return "bad entity at " + std::to_string(i);
    if (s[i] == '>') return "stray '>' at " + std::to_string(i);
    if (s[i] != '<') {
      ++i;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0) {
      i = s.find("-->", i);
      if (i == std::string::npos) return "unterminated comment";
      i += 3;
      continue;
    }
    if (s.compare(i, 2, "<?") == 0) {
      i = s.find("?>", i);
      if (i == std::string::npos) return "unterminated declaration";
      i += 2;
      continue;
    }
    // A tag: find its end outside quotes.
    size_t j = i + 1;
    char quote = 0;
    for (; j < s.size(); ++j) {
      if (quote) {
        if (s[j] == quote) quote = 0;
        else if (s[j] == '<') return "'<' inside an attribute at " + std::to_string(j);
        else if (s[j] == '&' && !entity_ok(j)) return "bad entity in attribute at " + std::to_string(j);
      } else if (s[j] == '"' || s[j] == '\'') {
        quote = s[j];
      } else if (s[j] == '>') {
        break;
      } else if (s[j] == '<') {
        return "'<' inside a tag at " + std::to_string(j);
      }
    }
    if (j >= s.size()) return "unterminated tag at " + std::to_string(i);
    const std::string tag = s.substr(i + 1, j - i - 1);
    const bool closing = !tag.empty() && tag[0] == '/', empty = !tag.empty() && tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \t\n/"));
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    // Attribute names (the text before each '=' outside quotes) must be unique.
    std::set<std::string> attrs;
    std::string word;
    char q = 0;
    for (char c : tag) {
      if (q) {
        if (c == q) q = 0;
      } else if (c == '"' || c == '\'') {
        q = c;
      } else if (c == '=') {
        if (!attrs.insert(word).second) return "attribute " + word + " repeated in <" + name + "> at " + std::to_string(i);
        word.clear();
      } else if (c == ' ' || c == '\t' || c == '\n') {
        word.clear();
      } else {
        word += c;
      }
    }
    if (closing) {
      if (stack.empty() || stack.back() != name) return "unbalanced </" + name + "> at " + std::to_string(i);
      stack.pop_back();
    } else if (!empty) {
      if (stack.empty()) ++roots;
      stack.push_back(name);
    } else if (stack.empty()) {
      ++roots;
    }
    i = j + 1;
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "expected one root element, got " + std::to_string(roots);
  return "";
}

}  // namespace indexshare::testing

// indexshare: the error type of the project.
//
// Every input problem (a bad descriptor token, an index bound outside the tensor, a NaN where the
// rules forbid one, a malformed file) is reported by throwing `indexshare::Error` with a message
// that names the thing at fault. Tools catch it at the top, print it, and exit with status 2.
#pragma once

#include <stdexcept>
#include <string>

namespace indexshare {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws Error(message) when `condition` is false. Use for input validation only; internal
// invariants use assert.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace indexshare

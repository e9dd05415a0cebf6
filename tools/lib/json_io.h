// indexshare tools/: reading text files and strict JSON, for every reader of user files
// (golden manifests, model configs).
//
//   read_text_file     the bytes of a regular file; Error naming the path for anything else (a
//                      folder read as empty JSON, a FIFO blocked the reader) or an OS error
//   parse_json_strict  strict JSON (no comments, no trailing data); Error naming `name` on invalid
//                      JSON, a duplicate key at any depth (with its path, e.g. 'config.seed') or
//                      nesting deeper than 64 levels
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace indexshare::io {

std::string read_text_file(const std::string& path);
nlohmann::json parse_json_strict(const std::string& text, const std::string& name);

}  // namespace indexshare::io

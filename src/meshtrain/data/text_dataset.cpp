// Text corpora: file discovery in sorted order, fortune/paragraph splitting, UTF-8 checks, JSON
// lines. Every failure is a DataError naming the path (and line) and what was expected there.
#include "meshtrain/data/text_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/core/progress.h"

namespace meshtrain {
namespace fs = std::filesystem;

std::string read_whole_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  MT_CHECK_T(DataError, static_cast<bool>(in), "cannot open '{}' for reading", p);
  std::ostringstream ss;
  ss << in.rdbuf();
  MT_CHECK_T(DataError, !in.bad(), "error while reading '{}'", p);
  return ss.str();
}

namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

// Calls f(line_without_terminator, line_with_terminator) for every line of `s`.
template <typename F>
void for_each_line(std::string_view s, F&& f) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    size_t end = nl == std::string_view::npos ? s.size() : nl + 1;
    std::string_view full = s.substr(pos, end - pos);
    std::string_view bare = full;
    if (!bare.empty() && bare.back() == '\n') bare.remove_suffix(1);
    f(bare, full);
    pos = end;
  }
}

}  // namespace

std::vector<std::string_view> split_fortunes(std::string_view content) {
  std::vector<std::string_view> docs;
  size_t start = 0, pos = 0;
  auto flush = [&](size_t end) {
    std::string_view d = content.substr(start, end - start);
    if (!is_blank(d)) docs.push_back(d);
  };
  for_each_line(content, [&](std::string_view bare, std::string_view full) {
    if (bare == "%" || bare == "%\r") {
      flush(pos);
      start = pos + full.size();
    }
    pos += full.size();
  });
  flush(content.size());
  return docs;
}

std::vector<std::string_view> split_paragraphs(std::string_view content) {
  std::vector<std::string_view> docs;
  size_t pos = 0, start = std::string_view::npos;
  for_each_line(content, [&](std::string_view bare, std::string_view full) {
    if (is_blank(bare)) {
      if (start != std::string_view::npos) docs.push_back(content.substr(start, pos - start));
      start = std::string_view::npos;
    } else if (start == std::string_view::npos) {
      start = pos;
    }
    pos += full.size();
  });
  if (start != std::string_view::npos) docs.push_back(content.substr(start));
  return docs;
}

int64_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07;
    else
      return int64_t(i);
    if (i + len > n) return int64_t(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return int64_t(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return int64_t(i);
    i += len;
  }
  return -1;
}

TextCorpus::TextCorpus(std::string kind, std::string path)
    : kind_(std::move(kind)), path_(std::move(path)) {}

void TextCorpus::add_document(std::string_view doc) {
  text_.append(doc);
  offsets_.push_back(int64_t(text_.size()));
}

std::string_view TextCorpus::document(int64_t i) const {
  MT_CHECK(i >= 0 && i < num_documents(), "document index {} out of [0, {})", i, num_documents());
  return std::string_view(text_).substr(size_t(offsets_[size_t(i)]),
                                        size_t(offsets_[size_t(i) + 1] - offsets_[size_t(i)]));
}

TextCorpus TextCorpus::from_documents(std::string kind, std::string path,
                                      const std::vector<std::string>& docs) {
  TextCorpus c(std::move(kind), std::move(path));
  for (const std::string& d : docs) c.add_document(d);
  return c;
}

namespace {

std::vector<std::string> fortune_files(const std::string& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    MT_THROW(DataError,
             "fortunes dataset: folder '{}' not found; run scripts/install_deps.sh (Debian "
             "package `fortunes`) or point [training] dataset_path at a folder of fortune files",
             folder);
  std::vector<fs::path> candidates;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || name.find('.') != std::string::npos) continue;
    if (e.is_regular_file()) candidates.push_back(e.path());  // follows symlinks; skips off/
  }
  std::sort(candidates.begin(), candidates.end());
  // A symlink to a file already listed adds nothing; dedupe after sorting so the first name
  // in sorted order is the one kept, whatever order the directory lists them in.
  std::vector<std::string> files;
  std::set<fs::path> seen;
  for (const fs::path& p : candidates) {
    fs::path canon = fs::weakly_canonical(p, ec);
    if (seen.insert(ec ? p : canon).second) files.push_back(p.string());
  }
  MT_CHECK_T(DataError, !files.empty(),
             "fortunes dataset: no fortune files (files without an extension) in '{}'", folder);
  return files;
}

// text and jsonl: the file itself, or the files under the folder whose extension is listed.
std::vector<std::string> files_by_extension(const std::string& kind, const std::string& path,
                                            const std::vector<std::string>& exts,
                                            const std::string& what) {
  MT_CHECK_T(DataError, !path.empty(), "{} dataset needs [training] dataset_path: {}", kind, what);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  MT_CHECK_T(DataError, fs::is_directory(path, ec), "{} dataset: '{}' not found (expected {})",
             kind, path, what);
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file() &&
        std::find(exts.begin(), exts.end(), e.path().extension().string()) != exts.end())
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::string globs;
  for (const std::string& x : exts) globs += (globs.empty() ? "*" : " or *") + x;
  MT_CHECK_T(DataError, !files.empty(), "{} dataset: no {} files under folder '{}'", kind, globs,
             path);
  return files;
}

std::string resolved(const std::string& kind, const std::string& path) {
  return kind == "fortunes" && path.empty() ? std::string(kDefaultFortunesDir) : path;
}

}  // namespace

std::vector<std::string> dataset_files(const std::string& kind, const std::string& path) {
  if (kind == "fortunes") return fortune_files(resolved(kind, path));
  if (kind == "text")
    return files_by_extension(kind, path, {".txt"}, "a UTF-8 file or a folder of *.txt files");
  if (kind == "jsonl")
    return files_by_extension(kind, path, {".jsonl", ".json"},
                              "a JSON-lines file or a folder of *.jsonl / *.json files");
  MT_THROW(DataError, "text dataset kind must be fortunes, text or jsonl, found '{}'", kind);
}

TextCorpus TextCorpus::load_files(const std::string& kind, const std::string& path,
                                  std::span<const std::string> files, const std::string& text_field,
                                  Progress* progress) {
  TextCorpus c(kind, resolved(kind, path));
  for (const std::string& f : files) {
    std::string content = read_whole_file(f);
    if (kind == "fortunes") {
      for (std::string_view d : split_fortunes(content)) c.add_document(d);
    } else if (kind == "text") {
      int64_t bad = find_invalid_utf8(content);
      if (bad >= 0)
        MT_THROW(DataError,
                 "text dataset: '{}' is not valid UTF-8 (byte offset {}); for pre-tokenized .bin "
                 "files use dataset \"tokens\"",
                 f, bad);
      for (std::string_view d : split_paragraphs(content)) c.add_document(d);
    } else {
      MT_CHECK_T(DataError, kind == "jsonl",
                 "text dataset kind must be fortunes, text or jsonl, found '{}'", kind);
      c.add_jsonl(f, content, text_field);
    }
    ++c.num_files_;
    if (progress) progress->add(int64_t(content.size()));
  }
  return c;
}

TextCorpus TextCorpus::load(const std::string& kind, const std::string& path,
                            const std::string& text_field, Progress* progress) {
  const std::vector<std::string> files = dataset_files(kind, path);
  std::optional<Progress> own;
  if (!progress) {
    int64_t total = 0;
    std::error_code ec;
    for (const std::string& f : files) total += int64_t(fs::file_size(f, ec));
    own.emplace(fmt::format("loading {} '{}'", kind, resolved(kind, path)), total,
                ProgressOptions{.unit = ProgressUnit::kBytes});
    progress = &*own;
  }
  TextCorpus c = load_files(kind, path, files, text_field, progress);
  if (kind == "fortunes")
    MT_CHECK_T(DataError, c.num_documents() > 0,
               "fortunes dataset: no documents in the {} fortune files of '{}'", files.size(),
               c.path());
  else if (kind == "text")
    MT_CHECK_T(DataError, c.num_documents() > 0,
               "text dataset: no documents (non-blank lines) in '{}'", path);
  else
    MT_CHECK_T(DataError, c.num_documents() > 0,
               "jsonl dataset: no documents in '{}' ({} file{}; every line is blank or an empty "
               "\"{}\")",
               path, files.size(), files.size() == 1 ? "" : "s", text_field);
  return c;
}

TextCorpus TextCorpus::load_fortunes(const std::string& folder) { return load("fortunes", folder); }

TextCorpus TextCorpus::load_text(const std::string& path) { return load("text", path); }

TextCorpus TextCorpus::load_jsonl(const std::string& path, const std::string& text_field) {
  return load("jsonl", path, text_field);
}

std::string TextCorpus::description() const {
  return fmt::format("{}: {} documents, {}", kind_, format_thousands(num_documents()),
                     format_bytes(num_bytes()));
}

std::string format_thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_bytes(int64_t bytes) {
  return Progress::format_amount(double(bytes), ProgressUnit::kBytes);
}

std::string format_si(double v) { return Progress::format_amount(v, ProgressUnit::kCount); }

// ---- JSON lines: one JSON object per line, the document is one string field of it ----

namespace {

std::string field_names(const nlohmann::json& j) {
  std::string names;
  int shown = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (shown++ == 8) {
      names += ", ...";
      break;
    }
    names += (names.empty() ? "" : ", ") + it.key();
  }
  return names.empty() ? "none" : names;
}

}  // namespace

void TextCorpus::add_jsonl(const std::string& file, std::string_view content,
                           const std::string& field) {
  const bool dot_json = file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0;
  const char* hint = dot_json ? " (a .json file in a jsonl dataset must be JSON lines: one object "
                                "per line)"
                              : "";
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < content.size()) {
    const size_t nl = content.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? content.size() : nl;
    const std::string_view line = content.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (is_blank(line)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      MT_THROW(DataError, "jsonl dataset: '{}' line {} is not JSON: {}{}", file, line_no, e.what(),
               hint);
    }
    MT_CHECK_T(DataError, j.is_object(),
               "jsonl dataset: '{}' line {} is a JSON {}, expected an object with a \"{}\" "
               "field{}",
               file, line_no, j.type_name(), field, hint);
    auto it = j.find(field);
    MT_CHECK_T(DataError, it != j.end(),
               "jsonl dataset: '{}' line {} has no \"{}\" field (its fields: {}); set [training] "
               "dataset_text_field to the field holding the text",
               file, line_no, field, field_names(j));
    MT_CHECK_T(DataError, it->is_string(),
               "jsonl dataset: '{}' line {}: field \"{}\" is a {}, expected a string", file,
               line_no, field, it->type_name());
    const std::string& text = it->get_ref<const std::string&>();
    if (!text.empty()) add_document(text);
  }
}

}  // namespace meshtrain

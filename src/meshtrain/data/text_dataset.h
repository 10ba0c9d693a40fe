// Document sources for the "fortunes", "text" and "jsonl" datasets: every document's bytes in one
// buffer with offsets, in a fixed order (sorted file names, then position in the file), so that a
// seed alone decides what the loader sees.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class Progress;

inline constexpr const char* kDefaultFortunesDir = "/usr/share/games/fortunes";
inline constexpr const char* kDefaultTextField = "text";

// The files a text dataset reads, in load order ("" = the default folder for fortunes):
//   fortunes: files without an extension directly in the folder (symlinked duplicates once);
//   text:     the file itself, or every *.txt under the folder (recursive, sorted by path);
//   jsonl:    the file itself, or every *.jsonl and *.json under the folder (recursive, sorted).
// DataError naming the path when it does not exist or holds no such file.
std::vector<std::string> dataset_files(const std::string& kind, const std::string& path);

class TextCorpus {
 public:
  // "fortunes": every file without an extension directly in `folder` ("" = the Debian
  // fortunes folder), sorted by name; *.dat, *.u8, sub-folders (off/) and dot-files are
  // skipped. A line that is exactly "%" separates documents; a document is the bytes between
  // separators (line ends included); whitespace-only documents are dropped.
  static TextCorpus load_fortunes(const std::string& folder);

  // "text": one UTF-8 file, or every *.txt file under a folder (recursive, sorted by path).
  // A document is a maximal run of non-blank lines: one or more blank (empty or whitespace-only)
  // lines separate documents, and so does the end of a file. Invalid UTF-8 is a DataError.
  static TextCorpus load_text(const std::string& path);

  // "jsonl": JSON lines, one document per line: the string field `text_field` of the line's JSON
  // object ([training] dataset_text_field). Blank lines are skipped, so are documents that are
  // empty strings. DataError naming the file and line for a line that is not a JSON object or
  // whose field is missing or not a string; a *.json file must be JSON lines too.
  static TextCorpus load_jsonl(const std::string& path,
                               const std::string& text_field = kDefaultTextField);

  // Any of the kinds above from some of its files (from dataset_files; the tokenize command
  // loads a large dataset in batches). `progress` advances by each file's size.
  static TextCorpus load_files(const std::string& kind, const std::string& path,
                               std::span<const std::string> files,
                               const std::string& text_field = kDefaultTextField,
                               Progress* progress = nullptr);
  // dataset_files + load_files, then DataError when there is no document.
  static TextCorpus load(const std::string& kind, const std::string& path,
                         const std::string& text_field = kDefaultTextField,
                         Progress* progress = nullptr);

  // For tests and tools: documents given directly (empty ones are kept).
  static TextCorpus from_documents(std::string kind, std::string path,
                                   const std::vector<std::string>& docs);

  int64_t num_documents() const { return int64_t(offsets_.size()) - 1; }
  std::string_view document(int64_t i) const;
  int64_t num_bytes() const { return offsets_.back(); }  // document bytes, separators excluded
  int64_t num_files() const { return num_files_; }
  const std::string& kind() const { return kind_; }
  const std::string& path() const { return path_; }
  std::string description() const;  // "fortunes: 15,234 documents, 2.54 MB"

 private:
  TextCorpus(std::string kind, std::string path);
  void add_document(std::string_view doc);
  void add_jsonl(const std::string& file, std::string_view content, const std::string& field);

  std::string kind_, path_;
  std::string text_;
  std::vector<int64_t> offsets_{0};  // document i is text_[offsets_[i], offsets_[i + 1])
  int64_t num_files_ = 0;
};

// Documents of one fortune file's content / one text file's content, in order (exposed for
// tests; the loaders above call them per file).
std::vector<std::string_view> split_fortunes(std::string_view content);
std::vector<std::string_view> split_paragraphs(std::string_view content);

// The whole file; DataError naming it when it cannot be read.
std::string read_whole_file(const std::string& path);

// Offset of the first byte that breaks UTF-8, or -1 when `s` is valid.
int64_t find_invalid_utf8(std::string_view s);

// "15,234"; "2.54 MB" (decimal units); "2.61M".
std::string format_thousands(int64_t n);
std::string format_bytes(int64_t bytes);
std::string format_si(double v);

}  // namespace meshtrain

// JSON-lines documents: one JSON object per line, the document is one string field of it. A line
// that breaks the format is a DataError naming the file, the line number and what was found.
#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"
#include "meshtrain/data/text_dataset.h"

namespace meshtrain {

namespace {

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

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
    if (blank(line)) continue;
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

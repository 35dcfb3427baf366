#include "proxy/client_request_guard.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "common/protocol/cluster_only_fields.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

// Looks at the keys of the outermost object only, without building the document, and stops at
// the first cluster-only one.
class TopLevelKeyScan : public nlohmann::json_sax<Json> {
 public:
  std::optional<std::string> found;  // the first cluster-only key

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool key(string_t& name) override {
    if (depth_ == 1 &&
        std::ranges::find(kClusterOnlyBodyFields, name) != kClusterOnlyBodyFields.end()) {
      found = name;
      return false;  // stops the parse
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool enter() {
    ++depth_;
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }
  int depth_ = 0;
};

}  // namespace

std::optional<ApiError> cluster_only_field_refusal(std::string_view body) {
  TopLevelKeyScan scan;
  Json::sax_parse(body, &scan);
  if (!scan.found) return std::nullopt;
  return invalid_request("'" + *scan.found +
                             "' is reserved for the cluster's own requests; a client may not "
                             "send it",
                         *scan.found);
}

}  // namespace pdserve::proxy

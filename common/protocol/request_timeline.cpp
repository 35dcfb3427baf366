#include "common/protocol/request_timeline.h"

#include <cmath>
#include <limits>

namespace pdserve {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr const char* kDecodeOrigin = "decode";
constexpr const char* kProxyOrigin = "proxy";

OrderedJson optional_number_json(const std::optional<double>& value) {
  return value ? OrderedJson(*value) : OrderedJson(nullptr);
}

// The fields of one object of the timeline, each named by its path
// ("timeline.spans[2].start_ms"). A problem throws InvalidArgument, which parse() returns.
class PathReader {
 public:
  PathReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {
    PDS_ENSURE(object.is_object(), StatusCode::kInvalidArgument, path_ + " is not an object");
  }

  // nullptr when the field is absent or null.
  const Json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  const Json& required(const char* key) const {
    const Json* value = find(key);
    if (value == nullptr) fail(key, "is missing");
    return *value;
  }

  double number(const char* key) const { return finite_number(key, required(key)); }
  std::optional<double> nullable_number(const char* key) const {
    const Json* value = find(key);
    if (value == nullptr) return std::nullopt;
    return finite_number(key, *value);
  }
  // An integer from 0 to T's maximum.
  template <typename T>
  T count(const char* key) const {
    const Json& value = required(key);
    const bool in_range =
        value.is_number_unsigned()
            ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
            : value.is_number_integer() && value.get<int64_t>() >= 0 &&
                  static_cast<uint64_t>(value.get<int64_t>()) <=
                      static_cast<uint64_t>(std::numeric_limits<T>::max());
    if (!in_range) fail(key, "must be a non-negative integer in range");
    return value.get<T>();
  }
  std::string string(const char* key) const {
    const Json& value = required(key);
    if (!value.is_string()) fail(key, "must be a string");
    return value.get<std::string>();
  }
  const Json& array(const char* key) const {
    const Json& value = required(key);
    if (!value.is_array()) fail(key, "must be an array");
    return value;
  }

  std::string path(const std::string& member) const { return path_ + "." + member; }
  [[noreturn]] void fail(const std::string& member, const std::string& problem) const {
    PDS_THROW(StatusCode::kInvalidArgument, path(member) + " " + problem);
  }

 private:
  double finite_number(const char* key, const Json& value) const {
    if (!value.is_number()) fail(key, "must be a number");
    const double number = value.get<double>();
    if (!std::isfinite(number)) fail(key, "must be finite");
    return number;
  }

  const Json& object_;
  std::string path_;
};

TimelineArgValue arg_value(const PathReader& span, const std::string& key, const Json& value) {
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    span.fail("args." + key, "is out of range");
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float() && std::isfinite(value.get<double>())) return value.get<double>();
  if (value.is_string()) return value.get<std::string>();
  span.fail("args." + key, "must be a finite number or a string");
}

RequestTimelineSpan parse_span(const Json& json, const std::string& path) {
  const PathReader span(json, path);
  RequestTimelineSpan out;
  out.name = span.string("name");
  out.node = span.string("node");
  out.start_ms = span.number("start_ms");
  out.end_ms = span.number("end_ms");
  PDS_ENSURE(out.end_ms >= out.start_ms, StatusCode::kInvalidArgument,
             path + " (" + out.name + ") ends before it starts");
  if (const Json* args = span.find("args")) {
    if (!args->is_object()) span.fail("args", "must be an object");
    for (const auto& [key, value] : args->items()) out.args[key] = arg_value(span, key, value);
  }
  return out;
}

KvTransferSummary parse_kv_transfer(const Json& json, const std::string& path) {
  const PathReader kv(json, path);
  KvTransferSummary out;
  out.bytes = kv.count<uint64_t>("bytes");
  out.blocks = kv.count<int>("blocks");
  out.ms = kv.number("ms");
  out.gb_per_s = kv.nullable_number("gb_per_s");
  out.exposed_ms = kv.nullable_number("exposed_ms");
  out.layers = kv.count<int>("layers");
  out.layers_overlapped = kv.count<int>("layers_overlapped");
  return out;
}

SpecDecodeSummary parse_spec_decode(const Json& json, const std::string& path) {
  const PathReader spec(json, path);
  SpecDecodeSummary out;
  out.drafts = spec.count<int64_t>("drafts");
  out.draft_tokens = spec.count<int64_t>("draft_tokens");
  out.accepted_tokens = spec.count<int64_t>("accepted_tokens");
  return out;
}

OrderedJson spec_decode_json(const SpecDecodeSummary& spec) {
  OrderedJson out;
  out["drafts"] = spec.drafts;
  out["draft_tokens"] = spec.draft_tokens;
  out["accepted_tokens"] = spec.accepted_tokens;
  out["acceptance_rate"] = spec.draft_tokens > 0 ? static_cast<double>(spec.accepted_tokens) /
                                                       static_cast<double>(spec.draft_tokens)
                                                 : 0.0;
  return out;
}

OrderedJson kv_transfer_json(const KvTransferSummary& kv) {
  OrderedJson out;
  out["bytes"] = kv.bytes;
  out["blocks"] = kv.blocks;
  out["ms"] = kv.ms;
  out["gb_per_s"] = optional_number_json(kv.gb_per_s);
  out["exposed_ms"] = optional_number_json(kv.exposed_ms);
  out["layers"] = kv.layers;
  out["layers_overlapped"] = kv.layers_overlapped;
  return out;
}

OrderedJson span_json(const RequestTimelineSpan& span) {
  return {{"name", span.name},
          {"node", span.node},
          {"start_ms", span.start_ms},
          {"end_ms", span.end_ms},
          {"args", timeline_args_json(span.args)}};
}

RequestTimeline parse_timeline(const Json& json) {
  const std::string path = "timeline";
  const PathReader reader(json, path);
  const Json& version = reader.required("version");
  if (!version.is_number_integer() || version != RequestTimeline::kVersion) {
    reader.fail("version", "is not " + std::to_string(RequestTimeline::kVersion));
  }
  RequestTimeline out;
  out.request_id = reader.string("request_id");
  if (out.request_id.empty()) reader.fail("request_id", "is empty");
  out.trace_id = reader.string("trace_id");
  const std::string origin = reader.string("origin");
  if (origin == kDecodeOrigin) {
    out.origin = TimelineOrigin::kDecode;
  } else if (origin == kProxyOrigin) {
    out.origin = TimelineOrigin::kProxy;
  } else {
    reader.fail("origin", "is neither 'decode' nor 'proxy'");
  }
  if (const Json* sync = reader.find("sync")) {
    const PathReader sync_reader(*sync, reader.path("sync"));
    out.head_sent_ms = sync_reader.number("head_sent_ms");
    if (*out.head_sent_ms < 0) sync_reader.fail("head_sent_ms", "is negative");
  } else if (out.origin == TimelineOrigin::kDecode) {
    reader.fail("sync", "is missing (the decode node's timeline has it)");
  }
  const Json& spans = reader.array("spans");
  out.spans.reserve(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    out.spans.push_back(parse_span(spans[i], reader.path("spans[" + std::to_string(i) + "]")));
  }
  const Json& tokens = reader.array("tokens_ms");
  out.tokens_ms.reserve(tokens.size());
  for (const Json& time : tokens) {
    if (!time.is_number() || !std::isfinite(time.get<double>())) {
      reader.fail("tokens_ms", "must hold finite numbers");
    }
    out.tokens_ms.push_back(time.get<double>());
  }
  out.output_tokens = reader.count<int64_t>("output_tokens");
  out.ttft_ms = reader.nullable_number("ttft_ms");
  out.tpot_ms = reader.nullable_number("tpot_ms");
  out.e2e_ms = reader.number("e2e_ms");
  if (const Json* kv = reader.find("kv_transfer")) {
    out.kv_transfer = parse_kv_transfer(*kv, reader.path("kv_transfer"));
  }
  if (const Json* spec = reader.find("spec_decode")) {
    out.spec_decode = parse_spec_decode(*spec, reader.path("spec_decode"));
  }
  return out;
}

}  // namespace

OrderedJson timeline_args_json(const TimelineArgs& args) {
  OrderedJson out = OrderedJson::object();
  for (const auto& [key, value] : args) {
    std::visit([&](const auto& held) { out[key] = held; }, value);
  }
  return out;
}

OrderedJson RequestTimeline::to_json() const {
  OrderedJson out;
  out["version"] = kVersion;
  out["request_id"] = request_id;
  out["trace_id"] = trace_id;
  out["origin"] = origin == TimelineOrigin::kDecode ? kDecodeOrigin : kProxyOrigin;
  if (head_sent_ms) out["sync"] = OrderedJson{{"head_sent_ms", *head_sent_ms}};
  OrderedJson span_array = OrderedJson::array();
  for (const RequestTimelineSpan& span : spans) span_array.push_back(span_json(span));
  out["spans"] = std::move(span_array);
  out["tokens_ms"] = tokens_ms;
  out["output_tokens"] = output_tokens;
  out["ttft_ms"] = optional_number_json(ttft_ms);
  out["tpot_ms"] = optional_number_json(tpot_ms);
  out["e2e_ms"] = e2e_ms;
  if (kv_transfer) out["kv_transfer"] = kv_transfer_json(*kv_transfer);
  if (spec_decode) out["spec_decode"] = spec_decode_json(*spec_decode);
  return out;
}

Result<RequestTimeline> RequestTimeline::parse(const Json& json) {
  return capture_status([&]() -> Result<RequestTimeline> { return parse_timeline(json); });
}

}  // namespace pdserve

#include "proxy/timeline_alignment.h"

#include <algorithm>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

double number_field(const Json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  PDS_ENSURE(it != object.end() && it->is_number(), StatusCode::kInvalidArgument,
             where + "." + key + " is missing or not a number");
  return it->get<double>();
}

// Shifts every span of the node's timeline; checks each span's fields on the way.
Json shifted_spans(const Json& timeline, double offset_ms) {
  const auto spans = timeline.find("spans");
  PDS_ENSURE(spans != timeline.end() && spans->is_array(), StatusCode::kInvalidArgument,
             "timeline.spans is missing or not an array");
  Json out = Json::array();
  for (size_t i = 0; i < spans->size(); ++i) {
    const Json& span = (*spans)[i];
    const std::string where = "timeline.spans[" + std::to_string(i) + "]";
    PDS_ENSURE(span.is_object(), StatusCode::kInvalidArgument, where + " is not an object");
    const auto name = span.find("name");
    PDS_ENSURE(name != span.end() && name->is_string(), StatusCode::kInvalidArgument,
               where + ".name is missing or not a string");
    const auto node = span.find("node");
    PDS_ENSURE(node != span.end() && node->is_string(), StatusCode::kInvalidArgument,
               where + ".node is missing or not a string");
    const double start = number_field(span, "start_ms", where);
    const double end = number_field(span, "end_ms", where);
    PDS_ENSURE(end >= start, StatusCode::kInvalidArgument,
               where + " (" + name->get<std::string>() + ") ends before it starts");
    Json moved = span;
    moved["start_ms"] = start + offset_ms;
    moved["end_ms"] = end + offset_ms;
    out.push_back(std::move(moved));
  }
  return out;
}

}  // namespace

ClockOffset estimate_offset(double sent_ms, double head_ms, double head_sent_ms) {
  const double network_ms = std::max(0.0, (head_ms - sent_ms) - head_sent_ms);
  return {sent_ms + network_ms / 2.0, network_ms / 2.0};
}

Result<Json> align_timeline(const Json& node_timeline, const ProxyMeasurements& proxy) {
  return capture_status([&]() -> Result<Json> {
    PDS_ENSURE(node_timeline.is_object(), StatusCode::kInvalidArgument,
               "timeline is not an object");
    PDS_ENSURE(!proxy.routes.empty(), StatusCode::kInvalidArgument, "no upstream request was sent");
    const auto version = node_timeline.find("version");
    PDS_ENSURE(version != node_timeline.end() && *version == 1, StatusCode::kInvalidArgument,
               "timeline.version is not 1");
    const auto request_id = node_timeline.find("request_id");
    PDS_ENSURE(request_id != node_timeline.end() && request_id->is_string() &&
                   !request_id->get<std::string>().empty(),
               StatusCode::kInvalidArgument, "timeline.request_id is missing or not a string");
    const auto sync = node_timeline.find("sync");
    PDS_ENSURE(sync != node_timeline.end() && sync->is_object(), StatusCode::kInvalidArgument,
               "timeline.sync is missing (the decode node's timeline has it)");
    const double head_sent = number_field(*sync, "head_sent_ms", "timeline.sync");
    PDS_ENSURE(head_sent >= 0.0, StatusCode::kInvalidArgument,
               "timeline.sync.head_sent_ms is negative");
    const double sent_ms = proxy.routes.back().sent_ms;
    ClockOffset offset = estimate_offset(sent_ms, proxy.head_ms, head_sent);
    // Causality bounds the estimate from the other end too: the node sent its last byte
    // before the proxy forwarded it. The symmetric-delay guess can break that when the head
    // and the end took different times to cross (a loaded machine).
    if (const auto node_e2e = node_timeline.find("e2e_ms");
        node_e2e != node_timeline.end() && node_e2e->is_number()) {
      const double latest_arrival = proxy.end_ms - node_e2e->get<double>();
      if (offset.node_arrival_ms > latest_arrival) {
        offset.node_arrival_ms = std::max(sent_ms, latest_arrival);
        offset.one_way_ms = offset.node_arrival_ms - sent_ms;
      }
    }

    Json aligned = node_timeline;
    aligned.erase("sync");
    aligned["origin"] = "proxy";
    aligned["trace_id"] = proxy.trace_id;
    Json spans = Json::array();
    spans.push_back({{"name", "proxy.request"},
                     {"node", "proxy"},
                     {"start_ms", 0.0},
                     {"end_ms", proxy.end_ms},
                     {"args", {{"attempts", proxy.routes.size()}}}});
    for (const RouteAttempt& route : proxy.routes) {
      Json args = {{"decode", route.decode_id}};
      if (!route.prefill_id.empty()) args["prefill"] = route.prefill_id;
      spans.push_back({{"name", "proxy.route"},
                       {"node", "proxy"},
                       {"start_ms", route.start_ms},
                       {"end_ms", route.sent_ms},
                       {"args", std::move(args)}});
    }
    for (Json& span : shifted_spans(node_timeline, offset.node_arrival_ms)) {
      spans.push_back(std::move(span));
    }
    aligned["spans"] = std::move(spans);

    Json tokens = Json::array();
    if (const auto it = node_timeline.find("tokens_ms"); it != node_timeline.end()) {
      PDS_ENSURE(it->is_array(), StatusCode::kInvalidArgument,
                 "timeline.tokens_ms is not an array");
      for (const Json& t : *it) {
        PDS_ENSURE(t.is_number(), StatusCode::kInvalidArgument,
                   "timeline.tokens_ms holds a non-number");
        tokens.push_back(t.get<double>() + offset.node_arrival_ms);
      }
    }
    int64_t output_tokens = 0;
    if (const auto it = node_timeline.find("output_tokens"); it != node_timeline.end()) {
      PDS_ENSURE(it->is_number_integer() && it->get<int64_t>() >= 0, StatusCode::kInvalidArgument,
                 "timeline.output_tokens is not a non-negative integer");
      output_tokens = it->get<int64_t>();
    }
    const double e2e = proxy.end_ms;
    if (!tokens.empty()) {
      const double ttft = std::min(tokens.front().get<double>() + offset.one_way_ms, e2e);
      aligned["ttft_ms"] = ttft;
      aligned["tpot_ms"] = output_tokens >= 2
                               ? Json((e2e - ttft) / static_cast<double>(output_tokens - 1))
                               : Json(nullptr);
    } else {
      aligned["ttft_ms"] = nullptr;
      aligned["tpot_ms"] = nullptr;
    }
    aligned["tokens_ms"] = std::move(tokens);
    aligned["e2e_ms"] = e2e;
    return aligned;
  });
}

}  // namespace pdserve::proxy

#include "common/http/service_routes.h"

#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/http/api_error_response.h"
#include "common/protocol/openai_error.h"

namespace pdserve::http {
namespace {

// ready=1 or ready=true among the query's parameters.
bool asks_readiness(std::string_view target) {
  const size_t question = target.find('?');
  if (question == std::string_view::npos) return false;
  std::string_view query = target.substr(question + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    if (pair == "ready=1" || pair == "ready=true") return true;
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return false;
}

}  // namespace

HttpResponse health_response(const HttpRequest& request, const ReadinessProbe& probe,
                             bool readiness) {
  if (!readiness && !asks_readiness(request.target)) return {200, "application/json", {}, "{}"};
  if (std::optional<std::string> missing = probe ? probe() : std::nullopt) {
    return api_error_response(service_unavailable("not ready: " + *missing, 1));
  }
  return {200, "application/json", {}, R"({"ready":true})"};
}

void add_service_routes(RouteTable& routes, ReadinessProbe probe,
                        std::function<void(int status)> on_answer) {
  auto answer = [probe = std::move(probe), on_answer = std::move(on_answer)](
                    bool readiness, const HttpRequest& request,
                    const std::shared_ptr<ResponseChannel>& channel) {
    HttpResponse response = health_response(request, probe, readiness);
    if (on_answer) on_answer(response.status);
    channel->send(std::move(response));
  };
  routes.add("GET", "/health",
             [answer](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
               answer(false, request, channel);
             });
  routes.add("GET", "/ready",
             [answer](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
               answer(true, request, channel);
             });
  routes.add(
      "GET", "/version", [on_answer](const HttpRequest&, std::shared_ptr<ResponseChannel> channel) {
        if (on_answer) on_answer(200);
        channel->send(
            {200, "application/json", {}, nlohmann::json{{"version", pdserve_version()}}.dump()});
      });
}

const char* pdserve_version() {
  return PDSERVE_VERSION;
}

}  // namespace pdserve::http

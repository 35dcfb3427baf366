// What a client without the cluster token may see of internal addresses: none, in messages and
// in the timeline; the rest of the text and the timeline's figures unchanged.
#include "proxy/address_redaction.h"

#include <gtest/gtest.h>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

TEST(RedactAddresses, UrlsAndIpv4AddressesGoTheRestStays) {
  EXPECT_EQ(redact_addresses("prefill node http://10.1.2.3:8100 answered HTTP 503: full"),
            "prefill node <internal> answered HTTP 503: full");
  EXPECT_EQ(redact_addresses("tried http://a.internal:80/x,https://b:9/ (2)"),
            "tried <internal>,<internal> (2)");
  EXPECT_EQ(redact_addresses("connect 192.168.0.10:34567 refused; 127.0.0.1 too"),
            "connect <internal> refused; <internal> too");
  EXPECT_EQ(redact_addresses("ucx tcp://[fe80::1]:1234 failed"), "ucx <internal> failed");
  EXPECT_EQ(redact_addresses("prefill node http://10.0.0.9:8100: the KV transfer failed."),
            "prefill node <internal>: the KV transfer failed.");
  EXPECT_EQ(redact_addresses("see http://h:1/x."), "see <internal>.");
  // Not addresses: versions, decimals, counts.
  EXPECT_EQ(redact_addresses("v1.2.3 took 0.25 s for 1024 blocks; 1.2.3.4.5"),
            "v1.2.3 took 0.25 s for 1024 blocks; 1.2.3.4.5");
  EXPECT_EQ(redact_addresses(""), "");
}

TEST(RedactTimeline, NodesBecomeRolesIdsAndUrlsLeaveFiguresStay) {
  const Json timeline = {
      {"version", 1},
      {"request_id", "cmpl-1"},
      {"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"},
      {"origin", "proxy"},
      {"tokens_ms", {12.5}},
      {"output_tokens", 1},
      {"ttft_ms", 12.5},
      {"e2e_ms", 20.0},
      {"spans",
       {{{"name", "proxy.route"},
         {"node", "proxy"},
         {"start_ms", 0.0},
         {"end_ms", 0.1},
         {"args", {{"decode", "decode-3"}, {"prefill", "prefill-1"}}}},
        {{"name", "prefill.remote"},
         {"node", "decode http://10.0.0.2:8000"},
         {"start_ms", 1.0},
         {"end_ms", 9.0},
         {"args", {{"prefill_url", "http://10.0.0.9:8100"}, {"prompt_tokens", 40}}}},
        {{"name", "prefill.chunk"},
         {"node", "prefill http://10.0.0.9:8100"},
         {"start_ms", 2.0},
         {"end_ms", 8.0},
         {"args", {{"note", "from 10.0.0.9:8100"}}}}}}};
  const Json redacted = redact_timeline(RequestTimeline::parse(timeline).value()).to_json();
  EXPECT_EQ(redacted.dump().find("10.0.0"), std::string::npos) << redacted.dump(2);
  EXPECT_EQ(redacted.dump().find("decode-3"), std::string::npos);
  EXPECT_EQ(redacted["spans"][0]["node"], "proxy");
  EXPECT_EQ(redacted["spans"][1]["node"], "decode");
  EXPECT_EQ(redacted["spans"][2]["node"], "prefill");
  EXPECT_EQ(redacted["spans"][1]["args"]["prompt_tokens"], 40);
  EXPECT_EQ(redacted["spans"][2]["args"]["note"], "from <internal>");
  EXPECT_EQ(redacted["ttft_ms"], 12.5);
  EXPECT_EQ(redacted["request_id"], "cmpl-1");
}

TEST(RedactErrorBody, OnlyTheMessageChanges) {
  const Json body = {{"error",
                      {{"message", "decode node http://10.0.0.2:8000 failed"},
                       {"type", "server_error"},
                       {"param", nullptr},
                       {"code", 503}}}};
  const Json redacted = Json::parse(redact_error_body(body.dump(), "cluster-secret"));
  EXPECT_EQ(redacted["error"]["message"], "decode node <internal> failed");
  EXPECT_EQ(redacted["error"]["type"], "server_error");
  EXPECT_EQ(redacted["error"]["code"], 503);
  // Not an error object: redacted as text.
  EXPECT_EQ(redact_error_body("upstream 10.0.0.2:8000 reset", "cluster-secret"),
            "upstream <internal> reset");
}

// The cluster token leaves every string of an error body (issue #34: addresses were scrubbed,
// the token was not), and text that is not an error object.
TEST(RedactErrorBody, TheClusterTokenLeavesEveryString) {
  const std::string token = "tok-3f9a";
  const Json body = {{"error",
                      {{"message", "refused 'Authorization: Bearer tok-3f9a' twice: tok-3f9a"},
                       {"type", "server_error"},
                       {"param", "header tok-3f9a"},
                       {"code", nullptr}}}};
  const std::string sent = redact_error_body(body.dump(), token);
  EXPECT_EQ(sent.find(token), std::string::npos) << sent;
  const Json redacted = Json::parse(sent);
  EXPECT_EQ(redacted["error"]["message"],
            "refused 'Authorization: Bearer <redacted>' twice: <redacted>");
  EXPECT_EQ(redacted["error"]["param"], "header <redacted>");
  EXPECT_EQ(redact_error_body("bad token tok-3f9a at 10.0.0.2:1", token),
            "bad token <redacted> at <internal>");
  // An open cluster has no token to hide.
  EXPECT_EQ(redact_secret("tok-3f9a", ""), "tok-3f9a");
  EXPECT_EQ(redact_secret("aXa", "X"), "a<redacted>a");
}

}  // namespace
}  // namespace pdserve::proxy

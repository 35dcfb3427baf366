#include "proxy/routing/cluster_tokenizer.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/json_depth.h"
#include "common/core/log.h"
#include "common/protocol/pdserve_headers.h"
#include "common/tokenizer/tokenizer_files.h"

namespace pdserve::proxy {
namespace {

constexpr size_t kMaxCandidates = 16;
constexpr std::chrono::milliseconds kMaxRetryDelay{60'000};

// A folder of its own under the system's temporary directory, removed on destruction: the
// fetched files are loaded from it (the tokenizer keeps what it needs in memory).
class TemporaryFolder {
 public:
  static Result<TemporaryFolder> create() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "pdserve-proxy-tokenizer-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return unavailable("cannot create a temporary folder for the tokenizer files");
    }
    return TemporaryFolder(std::filesystem::path(pattern));
  }
  TemporaryFolder(TemporaryFolder&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TemporaryFolder& operator=(TemporaryFolder&&) = delete;
  ~TemporaryFolder() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit TemporaryFolder(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

}  // namespace

std::string_view tokenizer_state_name(TokenizerState state) {
  switch (state) {
    case TokenizerState::kOff:
      return "off";
    case TokenizerState::kUnknown:
      return "unknown";
    case TokenizerState::kFetching:
      return "fetching";
    case TokenizerState::kReady:
      return "ready";
  }
  return "unknown";
}

ClusterTokenizer::ClusterTokenizer(ClusterTokenizerOptions options, std::string cluster_token,
                                   metrics::Registry& metrics)
    : options_(std::move(options)),
      cluster_token_(std::move(cluster_token)),
      mismatches_(metrics.counter("pdserve:proxy_tokenizer_mismatch_total",
                                  "Node registrations refused because the node's tokenizer "
                                  "differs from the cluster's (sha256 of its files).")),
      fetch_failures_(metrics.counter("pdserve:proxy_tokenizer_fetch_failures_total",
                                      "Failed fetches of the cluster's tokenizer from a node.")),
      in_use_(metrics.gauge("pdserve:proxy_cache_aware_routing",
                            "1 while the proxy tokenizes prompts for cache-aware placement "
                            "(a tokenizer is known), else 0.")) {
  if (!options_.enabled) {
    state_ = TokenizerState::kOff;
    return;
  }
  if (options_.fixed) {
    state_ = TokenizerState::kReady;
    sha256_ = options_.fixed_sha256;
    tokenizer_ = options_.fixed;
    in_use_.set(1.0);
    return;
  }
  fetcher_ = std::thread([this] { fetch_loop(); });
}

ClusterTokenizer::~ClusterTokenizer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (fetcher_.joinable()) fetcher_.join();
}

Status ClusterTokenizer::admit(const NodeRegistration& registration) {
  if (registration.tokenizer_sha256.empty()) return {};
  std::lock_guard lock(mutex_);
  if (state_ == TokenizerState::kOff) return {};
  if (state_ == TokenizerState::kUnknown) {
    sha256_ = registration.tokenizer_sha256;
    state_ = TokenizerState::kFetching;
    PDS_LOG_INFO("the cluster's tokenizer is sha256 " + sha256_ + " (first advertised by " +
                 registration.url + "): fetching it for cache-aware placement");
  } else if (registration.tokenizer_sha256 != sha256_) {
    mismatches_.inc();
    return failed_precondition("registration: the node at " + registration.url +
                               " has tokenizer sha256 " + registration.tokenizer_sha256 +
                               ", the cluster's is " + sha256_ +
                               " (one cluster serves one tokenizer)");
  }
  if (state_ == TokenizerState::kFetching) {
    std::erase_if(candidates_, [&](const Candidate& node) { return node.url == registration.url; });
    Result<http::BaseUrl> base = http::parse_base_url(registration.url);
    if (base.ok()) candidates_.push_front({registration.url, std::move(base).value()});
    if (candidates_.size() > kMaxCandidates) candidates_.pop_back();
    changed_.notify_all();
  }
  return {};
}

std::shared_ptr<const PromptTokenizer> ClusterTokenizer::current() const {
  std::lock_guard lock(mutex_);
  return tokenizer_;
}

TokenizerState ClusterTokenizer::state() const {
  std::lock_guard lock(mutex_);
  return state_;
}

bool ClusterTokenizer::wait_until_ready(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] { return state_ == TokenizerState::kReady; });
}

void ClusterTokenizer::fetch_loop() {
  Result<std::unique_ptr<http::HttpClient>> client = http::HttpClient::create(1);
  if (!client.ok()) {
    PDS_LOG_WARN("no HTTP client to fetch the tokenizer with: " + client.status().message() +
                 " (requests are placed by load alone)");
    return;
  }
  std::chrono::milliseconds delay = options_.retry_delay;
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] {
      return stopping_ || (state_ == TokenizerState::kFetching && !candidates_.empty());
    });
    if (stopping_) return;
    const Candidate node = candidates_.front();
    candidates_.pop_front();
    const std::string sha256 = sha256_;
    std::optional<Result<http::ClientResponse>> response = fetch_files(**client, node, lock);
    if (!response) return;
    lock.unlock();
    Result<std::shared_ptr<const PromptTokenizer>> loaded = load_files(*response, sha256);
    lock.lock();
    if (loaded.ok()) {
      tokenizer_ = std::move(loaded).value();
      state_ = TokenizerState::kReady;
      candidates_.clear();
      in_use_.set(1.0);
      PDS_LOG_INFO("cache-aware placement on: tokenizer sha256 " + sha256 + " fetched from " +
                   node.url);
      changed_.notify_all();
      return;
    }
    fetch_failures_.inc();
    PDS_LOG_WARN("fetching the tokenizer from " + node.url + " failed: " +
                 loaded.status().message() + " (requests are placed by load alone meanwhile)");
    if (candidates_.size() < kMaxCandidates) candidates_.push_back(node);
    // Stopping interrupts the pause; a registration does not (it would retry a failing node).
    if (changed_.wait_for(lock, delay, [&] { return stopping_; })) return;
    delay = std::min(delay * 2, kMaxRetryDelay);
  }
}

std::optional<Result<http::ClientResponse>> ClusterTokenizer::fetch_files(
    http::HttpClient& client, const Candidate& node, std::unique_lock<std::mutex>& lock) {
  http::ClientRequest request;
  request.method = "GET";
  request.target = "/cluster/tokenizer";
  request.headers.emplace_back(std::string(kAuthorizationHeader),
                               cluster_auth_header_value(cluster_token_));
  request.timeout = options_.fetch_timeout;
  fetched_.reset();
  const uint64_t fetch = ++fetches_;
  // The client (destroyed on this thread, before the object) ends the call before it goes.
  // A late answer of an earlier fetch is not this one's.
  client.fetch(node.base, std::move(request), [this, fetch](Result<http::ClientResponse> response) {
    std::lock_guard guard(mutex_);
    if (fetch != fetches_) return;
    fetched_ = std::move(response);
    changed_.notify_all();
  });
  // The client's own deadline ends the call; the extra second only guards against a lost answer.
  const auto deadline =
      std::chrono::steady_clock::now() + options_.fetch_timeout + std::chrono::seconds(1);
  if (!changed_.wait_until(lock, deadline, [&] { return stopping_ || fetched_.has_value(); })) {
    return Result<http::ClientResponse>(deadline_exceeded("GET /cluster/tokenizer: no answer"));
  }
  if (stopping_) return std::nullopt;
  return std::move(fetched_);
}

Result<std::shared_ptr<const PromptTokenizer>> ClusterTokenizer::load_files(
    const Result<http::ClientResponse>& response, const std::string& sha256) const {
  if (!response.ok()) return response.status();
  if (response->status != 200) {
    return unavailable("GET /cluster/tokenizer answered HTTP " + std::to_string(response->status));
  }
  PDS_ASSIGN_OR_RETURN(const nlohmann::json body,
                       parse_json_bounded(response->body, "the tokenizer files"));
  PDS_ASSIGN_OR_RETURN(const TokenizerFiles files, TokenizerFiles::parse(body));
  if (const std::string got = files.sha256(); got != sha256) {
    return invalid_argument("the files' sha256 is " + got + ", not the advertised " + sha256);
  }
  PDS_ASSIGN_OR_RETURN(const TemporaryFolder folder, TemporaryFolder::create());
  PDS_RETURN_IF_ERROR(files.write(folder.path()));
  PDS_ASSIGN_OR_RETURN(PromptTokenizer tokenizer,
                       PromptTokenizer::load(folder.path(), options_.max_text_bytes));
  return std::make_shared<const PromptTokenizer>(std::move(tokenizer));
}

}  // namespace pdserve::proxy

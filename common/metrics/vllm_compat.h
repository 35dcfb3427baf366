// What makes a series readable by a vLLM dashboard: vLLM v1's label names and histogram
// buckets (vllm/v1/metrics/loggers.py), so that its PromQL (histogram_quantile over the
// buckets, rates of the counters, filtered by model_name) works unchanged on pdserve's nodes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"

namespace pdserve::metrics {

// vLLM's time to first token buckets (seconds).
const std::vector<double>& vllm_ttft_buckets();
// vLLM's inter-token latency and per-request time per output token buckets (seconds).
const std::vector<double>& vllm_token_latency_buckets();
// vLLM's request phase buckets: e2e, queue, prefill, decode and inference times (seconds).
const std::vector<double>& vllm_request_latency_buckets();
// vLLM's token count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value.
std::vector<double> vllm_1_2_5_buckets(int64_t max_value);

// The labels vLLM puts on every series: model_name (the served name) and engine (the engine
// index of a data-parallel process; one engine per pdserve node: "0").
Labels vllm_labels(const std::string& model_name);

}  // namespace pdserve::metrics

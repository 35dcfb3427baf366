#include "common/metrics/vllm_compat.h"

namespace pdserve::metrics {

const std::vector<double>& vllm_ttft_buckets() {
  static const std::vector<double> buckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                              0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                              20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return buckets;
}

const std::vector<double>& vllm_token_latency_buckets() {
  static const std::vector<double> buckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                              0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                              7.5,  10.0,  20.0, 40.0,  80.0};
  return buckets;
}

const std::vector<double>& vllm_request_latency_buckets() {
  static const std::vector<double> buckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                              5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return buckets;
}

std::vector<double> vllm_1_2_5_buckets(int64_t max_value) {
  std::vector<double> buckets;
  for (int64_t scale = 1; scale <= max_value; scale *= 10) {
    for (int64_t mantissa : {1, 2, 5}) {
      if (mantissa * scale > max_value) return buckets;
      buckets.push_back(static_cast<double>(mantissa * scale));
    }
  }
  return buckets;
}

Labels vllm_labels(const std::string& model_name) {
  return {{"model_name", model_name}, {"engine", "0"}};
}

}  // namespace pdserve::metrics

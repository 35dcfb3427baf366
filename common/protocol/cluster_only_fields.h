// The one list of what a request may carry only from a cluster member (the cluster token): a
// decode node honours these from token holders alone. The proxy forwards client requests with
// its own token, so it must never pass them on from a client (issue #34 item 2): it refuses a
// body with such a field (400 naming it) and never copies a client's headers to a node (it
// builds each upstream request's headers itself). docs/RELIABILITY.md links here.
#pragma once

#include <array>
#include <string_view>

#include "common/protocol/pdserve_headers.h"
#include "common/protocol/stream_resume.h"

namespace pdserve {

// Top-level fields of a generation request's JSON body.
inline constexpr std::array<std::string_view, 1> kClusterOnlyBodyFields = {
    kStreamResumeField,  // continue a stream: choose the response id, inject delivered tokens
};

// Request headers. (X-Pdserve-Timeline and traceparent are client headers: the proxy reads
// them and sends its own.)
inline constexpr std::array<std::string_view, 2> kClusterOnlyHeaders = {
    kPrefillHeader,    // which prefill nodes the decode node calls (an SSRF lever)
    kResumableHeader,  // ask for stream checkpoints (token ids and sampler state)
};

}  // namespace pdserve

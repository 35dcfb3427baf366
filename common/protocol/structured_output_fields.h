// The fields that constrain a request's output (both endpoints): response_format, the guided_*
// fields and structured_outputs, and a tool_choice that forces a tool call. Each is checked with
// xgrammar without a vocabulary; at most one may constrain a request. Throw RequestError
// naming the field.
#pragma once

#include "common/protocol/openai_request.h"
#include "common/protocol/request_fields.h"

namespace pdserve::request_fields {

void read_structured_output(ObjectReader& reader, GenerationRequest& request);
// A tool_choice that forces a call ("required" or a named function) becomes the request's
// constraint (Qwen3's hermes format).
void constrain_tool_calls(GenerationRequest& request);

}  // namespace pdserve::request_fields

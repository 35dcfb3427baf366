// The text of common/protocol/openapi.json (generated into the build tree by CMake).
#pragma once

namespace pdserve {

extern const char* const kOpenApiSource;

}  // namespace pdserve

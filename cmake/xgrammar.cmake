# xgrammar's C++ core (Apache-2.0; the grammar engine of vLLM, SGLang and TensorRT-LLM), built
# as a static library from the sdist that scripts/setup.sh fetches with pip (pinned version and
# sha256) into third_party/. Only the C++ core: its Python bindings (cpp/tvm_ffi) are left out.
# It is third-party code: our warning flags are not applied to it.
set(PDSERVE_XGRAMMAR_VERSION 0.2.8)
set(PDSERVE_XGRAMMAR_DIR "${PROJECT_SOURCE_DIR}/third_party/xgrammar-${PDSERVE_XGRAMMAR_VERSION}"
    CACHE PATH "The unpacked xgrammar sdist (scripts/setup.sh puts it there)")
if(NOT EXISTS "${PDSERVE_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h")
  message(FATAL_ERROR "xgrammar ${PDSERVE_XGRAMMAR_VERSION} is missing (no "
                      "${PDSERVE_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h): run "
                      "`bash scripts/setup.sh`, which fetches it with pip")
endif()

file(GLOB_RECURSE PDSERVE_XGRAMMAR_SOURCES CONFIGURE_DEPENDS "${PDSERVE_XGRAMMAR_DIR}/cpp/*.cc")
list(FILTER PDSERVE_XGRAMMAR_SOURCES EXCLUDE REGEX "/cpp/tvm_ffi/.*\\.cc$")
add_library(xgrammar STATIC ${PDSERVE_XGRAMMAR_SOURCES})
set_target_properties(xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
target_include_directories(xgrammar SYSTEM PUBLIC "${PDSERVE_XGRAMMAR_DIR}/include"
                                                  "${PDSERVE_XGRAMMAR_DIR}/3rdparty/dlpack/include")
target_include_directories(xgrammar SYSTEM PRIVATE "${PDSERVE_XGRAMMAR_DIR}/3rdparty/picojson")
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
# No warnings (its headers are system headers to us) and no debug info (it halves the build).
target_compile_options(xgrammar PRIVATE -w -g0)
target_link_libraries(xgrammar PUBLIC Threads::Threads)

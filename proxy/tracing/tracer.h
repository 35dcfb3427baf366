// The proxy's tracing entry point: what the proxy server uses of this folder, and the one
// header of it that code outside may include (tests/architecture checks this).
//  * timeline_alignment.h: a decode node's request timeline moved onto the proxy's clock, with
//    the proxy's own spans (proxy.request, proxy.route) added;
//  * timeline_metrics.h: the PD split of a finished request and the histograms fed from it;
//  * trace_recorder.h: the last timelines for GET /trace (Chrome trace JSON) and --trace-file;
//  * otlp_exporter.h: each request's span tree to an OpenTelemetry collector (OTLP/HTTP JSON).
// docs/TRACING.md describes the formats.
#pragma once

#include "proxy/tracing/otlp_exporter.h"
#include "proxy/tracing/timeline_alignment.h"
#include "proxy/tracing/timeline_metrics.h"
#include "proxy/tracing/trace_recorder.h"

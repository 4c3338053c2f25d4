-- Shared by every wrk run of `make bench`: print one JSON line the harness reads.
function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"seconds":%.3f,"rps":%.2f,"p50_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,' ..
    '"errors_status":%d,"errors_socket":%d}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    errors.status, errors.connect + errors.read + errors.write + errors.timeout))
end

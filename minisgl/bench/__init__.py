"""What a benchmark measures: percentiles, per-stream latencies and throughput (chapter 21)."""

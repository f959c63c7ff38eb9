"""Prometheus metrics of one engine process: the same facts as /stats, no per-adapter or per-tenant labels."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests_running = Gauge("engine_requests_running", "Sequences scheduled in the batch", registry=r)
        self.requests_waiting = Gauge("engine_requests_waiting", "Sequences waiting for admission", registry=r)
        self.kv_blocks_used = Gauge("engine_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_blocks_total = Gauge("engine_kv_blocks_total", "KV cache blocks in the pool", registry=r)
        self.prefix_hit_rate = Gauge("engine_prefix_cache_hit_rate", "Share of prompt tokens from the prefix cache",
                                     registry=r)
        self.prefix_queried_tokens = Gauge("engine_prefix_cache_queried_tokens",
                                           "Prompt tokens looked up in the prefix cache since start", registry=r)
        self.prefix_hit_tokens = Gauge("engine_prefix_cache_hit_tokens",
                                       "Prompt tokens found in the prefix cache since start", registry=r)
        self.requests_total = Counter("engine_requests", "Requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("engine_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("engine_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("engine_time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.tpot = Histogram("engine_time_per_output_token_seconds", "Mean time per output token after the first",
                              registry=r, buckets=_LATENCY_BUCKETS)
        self.e2e = Histogram("engine_e2e_request_latency_seconds", "Request latency, arrival to last token",
                             registry=r, buckets=_LATENCY_BUCKETS)
        self.step_seconds = Histogram("engine_step_seconds", "Duration of one engine step", registry=r,
                                      buckets=_LATENCY_BUCKETS)
        self.adapter_hits = Gauge("engine_adapter_slot_hits", "Adapter slot cache hits", registry=r)
        self.adapter_misses = Gauge("engine_adapter_slot_misses", "Adapter slot cache misses", registry=r)
        self.adapter_evictions = Gauge("engine_adapter_slot_evictions", "Adapter slot evictions", registry=r)
        self.adapter_loads = Gauge("engine_adapter_loads", "Adapter loads from their source since start, by outcome",
                                   ["outcome"], registry=r)
        self.adapters_loading = Gauge("engine_adapters_loading", "Adapter loads in flight", registry=r)
        self.adapters_resident = Gauge("engine_adapters_resident", "Adapters in device slots", registry=r)
        self.adapters_host_tier = Gauge("engine_adapters_host_tier", "Adapters in the host-memory tier", registry=r)
        self.adapter_load_ms = Gauge("engine_adapter_load_milliseconds", "Recent adapter load times, by quantile",
                                     ["quantile"], registry=r)
        self.grammar_cache_hits = Gauge("engine_structured_outputs_grammar_cache_hits",
                                        "Compiled-grammar cache hits since start", registry=r)
        self.grammar_cache_misses = Gauge("engine_structured_outputs_grammar_cache_misses",
                                          "Compiled-grammar cache misses (compiles) since start", registry=r)
        self.grammar_cache_entries = Gauge("engine_structured_outputs_grammar_cache_entries",
                                           "Compiled grammars held", registry=r)
        self.grammar_compile_timeouts = Gauge("engine_structured_outputs_compile_timeouts",
                                              "Constraints refused for compiling longer than the bound", registry=r)
        # Degraded, not dead: a step that raised failed its requests and the loop went on (dead: /metrics stops
        # answering, so the scrape fails and `up` says it).
        self.step_errors = Gauge("engine_step_errors", "Engine steps that raised since start", registry=r)
        self.saturated = Gauge("engine_saturated", "1 while the waiting queue is over half of --max-waiting",
                               registry=r)
        self.spec_drafted = Gauge("engine_spec_decode_drafted_tokens", "Draft tokens proposed", ["method"],
                                  registry=r)
        self.spec_accepted = Gauge("engine_spec_decode_accepted_tokens", "Draft tokens kept by verification",
                                   ["method"], registry=r)
        self.spec_acceptance = Gauge("engine_spec_decode_acceptance_rate", "Accepted over drafted tokens",
                                     ["method"], registry=r)
        self.spec_mean_length = Gauge("engine_spec_decode_mean_accepted_length",
                                      "Draft tokens kept per verified sequence-step", ["method"], registry=r)
        self.fairness_backlogged_keys = Gauge("engine_fairness_backlogged_keys",
                                              "Fairness keys with requests waiting or running", registry=r)
        self.fairness_counter_spread = Gauge("engine_fairness_counter_spread",
                                             "Most minus least weighted service of the backlogged keys", registry=r)
        self.fairness_preemptions = Gauge("engine_fairness_preemptions",
                                          "Running sequences preempted for a less served key", registry=r)

    def observe_request(self, *, outcome: str, ttft: float | None, e2e: float, num_generated: int) -> None:
        self.requests_total.labels(outcome).inc()
        if ttft is not None:
            self.ttft.observe(ttft)
            if num_generated > 1:
                self.tpot.observe((e2e - ttft) / (num_generated - 1))
        self.e2e.observe(e2e)

    def update_from_stats(self, stats: dict) -> None:
        requests, blocks, adapters = stats["requests"], stats["kv_blocks"], stats["adapters"]
        self.requests_running.set(requests["running"])
        self.requests_waiting.set(requests["waiting"])
        self.kv_blocks_used.set(blocks["used"])
        self.kv_blocks_total.set(blocks["total"])
        self.prefix_hit_rate.set(stats["prefix_cache_hit_rate"])
        self.step_errors.set(stats.get("step_errors", 0))
        self.saturated.set(1 if stats.get("saturated") else 0)
        self.prefix_queried_tokens.set(stats["prefix_cache"]["queried_tokens"])
        self.prefix_hit_tokens.set(stats["prefix_cache"]["hit_tokens"])
        self.adapter_hits.set(adapters["hits"])
        self.adapter_misses.set(adapters["misses"])
        self.adapter_evictions.set(adapters["evictions"])
        self.adapters_resident.set(len(adapters["resident"]))
        self.adapters_host_tier.set(len(adapters["host_tier"]))
        self.adapter_load_ms.labels("0.5").set(adapters["load_ms_p50"])
        structured = stats.get("structured_outputs")
        if structured is not None:
            cache = structured["grammar_cache"]
            self.grammar_cache_hits.set(cache["hits"])
            self.grammar_cache_misses.set(cache["misses"])
            self.grammar_cache_entries.set(cache["entries"])
            self.grammar_compile_timeouts.set(structured["compile_timeouts"])
        spec = stats.get("speculative")
        if spec is not None:
            self.spec_drafted.labels(spec["method"]).set(spec["drafted_tokens"])
            self.spec_accepted.labels(spec["method"]).set(spec["accepted_tokens"])
            self.spec_acceptance.labels(spec["method"]).set(spec["acceptance_rate"])
            self.spec_mean_length.labels(spec["method"]).set(spec["mean_accepted_length"])
        fairness = stats.get("fairness")
        if fairness is not None:  # aggregates only: a label per key would be one series per tenant
            self.fairness_backlogged_keys.set(fairness["backlogged_keys"])
            self.fairness_counter_spread.set(fairness["counter_spread"])
            self.fairness_preemptions.set(fairness["preemptions"])
        loads = stats.get("adapter_loads")
        if loads is not None:
            self.adapter_loads.labels("ok").set(loads["loads"])
            self.adapter_loads.labels("failed").set(loads["failures"])
            self.adapters_loading.set(loads["loading"])
            self.adapter_load_ms.labels("0.99").set(loads["load_ms_p99"])

    def render(self) -> bytes:
        return generate_latest(self.registry)

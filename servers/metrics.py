"""Prometheus text for ``/metrics`` (``--enable-metrics``), with SGLang's ``sglang:`` names."""

from __future__ import annotations

from servers.state import ServerState


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(st: ServerState) -> str:
    eng = st.engine
    labels = f'{{model_name="{_esc(st.args.served_model_name or st.model_path)}"}}'
    load = eng.load()
    s = eng.stats
    rows: list[tuple[str, str, str, float]] = [
        ("num_running_reqs", "gauge", "Running requests", load["num_running_reqs"]),
        ("num_queue_reqs", "gauge", "Queued requests", load["num_queue_reqs"]),
        ("num_paused_reqs", "gauge", "Requests held by a pause",
         load["num_running_reqs"] + load["num_queue_reqs"] if eng.paused_mode else 0),
        ("gen_throughput", "gauge", "Generation throughput (tokens/s)", eng.gen_throughput()),
        ("token_usage", "gauge", "Fraction of KV slots in use",
         load["num_running_reqs"] / max(1, eng.max_running)),
        ("prompt_tokens_total", "counter", "Prompt tokens", s["prompt_tokens_total"]),
        ("generation_tokens_total", "counter", "Generated tokens", s["generation_tokens_total"]),
        ("num_requests_total", "counter", "Requests received", s["num_requests_total"]),
        ("num_aborted_requests_total", "counter", "Aborted requests", s["num_aborted_requests_total"]),
        ("forward_passes_total", "counter", "Model forward passes", s["forward_passes_total"]),
        ("weight_updates_total", "counter", "Successful weight updates", s["weight_updates_total"]),
    ]
    lines: list[str] = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}",
                  f"sglang:{name}{labels} {float(value)}"]
    for name, total, count, help_text in (
        ("e2e_request_latency_seconds", s["e2e_latency_sum"], s["e2e_latency_count"],
         "End-to-end request latency"),
        ("weight_load_duration_seconds", s["weight_load_seconds_sum"], s["weight_updates_total"],
         "Time spent loading weights"),
    ):
        lines += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} summary",
                  f"sglang:{name}_sum{labels} {float(total)}",
                  f"sglang:{name}_count{labels} {float(count)}"]
    return "\n".join(lines) + "\n"

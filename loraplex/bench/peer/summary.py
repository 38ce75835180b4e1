"""The human summary of ``loraplex bench peer``: a table per setting, every figure for each
kind of server and, for the headlines, the ratio with its spread over rounds."""

from __future__ import annotations

from typing import Any

from loraplex.bench.peer.report import ROLES

_ROWS = (
    ("adapter batch, output tokens/s", "adapter_tokens_per_s", "adapter_throughput_over_vllm"),
    ("adapter batch, completed", "adapter_completed_ratio", None),
    ("base batch, output tokens/s", "base_tokens_per_s", "base_throughput_over_vllm"),
    ("base batch, completed", "base_completed_ratio", None),
    ("zipf trace P50 TTFT (ms)", "trace_p50_ttft_ms", None),
    ("zipf trace P99 TTFT (ms)", "trace_p99_ttft_ms", "common_rate_p99_ttft_over_vllm"),
    ("zipf trace, completed", "trace_completed_ratio", None),
    ("start to first answer (s)", "start_to_first_answer_s", "start_to_first_answer_over_vllm"),
    ("peak RSS of the process tree (MiB)", "peak_rss_mib", "peak_rss_over_vllm"),
    ("probes passed", "probes_passed", None),
)
_EXTRA = (  # ratios with no row of their own
    ("loraplex base / vLLM without LoRA base", "base_throughput_over_vllm_nolora"),
    ("loraplex adapter batch / best base of any kind", "adapter_traffic_over_best_base"),
)


def _ratio_cell(setting: dict[str, Any], name: str) -> str:
    value = setting[name]
    if value is None:
        return "n/a"
    low, mid, high = setting[f"{name}_min"], setting[f"{name}_median"], setting[f"{name}_max"]
    spread = "n/a" if low is None or high is None else f"{low}-{high}, per-round median {mid}"
    return f"{value} ({spread})"


def summary_markdown(metrics: dict[str, Any], peer: str) -> str:
    """A table per setting: each figure for every kind and, for the headlines, the ratio to
    vLLM with LoRA (min-max and median over rounds in parentheses)."""
    parts = [f"# loraplex vs {peer}"]
    for key, s in metrics["per_max_loras"].items():
        roles = [role for role in ROLES if role in s]
        lines = [
            f"## max_loras {key} ({s['rounds']} rounds; trace at {s['common_rate_rps']} req/s)",
            "| figure | " + " | ".join(roles) + " | loraplex / vllm (min-max) |",
            "|---|" + "---|" * (len(roles) + 1),
        ]
        for title, figure, name in _ROWS:
            cells = [_cell(s[role][figure]) for role in roles]
            cells.append("" if name is None else _ratio_cell(s, name))
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"{title}: {_ratio_cell(s, name)}" for title, name in _EXTRA]
        lines.append(f"greedy continuations identical: {s['greedy_matched']} of "
                     f"{s['greedy_prompts']} prompts")  # fmt: skip
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _cell(value: object) -> str:
    return "n/a" if value is None else str(value)

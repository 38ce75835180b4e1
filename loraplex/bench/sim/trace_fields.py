"""``GeneratedTraces``: the fields and methods of a config whose traces are WORKLOADS.md's
generators (``bench sim``'s ``SimBenchConfig``, ``bench plan-check``'s ``TraceSet``).

Each config declares the fields itself, as dataclass fields with its own defaults (a plain base
class's annotations are not dataclass fields: they only tell the type checker what the methods
read); the two methods here are the one definition both use.
"""

from __future__ import annotations

from loraplex.bench.workloads import ScenarioParams, Workload, generate, trace_params


class GeneratedTraces:
    """Base of a frozen config dataclass that generates its traces (module docstring)."""

    traces: tuple[str, ...]  # scenario names
    trace_requests: int  # mean requests per trace
    rate: float  # mean requests per second
    num_adapters: int  # zipf-longtail's population (and cold-storm's storm pool)
    prompt_tokens: int  # per request
    output_tokens: int  # per request
    seed: int  # workloads and prompts

    def params(self) -> ScenarioParams:
        """The generators' parameters (ValueError naming a bad field)."""
        return trace_params(
            self.trace_requests, self.rate, self.prompt_tokens, self.output_tokens,
            self.num_adapters,
        )  # fmt: skip

    def workloads(self) -> list[Workload]:
        """Each of ``traces`` generated with ``seed``, in order."""
        params = self.params()
        return [generate(name, self.seed, params) for name in self.traces]

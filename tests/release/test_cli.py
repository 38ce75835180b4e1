"""``loraplex release ...`` and ``loraplex adapters alias ...`` through typer's CliRunner."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from registry_kit import write_adapter
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import app, registry_access
from loraplex.registry import AliasTarget, RegistrationRequest, Registry, RegistryConfig
from loraplex.release.model import ReleaseState, RevisionWindow
from loraplex.release.store import ReleaseStore


@pytest.fixture
def run(registry: Registry, registry_config: RegistryConfig):  # type: ignore[no-untyped-def]
    location = [
        "--data-dir",
        str(registry_config.data_dir),
        "--database-url",
        str(registry_config.database_url),
    ]

    def _run(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, [*args, *location])
        assert result.exit_code == code, result.output
        return result.output

    return _run


def test_start_takes_every_flag_into_the_plan(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    probes = tmp_path / "probes.jsonl"
    probes.write_text(
        '{"prompt": "2+2=", "expected": "4"}\n\n{"prompt": "hi", "differ_from_stable": true}\n'
    )
    out = run(
        "release", "start", "acme/bot", "v2", "--ladder", "1%,5%,0.25", "--dwell", "2m",
        "--window", "1h", "--gpu", "--probe-file", str(probes), "--no-auto-promote",
        "--max-error-rate", "0.1", "--min-requests", "50", "--min-latency-samples", "80",
        "--max-step", "2h", "--json",
    )  # fmt: skip
    body = json.loads(out)
    plan = body["plan"]
    assert body["state"] == "staged" and body["baseline"] == "v1"
    assert plan["ladder"] == [0.01, 0.05, 0.25]
    assert (plan["dwell_s"], plan["window_s"], plan["gpu"], plan["auto_promote"]) == (
        120.0, 3600.0, True, False,
    )  # fmt: skip
    assert plan["thresholds"]["max_error_rate"] == 0.1
    assert plan["thresholds"]["min_requests"] == 50
    assert plan["thresholds"]["min_latency_samples"] == 80
    assert plan["thresholds"]["max_step_s"] == 7200.0
    assert [p["prompt"] for p in plan["probes"]] == ["2+2=", "hi"]
    assert plan["probes"][1]["differ_from_stable"] is True


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--share", "0%"), "--share"),
        (("--share", "lots"), "--share"),
        (("--ladder", "5%,1%"), "--ladder"),
        (("--share", "5%", "--ladder", "1%,5%"), "--share and --ladder"),
        (("--dwell", "soon"), "--dwell"),
        (("--window", "-1m"), "--window"),
        (("--window", "inf"), "--window 'inf' is invalid"),  # stored Infinity broke the views
        (("--dwell", "1e300"), "--dwell '1e300' is invalid"),  # no date shows its hold_until
        (("--max-step", "721h"), "--max-step '721h' is invalid"),
        (("--max-error-rate", "2"), "max_error_rate"),
        (("--max-step", "soon"), "--max-step"),
        (("--max-step", "30s"), "max_step_s 30.0 is invalid; expected >= dwell_s 60.0"),
        (("--min-latency-samples", "0"), "min_latency_samples"),
    ],
)
def test_parse_errors_name_the_flag(
    run, registry: Registry, args: tuple[str, ...], flag: str
) -> None:  # type: ignore[no-untyped-def]
    out = run("release", "start", "acme/bot", "v2", *args, code=1)
    assert flag in out
    assert ReleaseStore(registry).list_releases(include_terminal=True) == []


def test_start_help_shows_the_default_ladder() -> None:
    out = CliRunner().invoke(app, ["release", "start", "--help"], env={"COLUMNS": "80"}).output
    ladder = " ".join(out.split("--ladder", 1)[1].split("--dwell", 1)[0].split())
    assert "[default: (1%,5%,25%)]" in ladder


def test_a_probe_file_with_an_unknown_key_is_refused(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    probes = tmp_path / "probes.jsonl"
    probes.write_text('{"prompt": "x", "expect": "y"}\n')
    out = run("release", "start", "acme/bot", "v2", "--probe-file", str(probes), code=1)
    assert "line 1" in out and "'expect'" in out


def test_status_prints_state_and_comparison_table(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    run("release", "start", "acme/bot", "v2", "--share", "5%")
    store = ReleaseStore(registry)
    staged = store.latest_release("acme", "bot")
    now = registry.now()
    for to in (ReleaseState.PREWARMING, ReleaseState.PROBING):
        staged = store.transition(staged, to, actor="t", now=now)
    canary = store.transition(staged, ReleaseState.CANARY, actor="t", now=now, step=0)
    from loraplex.release.compare import judge
    from loraplex.release.model import Thresholds

    window = RevisionWindow(requests=20, errors=4, ttft_p99_s=0.25)
    judged = judge(0, now, window, RevisionWindow(requests=40), limits=Thresholds(), dwelt=False)
    store.save_observation(canary, comparison=judged)

    out = run("release", "status", "acme/bot")
    assert "v1 -> v2\tcanary step 1/1 (5.0%)" in out
    assert "v2\tcandidate\t20\t0\t4\t0.200\t250.0" in out
    assert "v1\tstable\t40\t0\t0\t0.000" in out
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"step 1 compared at {stamp} (" in out and f"{now:.0f}" not in out
    assert "breach\terror rate 0.200 > max_error_rate 0.05" in out
    assert json.loads(run("release", "list", "--json"))[0]["share"] == 0.05


def test_operator_commands_and_their_refusals(  # type: ignore[no-untyped-def]
    run, registry: Registry, registry_config: RegistryConfig
) -> None:
    run("release", "start", "acme/bot", "v2")
    assert "already has release" in run("release", "start", "acme/bot", "v3", code=1)
    assert "cannot promote" in run("release", "promote", "acme/bot", code=1)
    assert "cannot rollback" in run("release", "rollback", "acme/bot", code=1)
    assert "aborted\n" in run("release", "abort", "acme/bot") + "\n"
    assert _listed(registry_config, "release", "list") == (
        "",  # nothing for a script to read
        "no release in flight (--all lists finished ones too)\n",  # it printed nothing at all
    )
    assert _listed(registry_config, "release", "list", "--tenant", "acme", "--json") == ("[]\n", "")
    assert "\taborted" in run("release", "list", "--all")
    assert "\taborted" in run("release", "list", "--all", "--tenant", "acme")
    refused = run("release", "list", "--all", "--tenant", "nobody", code=1)
    assert "tenant 'nobody' does not exist" in refused  # it listed nothing, as for acme's none
    assert "no release" in run("release", "status", "acme/nothing", code=1)
    assert "expected tenant/name" in run("release", "status", "bot", code=1)


def _listed(config: RegistryConfig, *args: str) -> tuple[str, str]:
    """``args``' stdout and stderr (``run`` answers both mixed)."""
    location = ["--data-dir", str(config.data_dir), "--database-url", str(config.database_url)]
    result = CliRunner().invoke(app, [*args, *location])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def test_alias_commands_set_show_rollback_history(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    empty = run("adapters", "alias", "history", "acme/bot")
    assert empty == (
        "alias acme/bot has no history: it was never moved, or every move was rolled back, "
        "so there is no rollback\n"
    )
    run("adapters", "alias", "set", "acme/bot", "v2")
    run("adapters", "alias", "set", "acme/bot", "v3:95", "v2:5")
    shown = json.loads(run("adapters", "alias", "show", "acme/bot", "--json"))
    assert shown["targets"] == [{"revision": "v3", "weight": 95}, {"revision": "v2", "weight": 5}]
    history = run("adapters", "alias", "history", "acme/bot").splitlines()
    assert history[0] == "rollbacks\ttargets\treplaced_at"
    assert history[1].startswith("1\tv2:1\t20") and history[2].startswith("2\tv1:1\t20")
    as_json = json.loads(run("adapters", "alias", "history", "acme/bot", "--json"))
    assert [(e["rollbacks"], e["targets"][0]["revision"]) for e in as_json] == [
        (1, "v2"),
        (2, "v1"),
    ]

    assert "targets     v2:1" in run("adapters", "alias", "rollback", "acme/bot")
    assert "targets     v1:1" in run("adapters", "alias", "rollback", "acme/bot")
    assert "no rollback target" in run("adapters", "alias", "rollback", "acme/bot", code=1)
    assert registry.get_alias("acme", "bot").targets == (AliasTarget("v1", 1),)
    assert "REVISION[:WEIGHT]" in run("adapters", "alias", "set", "acme/bot", "v2:x", code=1)


def test_list_commands_print_one_page_and_the_next_cursor(  # type: ignore[no-untyped-def]
    run,
    registry: Registry,
    registry_config: RegistryConfig,
    base: BaseModelSpec,
    tmp_path: Path,
) -> None:
    """``release list``, ``tenants list`` and ``adapters list`` print one page (``--limit``,
    100 by default), and on stderr the ``--after`` of the next when more rows follow, as
    ``keys list`` (``tests/registry/test_keys_list_paging.py``); they printed every row."""
    for _ in range(3):
        run("release", "start", "acme/bot", "v2")
        run("release", "abort", "acme/bot")
    for tenant in ("delta", "beta", "zeta", "gamma"):
        registry.create_tenant(tenant, "ops")
    for seed, name in enumerate(("alpha", "zed"), start=3):
        adapter_dir = write_adapter(tmp_path / "more" / name, base, seed=seed)
        registry.register(RegistrationRequest(adapter_dir, "acme", name, "r1"), "ops")
    location = ["--data-dir", str(registry_config.data_dir)]
    location += ["--database-url", str(registry_config.database_url)]

    def pages(what: str, *command: str) -> tuple[list[str], list[str]]:
        """Every page of ``command`` at two rows a page: the rows' first fields and the
        ``--after`` each page printed."""
        rows: list[str] = []
        cursors: list[str] = []
        after: list[str] = []
        while True:
            result = CliRunner().invoke(app, [*command, "--limit", "2", *after, *location])
            assert result.exit_code == 0, result.output
            rows += [line.split("\t")[0] for line in result.stdout.splitlines()]
            if not result.stderr:
                return rows, cursors
            assert result.stderr.startswith(f"more {what} follow: the next page is --after ")
            cursors.append(result.stderr.split()[-1])
            after = ["--after", cursors[-1]]

    tenants, cursors = pages("tenants", "tenants", "list")
    assert tenants == ["acme", "beta", "delta", "gamma", "zeta"] and cursors == ["beta", "gamma"]
    adapters, cursors = pages("adapters", "adapters", "list")
    assert adapters == ["acme/alpha", "acme/bot", "acme/zed"] and cursors == ["acme/bot"]
    released = ReleaseStore(registry).list_releases(include_terminal=True)
    lines, cursors = pages("releases", "release", "list", "--all")
    assert len(lines) == 3 and cursors == [released[1].release_id]
    whole = CliRunner().invoke(app, ["tenants", "list", *location])  # 100 by default
    assert len(whole.stdout.splitlines()) == 5 and whole.stderr == ""
    exactly = CliRunner().invoke(app, ["release", "list", "--all", "--limit", "3", *location])
    assert len(exactly.stdout.splitlines()) == 3 and exactly.stderr == ""
    as_json = CliRunner().invoke(
        app, ["release", "list", "--all", "--json", "--limit", "2", *location]
    )
    assert len(json.loads(as_json.stdout)) == 2
    assert as_json.stderr.endswith(f"--after {released[1].release_id}\n")


@pytest.mark.parametrize(
    "command", [["tenants", "list"], ["adapters", "list"], ["release", "list"]]
)
def test_list_commands_refuse_a_bad_page_naming_the_flag(  # type: ignore[no-untyped-def]
    run, command: list[str]
) -> None:
    for args, flag, message in (
        (["--limit", "0"], "--limit", "limit 0 is invalid; expected 1 to 1000"),
        (["--after", "x" * 300], "--after", "is invalid; expected 1 to 257 characters"),
    ):
        out = " ".join(re.sub("[│╭╮╰╯─]", " ", run(*command, *args, code=2)).split())
        assert f"Invalid value for {flag}:" in out and message in out


def test_adapters_show_reads_the_revisions_page_by_page(  # type: ignore[no-untyped-def]
    run, monkeypatch
) -> None:
    """``adapters show`` prints every revision, read ``LIST_PAGE`` rows a call (the admin
    API's pages), not in one read of the whole table."""
    monkeypatch.setattr(registry_access, "LIST_PAGE", 2)
    sizes: list[int] = []  # rows of each page read
    real = registry_access.every_row

    def counted(read, cursor, size):  # type: ignore[no-untyped-def]
        def read_counted(page):  # type: ignore[no-untyped-def]
            rows = read(page)
            sizes.append(len(rows))
            return rows

        return real(read_counted, cursor, size)

    monkeypatch.setattr(registry_access, "every_row", counted)
    shown = run("adapters", "show", "acme/bot").splitlines()
    assert [line.split("\t")[0] for line in shown if line.startswith("revision")] == [
        f"revision    {r}" for r in ("v1", "v2", "v3")
    ]
    assert sizes == [2, 1]


def _lines(*probes: dict[str, object]) -> str:
    return "".join(json.dumps(probe) + "\n" for probe in probes)


OK_PROBE = {"prompt": "2+2=", "expected": "4"}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (_lines(*[OK_PROBE] * 33), "line 33 is probe 33; expected at most 32 probes"),
        (_lines(OK_PROBE, {"prompt": "p" * 4097, "expected": "4"}), "line 2: prompt of 4097"),
        (_lines({"prompt": "p", "expected": "x" * 4097}), "line 1: expected of 4097"),
        (_lines({"prompt": "p", "expected": "4", "max_tokens": 100000}), "max_tokens 100000"),
        (_lines({"prompt": "p", "expected": "4", "max_tokens": 257}), "max_tokens 257"),
        (_lines({"prompt": "p", "expected": "4", "max_tokens": True}), "max_tokens True"),
        (_lines({"prompt": "p", "expected": "4", "max_tokens": 1.5}), "max_tokens 1.5"),
        (_lines({"prompt": 5, "expected": "4"}), "prompt 5 is invalid"),
        (_lines({"prompt": "p", "expected": 4}), "expected 4 is invalid"),
        (_lines({"prompt": "p", "differ_from_stable": "yes"}), "differ_from_stable 'yes'"),
        # a lone surrogate: stored, it made every admin answer showing the release a 400
        (_lines({"prompt": "\ud800 x", "expected": "4"}), "prompt '\\ud800' at character 0"),
    ],
)
def test_a_probe_file_over_the_bounds_is_refused_naming_the_line(  # type: ignore[no-untyped-def]
    run, registry: Registry, tmp_path: Path, text: str, named: str
) -> None:
    """attack27: the probe file was bounded by nothing (the admin API's body is: 32 probes,
    4096 characters, 256 tokens, typed fields): 3,000 probes of 100,000 tokens each were
    staged, and run on the engine at once."""
    probes = tmp_path / "probes.jsonl"
    probes.write_text(text)
    out = run("release", "start", "acme/bot", "v2", "--probe-file", str(probes), code=1)
    assert named in " ".join(out.split()), out
    assert ReleaseStore(registry).list_releases(include_terminal=True) == []


def test_a_ladder_of_more_than_16_steps_is_refused(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    ladder = ",".join(f"{i + 1}%" for i in range(17))
    out = run("release", "start", "acme/bot", "v2", "--ladder", ladder, code=1)
    assert "--ladder of 17 steps is invalid; expected at most 16" in " ".join(out.split())
    assert ReleaseStore(registry).list_releases(include_terminal=True) == []


def _store_out_of_bounds(registry: Registry, release_id: str) -> None:
    """Writes straight into the row what releases stored before ``check_plan_bounds`` and
    ``MAX_PLAN_SECONDS`` held: an infinite ``window_s``, a ``dwell_s`` of 1e300, a probe text
    with a lone surrogate (JSON escapes it: a text column could not hold it), and the
    ``hold_until`` such a window gave."""
    with registry.db.transaction() as tx:
        row = tx.query_one("SELECT plan FROM releases WHERE release_id = ?", (release_id,))
        assert row is not None
        plan = json.loads(row[0])
        plan.update(window_s=float("inf"), dwell_s=1e300)
        plan["thresholds"]["max_step_s"] = 1e300
        probe = {"prompt": "\ud800 2+2=", "expected": "4", "differ_from_stable": False}
        plan["probes"] = [{**probe, "max_tokens": 4}]
        tx.execute(
            "UPDATE releases SET plan = ?, hold_until = ? WHERE release_id = ?",
            (json.dumps(plan), 1e300, release_id),
        )


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_release_stored_before_the_bounds_is_shown_made_safe(  # type: ignore[no-untyped-def]
    run, registry: Registry
) -> None:
    """A release stored before the plan's bounds (an infinite window, a probe with a lone
    surrogate, a ``hold_until`` no date shows) ended ``release status`` with an OverflowError
    and made ``release list --json`` print ``Infinity`` (not JSON). Now each such value is
    shown safe (null, U+FFFD) and named in ``invalid``; the other releases are untouched."""
    run("release", "start", "acme/bot", "v2")
    run("release", "abort", "acme/bot")
    run("release", "start", "acme/bot", "v3")
    run("release", "abort", "acme/bot")
    clean, old = ReleaseStore(registry).list_releases(include_terminal=True)
    _store_out_of_bounds(registry, old.release_id)

    listed = _strict_json(run("release", "list", "--all", "--json"))
    assert isinstance(listed, list)
    assert [r["release_id"] for r in listed] == [clean.release_id, old.release_id]
    assert listed[0]["invalid"] == [] and listed[0]["plan"]["window_s"] == 600.0
    shown = listed[1]
    assert (shown["plan"]["window_s"], shown["plan"]["dwell_s"], shown["hold_until"]) == (
        None, None, None,
    )  # fmt: skip
    assert shown["plan"]["thresholds"]["max_step_s"] is None
    assert shown["plan"]["probes"][0]["prompt"] == "\ufffd 2+2="
    named = [problem.split(":", 1)[0] for problem in shown["invalid"]]
    assert named == [
        "plan.dwell_s", "plan.window_s", "plan.thresholds.max_step_s", "plan.probes[0].prompt",
        "hold_until",
    ]  # fmt: skip
    out = run("release", "status", "acme/bot")
    assert f"{old.release_id}\tacme/bot\tv1 -> v3\taborted" in out
    assert "invalid\tplan.window_s: inf is not a finite number; shown as null" in out
    assert "invalid\thold_until: 1e+300 is no date; shown as null" in out
    assert "holding v1 until no date (1e+300)" in out
    assert old.release_id in run("release", "list", "--all")


def test_start_warns_when_no_probe_will_run(
    registry: Registry, registry_config: RegistryConfig, base: BaseModelSpec, tmp_path: Path
) -> None:
    """v4 has no probe of its own: without --probe-file, probing runs nothing and the canary
    starts at once; ``release start`` says so on stderr (it said nothing; newop5). v2 has one."""
    adapter_dir = write_adapter(tmp_path / "bare", base, seed=7)
    registry.register(RegistrationRequest(adapter_dir, "acme", "bot", "v4"), "ops")
    location = ["--data-dir", str(registry_config.data_dir), "--database-url",
                str(registry_config.database_url)]  # fmt: skip
    bare = CliRunner().invoke(app, ["release", "start", "acme/bot", "v4", "--json", *location])
    assert bare.exit_code == 0, bare.output
    assert json.loads(bare.stdout)["candidate"] == "v4"  # stdout stays the record
    assert "warning: acme/bot@v4 has no output probe" in bare.stderr
    assert "--probe-file" in bare.stderr
    CliRunner().invoke(app, ["release", "abort", "acme/bot", *location])
    own = CliRunner().invoke(app, ["release", "start", "acme/bot", "v2", *location])
    assert own.exit_code == 0 and own.stderr == ""

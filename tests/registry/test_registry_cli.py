"""The registry commands end to end through the ``loraplex`` CLI (SQLite + local store and
PostgreSQL + S3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from registry_kit import AdapterFactory, S3Target
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.registry import RegistryConfig, open_registry


@pytest.fixture(params=["sqlite-local", "postgres-s3"])
def cli_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "data")}
    if request.param == "postgres-s3":
        target: S3Target = request.getfixturevalue("s3_target")
        env["LORAPLEX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
        env["LORAPLEX_STORE"] = f"s3://{target.bucket}/cli"
        env["LORAPLEX_S3_ENDPOINT"] = target.endpoint
    return env


def _run(env: dict[str, str], *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output
    return result.output


def test_admin_workflow(
    cli_env: dict[str, str], model_dir: Path, make_adapter: AdapterFactory
) -> None:
    env = {**cli_env, "LORAPLEX_BASE_MODEL": str(model_dir)}
    _run(env, "tenants", "create", "acme", "--priority", "high", "--max-gpu-bytes", "1024")
    assert "acme\thigh\tgpu_bytes=1024" in _run(env, "tenants", "list")

    created = _run(env, "keys", "create", "acme", "--actor", "alice")
    token = next(line for line in created.splitlines() if line.startswith("lpx_"))
    key_id = token.split("_")[1]
    assert f"{key_id}\tacme" in _run(env, "keys", "list")

    adapter_dir = make_adapter("a")
    register = ("adapters", "register", str(adapter_dir), "--tenant", "acme", "--name", "bot")
    out = _run(
        env, *register, "--revision", "v1", "--probe-prompt", "hi", "--expected-continuation", "yo"
    )
    assert out.startswith("registered acme/bot@v1 sha256=")
    again = _run(env, *register, "--revision", "v1")
    assert again.startswith("already registered (identical bytes) acme/bot@v1")
    conflict = _run(
        env,
        *register[:2],
        str(make_adapter("b", seed=1)),
        *register[3:],
        "--revision",
        "v1",
        code=1,
    )
    assert "error: acme/bot@v1 is already registered" in conflict

    assert _run(env, "adapters", "list").strip() == "acme/bot\tprivate\tv1:1"
    _run(env, "tenants", "create", "beta")
    beta = CliRunner().invoke(app, ["adapters", "list", "--tenant", "beta"], env=env)
    assert beta.exit_code == 0 and beta.stdout == "", beta.output  # acme/bot: private
    assert beta.stderr == "no adapter usable by tenant 'beta'\n"
    shown = _run(env, "adapters", "show", "acme/bot")
    assert "adapter     acme/bot (private)" in shown
    assert "revision    v1\tstable\twarm=on_demand\trank=4" in shown

    assert _run(env, "keys", "revoke", key_id).startswith(f"revoked key {key_id} of tenant acme")
    assert "revoked" in _run(env, "keys", "list", "--tenant", "acme")
    # NOTE: a second revoke printed "revoked key ..." though it wrote nothing (no audit row)
    again = _run(env, "keys", "revoke", key_id)
    assert again.startswith(f"key {key_id} of tenant acme was already revoked at ")

    config = RegistryConfig(
        Path(env["LORAPLEX_DATA_DIR"]),
        env.get("LORAPLEX_DATABASE_URL"),
        env.get("LORAPLEX_STORE"),
        env.get("LORAPLEX_S3_ENDPOINT"),
    )
    registry = open_registry(config)
    try:
        actors = {(e.action, e.actor) for e in registry.audit_log()}
        assert ("key.create", "alice") in actors
        assert sum(e.action == "key.revoke" for e in registry.audit_log()) == 1
        assert registry.check_integrity() == []
    finally:
        registry.close()


def test_errors_exit_with_status_1(cli_env: dict[str, str]) -> None:
    out = _run(cli_env, "keys", "create", "ghost", code=1)
    if "LORAPLEX_DATABASE_URL" not in cli_env:  # no SQLite registry yet: none is created
        assert "error: data_dir: no registry at" in out
    _run(cli_env, "tenants", "create", "real")
    out = _run(cli_env, "keys", "create", "ghost", code=1)
    assert "error: tenant 'ghost' does not exist" in out
    assert "did you mean" not in out  # no tenant's name is near
    assert "(`loraplex tenants create ghost` creates it)" in out


def test_a_key_for_a_tenant_that_does_not_exist_names_the_nearest(
    cli_env: dict[str, str],
) -> None:
    """The error said only that the tenant does not exist."""
    for name in ("acme", "globex"):
        _run(cli_env, "tenants", "create", name)
    out = _run(cli_env, "keys", "create", "acmee", code=1)
    assert out == (
        "error: tenant 'acmee' does not exist; did you mean acme? "
        "(`loraplex tenants create acmee` creates it)\n"
    )
    out = _run(cli_env, "keys", "create", "glob ex", code=1)  # no name: nothing to create
    assert out == "error: tenant 'glob ex' does not exist; did you mean globex?\n"
    out = _run(cli_env, "tenants", "create", "bad/name", code=1)
    assert "error: tenant 'bad/name' is invalid" in out


def test_adapters_list_for_a_tenant_that_does_not_exist_exits_1_naming_it(
    cli_env: dict[str, str], model_dir: Path, make_adapter: AdapterFactory
) -> None:
    """As ``keys list --tenant`` and ``release list --tenant`` do: it listed the public
    adapters, as if the tenant existed and owned none."""
    env = {**cli_env, "LORAPLEX_BASE_MODEL": str(model_dir)}
    for name in ("acme", "globex"):
        _run(env, "tenants", "create", name)
    register = ("adapters", "register", str(make_adapter("a")), "--tenant", "acme")
    _run(env, *register, "--name", "shared", "--revision", "v1", "--public")

    out = _run(env, "adapters", "list", "--tenant", "acmee", code=1)
    assert out == (
        "error: tenant 'acmee' does not exist; did you mean acme? "
        "(`loraplex tenants create acmee` creates it)\n"
    )
    # a tenant that exists and owns nothing still lists what it may use: the public adapter
    assert _run(env, "adapters", "list", "--tenant", "globex") == "acme/shared\tpublic\tv1:1\n"


def _words(output: str) -> str:
    """``output`` without typer's error box: its text as one line of single spaces."""
    return " ".join(output.replace("\u2502", " ").split())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--state", "zz"), "'--state': 'zz' is not one of canary, stable, deprecated"),
        (("--warm-policy", "GPU"), "'--warm-policy': 'GPU' is not one of gpu, cpu, on_demand"),
    ],
)
def test_a_bad_state_or_warm_policy_names_the_option_and_the_values(
    tmp_path: Path,
    model_dir: Path,
    make_adapter: AdapterFactory,
    args: tuple[str, str],
    expected: str,
) -> None:
    """typer refused them with pydantic's "Value error, 'zz' is not one of 'canary', ..."."""
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d"), "LORAPLEX_BASE_MODEL": str(model_dir)}
    adapter = str(make_adapter("a"))
    named = ("--tenant", "acme", "--name", "bot", "--revision", "v1")
    for command in (("register", adapter, *named), ("register-many", str(tmp_path))):
        out = _words(_run(env, "adapters", *command, *args, code=2))
        assert expected in out and "Value error" not in out
    assert not (tmp_path / "d").exists()  # a usage error: nothing was opened or made
    _run(env, "tenants", "create", "acme")
    _run(env, "adapters", "register", adapter, *named, "--state", "canary", "--warm-policy", "cpu")
    registry = open_registry(RegistryConfig(data_dir=tmp_path / "d"))
    try:
        revision = registry.get_revision("acme/bot@v1")
        assert (revision.state.value, revision.warm_policy.value) == ("canary", "cpu")
    finally:
        registry.close()


def test_default_locations_live_in_the_data_dir(tmp_path: Path) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d")}
    _run(env, "tenants", "create", "acme")
    assert (tmp_path / "d" / "registry.sqlite3").is_file()
    assert (tmp_path / "d" / "artifacts" / "sha256").is_dir()


def test_tenants_update_sets_seats_and_keeps_what_it_does_not_name(tmp_path: Path) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d")}
    _run(env, "tenants", "create", "acme", "--max-cold-loads", "2", "--max-running-seqs", "8")
    out = _run(env, "tenants", "update", "acme", "--reserved-running-seqs", "2",
               "--max-kv-blocks", "64", "--priority", "high")  # fmt: skip
    assert out.startswith("acme\thigh\t")
    assert "cold_loads=2" in out and "running_seqs=8\treserved_seqs=2\tkv_blocks=64" in out
    # a running server reads the rate limit per request, the rest only through the admin API
    # or a start: the command says so (the change seemed to apply and did not)
    assert "note: a running server takes max_requests_per_s at once" in out
    assert "PUT /admin/tenants/acme" in out
    rate = _run(env, "tenants", "update", "acme", "--max-requests-per-s", "5")
    assert "requests_per_s=5.0" in rate and "note:" not in rate
    lifted = _run(env, "tenants", "update", "acme", "--unset", "max_running_seqs")
    assert "running_seqs=None\treserved_seqs=2\tkv_blocks=64" in lifted
    assert lifted.splitlines()[0] in _run(env, "tenants", "list")
    registry = open_registry(RegistryConfig(data_dir=tmp_path / "d"))
    try:
        quotas = registry.get_tenant("acme").quotas
        assert (quotas.max_running_seqs, quotas.reserved_running_seqs) == (None, 2)
        assert registry.audit_log()[-1].action == "tenant.set_limits"
    finally:
        registry.close()


def test_an_unknown_priority_is_refused_naming_the_flag_and_the_classes(tmp_path: Path) -> None:
    # typer refused it with pydantic's "Value error, 'urgent' is not one of ..." (exit 2)
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d")}
    expected = "error: --priority 'urgent' is invalid; expected one of high, normal, batch"
    created = _run(env, "tenants", "create", "acme", "--priority", "urgent", code=1)
    assert expected in created and "Value error" not in created
    assert not (tmp_path / "d").exists()  # refused before a registry was opened or made
    _run(env, "tenants", "create", "acme", "--priority", "batch")
    updated = _run(env, "tenants", "update", "acme", "--priority", "urgent", code=1)
    assert expected in updated and "Value error" not in updated
    assert "acme\tbatch\t" in _run(env, "tenants", "list")


def test_tenants_update_refuses_bad_values_and_changes_nothing(tmp_path: Path) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d")}
    _run(env, "tenants", "create", "acme", "--max-running-seqs", "4")
    before = _run(env, "tenants", "list")
    cases = [
        (
            ("--reserved-running-seqs", "5"),
            "reserved_running_seqs 5 is invalid; expected <= max_running_seqs 4",
        ),
        (("--reserved-running-seqs", "-1"), "reserved_running_seqs -1 is invalid"),
        (("--max-running-seqs", "0"), "max_running_seqs 0 is invalid"),
        (("--max-kv-blocks", "-4"), "max_kv_blocks -4 is invalid"),
        (
            ("--unset", "max_seats"),
            "--unset 'max_seats' is invalid; expected one of max_gpu_bytes, max_cpu_bytes,",
        ),
        ((), "nothing to change"),
    ]
    for args, message in cases:
        assert f"error: {message}" in _run(env, "tenants", "update", "acme", *args, code=1)
    assert _run(env, "tenants", "list") == before
    missing = _run(env, "tenants", "update", "ghost", "--max-running-seqs", "2", code=1)
    assert "error: tenant 'ghost' does not exist" in missing


def test_a_warm_policy_registered_from_the_cli_says_how_a_running_server_gets_it(
    tmp_path: Path, model_dir: Path, make_adapter: AdapterFactory
) -> None:
    # the command writes the registry only; a running server read the policy at its next start,
    # and nothing said so: `--warm-policy gpu` looked applied and the copy stayed unpinned
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d"), "LORAPLEX_BASE_MODEL": str(model_dir)}
    _run(env, "tenants", "create", "acme")
    register = ("adapters", "register", str(make_adapter("a")), "--tenant", "acme", "--name", "bot")
    warm = _run(env, *register, "--revision", "v1", "--warm-policy", "gpu")
    assert warm.startswith("registered acme/bot@v1 sha256=")
    assert "note: a running server applies --warm-policy gpu at its next start" in warm
    assert 'PUT /admin/revisions/acme/bot/v1 {"warm_policy": "gpu"}' in warm
    assert "note:" not in _run(env, *register, "--revision", "v1", "--warm-policy", "gpu")
    assert "note:" not in _run(env, *register, "--revision", "v2")


def test_tenants_create_says_which_limits_a_running_server_takes_later(tmp_path: Path) -> None:
    # `tenants create tiny --max-gpu-bytes 1000` while serve ran: the server served tiny's
    # adapter from a GPU slot, as if uncapped, and nothing said why (`update` said it already)
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d")}
    capped = _run(env, "tenants", "create", "tiny", "--max-gpu-bytes", "1000")
    assert capped.startswith("created tenant tiny (normal)")
    assert "note: a running server takes max_requests_per_s at once" in capped
    assert "PUT /admin/tenants/tiny" in capped
    assert "note:" in _run(env, "tenants", "create", "vip", "--priority", "high")
    assert "note:" not in _run(env, "tenants", "create", "rated", "--max-requests-per-s", "5")
    assert "note:" not in _run(env, "tenants", "create", "plain")


def test_a_registration_warning_is_printed(
    tmp_path: Path, model_dir: Path, make_adapter: AdapterFactory
) -> None:
    """An ``exclude_modules`` entry that excludes nothing is registered and said, by
    ``adapters register`` and ``register-many`` alike (NOTE: it was accepted in silence)."""
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "d"), "LORAPLEX_BASE_MODEL": str(model_dir)}
    _run(env, "tenants", "create", "acme")
    adapter = make_adapter("a")
    config = adapter / "adapter_config.json"
    config.write_text(
        config.read_text().replace('"bias"', '"exclude_modules": ["lm_head"], "bias"')
    )
    named = ("--tenant", "acme", "--name", "bot", "--revision", "v1")
    out = _words(_run(env, "adapters", "register", str(adapter), *named))
    assert "registered acme/bot@v1" in out
    assert "warning: exclude_modules entries ['lm_head'] exclude none of the" in out
    tree = tmp_path / "tree" / "acme" / "bot" / "v2"
    tree.parent.mkdir(parents=True)
    adapter.rename(tree)
    out = _words(_run(env, "adapters", "register-many", str(tmp_path / "tree")))
    assert "warning: acme/bot@v2: exclude_modules entries ['lm_head'] exclude none" in out
    assert "1 registered, 0 already registered, 0 failed" in out

"""Tenants, quotas and API keys on both databases."""

from __future__ import annotations

import pytest
from registry_kit import OpenRegistry

from loraplex.errors import AuthenticationError, RecordNotFoundError, RegistryError
from loraplex.registry import PriorityClass, Registry, TenantQuotas
from loraplex.registry.keys import TOKEN_PREFIX, hash_token
from loraplex.registry.sql.tenants import _tenant


def test_tenants_are_created_listed_and_audited(registry: Registry) -> None:
    quotas = TenantQuotas(max_gpu_bytes=1 << 30, max_cold_loads=2, max_requests_per_s=5.0)
    registry.create_tenant("beta", "ops", PriorityClass.BATCH, quotas)
    registry.create_tenant("acme", "ops")

    assert [t.name for t in registry.list_tenants()] == ["acme", "beta"]
    beta = registry.get_tenant("beta")
    assert beta.priority is PriorityClass.BATCH
    assert beta.quotas == quotas
    assert registry.get_tenant("acme").quotas == TenantQuotas()
    entries = registry.audit_log()
    assert [(e.action, e.subject, e.actor) for e in entries] == [
        ("tenant.create", "beta", "ops"),
        ("tenant.create", "acme", "ops"),
    ]
    assert entries[0].details["max_gpu_bytes"] == 1 << 30
    assert entries[0].seq < entries[1].seq


def test_duplicate_or_invalid_tenants_are_refused(registry: Registry) -> None:
    registry.create_tenant("acme", "ops")
    with pytest.raises(RegistryError, match="tenant 'acme' already exists"):
        registry.create_tenant("acme", "ops")
    with pytest.raises(ValueError, match=r"tenant '\.\./x' is invalid"):
        registry.create_tenant("../x", "ops")
    with pytest.raises(RegistryError, match="does not exist"):
        registry.get_tenant("ghost")
    assert len(registry.audit_log()) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_gpu_bytes", -1),
        ("max_cold_loads", 0),
        ("max_requests_per_s", 0.0),
        # past a BIGINT: the database raised OverflowError (a 500 on the admin API, a traceback
        # on the CLI)
        ("max_gpu_bytes", 1 << 63),
        ("max_cpu_bytes", 10**20),
        ("max_disk_bytes", 1 << 64),
        ("max_cold_loads", 1 << 63),
        # nan was refused, inf stored (the CLI took it; the admin API refused it)
        ("max_requests_per_s", float("inf")),
        ("max_requests_per_s", float("nan")),
    ],
)
def test_quota_values_are_validated(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TenantQuotas(**{field: value})  # type: ignore[arg-type]


def test_limits_change_and_persist(open_reg: OpenRegistry) -> None:
    registry = open_reg()
    registry.create_tenant("acme", "ops")
    registry.set_tenant_limits("acme", "ops", PriorityClass.HIGH, {"max_cpu_bytes": 7})
    reopened = open_reg()
    acme = reopened.get_tenant("acme")
    assert (acme.priority, acme.quotas.max_cpu_bytes) == (PriorityClass.HIGH, 7)
    assert reopened.audit_log()[-1].action == "tenant.set_limits"


def test_limit_changes_keep_what_they_do_not_name(registry: Registry) -> None:
    quotas = TenantQuotas(max_gpu_bytes=5, max_cold_loads=2)
    registry.create_tenant("acme", "ops", PriorityClass.HIGH, quotas)

    registry.set_tenant_limits("acme", "ops", quotas={"max_cpu_bytes": 7})
    after_quota = registry.get_tenant("acme")
    registry.set_tenant_limits("acme", "ops", PriorityClass.BATCH)
    after_priority = registry.get_tenant("acme")
    registry.set_tenant_limits("acme", "ops", quotas={"max_gpu_bytes": None})

    assert after_quota.priority is PriorityClass.HIGH
    assert after_quota.quotas == TenantQuotas(max_gpu_bytes=5, max_cpu_bytes=7, max_cold_loads=2)
    assert after_priority.priority is PriorityClass.BATCH
    assert after_priority.quotas == after_quota.quotas
    assert registry.get_tenant("acme").quotas == TenantQuotas(max_cpu_bytes=7, max_cold_loads=2)
    for bad in ({"max_gpu_byte": 1}, {"max_cold_loads": 0}):
        with pytest.raises(ValueError, match=r"max_gpu_byte|max_cold_loads"):
            registry.set_tenant_limits("acme", "ops", quotas=bad)
    assert registry.get_tenant("acme").quotas.max_cold_loads == 2


def test_key_authenticates_its_tenant_and_is_stored_hashed(registry: Registry) -> None:
    registry.create_tenant("acme", "ops")
    issued = registry.create_key("acme", "ops")

    assert issued.token.startswith(TOKEN_PREFIX)
    assert issued.key_id in issued.token
    assert "acme" not in issued.token
    assert len(issued.token) > 32 + len(TOKEN_PREFIX)
    assert registry.authenticate(issued.token).name == "acme"
    with registry.db.transaction(write=False) as tx:
        rows = tx.query("SELECT key_id, tenant, token_sha256 FROM api_keys")
    assert rows == [(issued.key_id, "acme", hash_token(issued.token))]
    assert issued.token not in repr(rows)
    assert [k.key_id for k in registry.list_keys("acme")] == [issued.key_id]
    assert registry.audit_log()[-1].details == {"key_id": issued.key_id}


def test_each_key_is_unique(registry: Registry) -> None:
    registry.create_tenant("acme", "ops")
    tokens = {registry.create_key("acme", "ops").token for _ in range(5)}
    assert len(tokens) == 5


def test_revocation_is_immediate_for_every_process(open_reg: OpenRegistry) -> None:
    admin, server = open_reg(), open_reg()
    admin.create_tenant("acme", "ops")
    issued = admin.create_key("acme", "ops")
    other = admin.create_key("acme", "ops")
    assert server.authenticate(issued.token).name == "acme"

    revoked = admin.revoke_key(issued.key_id, "ops")

    assert revoked.revoked_at is not None
    with pytest.raises(AuthenticationError):
        server.authenticate(issued.token)
    assert server.authenticate(other.token).name == "acme"
    assert admin.revoke_key(issued.key_id, "ops") == revoked  # idempotent
    assert [e.action for e in admin.audit_log()].count("key.revoke") == 1


def test_bad_tokens_all_fail_the_same_way(registry: Registry) -> None:
    registry.create_tenant("acme", "ops")
    issued = registry.create_key("acme", "ops")
    registry.create_key("acme", "ops")
    forged = issued.token[:-4] + ("AAAA" if not issued.token.endswith("AAAA") else "BBBB")
    unknown_id = f"{TOKEN_PREFIX}{'0' * 16}_{issued.token.rsplit('_', 1)[1]}"
    messages = set()
    for token in (forged, unknown_id, "", "lpx_", "Bearer x", issued.token + "x"):
        with pytest.raises(AuthenticationError) as info:
            registry.authenticate(token)
        messages.add(str(info.value))
    assert messages == {"invalid API key"}


def test_keys_need_an_existing_tenant(registry: Registry) -> None:
    with pytest.raises(RegistryError, match="tenant 'ghost' does not exist"):
        registry.create_key("ghost", "ops")
    with pytest.raises(RegistryError, match="API key 'nope' does not exist"):
        registry.revoke_key("nope", "ops")
    assert registry.list_keys() == []


def test_seat_limits_change_persist_and_are_audited(open_reg: OpenRegistry) -> None:
    registry = open_reg()
    registry.create_tenant("acme", "ops")
    assert registry.get_tenant("acme").quotas.reserved_running_seqs == 0  # default: none
    seats = {"max_running_seqs": 4, "reserved_running_seqs": 2, "max_kv_blocks": 64}
    registry.set_tenant_limits("acme", "ops", quotas=seats)
    reopened = open_reg()
    quotas = reopened.get_tenant("acme").quotas
    assert (quotas.max_running_seqs, quotas.reserved_running_seqs, quotas.max_kv_blocks) == (
        4,
        2,
        64,
    )
    assert reopened.audit_log()[-1].details["reserved_running_seqs"] == 2
    reopened.set_tenant_limits("acme", "ops", quotas={"max_running_seqs": None})
    assert reopened.get_tenant("acme").quotas.reserved_running_seqs == 2  # untouched


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"reserved_running_seqs": 5},
            "reserved_running_seqs 5 is invalid; expected <= max_running_seqs 4",
        ),
        ({"reserved_running_seqs": -1}, "reserved_running_seqs -1 is invalid"),
        ({"reserved_running_seqs": None}, "reserved_running_seqs None is invalid"),
        ({"max_running_seqs": 0}, "max_running_seqs 0 is invalid"),
        ({"max_kv_blocks": -3}, "max_kv_blocks -3 is invalid"),
        (
            {"max_kv_blocks": 1 << 40},
            r"max_kv_blocks 1099511627776 is invalid; expected unset \(null; the CLI's "
            r"--unset\) or an int in \[1, ",
        ),
    ],
)
def test_invalid_seat_limits_change_nothing(
    registry: Registry, change: dict[str, int | None], message: str
) -> None:
    registry.create_tenant("acme", "ops", quotas=TenantQuotas(max_running_seqs=4))
    with pytest.raises(ValueError, match=message):
        registry.set_tenant_limits("acme", "ops", quotas=change)
    assert registry.get_tenant("acme").quotas == TenantQuotas(max_running_seqs=4)


def test_seat_limits_of_an_unknown_tenant_are_refused(registry: Registry) -> None:
    with pytest.raises(RecordNotFoundError, match="tenant 'ghost' does not exist"):
        registry.set_tenant_limits("ghost", "ops", quotas={"max_running_seqs": 2})


def test_migration_3_gives_existing_tenants_no_seat_limits(database_url: str) -> None:
    from loraplex.registry.sql.connect import open_database
    from loraplex.registry.sql.migrations import MIGRATIONS, migrate
    from loraplex.registry.sql.tenants import get_tenant

    db = open_database(database_url)
    try:
        migrate(db, now=1.0, migrations=MIGRATIONS[:2])
        with db.transaction() as tx:
            tx.execute("INSERT INTO tenants (name, priority, created_at) VALUES ('t', 'normal', 0)")
        assert migrate(db, now=2.0) >= 3
        with db.transaction(write=False) as tx:
            tenant = get_tenant(tx, "t")
        assert tenant is not None and tenant.quotas == TenantQuotas()
    finally:
        db.close()


def test_the_largest_quota_values_round_trip(registry: Registry) -> None:
    largest = TenantQuotas(
        max_gpu_bytes=(1 << 63) - 1, max_cold_loads=1 << 31, max_requests_per_s=1e308
    )
    registry.create_tenant("acme", "ops", quotas=largest)
    assert registry.get_tenant("acme").quotas == largest


def test_an_infinite_rate_stored_by_an_earlier_version_reads_as_unlimited() -> None:
    row = ("acme", "normal", None, None, None, None, float("inf"), 1.0, None, 0, None)
    assert _tenant(row).quotas.max_requests_per_s is None  # it raised: no tenant listed
    assert _tenant((*row[:6], 2.5, *row[7:])).quotas.max_requests_per_s == 2.5

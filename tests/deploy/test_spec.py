"""``K8sSpec`` refuses what would not deploy or not work, naming the field (= the flag); the YAML
writer's output reads back as exactly what it was given."""

from __future__ import annotations

from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.deploy import K8sSpec, SpecError
from loraplex.deploy.serve_file import RESERVED_SERVE_KEYS, toml_text
from loraplex.deploy.yaml_text import dump_documents
from loraplex.serve.config.keys import NOT_IN_FLEET

BASE: dict[str, Any] = {"image": "ghcr.io/acme/loraplex:1.0", "store": "s3://adapters/prod"}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"replicas": 0}, "replicas"),
        ({"max_loras": 0}, "max_loras"),
        ({"port": 0}, "port"),
        ({"admin_port": 70000}, "admin_port"),
        ({"port": 8001}, "admin_port"),  # the same as the default admin port
        ({"port": 6379, "ray": True}, "port"),  # Ray's own port on the head
        ({"admin_port": 8265, "ray": True}, "admin_port"),  # the ingress's admin socket too
        ({"name": "Loraplex"}, "name"),
        ({"name": "1st"}, "name"),  # a Service name starts with a letter
        ({"name": "a" * 41}, "name"),
        ({"name": "lpx\n"}, "name"),  # a trailing newline is not a name
        ({"image": "img:1\n"}, "image"),
        ({"namespace": "prod_eu"}, "namespace"),
        ({"secret": "Bad_Name"}, "secret"),
        ({"store": "/srv/adapters"}, "store"),
        ({"store": "s3://"}, "store"),
        ({"s3_endpoint": "ftp://minio:9000"}, "s3_endpoint"),
        ({"s3_endpoint": "http://key:secret@minio:9000"}, "s3_endpoint"),
        ({"database_url": "sqlite:///registry.sqlite3"}, "database_url"),
        ({"database_url": "postgresql://u@h/db?password=hunter2"}, "database_url"),
        ({"cpu": "four"}, "cpu"),
        ({"memory": "16 GB"}, "memory"),
        ({"model": "models/llama"}, "model"),
        ({"image": "my image"}, "image"),
        ({"epp_image": ""}, "epp_image"),
        ({"ray_version": "latest"}, "ray_version"),
        ({"head_cpu": "2"}, "head_cpu"),  # no head pod without --ray: refused, not ignored
        ({"head_memory": "4Gi"}, "head_memory"),
        ({"head_cpu": "one", "ray": True}, "head_cpu"),
        ({"head_memory": "4 GB", "ray": True}, "head_memory"),
        ({"epp_image": "epp:2", "ray": True}, "epp_image"),  # no endpoint picker with --ray
        ({"ray_version": "2.61.0"}, "ray_version"),  # no RayService without --ray
        ({"serve_config": {"port": 9000}}, "serve_config"),
        ({"serve_config": {"max_num_seqs": 0}}, "serve_config"),
        ({"serve_config": {"no_such_key": 1}}, "serve_config"),
        # a password would be in the ConfigMap (or the RayService's args) in plain text
        ({"serve_config": {"shared_state_url": "redis://:hunter2@redis:6379/0"}}, "serve_config"),
        (
            {"serve_config": {"shared_state_url": "redis://u:pw@r:6379"}, "ray": True},
            "serve_config",
        ),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        K8sSpec(**{**BASE, **changes})
    assert caught.value.field == field
    assert field in str(caught.value) or field == "serve_config"


def test_a_database_password_is_refused_without_being_repeated() -> None:
    for url in ("postgresql://u:hunter2@h/db", "postgresql://u:hunter2@h/ db"):
        with pytest.raises(SpecError) as caught:
            K8sSpec(**BASE, database_url=url)
        assert caught.value.field == "database_url"
        assert "hunter2" not in str(caught.value)


def test_every_reserved_serve_key_is_refused() -> None:
    for key in sorted(RESERVED_SERVE_KEYS):
        with pytest.raises(SpecError) as caught:
            K8sSpec(**BASE, serve_config={key: 1})
        assert repr(key) in str(caught.value)


def test_defaults_are_valid_and_the_secret_is_named_after_the_deployment() -> None:
    spec = K8sSpec(**BASE, name="lpx")
    assert spec.secret_name == "lpx-secrets"
    assert K8sSpec(**BASE, secret="creds").secret_name == "creds"


def test_the_serve_table_is_toml_that_reads_back() -> None:
    import tomllib

    values = {"policy": "lru", "max_num_seqs": 16, "auto_warm": False, "queue_deadline_s": 2.5}
    assert tomllib.loads(toml_text(values)) == {"serve": values}


_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\n"), max_size=40)
_scalars = st.one_of(st.booleans(), st.integers(-(2**40), 2**40), _text)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(st.dictionaries(_text, inner, max_size=3) | _scalars, max_size=3)
        | st.dictionaries(_text, inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(_text, _values, min_size=1, max_size=4), min_size=1, max_size=3))
def test_yaml_reads_back_exactly(documents: list[dict[str, Any]]) -> None:
    text = dump_documents(documents, ["a comment", "another"])
    assert list(yaml.safe_load_all(text)) == documents


def test_embedded_files_are_literal_blocks_and_odd_keys_quoted() -> None:
    text = dump_documents([{"data": {"f.yaml": "a: 1\nb:\n  - c\n"}, "yes": "on", "8000": 1}])
    assert "  f.yaml: |\n    a: 1\n    b:\n      - c\n" in text
    assert '"yes": "on"' in text and '"8000": 1' in text
    assert yaml.safe_load(text) == {"data": {"f.yaml": "a: 1\nb:\n  - c\n"}, "yes": "on", "8000": 1}


# a valid value off the default for each key a fleet does not read
DEFAULTS_OFF = {
    "engine_process": False,
    "engine_hung_kill_after_s": 120.0,
    "engine_unresponsive_after_s": 20.0,
    "stream_pause_bytes": 1 << 20,
    "max_stream_resumes": 2,
    "max_paused_kv_fraction": 0.5,
}


def test_keys_a_fleet_does_not_read_are_refused_for_ray_only() -> None:
    assert set(DEFAULTS_OFF) == set(NOT_IN_FLEET)
    for key in NOT_IN_FLEET:
        value = DEFAULTS_OFF[key]
        K8sSpec(**BASE, serve_config={key: value})  # a Deployment's replicas read it
        with pytest.raises(SpecError) as caught:
            K8sSpec(**BASE, ray=True, serve_config={key: value})
        assert caught.value.field == "serve_config" and repr(key) in str(caught.value)


def test_a_shared_state_password_is_refused_unshown_and_a_plain_url_passes() -> None:
    with pytest.raises(SpecError) as caught:
        K8sSpec(**BASE, serve_config={"shared_state_url": "redis://:hunter2@redis:6379/0"})
    assert "shared-state-url" in str(caught.value) and "hunter2" not in str(caught.value)
    url = "redis://redis.serving:6379/0"
    assert K8sSpec(**BASE, serve_config={"shared_state_url": url}).serve_config == {
        "shared_state_url": url
    }


def test_a_shared_state_prefix_may_go_with_the_secrets_url() -> None:
    """The URL of a Redis with a password comes from the secret's 'shared-state-url', not the
    file: a prefix alone in the file is the replica's to check (it refuses one with no URL)."""
    for ray in (False, True):
        spec = K8sSpec(**BASE, ray=ray, serve_config={"shared_state_prefix": "blue"})
        assert spec.serve_config == {"shared_state_prefix": "blue"}
    with pytest.raises(SpecError, match="shared_state_prefix 'a b' is invalid"):
        K8sSpec(**BASE, serve_config={"shared_state_prefix": "a b"})


@pytest.mark.parametrize(
    ("fleet_config", "named"),
    [
        ({"replicas": 3}, "replicas"),  # --replicas sizes the worker group
        ({"engine_resource": "gpu_pool"}, "engine_resource"),  # the workers advertise ours
        ({"replica": 3}, "replica"),  # unknown
        ({"policy": "lru"}, "policy"),  # an eviction policy, not a routing one
        ({"router": {"max_queud": 4}}, "max_queud"),
        ({"topology": {"min_replicas": "two"}}, "min_replicas"),
        ({"report_period_s": 5.0}, "report_period_s"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_fleet_keys_the_rayservice_sets_or_cannot_take_are_refused_by_name(
    fleet_config: dict[str, Any], named: str
) -> None:
    with pytest.raises(SpecError) as caught:
        K8sSpec(**BASE, ray=True, fleet_config=fleet_config)
    assert caught.value.field == "serve_config" and named in str(caught.value)


def test_fleet_keys_are_refused_without_ray() -> None:
    """The Deployment path runs ``loraplex serve`` replicas, no fleet: nothing would read them."""
    with pytest.raises(SpecError, match=r"\[fleet\] keys \['policy'\] are used only with ray"):
        K8sSpec(**BASE, fleet_config={"policy": "pow2"})
    assert K8sSpec(**BASE, ray=True, fleet_config={"policy": "pow2"}).fleet_config


def test_a_topology_is_checked_against_the_rendered_replicas() -> None:
    """The builder gets ``--replicas`` engine replicas: a topology whose ``min_replicas`` they
    do not reach would never dedicate one, and is refused naming both."""
    fleet = {"topology": {"min_replicas": 3}}
    auto = {"mode": "auto"}
    with pytest.raises(SpecError) as caught:
        K8sSpec(**BASE, ray=True, replicas=2, serve_config=auto, fleet_config=fleet)
    assert caught.value.field == "serve_config"
    assert "topology is set with replicas 2; expected replicas >= its min_replicas 3" in str(
        caught.value
    )
    spec = K8sSpec(**BASE, ray=True, replicas=3, serve_config=auto, fleet_config=fleet)
    assert spec.fleet_config == fleet

"""``loraplex keys list`` prints one page (``--limit``, 100 by default, at most 1000) after
``--after`` (a key id), and on stderr the next page's ``--after`` when more keys follow, as the
admin API's ``GET /admin/keys`` pages. NOTE: it printed every key the registry held."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.registry import RegistryConfig, open_registry
from loraplex.registry.sql.paging import DEFAULT_PAGE


def _keys(data_dir: Path, count: int) -> list[str]:
    """``count`` keys of tenant acme, in the listing's order (age)."""
    registry = open_registry(RegistryConfig(data_dir))
    try:
        registry.create_tenant("acme", "test")
        return [registry.create_key("acme", "test").key_id for _ in range(count)]
    finally:
        registry.close()


def _list(data_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["keys", "list", "--data-dir", str(data_dir), *args])


def _ids(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [line.split("\t")[0] for line in result.stdout.splitlines()]


def test_a_listing_longer_than_a_page_prints_one_page_and_the_next_cursor(tmp_path: Path) -> None:
    keys = _keys(tmp_path, DEFAULT_PAGE + 1)
    first = _list(tmp_path)
    assert _ids(first) == keys[:DEFAULT_PAGE]
    assert first.stderr == f"more keys follow: the next page is --after {keys[-2]}\n"
    rest = _list(tmp_path, "--after", keys[-2])
    assert _ids(rest) == keys[-1:] and rest.stderr == ""


def test_limit_and_after_page_through_every_key_once(tmp_path: Path) -> None:
    keys = _keys(tmp_path, 5)
    seen, after = [], []
    while True:
        page = _list(tmp_path, "--limit", "2", *after)
        seen += _ids(page)
        if not page.stderr:
            break
        after = ["--after", page.stderr.split()[-1]]
    assert seen == keys
    exactly = _list(tmp_path, "--limit", "5")  # a full page with nothing after it
    assert _ids(exactly) == keys and exactly.stderr == ""


@pytest.mark.parametrize(
    ("args", "flag", "message"),
    [
        (["--limit", "0"], "--limit", "limit 0 is invalid; expected 1 to 1000"),
        (["--limit", "1001"], "--limit", "limit 1001 is invalid; expected 1 to 1000"),
        (["--after", "nope"], "--after", "after 'nope' is not the id of any key"),
        (["--after", "x" * 300], "--after", "is invalid; expected 1 to 257 characters"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(
    tmp_path: Path, args: list[str], flag: str, message: str
) -> None:
    _keys(tmp_path, 1)
    result = _list(tmp_path, *args)
    assert result.exit_code == 2, result.output
    flat = " ".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())  # rich's box, unwrapped
    assert f"Invalid value for {flag}:" in flat and message in flat
    assert result.stdout == ""


def test_a_tenant_that_does_not_exist_exits_1_naming_it_and_the_nearest(tmp_path: Path) -> None:
    """As ``GET /admin/keys?tenant=`` answers 404: it listed no key, as if the tenant had none."""
    _keys(tmp_path, 1)
    result = _list(tmp_path, "--tenant", "acmee")
    assert result.exit_code == 1, result.output
    assert "tenant 'acmee' does not exist" in result.stderr
    assert "did you mean acme?" in result.stderr and result.stdout == ""

"""/admin/dashboard in a real browser: headless Chromium loads the page from a uvicorn server whose
fleet is a fake of two replicas with changing counters, and the test reads back its DOM and a
screenshot: replica rows, chart canvases and legends, and every series' colour drawn inside its
chart's plot area.

The server has been running before the page opens: its history holds ``HISTORY_SAMPLES`` samples
(taken by the server's ``FleetHistory`` on a manual clock, five seconds apart) of the fleet and
of requests observed through the server's metrics (three tenant classes, a long tail of
revisions). The page must plot that hour from its first load: the series start at the first
sample, the class rates and the top-revision table are those the traffic implies.

With ``LORAPLEX_DASHBOARD_SCREENSHOT`` set to a path, the screenshot is copied there (how
``docs/dashboard.png`` is made).

Chromium is found as ``chromium`` or ``chromium-browser``. Without it these tests skip, except
where the environment variable ``CI`` is ``true`` (CI installs it, so its absence is a failure).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import cast

import pytest
import uvicorn
from PIL import Image

from loraplex.clock import ManualClock
from loraplex.engine.protocol import EngineClient, EngineHealth, EngineLoad, TokenDelta
from loraplex.registry import RegistryConfig, open_registry
from loraplex.router.fleet_state import FleetState, ReplicaLoadView, ReplicaState, TierOccupancy
from loraplex.server.app import create_app
from loraplex.server.deps import ServerConfig, ServerDeps
from loraplex.server.history import FleetHistory, HistoryConfig
from loraplex.server.listeners import ConnectionLimits, ListenerConfig, bind

ADMIN_KEY = "browser-test-admin-credential-0123"
REPLICAS = ("replica-a", "replica-b")
REASONS = ("affinity_l0", "load_first", "cold_rendezvous")
CHARTS = ("occupancy", "hits", "load", "decisions", "classes", "revisions")
HISTORY_SAMPLES = 400  # samples the server took before the page opened (2000 s of views)
HISTORY = HistoryConfig(interval_s=5.0)  # the default hour and top 8, five seconds a sample
# Per sample (5 s): class -> (requests, tokens each); rates: high 6, normal 2, batch 4 tokens/s
TRAFFIC = {"high": (3, 10), "normal": (2, 5), "batch": (1, 20)}
HIGH_REVISION = "acme/support@r1"  # every high request
BATCH_REVISION = "globex/summarize@r2"  # every batch request
TAIL = tuple(f"tail/adapter-{i:02d}@r1" for i in range(12))  # the normal requests, in turn
WINDOW = (1280, 1400)  # the browser window (the page is taller than 1000 px now)
VIEW_SPACING_S = 5.0  # each view is this much later than the one before (so lines have length)
VIRTUAL_TIME_MS = 20_000  # about 20 polls of the page (one a second of the browser's time)
MIN_PIXELS = 20  # pixels of a series' colour its plot area must hold (a line, not a stray dot)
COLOR_TOLERANCE = 30  # per channel, for antialiased edges
CHROMIUM_TIMEOUT_S = 120

pytestmark = pytest.mark.slow  # a few Chromium runs, a few seconds each


@dataclass
class ChangingFleet:
    """Two replicas whose counters grow at known rates on every view, and three routing reasons."""

    num_views: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fleet_state(self) -> FleetState:
        with self.lock:
            self.num_views += 1
            n = self.num_views
        return FleetState(
            at_s=1.7e9 + n * VIEW_SPACING_S,
            policy="affinity_until_saturated",
            replicas=(
                _replica("replica-a", n, hits_l0=8, used=(150, 300, 1800)),
                _replica("replica-b", n, hits_l0=2, used=(60, 500, 1300)),
            ),
            decisions={"affinity_l0": 7 * n, "load_first": 3 * n, "cold_rendezvous": n},
        )


def _replica(replica_id: str, n: int, hits_l0: int, used: tuple[int, int, int]) -> ReplicaState:
    """``replica_id`` at view ``n``: ``hits_l0`` L0 hits, one L1 hit and one miss per view."""
    tiers = {
        "l0": TierOccupancy(2, used[0], 200),
        "l1": TierOccupancy(5, used[1] + 10 * (n % 5), 1000),
        "l2": TierOccupancy(9, used[2], 2000),
    }
    # 1000 misses before the page opened: the cumulative ratio is far from the per-view one.
    hits = {"l0": hits_l0 * n, "l1": n, "l2": 0, "miss": 1000 + n}
    load = ReplicaLoadView(n % 3, 4 if replica_id == "replica-a" else 1, 40 * n, 0.5, 0.0)
    return ReplicaState(replica_id, True, 0.4, tiers, hits, load)


class IdleEngine:
    """The engine behind the app: never asked to generate here, always up and idle (the app's
    metrics read its load)."""

    def health(self) -> EngineHealth:
        return EngineHealth(up=True, num_restarts=0, down_reason=None)

    def load_snapshot(self) -> EngineLoad:
        return EngineLoad(0, 0, 0, 0.0, (), (), 1, 0)


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found is not None:
            return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("chromium is not installed, and CI=true (CI installs it: see .ci/run)")
    pytest.skip("chromium (or chromium-browser) is not installed; apt-get install -y chromium")


def run_before_the_page(deps: ServerDeps, history: FleetHistory, clock: ManualClock) -> None:
    """``HISTORY_SAMPLES`` intervals of traffic, each observed as the server observes a request
    (``start_request``, its deltas, ``finish``) and then sampled."""
    tail = 0
    for _ in range(HISTORY_SAMPLES):
        for priority_class, (num_requests, tokens) in TRAFFIC.items():
            for _ in range(num_requests):
                if priority_class == "normal":
                    revision, tail = TAIL[tail % len(TAIL)], tail + 1
                else:
                    revision = HIGH_REVISION if priority_class == "high" else BATCH_REVISION
                observed = deps.metrics.start_request(priority_class, False, clock.now(),
                                                      revision=revision)  # fmt: skip
                delta = TokenDelta(tuple(range(tokens)), "x" * tokens, "stop", 3, tokens)
                observed.on_delta(delta, clock.now())
                observed.finish("stop")
        clock.advance(HISTORY.interval_s)
        history.sample()


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    chromium_binary()  # skip (or fail on CI) before starting anything
    registry = open_registry(RegistryConfig(tmp_path_factory.mktemp("browser-registry")))
    config = ServerConfig(base_model_name="browser-test-base", admin_key=ADMIN_KEY)
    engine = cast(EngineClient, IdleEngine())
    fleet = ChangingFleet()
    deps = ServerDeps(config, engine, registry, refresh_tenants=lambda: None, fleet=fleet,
                      history=HISTORY)  # fmt: skip
    app = create_app(deps)
    clock = ManualClock()
    # The app's own history, on a clock the test moves (``Server`` would sample it on a thread).
    app.state.history = FleetHistory(fleet, deps.metrics.traffic, HISTORY, clock)
    run_before_the_page(deps, app.state.history, clock)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(ListenerConfig(app, ConnectionLimits(), "warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/admin/dashboard"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        registry.close()


def run_chromium(url: str, tmp_path: Path, *mode: str) -> str:
    """Chromium's stdout after loading ``url`` for VIRTUAL_TIME_MS of page time."""
    done = subprocess.run(
        [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--virtual-time-budget={VIRTUAL_TIME_MS}",
         f"--user-data-dir={tmp_path / 'profile'}", *mode, url],
        capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@dataclass
class PageDom:
    """What the test reads of the dumped DOM."""

    rows: list[str] = field(default_factory=list)  # data-replica of each table row
    plot_boxes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # canvas id -> box
    series: dict[str, list[dict[str, object]]] = field(default_factory=dict)  # canvas id -> data
    table_rows: dict[str, list[list[str]]] = field(default_factory=dict)  # table id -> cells
    legends: dict[str, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    status: str = ""  # the status line's text
    form_hidden: bool = True  # the key form's ``hidden``


class DomReader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.dom = PageDom()
        self._legend: str | None = None  # the chart whose legend is open
        self._swatch: tuple[int, ...] | None = None  # the colour of the open legend entry
        self._in: str | None = None  # "status", "label" or "cell" while reading their text
        self._table: str | None = None  # the id of the open table

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-replica" in a:
            self.dom.rows.append(a["data-replica"])
        elif tag == "canvas" and "data-plot-box" in a:  # drawn at least once
            self.dom.plot_boxes[a["id"]] = tuple(int(v) for v in a["data-plot-box"].split())
            self.dom.series[a["id"]] = json.loads(a["data-series"])
        elif tag == "table":
            self._table = a.get("id")
            self.dom.table_rows[a.get("id", "")] = []
        elif tag == "tr" and self._table is not None and {"data-class", "data-revision"} & set(a):
            self.dom.table_rows[self._table].append([])
        elif tag == "td" and self._table is not None and self.dom.table_rows[self._table]:
            self._in = "cell"
            self.dom.table_rows[self._table][-1].append("")
        elif tag == "ul" and a.get("id", "").startswith("legend-"):
            self._legend = a["id"].removeprefix("legend-")
            self.dom.legends[self._legend] = []
        elif tag == "span" and a.get("class") == "swatch":
            found = re.search(r"border-top-color:\s*rgb\((\d+), (\d+), (\d+)\)", a.get("style", ""))
            assert found is not None, a
            self._swatch = tuple(int(v) for v in found.groups())
        elif tag == "span" and self._swatch is not None:
            self._in = "label"
        elif tag == "span" and a.get("id") == "status":
            self._in = "status"
        elif tag == "form":
            self.dom.form_hidden = "hidden" in a

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul":
            self._legend = None
        if tag in ("span", "td"):
            self._in = None
        if tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._in == "status":
            self.dom.status += data
        elif self._in == "cell" and self._table is not None:
            self.dom.table_rows[self._table][-1][-1] += data
        elif self._in == "label" and self._legend is not None and self._swatch is not None:
            self.dom.legends[self._legend].append((data, self._swatch))
            self._swatch = None


def read_dom(html: str) -> PageDom:
    reader = DomReader()
    reader.feed(html)
    return reader.dom


@dataclass(frozen=True)
class Rendered:
    """The page with the right key, after about 20 polls: its DOM and a screenshot of it."""

    dom: PageDom
    screenshot: Image.Image


@pytest.fixture(scope="module")
def rendered(page_url: str, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    tmp_path = tmp_path_factory.mktemp("chromium")
    shot = tmp_path / "dashboard.png"
    # One run for both, so the plot boxes in the DOM are those of the screenshot.
    html = run_chromium(f"{page_url}#key={ADMIN_KEY}", tmp_path, "--dump-dom",
                        f"--screenshot={shot}")  # fmt: skip
    copy_to = os.environ.get("LORAPLEX_DASHBOARD_SCREENSHOT")
    if copy_to:
        shutil.copyfile(shot, copy_to)
    return Rendered(read_dom(html), Image.open(shot).convert("RGB"))


def test_the_page_shows_the_replicas_their_charts_and_legends(rendered: Rendered) -> None:
    dom = rendered.dom
    assert dom.rows == list(REPLICAS)
    assert dom.form_hidden and dom.status.startswith("updated"), dom.status
    assert set(dom.plot_boxes) == {f"chart-{name}" for name in CHARTS}
    tier_labels = [f"{r} {t}" for r in REPLICAS for t in ("L0", "L1", "L2")]
    assert [label for label, _ in dom.legends["occupancy"]] == tier_labels
    for name in ("hits", "load"):
        assert [label for label, _ in dom.legends[name]] == list(REPLICAS)
    assert [label for label, _ in dom.legends["decisions"]] == list(REASONS)
    assert [label for label, _ in dom.legends["classes"]] == list(TRAFFIC)
    assert [label for label, _ in dom.legends["revisions"]] == [*TOP_REVISIONS, "other"]


# The hour's top 8 by tokens: high (30 a sample) and batch (20), then six of the tail's twelve
# (each 5 tokens a request; ties by requests, then by name).
TOP_REVISIONS = (HIGH_REVISION, BATCH_REVISION, *sorted(TAIL)[:6])


def test_the_history_from_before_the_page_opened_is_plotted(rendered: Rendered) -> None:
    first_sample_s = 1.7e9 + VIEW_SPACING_S  # the fleet's first view was the first sample's
    for name in ("occupancy", "hits", "load", "decisions"):
        for series in rendered.dom.series[f"chart-{name}"]:
            # history views plus the page's own polls (about one a second for 20 s)
            assert HISTORY_SAMPLES <= cast(int, series["points"]) <= HISTORY_SAMPLES + 30, series
            first_x = cast(float, series["first_x"])
            assert first_x <= first_sample_s + VIEW_SPACING_S, (name, series)
    classes = {str(s["label"]): s for s in rendered.dom.series["chart-classes"]}
    for name, (num_requests, tokens) in TRAFFIC.items():
        assert classes[name]["points"] == HISTORY_SAMPLES
        assert classes[name]["first_x"] == first_sample_s
        rate = cast(float, classes[name]["mean_y"])
        assert rate == pytest.approx(num_requests * tokens / HISTORY.interval_s), name


def test_the_class_and_top_revision_tables_sum_the_hour(rendered: Rendered) -> None:
    classes = rendered.dom.table_rows["classes"]
    assert classes == [
        [name, f"{n * HISTORY_SAMPLES}", f"{n * tokens * HISTORY_SAMPLES}", "0"]
        for name, (n, tokens) in TRAFFIC.items()
    ]
    revisions = rendered.dom.table_rows["revisions"]
    assert [row[0] for row in revisions] == [*TOP_REVISIONS, "other (6 revisions)"]
    assert revisions[0][1:3] == [f"{3 * HISTORY_SAMPLES}", f"{30 * HISTORY_SAMPLES}"]
    assert revisions[1][1:3] == [f"{HISTORY_SAMPLES}", f"{20 * HISTORY_SAMPLES}"]
    tail_requests = 2 * HISTORY_SAMPLES  # 800 normal requests over twelve revisions
    assert sum(int(row[1]) for row in revisions[2:]) == tail_requests
    assert revisions[0][3] == "50 %"  # 12000 of 24000 tokens


def test_the_screenshot_draws_every_series_inside_its_chart(rendered: Rendered) -> None:
    image, dom = rendered.screenshot, rendered.dom
    assert image.size == WINDOW
    assert len(image.getcolors(maxcolors=1 << 16) or ()) > 50, "the screenshot is blank"
    for name in CHARTS:
        left, top, width, height = dom.plot_boxes[f"chart-{name}"]
        assert top + height <= image.size[1], f"chart {name} is below the screenshot"
        plot = image.crop((left, top, left + width, top + height))
        colours = {colour for _, colour in dom.legends[name]}
        if name == "revisions":  # the tail's lines lie on one another: the two largest
            colours = {colour for _, colour in dom.legends[name][:2]}
        assert len(colours) == (3 if name in ("decisions", "classes") else 2), name
        for colour in colours:
            assert _pixels_near(plot, colour) >= MIN_PIXELS, (name, colour)


def test_the_hit_ratio_is_l0_hits_over_acquires_between_views(rendered: Rendered) -> None:
    # Per view replica-a gains 8 L0 hits, 1 L1 hit, 1 miss (0.8); replica-b 2, 1, 1 (0.5).
    left, top, width, height = rendered.dom.plot_boxes["chart-hits"]
    plot = rendered.screenshot.crop((left, top, left + width, top + height))
    for (label, colour), ratio in zip(rendered.dom.legends["hits"], (0.8, 0.5), strict=True):
        rows = _rows_near(plot, colour)
        assert rows, label
        assert abs(statistics.median(rows) - height * (1 - ratio)) <= 3, (label, rows)


def _rows_near(image: Image.Image, colour: tuple[int, ...]) -> list[int]:
    pixels = image.load()
    assert pixels is not None
    return [
        y
        for y in range(image.size[1])
        for x in range(image.size[0])
        if max(abs(p - c) for p, c in zip(pixels[x, y], colour, strict=True)) <= COLOR_TOLERANCE
    ]


def _pixels_near(image: Image.Image, colour: tuple[int, ...]) -> int:
    return sum(
        count
        for count, pixel in image.getcolors(maxcolors=1 << 20) or ()
        if max(abs(p - c) for p, c in zip(pixel, colour, strict=True)) <= COLOR_TOLERANCE
    )


def test_a_wrong_key_shows_the_refusal_and_the_key_form(page_url: str, tmp_path: Path) -> None:
    dom = read_dom(run_chromium(f"{page_url}#key=not-the-admin-key", tmp_path, "--dump-dom"))
    assert "401" in dom.status and "refused" in dom.status, dom.status
    assert not dom.form_hidden and dom.rows == [] and dom.plot_boxes == {}


def test_without_a_key_the_page_asks_for_one(page_url: str, tmp_path: Path) -> None:
    dom = read_dom(run_chromium(page_url, tmp_path, "--dump-dom"))
    assert not dom.form_hidden and "admin key" in dom.status and dom.rows == []

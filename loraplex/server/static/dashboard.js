// The fleet page: on open it loads the last hour the server sampled (/admin/fleet/history),
// then polls /admin/fleet once a second with the admin key and the history for new samples; it
// shows the replicas in a table and charts the hour: fleet views (the history's, then the live
// ones), traffic per tenant class and the top revisions (from the history's samples).
//
// The key comes from the URL fragment (#key=..., which a browser never sends to a server) or the
// form, and is kept in this tab's sessionStorage only. Counters in a view are cumulative; rates
// and ratios are the differences between consecutive views.

import { LineChart } from "./chart.js";
import { TrafficViews } from "./traffic.js";

const POLL_MS = 1000;
const HISTORY_POLL_MS = 5000; // new history samples are asked for this often
const REQUEST_TIMEOUT_MS = 5000;
const HISTORY_S = 3600;
const MAX_VIEWS = 4000 + 3600; // views kept at most (one an hour at 1 s, plus the history's)
const KEY_STORAGE = "loraplex.adminKey";
const TIERS = ["l0", "l1", "l2"];
const ACQUIRE_KEYS = ["l0", "l1", "l2", "miss"];
const TIER_DASH = { l0: [], l1: [7, 4], l2: [2, 3] };
const REPLICA_COLORS = ["#d11f3a", "#1f5fd1", "#16a05a", "#8c2fd6", "#e07a10", "#0f9bb0",
  "#c2338f", "#6b8e1a"];
const REASON_COLORS = ["#e07a10", "#0f9bb0", "#8c2fd6", "#16a05a", "#d11f3a", "#1f5fd1",
  "#c2338f", "#6b8e1a"];

const views = []; // FleetState JSON, oldest first
const replicaColors = new Map(); // replica id -> colour, fixed at first sight
const reasonColors = new Map(); // routing reason -> colour, fixed at first sight
let adminKey = null;

const status = document.getElementById("status");
const keyForm = document.getElementById("key-form");
const keyInput = document.getElementById("key-input");
const commonOptions = { xWindow: HISTORY_S, xStep: 600 };
const charts = {
  occupancy: new LineChart(document.getElementById("chart-occupancy"),
    document.getElementById("legend-occupancy"),
    { ...commonOptions, yMax: 100, yFormat: (v) => `${v} %`, empty: "no cached tiers" }),
  hits: new LineChart(document.getElementById("chart-hits"),
    document.getElementById("legend-hits"),
    { ...commonOptions, yMax: 1, yFormat: (v) => `${Math.round(v * 100)} %`,
      empty: "no adapter acquires yet" }),
  load: new LineChart(document.getElementById("chart-load"),
    document.getElementById("legend-load"),
    { ...commonOptions, yFormat: (v) => `${v}`, empty: "no load reported" }),
  decisions: new LineChart(document.getElementById("chart-decisions"),
    document.getElementById("legend-decisions"),
    { ...commonOptions, yFormat: (v) => `${v}/s`, empty: "no routing decisions" }),
};
const traffic = new TrafficViews(HISTORY_S, commonOptions);
let historyLoaded = false; // the first history answer seeds the fleet views too
let lastSeq = 0; // the newest history sample this page has
let lastHistoryPoll = -Infinity; // performance.now() of the last history request

function setStatus(text, isError) {
  status.textContent = text;
  status.classList.toggle("error", isError);
}

function keyFromFragment() {
  const fromUrl = new URLSearchParams(window.location.hash.slice(1)).get("key");
  if (fromUrl) {
    sessionStorage.setItem(KEY_STORAGE, fromUrl);
    // The key leaves the address bar (and this history entry) once it is kept.
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  return sessionStorage.getItem(KEY_STORAGE);
}

function askForKey(message, isError) {
  adminKey = null;
  sessionStorage.removeItem(KEY_STORAGE);
  keyForm.hidden = false;
  setStatus(message, isError);
  keyInput.focus();
}

keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  adminKey = keyInput.value.trim();
  keyInput.value = "";
  sessionStorage.setItem(KEY_STORAGE, adminKey);
  keyForm.hidden = true;
  lastHistoryPoll = -Infinity; // the history first, with the new key
  poll();
});

async function fetchAdmin(path) {
  const abort = new AbortController();
  const timeout = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
  try {
    return await fetch(path, {
      headers: { Authorization: `Bearer ${adminKey}` },
      cache: "no-store",
      signal: abort.signal,
    });
  } finally {
    clearTimeout(timeout);
  }
}

// The JSON of an admin path; null (and the key form shown) when the key was refused.
async function getAdmin(path) {
  const response = await fetchAdmin(path);
  if (response.status === 401) {
    askForKey("The admin key was refused (401 Unauthorized): enter the admin key.", true);
    return null;
  }
  if (!response.ok) {
    throw new Error(`/admin/${path.split("?")[0]} answered ${response.status}`);
  }
  return response.json();
}

// New history samples: traffic always; fleet views only on the first load (live polls cover
// the time since).
async function pollHistory() {
  lastHistoryPoll = performance.now();
  const history = await getAdmin(`fleet/history?after=${lastSeq}`);
  if (history === null) {
    return false;
  }
  if (history.last_seq < lastSeq) { // the server restarted: its samples are numbered anew
    lastSeq = 0;
    traffic.clear();
    lastHistoryPoll = -Infinity;
    return true;
  }
  for (const sample of history.samples) {
    if (!historyLoaded) {
      record(sample.fleet);
    }
    lastSeq = Math.max(lastSeq, sample.seq);
  }
  traffic.record(history);
  historyLoaded = true;
  return true;
}

async function poll() {
  const started = performance.now();
  try {
    if (started - lastHistoryPoll >= HISTORY_POLL_MS && !(await pollHistory())) {
      return;
    }
    const view = await getAdmin("fleet");
    if (view === null) {
      return;
    }
    record(view);
    render();
    setStatus(`updated ${new Date(views.at(-1).at_s * 1000).toLocaleTimeString()}`, false);
  } catch (error) {
    setStatus(`fleet unavailable: ${error.message}`, true);
  }
  setTimeout(poll, Math.max(0, POLL_MS - (performance.now() - started)));
}

function record(view) {
  if (views.length > 0 && view.at_s <= views.at(-1).at_s) {
    return; // not newer than what the page has (a history sample after a live view)
  }
  views.push(view);
  const start = view.at_s - HISTORY_S;
  // One view older than the window stays: the first interval inside it is differenced from it.
  while (views.length > MAX_VIEWS || (views.length > 1 && views[1].at_s <= start)) {
    views.shift();
  }
  for (const replica of view.replicas) {
    assignColor(replicaColors, replica.replica_id, REPLICA_COLORS);
  }
  for (const reason of Object.keys(view.decisions)) {
    assignColor(reasonColors, reason, REASON_COLORS);
  }
}

function assignColor(colors, name, palette) {
  if (!colors.has(name)) {
    colors.set(name, palette[colors.size % palette.length]);
  }
}

function replicaOf(view, id) {
  return view.replicas.find((r) => r.replica_id === id) ?? null;
}

// Replica ids in any kept view, in the order they were first seen.
function replicaIds() {
  const seen = new Set(views.flatMap((v) => v.replicas.map((r) => r.replica_id)));
  return [...replicaColors.keys()].filter((id) => seen.has(id));
}

// One point per view: value(replica) or null where the replica is absent.
function perView(id, value) {
  return views.map((v) => {
    const replica = replicaOf(v, id);
    return [v.at_s, replica === null ? null : value(replica)];
  });
}

// One point per interval between consecutive views, at the later one: change(before, after).
function perInterval(change) {
  const points = [];
  for (let i = 1; i < views.length; i++) {
    points.push([views[i].at_s, change(views[i - 1], views[i])]);
  }
  return points;
}

function occupancySeries() {
  return replicaIds().flatMap((id) => TIERS.map((tier) => ({
    label: `${id} ${tier.toUpperCase()}`,
    color: replicaColors.get(id),
    dash: TIER_DASH[tier],
    points: perView(id, (r) => {
      const t = r.tiers[tier];
      return t && t.capacity_bytes > 0 ? (100 * t.used_bytes) / t.capacity_bytes : null;
    }),
  })));
}

// L0 hits over all acquires in the interval; null without acquires or when counters restarted.
function l0HitRatio(before, after) {
  if (before === null || after === null) {
    return null;
  }
  const deltas = ACQUIRE_KEYS.map((k) => (after.hits[k] ?? 0) - (before.hits[k] ?? 0));
  const acquires = deltas.reduce((a, b) => a + b, 0);
  return deltas.some((d) => d < 0) || acquires === 0 ? null : deltas[0] / acquires;
}

function hitSeries() {
  return replicaIds().map((id) => ({
    label: id,
    color: replicaColors.get(id),
    dash: [],
    points: perInterval((a, b) => l0HitRatio(replicaOf(a, id), replicaOf(b, id))),
  }));
}

function loadSeries() {
  return replicaIds().map((id) => ({
    label: id,
    color: replicaColors.get(id),
    dash: [],
    points: perView(id, (r) => (r.load === null ? null : r.load.num_queued + r.load.num_running)),
  }));
}

function decisionSeries() {
  const seen = new Set(views.flatMap((v) => Object.keys(v.decisions)));
  const reasons = [...reasonColors.keys()].filter((reason) => seen.has(reason));
  return reasons.map((reason) => ({
    label: reason,
    color: reasonColors.get(reason),
    dash: [],
    points: perInterval((a, b) => {
      const seconds = b.at_s - a.at_s;
      const count = (b.decisions[reason] ?? 0) - (a.decisions[reason] ?? 0);
      return seconds > 0 && count >= 0 ? count / seconds : null;
    }),
  }));
}

function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

function tierCell(tier) {
  if (!tier) {
    return "–";
  }
  return `${tier.count} · ${formatBytes(tier.used_bytes)} / ${formatBytes(tier.capacity_bytes)}`;
}

function replicaRow(r) {
  const load = r.load;
  const cells = [
    r.replica_id,
    r.healthy ? "yes" : "no",
    r.report_age_s === null ? "never" : `${r.report_age_s.toFixed(1)} s`,
    ...TIERS.map((t) => tierCell(r.tiers[t])),
    load ? `${load.num_queued}` : "–",
    load ? `${load.num_running}` : "–",
    load ? `${load.num_active_tokens}` : "–",
    load ? `${Math.round(load.kv_usage * 100)} %` : "–",
    load ? load.evictions_per_min.toFixed(0) : "–",
  ];
  const row = document.createElement("tr");
  row.dataset.replica = r.replica_id;
  row.classList.toggle("unhealthy", !r.healthy);
  row.title = r.down_reason || ""; // why it is out of rotation (an attribute: text, not markup)
  for (const text of cells) {
    const cell = document.createElement("td");
    cell.textContent = text; // text, never markup: ids come from the replicas
    row.append(cell);
  }
  return row;
}

function render() {
  const latest = views.at(-1);
  if (!latest) {
    return;
  }
  document.getElementById("policy").textContent =
    latest.policy === null ? "one replica, no routing" : `routing policy: ${latest.policy}`;
  document.querySelector("#replicas tbody").replaceChildren(...latest.replicas.map(replicaRow));
  charts.occupancy.render(occupancySeries(), latest.at_s);
  charts.hits.render(hitSeries(), latest.at_s);
  charts.load.render(loadSeries(), latest.at_s);
  charts.decisions.render(decisionSeries(), latest.at_s);
  traffic.render(latest.at_s);
}

window.addEventListener("resize", render);
adminKey = keyFromFragment();
if (adminKey) {
  poll();
} else {
  askForKey("Enter the admin key to see the fleet.", false);
}

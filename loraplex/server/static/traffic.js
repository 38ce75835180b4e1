// The traffic views of the fleet page, from the server's history samples (/admin/fleet/history):
// tokens per second by tenant class, tokens per second of the top revisions (the rest as
// "other"), and two tables summing the hour: per class, and the top revisions.
//
// Each sample counts one interval's traffic (not cumulative), so a rate is the sample's count
// over its interval_s. The server bounds what a sample names (its top revisions, the rest summed);
// a revision outside a sample's top counts under "other" there. Names are shown as text only.

import { LineChart } from "./chart.js";

const CLASS_ORDER = ["high", "normal", "batch"];
const CLASS_COLORS = { high: "#d11f3a", normal: "#1f5fd1", batch: "#16a05a" };
const EXTRA_CLASS_COLOR = "#5b6573";
const OTHER_LABEL = "other";
const OTHER_COLOR = "#8a939f";
const REVISION_COLORS = ["#e07a10", "#8c2fd6", "#0f9bb0", "#c2338f", "#6b8e1a", "#1f5fd1",
  "#d11f3a", "#16a05a"];

function rate(count, sample) {
  return sample.interval_s > 0 ? count / sample.interval_s : null;
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text; // text, never markup: revision names come from tenants
  return td;
}

export class TrafficViews {
  constructor(windowS, chartOptions) {
    this.windowS = windowS;
    this.samples = []; // history samples, oldest first
    this.maxSamples = 1;
    this.window = null; // the latest answer's window summary (top revisions over the hour)
    this.revisionColors = new Map(); // revision -> colour, fixed at first sight
    this.classes = new LineChart(document.getElementById("chart-classes"),
      document.getElementById("legend-classes"),
      { ...chartOptions, yFormat: (v) => `${v}/s`, empty: "no requests finished" });
    this.revisions = new LineChart(document.getElementById("chart-revisions"),
      document.getElementById("legend-revisions"),
      { ...chartOptions, yFormat: (v) => `${v}/s`, empty: "no requests finished" });
  }

  // Forgets every sample (the server restarted and numbers its samples anew).
  clear() {
    this.samples = [];
    this.window = null;
  }

  // Appends an answer of /admin/fleet/history (its samples newer than those kept).
  record(history) {
    this.maxSamples = history.max_samples;
    const newest = this.samples.length > 0 ? this.samples.at(-1).seq : 0;
    for (const sample of history.samples) {
      if (sample.seq > newest) {
        this.samples.push(sample);
      }
    }
    while (this.samples.length > this.maxSamples) {
      this.samples.shift();
    }
    this.window = history.window;
    for (const entry of this.window.top_revisions) {
      if (!this.revisionColors.has(entry.revision)) {
        this.revisionColors.set(entry.revision,
          REVISION_COLORS[this.revisionColors.size % REVISION_COLORS.length]);
      }
    }
  }

  render(xMax) {
    const start = xMax - this.windowS;
    const shown = this.samples.filter((s) => s.at_s >= start);
    this.classes.render(this.classSeries(shown), xMax);
    this.revisions.render(this.revisionSeries(shown), xMax);
    this.renderClassTable(shown);
    this.renderRevisionTable();
  }

  classNames(samples) {
    const seen = new Set(samples.flatMap((s) => Object.keys(s.classes)));
    const extra = [...seen].filter((c) => !CLASS_ORDER.includes(c)).sort();
    return [...CLASS_ORDER.filter((c) => seen.has(c)), ...extra];
  }

  classSeries(samples) {
    return this.classNames(samples).map((name) => ({
      label: name,
      color: CLASS_COLORS[name] ?? EXTRA_CLASS_COLOR,
      dash: [],
      points: samples.map((s) => [s.at_s, rate(s.classes[name]?.tokens ?? 0, s)]),
    }));
  }

  revisionSeries(samples) {
    if (this.window === null || samples.length === 0) {
      return [];
    }
    const top = this.window.top_revisions.map((e) => e.revision);
    const series = top.map((name) => ({
      label: name,
      color: this.revisionColors.get(name),
      dash: [],
      points: samples.map((s) => {
        const entry = s.top_revisions.find((e) => e.revision === name);
        return [s.at_s, rate(entry ? entry.tokens : 0, s)];
      }),
    }));
    const others = samples.map((s) => {
      const outside = s.top_revisions.filter((e) => !top.includes(e.revision));
      const tokens = outside.reduce((sum, e) => sum + e.tokens, s.other_revisions.tokens);
      return [s.at_s, rate(tokens, s)];
    });
    if (others.some(([, y]) => y !== null && y > 0)) {
      series.push({ label: OTHER_LABEL, color: OTHER_COLOR, dash: [4, 3], points: others });
    }
    return series;
  }

  renderClassTable(samples) {
    const rows = this.classNames(samples).map((name) => {
      const sum = { requests: 0, tokens: 0, errors: 0 };
      for (const s of samples) {
        const t = s.classes[name];
        if (t) {
          sum.requests += t.requests;
          sum.tokens += t.tokens;
          sum.errors += t.errors;
        }
      }
      const row = document.createElement("tr");
      row.dataset.class = name;
      row.append(cell(name), cell(`${sum.requests}`), cell(`${sum.tokens}`), cell(`${sum.errors}`));
      return row;
    });
    document.querySelector("#classes tbody").replaceChildren(...rows);
  }

  renderRevisionTable() {
    if (this.window === null) {
      return;
    }
    const entries = [...this.window.top_revisions];
    const other = this.window.other_revisions;
    const total = entries.reduce((sum, e) => sum + e.tokens, other.tokens);
    const share = (tokens) => (total > 0 ? `${Math.round((100 * tokens) / total)} %` : "–");
    const rows = entries.map((e) => {
      const row = document.createElement("tr");
      row.dataset.revision = e.revision;
      row.append(cell(e.revision), cell(`${e.requests}`), cell(`${e.tokens}`), cell(share(e.tokens)));
      return row;
    });
    if (other.requests > 0) {
      const row = document.createElement("tr");
      row.dataset.revision = OTHER_LABEL;
      row.append(cell(`other (${other.num_revisions} revisions)`), cell(`${other.requests}`),
        cell(`${other.tokens}`), cell(share(other.tokens)));
      rows.push(row);
    }
    document.querySelector("#revisions tbody").replaceChildren(...rows);
  }
}

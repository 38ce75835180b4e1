// Line charts on a canvas: axes with ticks, a grid, one line per series, gaps where a value is
// null, and a legend in a list element beside the canvas. No dependencies, no build step.
//
// A series is {label, color, dash, points}: dash is a canvas line-dash array ([] for solid) and
// points are [x, y] pairs with x ascending (seconds) and y a number or null (no value: a gap).

const MARGIN = { left: 52, right: 12, top: 10, bottom: 24 };
const AXIS_COLOR = "#5b6573";
const GRID_COLOR = "#e6e9ee";
const FONT = "11px system-ui, sans-serif";
const LINE_WIDTH = 2;

// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
function niceStep(raw) {
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const factor of [1, 2, 5, 10]) {
    if (factor * power >= raw) {
      return factor * power;
    }
  }
  return 10 * power;
}

function largestValue(series) {
  let largest = 0;
  for (const s of series) {
    for (const [, y] of s.points) {
      if (y !== null && y > largest) {
        largest = y;
      }
    }
  }
  return largest;
}

export class LineChart {
  // options: yMax (fixed top of the y axis; absent: from the data), yFormat (tick label of a
  // value), xWindow (seconds shown, ending at the latest time), xStep (seconds between x ticks;
  // absent: about five ticks), empty (text shown with no data).
  constructor(canvas, legend, options) {
    this.canvas = canvas;
    this.legend = legend;
    this.options = options;
    this.legendKey = null;
  }

  render(series, xMax) {
    const ctx = this.prepare();
    const box = this.plotBox();
    const xMin = xMax - this.options.xWindow;
    const yTop = this.options.yMax ?? this.dataTop(series);
    const toX = (x) => box.left + ((x - xMin) / (xMax - xMin)) * box.width;
    const toY = (y) => box.top + box.height - (y / yTop) * box.height;
    this.drawAxes(ctx, box, xMin, xMax, yTop, toX, toY);
    ctx.save();
    ctx.beginPath();
    ctx.rect(box.left, box.top, box.width, box.height);
    ctx.clip();
    for (const s of series) {
      this.drawSeries(ctx, s, toX, toY);
    }
    ctx.restore();
    if (!series.some((s) => s.points.some(([, y]) => y !== null))) {
      ctx.fillStyle = AXIS_COLOR;
      ctx.textAlign = "center";
      ctx.fillText(this.options.empty, box.left + box.width / 2, box.top + box.height / 2);
    }
    this.renderLegend(series);
    this.markPlotBox(box);
    this.markSeries(series, xMin);
  }

  // Sizes the backing store to the element (times the device pixel ratio) and clears it.
  prepare() {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(this.canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(this.canvas.clientHeight * ratio));
    if (this.canvas.width !== width || this.canvas.height !== height) {
      this.canvas.width = width;
      this.canvas.height = height;
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, this.canvas.clientWidth, this.canvas.clientHeight);
    ctx.font = FONT;
    return ctx;
  }

  plotBox() {
    return {
      left: MARGIN.left,
      top: MARGIN.top,
      width: Math.max(1, this.canvas.clientWidth - MARGIN.left - MARGIN.right),
      height: Math.max(1, this.canvas.clientHeight - MARGIN.top - MARGIN.bottom),
    };
  }

  // The top of the y axis: a whole number of ticks above the largest value (1 when all are 0).
  dataTop(series) {
    const largest = largestValue(series);
    if (largest <= 0) {
      return 1;
    }
    const step = niceStep(largest / 4);
    return Math.ceil(largest / step) * step;
  }

  drawAxes(ctx, box, xMin, xMax, yTop, toX, toY) {
    const format = this.options.yFormat;
    ctx.lineWidth = 1;
    ctx.setLineDash([]);
    ctx.fillStyle = AXIS_COLOR;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    const yStep = niceStep(yTop / 4);
    for (let y = 0; y <= yTop + yStep / 1e6; y += yStep) {
      const py = Math.round(toY(y)) + 0.5;
      this.line(ctx, GRID_COLOR, box.left, py, box.left + box.width, py);
      ctx.fillText(format(y), box.left - 6, py);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const xStep = this.options.xStep ?? niceStep((xMax - xMin) / 5);
    for (let ago = 0; ago <= xMax - xMin; ago += xStep) {
      const px = Math.round(toX(xMax - ago)) + 0.5;
      this.line(ctx, GRID_COLOR, px, box.top, px, box.top + box.height);
      const label = ago === 0 ? "now" : ago % 60 === 0 ? `-${ago / 60} min` : `-${ago} s`;
      ctx.fillText(label, Math.min(px, box.left + box.width - 12), box.top + box.height + 6);
    }
    const bottom = box.top + box.height + 0.5;
    this.line(ctx, AXIS_COLOR, box.left - 0.5, box.top, box.left - 0.5, bottom);
    this.line(ctx, AXIS_COLOR, box.left - 0.5, bottom, box.left + box.width, bottom);
  }

  line(ctx, color, x0, y0, x1, y1) {
    ctx.strokeStyle = color;
    ctx.beginPath();
    ctx.moveTo(x0, y0);
    ctx.lineTo(x1, y1);
    ctx.stroke();
  }

  // One path per run of non-null values; a run of one point is drawn as a dot.
  drawSeries(ctx, s, toX, toY) {
    ctx.strokeStyle = s.color;
    ctx.fillStyle = s.color;
    ctx.lineWidth = LINE_WIDTH;
    ctx.lineJoin = "round";
    ctx.setLineDash(s.dash);
    let run = [];
    const flush = () => {
      if (run.length === 1) {
        ctx.beginPath();
        ctx.arc(run[0][0], run[0][1], LINE_WIDTH * 1.5, 0, 2 * Math.PI);
        ctx.fill();
      } else if (run.length > 1) {
        ctx.beginPath();
        ctx.moveTo(run[0][0], run[0][1]);
        for (const [px, py] of run.slice(1)) {
          ctx.lineTo(px, py);
        }
        ctx.stroke();
      }
      run = [];
    };
    for (const [x, y] of s.points) {
      if (y === null) {
        flush();
      } else {
        run.push([toX(x), toY(y)]);
      }
    }
    flush();
  }

  // Rebuilt only when the series change, so the list is not replaced on every poll.
  renderLegend(series) {
    const key = JSON.stringify(series.map((s) => [s.label, s.color, s.dash]));
    if (key === this.legendKey) {
      return;
    }
    this.legendKey = key;
    const items = series.map((s) => {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      // NOTE: set through the CSSOM, which the page's style-src 'self' allows (a style
      // attribute in markup it would refuse).
      swatch.style.borderTopColor = s.color;
      swatch.style.borderTopStyle = s.dash.length === 0 ? "solid" : s.dash[0] > 3 ? "dashed" : "dotted";
      const label = document.createElement("span");
      label.textContent = s.label;
      item.append(swatch, label);
      return item;
    });
    this.legend.replaceChildren(...items);
  }

  // Where the plot area lies on the page, in CSS pixels ("left top width height"), for tools
  // that inspect the rendered page (the browser test looks for each series' colour there).
  markPlotBox(box) {
    const rect = this.canvas.getBoundingClientRect();
    const left = Math.round(rect.left + window.scrollX + box.left);
    const top = Math.round(rect.top + window.scrollY + box.top);
    this.canvas.dataset.plotBox = `${left} ${top} ${Math.round(box.width)} ${Math.round(box.height)}`;
  }

  // What each series plots inside the window, for the same tools: its label, how many points
  // have a value, the first and last of their x, and the mean of their y.
  markSeries(series, xMin) {
    const summary = series.map((s) => {
      const shown = s.points.filter(([x, y]) => y !== null && x >= xMin);
      const mean = shown.reduce((sum, [, y]) => sum + y, 0) / Math.max(1, shown.length);
      return { label: s.label, points: shown.length, first_x: shown[0]?.[0] ?? null,
        last_x: shown.at(-1)?.[0] ?? null, mean_y: shown.length > 0 ? mean : null };
    });
    this.canvas.dataset.series = JSON.stringify(summary);
  }
}

// Charts of the NotebookOS dashboard, drawn as inline SVG: time series with labelled axes and units, stacked bars,
// and the events timeline. No library. Every chart marks what it drew for tests and screen readers:
// <svg class="chart" data-chart=...> holds <g class="axis x|y"> with <text class="tick"> and <text class="axis-label">,
// and one <path class="series" data-series=... data-points=N> per series (bars: <rect class="bar">).
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 480;
  const HEIGHT = 200;
  const MARGIN = { left: 52, right: 12, top: 10, bottom: 34 };
  const PALETTE = ["#e07a1f", "#6f5bd6", "#3fa34d", "#1f77b4", "#b3261e", "#8c564b", "#17becf", "#7f7f7f"];

  function node(tag, attrs, text) {
    const element = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) element.setAttribute(key, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  // Round steps (1, 2, 5 x 10^n) from 0 up to at least `max`.
  function niceTicks(max, count) {
    if (!(max > 0)) return [0, 1];
    const raw = max / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
    const ticks = [];
    for (let v = 0; v < max + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
    if (ticks[ticks.length - 1] < max) ticks.push(ticks[ticks.length - 1] + step);
    return ticks;
  }

  // Clock times at round steps between t0 and t1 (Unix seconds).
  function timeTicks(t0, t1) {
    const span = Math.max(1, t1 - t0);
    const steps = [10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
    const step = steps.find((s) => span / s <= 6) || 86400;
    const ticks = [];
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push(t);
    return { ticks, seconds: step < 60 };
  }

  function clock(t, seconds) {
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + (seconds ? ":" + pad(d.getSeconds()) : "");
  }

  function number(v) {
    if (v === 0) return "0";
    if (Math.abs(v) >= 100) return v.toFixed(0);
    return String(Number(v.toPrecision(3)));
  }

  function frame(svg, label) {
    svg.replaceChildren();
    svg.setAttribute("viewBox", "0 0 " + WIDTH + " " + HEIGHT);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", label);
    svg.classList.add("chart");
  }

  function yAxis(svg, ticks, unit, y) {
    const axis = node("g", { class: "axis y" });
    for (const value of ticks) {
      axis.append(node("line", { class: "grid", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(value), y2: y(value) }));
      axis.append(node("text", { class: "tick", x: MARGIN.left - 4, y: y(value) + 3, "text-anchor": "end" }, number(value)));
    }
    const middle = (MARGIN.top + HEIGHT - MARGIN.bottom) / 2;
    axis.append(node("text", { class: "axis-label", transform: "translate(11," + middle + ") rotate(-90)", "text-anchor": "middle" }, unit));
    svg.append(axis);
  }

  function xTimeAxis(svg, t0, t1, x, label) {
    const axis = node("g", { class: "axis x" });
    const base = HEIGHT - MARGIN.bottom;
    axis.append(node("line", { class: "baseline", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: base, y2: base }));
    const { ticks, seconds } = timeTicks(t0, t1);
    for (const t of ticks) {
      axis.append(node("line", { class: "mark", x1: x(t), x2: x(t), y1: base, y2: base + 4 }));
      if (x(t) > WIDTH - MARGIN.right - 18) continue; // a label cut by the edge: the mark alone
      axis.append(node("text", { class: "tick", x: x(t), y: base + 14, "text-anchor": "middle" }, clock(t, seconds)));
    }
    axis.append(node("text", { class: "axis-label", x: (MARGIN.left + WIDTH - MARGIN.right) / 2, y: HEIGHT - 3, "text-anchor": "middle" }, label));
    svg.append(axis);
  }

  function legend(container, entries) {
    if (!container) return;
    container.replaceChildren(
      ...entries.map((e) => {
        const item = document.createElement("span");
        item.className = "legend-item";
        const swatch = document.createElement("span");
        swatch.className = "swatch" + (e.dashed ? " dashed" : "") + (e.box ? " box" : "");
        swatch.style.borderColor = e.color;
        swatch.style.background = e.dashed ? "transparent" : e.color;
        item.append(swatch, " " + e.label);
        return item;
      }),
    );
  }

  // A time series chart. `points`: [{at, ...}]; `series`: [{key, label, color, value(point) -> number|null,
  // dashed, dots}]. Missing values (null) break a line; `dots` marks every point (sparse series).
  function timeSeries(svg, options) {
    const { points, series, unit, title } = options;
    frame(svg, title);
    svg.dataset.chart = options.name;
    if (!points.length) {
      svg.append(node("text", { class: "empty", x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle" }, "no samples yet"));
      legend(options.legend, []);
      return;
    }
    const t1 = points[points.length - 1].at;
    const t0 = Math.min(points[0].at, t1 - 60);
    let most = 0;
    for (const s of series) for (const p of points) most = Math.max(most, s.value(p) || 0);
    const ticks = niceTicks(Math.max(most, options.min_top || 0), 4);
    const top = ticks[ticks.length - 1] || 1;
    const x = (t) => MARGIN.left + ((t - t0) / (t1 - t0)) * (WIDTH - MARGIN.left - MARGIN.right);
    const y = (v) => HEIGHT - MARGIN.bottom - (v / top) * (HEIGHT - MARGIN.top - MARGIN.bottom);
    yAxis(svg, ticks, unit, y);
    xTimeAxis(svg, t0, t1, x, "time (this browser's clock)");
    for (const s of series) {
      let d = "";
      let drawn = 0;
      let pen = "M";
      const dots = node("g", { class: "dots", fill: s.color });
      for (const p of points) {
        const v = s.value(p);
        if (v === null || v === undefined || Number.isNaN(v)) {
          pen = "M";
          continue;
        }
        d += pen + x(p.at).toFixed(1) + "," + y(v).toFixed(1) + " ";
        pen = "L";
        drawn += 1;
        if (s.dots) dots.append(node("circle", { cx: x(p.at).toFixed(1), cy: y(v).toFixed(1), r: 2 }));
      }
      const path = node("path", {
        class: "series",
        d: d.trim() || "M0,0",
        fill: "none",
        stroke: s.color,
        "stroke-width": 2,
        "data-series": s.key,
        "data-points": drawn,
      });
      if (s.dashed) path.setAttribute("stroke-dasharray", "5 3");
      path.append(node("title", {}, s.label));
      svg.append(path);
      if (s.dots) svg.append(dots);
    }
    legend(options.legend, series);
  }

  // Stacked bars: one bar per category (x), one segment per stack key. `rows`: [{category, key, value}].
  function stackedBars(svg, options) {
    const { rows, unit, title } = options;
    frame(svg, title);
    svg.dataset.chart = options.name;
    const categories = [...new Set(rows.map((r) => r.category))].sort().slice(-(options.last || 14));
    const keys = [...new Set(rows.map((r) => r.key))].sort();
    const color = (key) => PALETTE[keys.indexOf(key) % PALETTE.length];
    if (!categories.length) {
      svg.append(node("text", { class: "empty", x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle" }, options.empty));
      legend(options.legend, []);
      return;
    }
    const totals = categories.map((c) => rows.filter((r) => r.category === c).reduce((sum, r) => sum + r.value, 0));
    const ticks = niceTicks(Math.max(...totals), 4);
    const top = ticks[ticks.length - 1] || 1;
    const y = (v) => HEIGHT - MARGIN.bottom - (v / top) * (HEIGHT - MARGIN.top - MARGIN.bottom);
    yAxis(svg, ticks, unit, y);
    const band = (WIDTH - MARGIN.left - MARGIN.right) / categories.length;
    const axis = node("g", { class: "axis x" });
    const base = HEIGHT - MARGIN.bottom;
    axis.append(node("line", { class: "baseline", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: base, y2: base }));
    const barWidth = Math.min(band * 0.7, 48);
    categories.forEach((category, i) => {
      const left = MARGIN.left + i * band + (band - barWidth) / 2;
      let level = 0;
      for (const r of rows.filter((row) => row.category === category).sort((a, b) => (a.key < b.key ? -1 : 1))) {
        const bar = node("rect", {
          class: "bar",
          x: left.toFixed(1),
          y: y(level + r.value).toFixed(1),
          width: barWidth.toFixed(1),
          height: Math.max(0.5, y(level) - y(level + r.value)).toFixed(1),
          fill: color(r.key),
          "data-category": category,
          "data-key": r.key,
          "data-value": r.value,
        });
        bar.append(node("title", {}, r.key + ", " + category + ": " + number(r.value) + " " + unit));
        svg.append(bar);
        level += r.value;
      }
      axis.append(node("text", { class: "tick", x: left + barWidth / 2, y: base + 14, "text-anchor": "middle" }, options.tick(category)));
    });
    axis.append(node("text", { class: "axis-label", x: (MARGIN.left + WIDTH - MARGIN.right) / 2, y: HEIGHT - 3, "text-anchor": "middle" }, options.x_label));
    svg.append(axis);
    legend(options.legend, keys.map((key) => ({ label: key, color: color(key), box: true })));
  }

  // The events of the last `span` seconds, one lane per kind, newest on the right.
  function timeline(svg, options) {
    const { events, lanes, span, now } = options;
    const height = 40 + lanes.length * 22;
    svg.replaceChildren();
    svg.setAttribute("viewBox", "0 0 " + WIDTH * 2 + " " + height);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", options.title);
    svg.classList.add("chart");
    svg.dataset.chart = "timeline";
    const left = 90;
    const right = WIDTH * 2 - 12;
    const base = 10 + lanes.length * 22;
    const x = (t) => left + ((t - (now - span)) / span) * (right - left);
    const lanesAxis = node("g", { class: "axis y" });
    lanes.forEach((lane, i) => {
      const mid = 10 + i * 22 + 11;
      lanesAxis.append(node("line", { class: "grid", x1: left, x2: right, y1: mid, y2: mid }));
      lanesAxis.append(node("text", { class: "tick", x: left - 6, y: mid + 4, "text-anchor": "end" }, lane.label));
    });
    svg.append(lanesAxis);
    const axis = node("g", { class: "axis x" });
    axis.append(node("line", { class: "baseline", x1: left, x2: right, y1: base, y2: base }));
    const { ticks, seconds } = timeTicks(now - span, now);
    for (const t of ticks) {
      axis.append(node("line", { class: "mark", x1: x(t), x2: x(t), y1: base, y2: base + 4 }));
      axis.append(node("text", { class: "tick", x: x(t), y: base + 15, "text-anchor": "middle" }, clock(t, seconds)));
    }
    axis.append(node("text", { class: "axis-label", x: (left + right) / 2, y: height - 3, "text-anchor": "middle" }, options.x_label));
    svg.append(axis);
    for (const e of events) {
      const lane = lanes.findIndex((l) => l.kind === e.kind);
      if (lane < 0 || now - e.at > span) continue;
      const mark = node("circle", {
        class: "event" + (e.action === "failed" ? " failed" : ""),
        cx: x(e.at).toFixed(1),
        cy: 10 + lane * 22 + 11,
        r: 6,
        fill: e.action === "failed" ? "#b3261e" : lanes[lane].color,
        "data-seq": e.seq,
      });
      mark.append(node("title", {}, clock(e.at, true) + " " + e.kind + " " + e.action + ": " + e.summary));
      svg.append(mark);
    }
  }

  window.NotebookOSCharts = { timeSeries, stackedBars, timeline, niceTicks, PALETTE };
})();

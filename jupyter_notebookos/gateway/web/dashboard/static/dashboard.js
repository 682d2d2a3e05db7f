// The NotebookOS operator dashboard: polls the gateway's JSON API and draws it. No build step, no library.
// Every number shown comes from /api/notebookos/cluster (its "totals" block holds the sums),
// /api/notebookos/events or /api/notebookos/history; this script only lays them out (charts: charts.js).
// The admin's actions (move a replica, drain a host, delete a kernel) ask for confirmation in a dialog, then call
// the API and show its answer.
"use strict";

(function () {
  const script = document.currentScript;
  const BASE = (script && script.dataset.baseUrl) || "/";
  const params = new URLSearchParams(window.location.search);
  const INTERVAL_MS = Math.max(500, Number(params.get("interval") || 2000));
  const TIMELINE_SPAN_S = 30 * 60;
  const Charts = window.NotebookOSCharts;
  const LANES = [
    { kind: "migration", label: "migrations", color: "#6f5bd6" },
    { kind: "scaling", label: "scaling", color: "#e07a1f" },
    { kind: "host", label: "hosts", color: "#3fa34d" },
  ];

  // The admin token: from ?token= on first load (then out of the address bar and history), kept for this tab.
  if (params.has("token")) {
    sessionStorage.setItem("notebookos-token", params.get("token"));
    params.delete("token");
    const query = params.toString();
    history.replaceState(null, "", window.location.pathname + (query ? "?" + query : ""));
  }
  const token = sessionStorage.getItem("notebookos-token");

  let lastEvent = 0;
  const events = [];
  const samples = [];
  let historyInfo = { interval: 15, capacity: 1440, gpu_hours_per_user_per_day: [] };
  let historyFetchedAt = 0;
  let cluster = null;

  async function call(method, path, body) {
    const headers = token ? { Authorization: "token " + token } : {};
    const init = { method: method, headers: headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(BASE + path, init);
    if (!response.ok) {
      let message = "";
      try {
        message = (await response.json()).message || "";
      } catch (_) {
        /* not JSON */
      }
      throw new Error("HTTP " + response.status + (message ? ": " + message : ""));
    }
    return response.status === 204 ? {} : response.json();
  }

  const getJson = (path) => call("GET", path);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function shortId(id) {
    return id ? id.slice(0, 8) : "(another user's)";
  }

  function bytes(value) {
    if (value === null || value === undefined) return "unknown";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = value;
    let unit = 0;
    while (v >= 1024 && unit < units.length - 1) {
      v /= 1024;
      unit += 1;
    }
    return (v >= 100 || unit === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[unit];
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.floor(seconds);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  // -- the admin's actions --------------------------------------------------------------------------------

  // Ask before acting: resolves to null (cancelled) or {choice} (the select's value, "" when none is shown).
  function confirmAction(title, text, choices) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    const select = document.getElementById("confirm-select");
    document.getElementById("confirm-choice").hidden = !choices;
    select.replaceChildren(...(choices || []).map((c) => el("option", { value: c.value }, c.label)));
    return new Promise((resolve) => {
      const ok = document.getElementById("confirm-ok");
      const cancel = document.getElementById("confirm-cancel");
      const done = (answer) => {
        ok.onclick = cancel.onclick = dialog.oncancel = null;
        dialog.close();
        resolve(answer);
      };
      ok.onclick = () => done({ choice: choices ? select.value : "" });
      cancel.onclick = () => done(null);
      dialog.oncancel = () => done(null);
      dialog.showModal();
    });
  }

  function tell(text, failed) {
    const result = document.getElementById("action-result");
    result.textContent = text;
    result.classList.toggle("error", Boolean(failed));
    result.hidden = false;
  }

  async function act(what, run) {
    tell(what + "…");
    try {
      tell(await run());
    } catch (err) {
      tell(what + " failed: " + err.message, true);
    }
    refresh();
  }

  async function moveReplica(kernel, replica) {
    const hosts = (cluster ? cluster.hosts : []).filter((h) => h.name !== replica.host && !h.draining && !h.cordoned);
    const choices = [{ value: "", label: "the host the scheduler picks" }].concat(
      hosts.map((h) => ({ value: h.name, label: h.name + " (ratio " + Number(h.subscription_ratio).toFixed(2) + ")" })),
    );
    const answer = await confirmAction(
      "Move replica " + replica.replica_id + " of kernel " + shortId(kernel.kernel_id) + "?",
      "A new replica starts on the target, catches up with the state, and replica " + replica.replica_id +
        " on " + replica.host + " is retired. The kernel keeps serving meanwhile.",
      choices,
    );
    if (!answer) return;
    const path = "api/notebookos/kernels/" + kernel.kernel_id + "/replicas/" + replica.replica_id + "/migrate";
    await act("moving replica " + replica.replica_id, async () => {
      const r = await call("POST", path, answer.choice ? { host: answer.choice } : {});
      return "moved replica " + r.previous_replica_id + " of " + shortId(r.kernel_id) + ": " + r.from + " → " + r.to +
        " in " + r.seconds.toFixed(1) + " s (now replica " + r.replica_id + ")";
    });
  }

  async function drainHost(host) {
    const answer = await confirmAction(
      "Drain " + host.name + "?",
      "Its " + host.replicas + " replica(s) move to other hosts now. A replica running a cell stays until you " +
        "drain again. The host takes no new replica and runs no new cell until you put it back in service.",
    );
    if (!answer) return;
    await act("draining " + host.name, async () => (await call("POST", "api/notebookos/hosts/" + host.name + "/drain")).summary);
  }

  async function undrainHost(host) {
    const answer = await confirmAction("Put " + host.name + " back in service?", "New replicas and cells may land on it again.");
    if (!answer) return;
    await act("putting " + host.name + " back", async () => (await call("POST", "api/notebookos/hosts/" + host.name + "/undrain")).summary);
  }

  async function deleteKernel(kernel) {
    const answer = await confirmAction(
      "Delete kernel " + shortId(kernel.kernel_id) + "?",
      "Its replicas stop and its state (every variable) is gone. " +
        (kernel.notebook ? "The notebook " + kernel.notebook + " " : "Its notebook ") +
        "sees its kernel die" + (kernel.owner ? "; tell " + kernel.owner + " first." : "."),
    );
    if (!answer) return;
    await act("deleting kernel " + shortId(kernel.kernel_id), async () => {
      await call("DELETE", "api/kernels/" + kernel.kernel_id);
      return "deleted kernel " + kernel.kernel_id;
    });
  }

  // -- tables ---------------------------------------------------------------------------------------------

  function renderTotals() {
    const totals = Object.assign({ subscription_limit: cluster.subscription_ratio }, cluster.totals);
    for (const node of document.querySelectorAll("[data-total]")) {
      const value = totals[node.dataset.total];
      node.textContent = node.dataset.total.startsWith("subscription_") ? Number(value).toFixed(2) : String(value);
    }
  }

  function gpuUse(host) {
    const readings = host.gpu_readings;
    if (!readings) return el("td", { class: "muted", title: host.simulated ? "simulated GPUs: nothing to read" : "no NVML readings" }, "–");
    return el(
      "td",
      { class: "num" },
      readings.map((g) => g.utilization_percent + "% · " + bytes(g.memory_used_bytes) + " / " + bytes(g.memory_total_bytes)).join(", "),
    );
  }

  function renderHosts() {
    const most = Math.max(1, ...cluster.hosts.map((h) => Math.max(h.gpus, h.gpus_pending)));
    fill(
      document.querySelector("#hosts tbody"),
      cluster.hosts.map((h) => {
        const squares = el("td", { class: "gpus" });
        for (let i = 0; i < h.gpus; i++) {
          const state = i < h.gpus_committed ? "committed" : "idle";
          squares.append(el("span", { class: "gpu " + state, title: h.name + " GPU " + i + ": " + state, "data-state": state }));
        }
        const tags = el("td", {});
        if (h.simulated) tags.append(el("span", { class: "tag", title: "a host simulated on this machine: its GPUs are simulated, its memory and CPUs are this machine's" }, "simulated"));
        if (h.draining) tags.append(el("span", { class: "tag warn" }, "draining"));
        if (h.cordoned) tags.append(el("span", { class: "tag" }, "cordoned"));
        const bar = el("span", { class: "bar", title: h.gpus_pending + " GPUs pending" });
        bar.style.width = Math.round((120 * h.gpus_pending) / most) + "px";
        const problems = h.problems || [];
        const health = el("td", { class: "health " + (problems.length ? "attention" : "ok"), title: problems.join("; ") || "no problem seen" }, problems.length ? "⚠ " + problems.join("; ") : "ok");
        const action = h.draining
          ? el("button", { type: "button", class: "undrain", onclick: () => undrainHost(h) }, "Back in service")
          : el("button", { type: "button", class: "drain", onclick: () => drainHost(h) }, "Drain");
        return el(
          "tr",
          {
            "data-host": h.name,
            "data-gpus": h.gpus,
            "data-committed": h.gpus_committed,
            "data-idle": h.gpus_idle,
            "data-pending": h.gpus_pending,
            "data-health": h.health || "",
          },
          el("td", {}, h.name),
          squares,
          el("td", { class: "num" }, bar, " ", el("span", { class: "pending-count" }, h.gpus_pending)),
          el("td", { class: "num" }, Number(h.subscription_ratio).toFixed(2)),
          el("td", { class: "num" }, h.replicas),
          el("td", { class: "num memory", title: h.shares_machine_memory ? "its replicas' memory; this machine's is shared by every simulated host" : "" }, bytes(h.memory_bytes)),
          gpuUse(h),
          health,
          tags,
          el("td", {}, action),
        );
      }),
    );
    const shared = cluster.hosts.find((h) => h.shares_machine_memory);
    document.getElementById("machine-note").textContent = shared
      ? "Simulated hosts share this machine: " + bytes(shared.machine_memory_available_bytes) + " of " +
        bytes(shared.machine_memory_total_bytes) + " memory available" +
        (cluster.readings_at ? " (read " + new Date(cluster.readings_at * 1000).toLocaleTimeString() + ")." : ".")
      : "";
  }

  function renderQueue() {
    fill(
      document.querySelector("#queue tbody"),
      cluster.queue.map((q) =>
        el(
          "tr",
          { "data-kernel": q.kernel_id || "" },
          el("td", { class: "num" }, q.position),
          el("td", {}, el("code", {}, shortId(q.kernel_id))),
          el("td", { class: "num" }, q.gpus),
          el("td", { class: "num" }, (q.waiting_ms / 1000).toFixed(1) + " s"),
        ),
      ),
    );
    document.getElementById("queue-empty").hidden = cluster.queue.length > 0;
  }

  function renderUsers() {
    fill(
      document.querySelector("#users tbody"),
      cluster.totals.kernels_per_user.map((u) =>
        el(
          "tr",
          { "data-user": u.user, "data-kernels": u.kernels },
          el("td", {}, u.user),
          el("td", { class: "num" }, u.kernels),
          el("td", { class: "num" }, u.running),
          el("td", { class: "num" }, u.gpus),
        ),
      ),
    );
  }

  function notebook(k) {
    if (k.notebook) return el("td", { class: "notebook", title: k.notebook }, k.notebook.split("/").pop());
    if (k.working_dir) return el("td", { class: "notebook muted", title: "the client sent only the notebook's directory" }, "in " + k.working_dir);
    return el("td", { class: "notebook muted", title: "the client did not say (a Jupyter server sends it with GatewayClient.allowed_envs=JPY_SESSION_NAME)" }, "–");
  }

  function renderKernels() {
    fill(
      document.querySelector("#kernels tbody"),
      cluster.kernels.map((k) => {
        const replicas = el("td", { class: "replicas" });
        for (const r of k.replicas) {
          const label = r.replica_id + "@" + r.host + (r.state === "ready" ? "" : " (" + r.state + ")");
          const title = "replica " + r.replica_id + " on " + r.host + ": " + bytes(r.memory_bytes) + " — click to move it";
          replicas.append(el("button", { type: "button", class: "replica", title: title, "data-replica": r.replica_id, onclick: () => moveReplica(k, r) }, label));
        }
        const used = k.gpu_seconds_total !== undefined ? k.gpu_seconds_total : k.gpu_seconds_used || 0;
        return el(
          "tr",
          { "data-kernel": k.kernel_id || "", "data-residency": k.residency || "", "data-memory": k.memory_bytes === null ? "" : String(k.memory_bytes) },
          el("td", {}, el("code", { title: k.kernel_id || "" }, shortId(k.kernel_id))),
          notebook(k),
          el("td", {}, k.owner || "(admin)"),
          el("td", {}, k.state),
          el("td", { class: "num idle-time" }, duration(k.idle_seconds)),
          el("td", { class: "residency", title: "hibernation is not built yet: every kernel is resident" }, k.residency || "resident"),
          el("td", {}, k.executor || "–"),
          replicas,
          el("td", { class: "num memory" }, bytes(k.memory_bytes)),
          el("td", { class: "num" }, k.gpus),
          el("td", { class: "num" }, Number(used).toFixed(1) + " / " + (k.gpu_seconds_held_if_reserved || 0).toFixed(0)),
          el("td", {}, el("button", { type: "button", class: "delete danger", onclick: () => deleteKernel(k) }, "Delete")),
        );
      }),
    );
  }

  // -- charts ---------------------------------------------------------------------------------------------

  function renderTimeline() {
    document.getElementById("timeline").replaceChildren(
      ...events
        .slice()
        .reverse()
        .map((e) =>
          el(
            "li",
            { "data-seq": e.seq, "data-kind": e.kind, class: e.action === "failed" ? "failed" : "" },
            new Date(e.at * 1000).toLocaleTimeString() + " ",
            el("span", { class: "kind" }, e.kind + " " + e.action),
            " " + e.summary,
          ),
        ),
    );
    document.getElementById("timeline-empty").hidden = events.length > 0;
    Charts.timeline(document.getElementById("timeline-chart"), {
      events: events,
      lanes: LANES,
      span: TIMELINE_SPAN_S,
      now: Date.now() / 1000,
      title: "migrations, scaling and hosts of the last 30 minutes",
      x_label: "time (last 30 minutes)",
    });
    const legend = document.getElementById("legend-timeline");
    const swatch = (color) => {
      const dot = el("span", { class: "swatch dot" });
      dot.style.background = color; // CSSOM: allowed by the page's style-src 'self'
      return dot;
    };
    legend.replaceChildren(
      ...LANES.map((l) => el("span", { class: "legend-item" }, swatch(l.color), " " + l.label)),
      el("span", { class: "legend-item" }, swatch("#b3261e"), " failed"),
    );
  }

  function renderHistory() {
    const hours = (historyInfo.capacity * historyInfo.interval) / 3600;
    document.getElementById("history-span").textContent =
      "(a sample every " + historyInfo.interval + " s, the last " + (hours >= 1 ? hours.toFixed(0) + " h" : (hours * 60).toFixed(0) + " min") + " kept by the gateway)";
    Charts.timeSeries(document.getElementById("chart-gpus"), {
      name: "gpus",
      title: "GPUs committed to running cells, and all GPUs, over time",
      points: samples,
      unit: "GPUs",
      min_top: 1,
      legend: document.getElementById("legend-gpus"),
      series: [
        { key: "committed", label: "committed", color: "#e07a1f", value: (p) => p.gpus_committed },
        { key: "gpus", label: "all GPUs", color: "#888", dashed: true, value: (p) => p.gpus },
      ],
    });
    Charts.timeSeries(document.getElementById("chart-queue"), {
      name: "queue",
      title: "cells waiting for GPUs over time",
      points: samples,
      unit: "cells",
      min_top: 1,
      legend: document.getElementById("legend-queue"),
      series: [{ key: "queued", label: "cells waiting", color: "#6f5bd6", value: (p) => p.queued_cells }],
    });
    Charts.timeSeries(document.getElementById("chart-wait"), {
      name: "wait",
      title: "queue-wait percentiles of the cells that started, over time",
      points: samples,
      unit: "seconds",
      min_top: 0.01,
      legend: document.getElementById("legend-wait"),
      series: [
        { key: "p50", label: "p50", color: "#3fa34d", dots: true, value: (p) => p.queue_wait_seconds.p50 },
        { key: "p95", label: "p95", color: "#e07a1f", dots: true, value: (p) => p.queue_wait_seconds.p95 },
        { key: "p99", label: "p99", color: "#b3261e", dots: true, value: (p) => p.queue_wait_seconds.p99 },
      ],
    });
    Charts.stackedBars(document.getElementById("chart-usage"), {
      name: "usage",
      title: "GPU-hours per user per day",
      rows: historyInfo.gpu_hours_per_user_per_day.map((r) => ({ category: r.day, key: r.user, value: r.gpu_hours })),
      unit: "GPU-hours",
      x_label: "day (UTC)",
      empty: "no GPU time used yet",
      tick: (day) => day.slice(5),
      legend: document.getElementById("legend-usage"),
    });
  }

  async function refreshHistory() {
    if (Date.now() - historyFetchedAt < Math.max(INTERVAL_MS, historyInfo.interval * 1000)) return;
    const since = samples.length ? samples[samples.length - 1].at : 0;
    const fresh = await getJson("api/notebookos/history?since=" + since);
    historyFetchedAt = Date.now();
    historyInfo = fresh;
    samples.push(...fresh.samples);
    samples.splice(0, Math.max(0, samples.length - fresh.capacity));
    renderHistory();
  }

  let refreshing = false;

  async function refresh() {
    if (refreshing) return; // an action's refresh and the poll's must not add the same events twice
    refreshing = true;
    const status = document.getElementById("status");
    try {
      const [fresh, news0] = await Promise.all([
        getJson("api/notebookos/cluster"),
        getJson("api/notebookos/events?since=" + lastEvent),
      ]);
      let news = news0;
      if (news.last < lastEvent) {
        // The gateway restarted and numbers its events from 1 again: start the timeline over.
        events.length = 0;
        news = await getJson("api/notebookos/events?since=0");
      }
      cluster = fresh;
      renderTotals();
      renderHosts();
      renderQueue();
      renderUsers();
      renderKernels();
      events.push(...news.events);
      events.splice(0, Math.max(0, events.length - 500));
      lastEvent = news.last;
      renderTimeline();
      await refreshHistory();
      status.textContent = "updated " + new Date().toLocaleTimeString() + " (every " + INTERVAL_MS / 1000 + " s)";
      status.classList.remove("error");
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    } catch (err) {
      status.textContent = "cannot read the cluster: " + err.message;
      status.classList.add("error");
    } finally {
      refreshing = false;
    }
  }

  async function loop() {
    await refresh();
    setTimeout(loop, INTERVAL_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", loop);
  else loop();
})();

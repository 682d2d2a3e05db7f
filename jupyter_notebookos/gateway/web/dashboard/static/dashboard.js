// The NotebookOS operator dashboard: polls the gateway's JSON API and draws it. No build step, no library.
// Every number shown comes from /api/notebookos/cluster (its "totals" block holds the sums) or
// /api/notebookos/events; this script only lays them out.
"use strict";

(function () {
  const script = document.currentScript;
  const BASE = (script && script.dataset.baseUrl) || "/";
  const params = new URLSearchParams(window.location.search);
  const INTERVAL_MS = Math.max(500, Number(params.get("interval") || 2000));
  const TIMELINE_SPAN_S = 30 * 60;

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

  async function getJson(path) {
    const headers = token ? { Authorization: "token " + token } : {};
    const response = await fetch(BASE + path, { headers: headers, cache: "no-store" });
    if (!response.ok) {
      let message = "";
      try {
        message = (await response.json()).message || "";
      } catch (_) {
        /* not JSON */
      }
      throw new Error("HTTP " + response.status + (message ? ": " + message : ""));
    }
    return response.json();
  }

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

  function renderTotals(cluster) {
    const totals = Object.assign({ subscription_limit: cluster.subscription_ratio }, cluster.totals);
    for (const node of document.querySelectorAll("[data-total]")) {
      const value = totals[node.dataset.total];
      node.textContent = node.dataset.total.startsWith("subscription_") ? Number(value).toFixed(2) : String(value);
    }
  }

  function renderHosts(cluster) {
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
        if (h.simulated) tags.append(el("span", { class: "tag" }, "simulated"));
        if (h.draining) tags.append(el("span", { class: "tag" }, "draining"));
        if (h.cordoned) tags.append(el("span", { class: "tag" }, "cordoned"));
        const bar = el("span", { class: "bar", title: h.gpus_pending + " GPUs pending" });
        bar.style.width = Math.round((120 * h.gpus_pending) / most) + "px";
        return el(
          "tr",
          {
            "data-host": h.name,
            "data-gpus": h.gpus,
            "data-committed": h.gpus_committed,
            "data-idle": h.gpus_idle,
            "data-pending": h.gpus_pending,
          },
          el("td", {}, h.name),
          squares,
          el("td", { class: "num" }, bar, " ", el("span", { class: "pending-count" }, h.gpus_pending)),
          el("td", { class: "num" }, Number(h.subscription_ratio).toFixed(2)),
          el("td", { class: "num" }, h.replicas),
          tags,
        );
      }),
    );
  }

  function renderQueue(cluster) {
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

  function renderUsers(cluster) {
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

  function renderKernels(cluster) {
    fill(
      document.querySelector("#kernels tbody"),
      cluster.kernels.map((k) =>
        el(
          "tr",
          { "data-kernel": k.kernel_id || "" },
          el("td", {}, el("code", { title: k.kernel_id || "" }, shortId(k.kernel_id))),
          el("td", {}, k.owner || "(admin)"),
          el("td", {}, k.state),
          el("td", {}, k.executor || "–"),
          el("td", {}, k.replicas.map((r) => (r.replica_id ? r.replica_id + "@" : "") + r.host + (r.state === "ready" ? "" : " (" + r.state + ")")).join(", ")),
          el("td", { class: "num" }, k.gpus),
          el("td", { class: "num" }, (k.gpu_seconds_used || 0).toFixed(1) + " / " + (k.gpu_seconds_held_if_reserved || 0).toFixed(0)),
        ),
      ),
    );
  }

  function renderTimeline() {
    const list = document.getElementById("timeline");
    list.replaceChildren(
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
    // The strip: one mark per event of the last 30 minutes, newest on the right.
    const strip = document.getElementById("timeline-strip");
    const now = Date.now() / 1000;
    const colors = { migration: "#6f5bd6", scaling: "#e07a1f", host: "#3fa34d" };
    strip.replaceChildren(
      ...events
        .filter((e) => now - e.at <= TIMELINE_SPAN_S)
        .map((e) => {
          const mark = document.createElementNS("http://www.w3.org/2000/svg", "rect");
          mark.setAttribute("x", String(1000 - ((now - e.at) / TIMELINE_SPAN_S) * 1000 - 2));
          mark.setAttribute("y", e.kind === "migration" ? "4" : e.kind === "scaling" ? "16" : "28");
          mark.setAttribute("width", "4");
          mark.setAttribute("height", "8");
          mark.setAttribute("fill", e.action === "failed" ? "#b3261e" : colors[e.kind] || "#444");
          const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
          title.textContent = e.summary;
          mark.append(title);
          return mark;
        }),
    );
  }

  async function refresh() {
    const status = document.getElementById("status");
    try {
      const [cluster, fresh] = await Promise.all([
        getJson("api/notebookos/cluster"),
        getJson("api/notebookos/events?since=" + lastEvent),
      ]);
      let news = fresh;
      if (news.last < lastEvent) {
        // The gateway restarted and numbers its events from 1 again: start the timeline over.
        events.length = 0;
        news = await getJson("api/notebookos/events?since=0");
      }
      renderTotals(cluster);
      renderHosts(cluster);
      renderQueue(cluster);
      renderUsers(cluster);
      renderKernels(cluster);
      events.push(...news.events);
      events.splice(0, Math.max(0, events.length - 500));
      lastEvent = news.last;
      renderTimeline();
      status.textContent = "updated " + new Date().toLocaleTimeString() + " (every " + INTERVAL_MS / 1000 + " s)";
      status.classList.remove("error");
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    } catch (err) {
      status.textContent = "cannot read the cluster: " + err.message;
      status.classList.add("error");
    }
  }

  async function loop() {
    await refresh();
    setTimeout(loop, INTERVAL_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", loop);
  else loop();
})();

// lakebroker dashboard: polls GET /v1/dashboard every second and updates the page in place.
// No framework and no build: a keyed `sync` over each list, and text set only when it changed.
// Data is only ever set as text (never as HTML): error messages come from remote endpoints.
"use strict";

(() => {
  const POLL_MS = 1000;
  const HIDDEN_POLL_MS = 5000;
  const SPARK_POINTS = 60;
  const TOKEN_KEY = "lakebroker.token";
  const JOBS = [["compaction", "Compaction"], ["retention", "Retention"], ["replication", "Replication"]];

  // ---- token: from ?token= once, then sessionStorage (this tab only) -------------------------
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  const authHeaders = () => {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: "Bearer " + token } : {};
  };

  // ---- small DOM helpers ---------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) el.append(c);
    return el;
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return el;
  }

  function setText(el, value) {
    const text = value === null || value === undefined ? "–" : String(value);
    if (el.textContent !== text) el.textContent = text;
  }

  function setAttr(el, name, value) {
    const v = String(value);
    if (el.getAttribute(name) !== v) el.setAttribute(name, v);
  }

  function setClass(el, base, variant) {
    const cls = variant ? `${base} ${variant}` : base;
    if (el.className !== cls) el.className = cls;
  }

  // Keyed list update: reuse the element of each key, create new ones, drop the gone ones, keep order.
  function sync(container, items, keyOf, create, update, before = null) {
    const existing = new Map();
    for (const el of Array.from(container.children)) if (el.dataset.key !== undefined) existing.set(el.dataset.key, el);
    let cursor = before;
    for (let i = items.length - 1; i >= 0; i--) {
      const key = String(keyOf(items[i]));
      let el = existing.get(key);
      if (el) existing.delete(key);
      else {
        el = create(items[i]);
        el.dataset.key = key;
      }
      update(el, items[i]);
      if (el.nextSibling !== cursor || el.parentNode !== container) container.insertBefore(el, cursor);
      cursor = el;
    }
    for (const el of existing.values()) el.remove();
  }

  // ---- formatting ------------------------------------------------------------------------
  const nf = new Intl.NumberFormat("en-US");
  const n = (x) => (x === null || x === undefined ? "–" : nf.format(x));

  function bytes(x) {
    if (x === null || x === undefined) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let v = x;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)) + " " + units[i];
  }

  function rate(x) {
    if (x === null || x === undefined) return "–";
    if (x === 0) return "0 msg/s";
    return (x >= 100 ? nf.format(Math.round(x)) : x.toFixed(x >= 10 ? 1 : 2)) + " msg/s";
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
    return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
  }

  function ago(iso) {
    if (!iso) return "–";
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }

  const STATE_LABEL = { healthy: "healthy", backing_off: "backing off", circuit_open: "circuit open",
                        disabled: "disabled", paused: "paused", idle: "idle", ok: "ok", failed: "failed",
                        skipped: "skipped" };
  const label = (state) => STATE_LABEL[state] || state;

  // ---- produce-rate sparklines (history kept here, one point per poll) -------------------
  const rateHistory = new Map();

  function sparkline() {
    const el = svg("svg", { class: "spark", viewBox: `0 0 ${SPARK_POINTS - 1} 22`, preserveAspectRatio: "none",
                            "aria-hidden": "true" });
    el.append(svg("polygon", { points: "" }), svg("polyline", { points: "" }));
    return el;
  }

  function drawSpark(el, points) {
    const max = Math.max(1, ...points);
    const offset = SPARK_POINTS - points.length;
    const xy = points.map((v, i) => `${offset + i},${(21 - (v / max) * 19).toFixed(1)}`);
    el.querySelector("polyline").setAttribute("points", xy.join(" "));
    el.querySelector("polygon").setAttribute("points", xy.length
      ? `${offset},22 ${xy.join(" ")} ${SPARK_POINTS - 1},22` : "");
  }

  // ---- a subscription's last 15 minutes (sampled by the server every 15 s) ----------------
  const HISTORY_POINTS = 60;

  function historyChart(id, key, title) {
    const chart = svg("svg", { class: "history", viewBox: `0 0 ${HISTORY_POINTS - 1} 30`,
                               preserveAspectRatio: "none", role: "img", "aria-label": `${title}, last 15 minutes` });
    chart.append(svg("polygon", { points: "" }), svg("polyline", { points: "" }));
    return h("figure", { class: `chart ${key}`, "data-ref": `chart-${key}`, "data-testid": `${id}-chart-${key}` },
      h("figcaption", {}, h("span", { text: title }),
        h("strong", { "data-ref": "now", "data-testid": `${id}-chart-${key}-now` })), chart);
  }

  function drawHistory(figure, values, format) {
    const max = Math.max(1, ...values);
    const offset = HISTORY_POINTS - Math.min(values.length, HISTORY_POINTS);
    const xy = values.slice(-HISTORY_POINTS).map((v, i) => `${offset + i},${(29 - (v / max) * 27).toFixed(1)}`);
    const chart = figure.querySelector("svg");
    chart.querySelector("polyline").setAttribute("points", xy.join(" "));
    chart.querySelector("polygon").setAttribute("points", xy.length
      ? `${offset},30 ${xy.join(" ")} ${HISTORY_POINTS - 1},30` : "");
    setAttr(figure, "data-points", values.length);
    setAttr(figure, "data-max", values.length ? Math.max(...values) : 0);
    setText(ref(figure, "now"), values.length ? format(values[values.length - 1]) : "–");
  }

  // ---- topics ----------------------------------------------------------------------------
  const collapsed = new Set();

  function createTopic(t) {
    const id = `topic-${t.name}`;
    const caret = h("span", { class: "caret", text: "▾" });
    const row = h("tr", { class: "topic" },
      h("td", {}, h("span", { class: "name" }, caret, h("span", { text: t.name }),
        h("span", { class: "meta", "data-ref": "count" }),
        h("span", { class: "pill failed", "data-ref": "unavailable", "data-testid": `${id}-unavailable`,
                    text: "unavailable", hidden: true }))),
      h("td", { class: "num", "data-ref": "start", title: "sum over partitions" }),
      h("td", { class: "num", "data-ref": "end", "data-testid": `${id}-log-end`, title: "sum over partitions" }),
      h("td", { class: "num", "data-ref": "committed", title: "sum over partitions" }),
      h("td", { class: "num", "data-ref": "size", "data-testid": `${id}-size` }),
      h("td", { class: "num", "data-ref": "files", "data-testid": `${id}-files` }),
      h("td", { class: "num" }, h("span", { class: "rate" }, sparkline(),
        h("span", { "data-ref": "rate", "data-testid": `${id}-rate` }))));
    const body = h("tbody", { "data-testid": id }, row);
    if (t.partitions.length > 12) collapsed.add(t.name);
    row.addEventListener("click", () => {
      if (collapsed.has(t.name)) collapsed.delete(t.name); else collapsed.add(t.name);
      body.classList.toggle("collapsed", collapsed.has(t.name));
    });
    body.classList.toggle("collapsed", collapsed.has(t.name));
    return body;
  }

  function createPartition(topic, p) {
    const id = `partition-${topic}-${p.partition}`;
    return h("tr", { class: "part", "data-testid": id },
      h("td", { text: `partition ${p.partition}` }),
      h("td", { class: "num", "data-ref": "start" }),
      h("td", { class: "num", "data-ref": "end", "data-testid": `${id}-log-end` }),
      h("td", { class: "num", "data-ref": "committed" }),
      h("td", { class: "num", "data-ref": "size" }),
      h("td", { class: "num", "data-ref": "files" }),
      h("td", { class: "num" }));
  }

  const ref = (el, name) => el.querySelector(`[data-ref="${name}"]`);

  function updatePartition(row, p) {
    const before = ref(row, "end").textContent;
    setText(ref(row, "start"), n(p.log_start_offset));
    setText(ref(row, "end"), n(p.log_end_offset));
    setText(ref(row, "committed"), n(p.high_watermark));
    setText(ref(row, "size"), bytes(p.size_bytes));
    setText(ref(row, "files"), n(p.files));
    if (before !== "" && before !== ref(row, "end").textContent) flash(row);
  }

  function flash(row) {
    row.classList.remove("flash");
    void row.offsetWidth; // restart the animation
    row.classList.add("flash");
  }

  function updateTopic(body, t) {
    const row = body.firstElementChild;
    const sum = (k) => t.partitions.reduce((a, p) => a + p[k], 0);
    setText(ref(row, "count"), `${t.partitions.length} partition${t.partitions.length === 1 ? "" : "s"}`);
    setText(ref(row, "start"), n(sum("log_start_offset")));
    setText(ref(row, "end"), n(t.log_end_offset));
    setText(ref(row, "committed"), n(sum("high_watermark")));
    setText(ref(row, "size"), bytes(t.size_bytes));
    setText(ref(row, "files"), n(t.files));
    setText(ref(row, "rate"), rate(t.produce_rate));
    const unavailable = ref(row, "unavailable");
    unavailable.hidden = !t.unavailable;
    unavailable.title = t.unavailable || "";
    const points = rateHistory.get(t.name) || [];
    if (t.produce_rate !== null) points.push(t.produce_rate);
    while (points.length > SPARK_POINTS) points.shift();
    rateHistory.set(t.name, points);
    drawSpark(row.querySelector(".spark"), points);
    sync(body, t.partitions, (p) => p.partition, (p) => createPartition(t.name, p), updatePartition);
  }

  function renderTopics(topics) {
    const table = $("topics");
    table.querySelector(".empty-body").hidden = topics.length > 0;
    for (const name of rateHistory.keys()) if (!topics.some((t) => t.name === name)) rateHistory.delete(name);
    sync(table, topics, (t) => t.name, createTopic, updateTopic, table.querySelector(".empty-body"));
  }

  // ---- subscriptions -----------------------------------------------------------------------
  function createSub(s) {
    const id = `sub-${s.name}`;
    const count = (key, title, cls) => h("div", { class: cls },
      h("dt", { text: title }), h("dd", { "data-ref": key, "data-testid": `${id}-${key}` }));
    const table = h("table", { class: "grid compact" },
      h("thead", {}, h("tr", {},
        h("th", { text: "Partition" }), h("th", { class: "num", text: "Committed" }),
        h("th", { class: "num", text: "Log end" }), h("th", { class: "num", text: "Lag" }),
        h("th", { class: "num", text: "In flight" }), h("th", { text: "State" }))),
      h("tbody", { "data-ref": "parts" }));
    return h("article", { class: "sub", "data-testid": id },
      h("div", { class: "sub-head" },
        h("span", { class: "sub-name", text: s.name }),
        h("span", { class: "sub-topic", text: `→ ${s.topic}` }),
        h("span", { class: "pill", "data-ref": "state", "data-testid": `${id}-state` })),
      h("div", { class: "sub-url mono", "data-ref": "url" }),
      h("div", { class: "sub-filter mono", "data-ref": "filter", "data-testid": `${id}-filter` }),
      h("div", { class: "progress", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
                 "aria-label": `${s.name}: delivered of produced`, "data-ref": "progress",
                 "data-testid": `${id}-progress` },
        h("span", { class: "delivered", "data-ref": "bar-delivered" }),
        h("span", { class: "dead", "data-ref": "bar-dead" })),
      h("div", { class: "progress-label" },
        h("span", { "data-ref": "progress-text" }), h("strong", { "data-ref": "percent" })),
      h("dl", { class: "counts" },
        count("delivered", "Delivered"), count("pending", "Pending"), count("dead", "Dead-lettered"),
        count("in-flight", "In flight")),
      h("div", { class: "charts" }, historyChart(id, "delivered", "Delivered / s"),
        historyChart(id, "dead", "Dead-lettered / s"), historyChart(id, "lag", "Lag")),
      replayAllButton(s.name),
      h("ul", { class: "replays", "data-ref": "replays", "data-testid": `${id}-replays` }),
      h("p", { class: "last-error", "data-ref": "error-line" },
        h("span", { class: "label", text: "Last error" }),
        h("span", { class: "error-text", "data-ref": "error", "data-testid": `${id}-error` })),
      table);
  }

  // Every dead letter of a subscription not yet replayed, after the operator confirms the count.
  function replayAllButton(name) {
    const button = h("button", { type: "button", class: "replay-all", "data-ref": "replay-all",
                                 "data-testid": `sub-${name}-replay-all` });
    button.addEventListener("click", async () => {
      const count = Number(button.dataset.count || 0);
      if (!window.confirm(`Replay all ${n(count)} dead letters of ${name}? Each is delivered again.`)) return;
      button.disabled = true;
      try {
        const r = await fetch(`/v1/subscriptions/${encodeURIComponent(name)}/dead-letters/replay`, {
          method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() }, body: "{}",
        });
        if (!r.ok) throw new Error(await errorOf(r));
        pollSoon();
      } catch (e) {
        button.disabled = false;
        showError(`Replay of ${name}'s dead letters failed: ${e.message}`, 8000);
      }
    });
    return button;
  }

  // A replay by predicate (POST /v1/subscriptions/{name}/replays): its progress, and a cancel while it runs.
  function createReplay(sub, r) {
    const id = `replay-${r.id}`;
    const cancel = h("button", { type: "button", class: "cancel-replay", "data-ref": "cancel",
                                 "data-testid": `${id}-cancel`, text: "Cancel" });
    cancel.addEventListener("click", async () => {
      if (!window.confirm(`Cancel replay ${r.id} of ${sub}?`)) return;
      cancel.disabled = true;
      try {
        const url = `/v1/subscriptions/${encodeURIComponent(sub)}/replays/${encodeURIComponent(r.id)}`;
        const answer = await fetch(url, { method: "DELETE", headers: authHeaders() });
        if (!answer.ok) throw new Error(await errorOf(answer));
        pollSoon();
      } catch (e) {
        cancel.disabled = false;
        showError(`Cancelling replay ${r.id} failed: ${e.message}`, 8000);
      }
    });
    return h("li", { "data-testid": id },
      h("span", { class: "pill", "data-ref": "state", "data-testid": `${id}-state` }),
      h("span", { class: "mono replay-where", "data-ref": "where" }),
      h("span", { "data-ref": "progress", "data-testid": `${id}-progress` }), cancel);
  }

  function updateReplay(item, r) {
    setClass(ref(item, "state"), "pill", r.state);
    setText(ref(item, "state"), `replay ${label(r.state)}`);
    setText(ref(item, "where"), r.where || "every message");
    const scanned = r.to_scan > 0 ? Math.floor((1000 * r.scanned) / r.to_scan) / 10 : 100;
    setText(ref(item, "progress"), `${n(r.delivered)} of ${n(r.matched)} matched delivered` +
      (r.failed ? `, ${n(r.failed)} failed` : "") + `, ${scanned.toFixed(1)} % scanned` + (r.error ? ` (${r.error})` : ""));
    ref(item, "cancel").hidden = r.state !== "running";
  }

  function updateSub(card, s) {
    const pct = s.produced > 0 ? (100 * s.delivered) / s.produced : 0;
    const deadPct = s.produced > 0 ? (100 * s.dead_lettered) / s.produced : 0;
    setText(ref(card, "url"), s.url);
    const filter = ref(card, "filter");
    setText(filter, s.filter ? `filter: ${s.filter}` : "");
    filter.hidden = !s.filter;
    const replayAll = ref(card, "replay-all");
    replayAll.dataset.count = String(s.dead_lettered);
    replayAll.hidden = s.dead_lettered === 0;
    if (s.dead_lettered === 0) replayAll.disabled = false;
    setText(replayAll, `Replay ${n(s.dead_lettered)} dead letter${s.dead_lettered === 1 ? "" : "s"}`);
    const history = s.history || { delivered_per_s: [], dead_lettered_per_s: [], lag: [] };
    const perSecond = (v) => (v >= 100 ? n(Math.round(v)) : v.toFixed(v >= 10 ? 1 : 2));
    drawHistory(ref(card, "chart-delivered"), history.delivered_per_s, perSecond);
    drawHistory(ref(card, "chart-dead"), history.dead_lettered_per_s, perSecond);
    drawHistory(ref(card, "chart-lag"), history.lag, n);
    sync(ref(card, "replays"), s.replays, (r) => r.id, (r) => createReplay(s.name, r), updateReplay);
    setClass(ref(card, "state"), "pill", s.endpoint_state);
    setText(ref(card, "state"), label(s.endpoint_state));
    const bar = ref(card, "progress");
    setAttr(bar, "aria-valuenow", pct.toFixed(1));
    setAttr(bar, "data-delivered", s.delivered);
    ref(card, "bar-delivered").style.width = pct.toFixed(2) + "%";
    ref(card, "bar-dead").style.width = deadPct.toFixed(2) + "%";
    setText(ref(card, "progress-text"), s.produced > 0 ? `${n(s.delivered)} of ${n(s.produced)} produced delivered`
      : "Nothing produced yet");
    setText(ref(card, "percent"), s.produced > 0 ? (Math.floor(pct * 10) / 10).toFixed(1) + " %" : "");
    setText(ref(card, "delivered"), n(s.delivered));
    setText(ref(card, "pending"), n(s.pending));
    setText(ref(card, "dead"), n(s.dead_lettered));
    ref(card, "dead").parentElement.classList.toggle("is-bad", s.dead_lettered > 0);
    setText(ref(card, "in-flight"), n(s.in_flight));
    setText(ref(card, "error"), s.last_error || "none");
    ref(card, "error").title = s.last_error || "";
    ref(card, "error-line").classList.toggle("none", !s.last_error);
    const maxLag = Math.max(1, ...s.partitions.map((p) => p.lag));
    sync(ref(card, "parts"), s.partitions, (p) => p.partition, (p) => h("tr", {},
      h("td", { text: String(p.partition) }), h("td", { class: "num", "data-ref": "committed" }),
      h("td", { class: "num", "data-ref": "end" }),
      h("td", { class: "num" }, h("span", { "data-ref": "lag", "data-testid": `sub-${s.name}-lag-${p.partition}` }),
        h("span", { class: "lagbar" }, h("span", { "data-ref": "lagbar" }))),
      h("td", { class: "num", "data-ref": "inflight" }), h("td", { class: "state", "data-ref": "state" })),
    (row, p) => {
      setText(ref(row, "committed"), n(p.committed_offset));
      setText(ref(row, "end"), n(p.high_watermark));
      setText(ref(row, "lag"), n(p.lag));
      ref(row, "lagbar").style.width = ((100 * p.lag) / maxLag).toFixed(1) + "%";
      setText(ref(row, "inflight"), n(p.in_flight));
      setText(ref(row, "state"), label(p.state));
      setClass(ref(row, "state"), "state", p.state);
      if (p.last_error) ref(row, "state").title = p.last_error;
    });
  }

  function renderSubs(subs) {
    const box = $("subscriptions");
    const empty = box.querySelector(".empty");
    if (empty) empty.hidden = subs.length > 0;
    sync(box, subs, (s) => s.name, createSub, updateSub, empty);
  }

  // ---- consumer groups -------------------------------------------------------------------
  function createGroup(g) {
    const id = `group-${g.group}-${g.topic}-${g.partition}`;
    return h("tr", { "data-testid": id },
      h("td", { text: g.group }),
      h("td", { text: `${g.topic} / ${g.partition}` }),
      h("td", { class: "num", "data-ref": "committed" }),
      h("td", { class: "num", "data-ref": "end" }),
      h("td", { class: "num", "data-ref": "lag", "data-testid": `${id}-lag` }));
  }

  function updateGroup(row, g) {
    setText(ref(row, "committed"), n(g.committed_offset));
    setText(ref(row, "end"), n(g.high_watermark));
    setText(ref(row, "lag"), n(g.lag));
  }

  function renderGroups(groups) {
    const body = $("groups").querySelector("tbody");
    const empty = body.querySelector(".empty-row");
    empty.hidden = groups.length > 0;
    sync(body, groups, (g) => `${g.group}\u0000${g.topic}\u0000${g.partition}`, createGroup, updateGroup, empty);
  }

  // ---- jobs ------------------------------------------------------------------------------
  function createJob([job, title]) {
    const fact = (name, title) => [h("dt", { text: title }),
      h("dd", { "data-ref": name, "data-testid": `job-${job}-${name}` })];
    return h("article", { class: "job", "data-testid": `job-${job}` },
      h("div", { class: "job-head" }, h("h3", { text: title }),
        h("span", { class: "pill", "data-ref": "outcome", "data-testid": `job-${job}-outcome` })),
      h("dl", { class: "job-facts", "data-ref": "facts" },
        ...fact("when", "Last run"), ...fact("duration", "Duration"), ...fact("files", "Files"),
        ...fact("bytes", "Size"), ...fact("tables", "Tables"), ...fact("error", "Error")),
      h("p", { class: "empty", "data-ref": "none", text: "No runs recorded yet." }),
      h("ul", { class: "history", "data-ref": "history" }));
  }

  function updateJob(card, runs) {
    const last = runs[0];
    ref(card, "facts").hidden = !last;
    ref(card, "none").hidden = !!last;
    setClass(ref(card, "outcome"), "pill", last ? last.outcome : "none");
    setText(ref(card, "outcome"), last ? label(last.outcome) : "never run");
    if (last) {
      setText(ref(card, "when"), `${ago(last.started_at)} · ${last.trigger}`);
      setText(ref(card, "duration"), duration(last.duration_ms));
      setText(ref(card, "files"), last.files_before === null ? "–" : `${n(last.files_before)} → ${n(last.files_after)}`);
      setText(ref(card, "bytes"), last.bytes_before === null ? "–"
        : `${bytes(last.bytes_before)} → ${bytes(last.bytes_after)}`);
      setText(ref(card, "tables"), n(last.tables));
      setText(ref(card, "error"), last.error || "none");
      ref(card, "error").className = last.error ? "error-text" : "";
    }
    ref(card, "history").hidden = runs.length < 2;
    sync(ref(card, "history"), runs.slice(1), (r) => r.run_id, () => h("li", {},
      h("span", {}, h("i", { class: "outcome-dot", "data-ref": "dot" }), h("span", { "data-ref": "when" })),
      h("span", { "data-ref": "duration" }), h("span", { "data-ref": "files" })),
    (li, r) => {
      setClass(ref(li, "dot"), "outcome-dot", r.outcome);
      setText(ref(li, "when"), ago(r.started_at));
      setText(ref(li, "duration"), duration(r.duration_ms));
      setText(ref(li, "files"), r.files_before === null ? "" : `${n(r.files_before)} → ${n(r.files_after)} files`);
    });
  }

  function renderJobs(jobs) {
    sync($("jobs"), JOBS, ([job]) => job, createJob, (card, [job]) => updateJob(card, jobs[job] || []));
  }

  // ---- dead letters ------------------------------------------------------------------------
  const replaying = new Set();
  const letterKey = (d) => `${d.subscription}-${d.partition}-${d.offset}`;

  function createLetter(d) {
    const key = letterKey(d);
    const button = h("button", { type: "button", "data-testid": `replay-${key}`, text: "Replay" });
    button.addEventListener("click", () => replay(d, button));
    return h("tr", { "data-testid": `dead-letter-${key}` },
      h("td", { text: d.subscription }), h("td", { text: d.topic }),
      h("td", { class: "num", text: String(d.partition) }), h("td", { class: "num", text: n(d.offset) }),
      h("td", { class: "num", "data-ref": "attempts" }),
      h("td", {}, h("div", { class: "error-text", "data-ref": "error" })),
      h("td", { "data-ref": "since" }),
      h("td", { class: "action" }, button));
  }

  function updateLetter(row, d) {
    setText(ref(row, "attempts"), n(d.attempts));
    const error = d.last_error || (d.last_status ? `HTTP ${d.last_status}` : "");
    setText(ref(row, "error"), error || "–");
    ref(row, "error").title = error;
    setText(ref(row, "since"), ago(d.dead_at));
    const button = row.querySelector("button");
    const busy = replaying.has(letterKey(d)) || !!d.replay_requested_at;
    button.disabled = busy;
    setText(button, busy ? "Replaying…" : "Replay");
  }

  async function replay(d, button) {
    const key = letterKey(d);
    replaying.add(key);
    button.disabled = true;
    button.textContent = "Replaying…";
    try {
      const r = await fetch(`/v1/subscriptions/${encodeURIComponent(d.subscription)}/dead-letters/replay`, {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify({ partition: d.partition, from_offset: d.offset, to_offset: d.offset }),
      });
      if (!r.ok) throw new Error(await errorOf(r));
      pollSoon();
    } catch (e) {
      replaying.delete(key);
      button.disabled = false;
      button.textContent = "Replay";
      showError(`Replay of ${d.subscription} partition ${d.partition} offset ${d.offset} failed: ${e.message}`, 8000);
    }
  }

  function renderLetters(letters, total) {
    const body = $("dead-letters").tBodies[0];
    const empty = body.querySelector(".empty-row");
    empty.hidden = letters.length > 0;
    const live = new Set(letters.map(letterKey));
    for (const key of replaying) if (!live.has(key)) replaying.delete(key);
    sync(body, letters, letterKey, createLetter, updateLetter, empty);
    const badge = $("dead-count");
    // The table shows the first rows of each subscription; the badge says how many there are in all.
    setText(badge, total > letters.length ? `${n(letters.length)} of ${n(total)}` : n(total));
    badge.classList.toggle("hot", total > 0);
  }

  // ---- offsets lost to WAL damage -----------------------------------------------------------
  const lostKey = (d) => `${d.topic}-${d.partition}-${d.first_offset}`;

  function createLost(d) {
    return h("tr", { "data-testid": `lost-${lostKey(d)}` },
      h("td", { text: d.topic }), h("td", { class: "num", text: String(d.partition) }),
      h("td", { class: "num", text: `${n(d.first_offset)}–${n(d.last_offset)}` }),
      h("td", { class: "num", text: n(d.lost) }),
      h("td", {}, h("span", { "data-ref": "state" })),
      h("td", {}, h("div", { class: "error-text", text: d.wal_damage, title: d.wal_damage })),
      h("td", { "data-ref": "skipped" }));
  }

  function updateLost(row, d) {
    const state = ref(row, "state");
    setText(state, d.state === "held" ? "held: run wal skip" : "skipped");
    setClass(state, "pill", d.state === "held" ? "failed" : "ok");
    setText(ref(row, "skipped"), d.skipped_at ? `${ago(d.skipped_at)} by ${d.skipped_by}` : "–");
  }

  function renderLost(lost) {
    const body = $("lost-offsets").tBodies[0];
    const empty = body.querySelector(".empty-row");
    empty.hidden = lost.length > 0;
    sync(body, lost, lostKey, createLost, updateLost, empty);
    const badge = $("lost-count");
    const held = lost.filter((d) => d.state === "held").length;
    setText(badge, n(lost.length));
    badge.classList.toggle("hot", held > 0);
  }

  // ---- the whole page ----------------------------------------------------------------------
  let last = null;

  function render(data) {
    last = data;
    renderTopics(data.topics);
    renderSubs(data.subscriptions);
    renderGroups(data.groups);
    renderJobs(data.jobs);
    const deadTotal = data.subscriptions.reduce((a, s) => a + s.dead_lettered, 0);
    renderLetters(data.dead_letters, deadTotal);
    renderLost(data.lost_offsets);
    const rates = data.topics.map((t) => t.produce_rate).filter((r) => r !== null);
    setText(document.querySelector('[data-testid="kpi-topics"]'), n(data.topics.length));
    setText(document.querySelector('[data-testid="kpi-produced"]'),
      n(data.topics.reduce((a, t) => a + t.log_end_offset, 0)));
    setText(document.querySelector('[data-testid="kpi-rate"]'), rates.length ? rate(rates.reduce((a, r) => a + r, 0))
      : "–");
    setText(document.querySelector('[data-testid="kpi-subscriptions"]'), n(data.subscriptions.length));
    setText(document.querySelector('[data-testid="kpi-pending"]'),
      n(data.subscriptions.reduce((a, s) => a + s.pending, 0)));
    setText(document.querySelector('[data-testid="kpi-dead"]'), n(deadTotal));
    setText($("updated"), new Date(data.generated_at).toLocaleTimeString());
  }

  function setLive(state, text) {
    setAttr($("live"), "data-state", state);
    setText($("live-text"), text);
  }

  let errorTimer = null;

  function showError(text, forMs = 0) {
    const el = $("error");
    clearTimeout(errorTimer);
    el.hidden = !text;
    setText(el, text || "");
    if (text && forMs) errorTimer = setTimeout(() => showError(""), forMs);
  }

  async function errorOf(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || response.statusText;
    } catch {
      return `HTTP ${response.status}`;
    }
  }

  let timer = null;
  let inFlight = false;
  let again = false; // a refresh was asked for while a poll was running
  let unreachable = false;

  function pollSoon() {
    if (inFlight) { again = true; return; }
    clearTimeout(timer);
    timer = setTimeout(poll, 150);
  }

  async function poll() {
    clearTimeout(timer);
    inFlight = true;
    let next = document.hidden ? HIDDEN_POLL_MS : POLL_MS;
    try {
      const r = await fetch("/v1/dashboard", { headers: authHeaders(), cache: "no-store" });
      if (r.status === 401 || r.status === 403) {
        const message = await errorOf(r);
        $("auth").hidden = false;
        setText($("auth-text"), r.status === 401 ? "This broker needs an API token with the admin scope."
          : `This token cannot open the dashboard: ${message}`);
        setLive("auth", "Token needed");
        next = 3000;
      } else if (!r.ok) {
        throw new Error(await errorOf(r));
      } else {
        $("auth").hidden = true;
        render(await r.json());
        setLive("live", "Live");
        if (unreachable) showError("");
        unreachable = false;
      }
    } catch (e) {
      setLive("stale", "Reconnecting…");
      showError(`Cannot reach the broker: ${e.message}`);
      unreachable = true;
      next = 2000;
    } finally {
      inFlight = false;
      timer = setTimeout(poll, again ? 150 : next);
      again = false;
    }
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token-input").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $("token-input").value = "";
    pollSoon();
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) pollSoon(); });
  // relative times ("3 s ago") move on between polls too
  setInterval(() => { if (last) renderJobs(last.jobs); }, 5000);
  poll();
})();

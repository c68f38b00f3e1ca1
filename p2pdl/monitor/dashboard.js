"use strict";
// Everything shown comes from /api/state of the monitor that served this
// page; names and the like are the peers' word, so they are set as text,
// never as markup.
const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
const fmt = (v, digits) => v === null || v === undefined ? "–"
  : Number(v).toLocaleString(undefined, {maximumFractionDigits: digits});
const short = (id) => id.length > 12 ? "…" + id.slice(-8) : id;
const duration = (s) => s === null || s === undefined ? "–"
  : s < 90 ? s.toFixed(0) + " s" : s < 5400 ? (s / 60).toFixed(1) + " min"
  : (s / 3600).toFixed(1) + " h";

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}

function fill(tbody, rows, columns, emptyText) {
  tbody.replaceChildren();
  if (!rows.length) {
    const tr = document.createElement("tr");
    cell(tr, emptyText, "empty");
    tr.firstChild.colSpan = columns;
    tbody.appendChild(tr);
  }
  for (const r of rows) {
    const tr = document.createElement("tr");
    for (const [text, cls] of r) cell(tr, text, cls);
    tbody.appendChild(tr);
  }
}

function chart(svg, points, series) {
  // series: [{get: point -> number|null, color}]
  // Drawn at the element's own width, so text is never stretched.
  const W = Math.max(200, Math.round(svg.clientWidth || 400)), H = 150, L = 44, B = 18;
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const values = [];
  for (const s of series) for (const p of points) {
    const v = s.get(p); if (v !== null && Number.isFinite(v)) values.push(v);
  }
  if (points.length < 2 || !values.length) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 8); t.setAttribute("y", 20); t.textContent = "waiting for data";
    svg.appendChild(t); return;
  }
  let lo = Math.min(...values), hi = Math.max(...values);
  if (hi === lo) { hi += 1; lo = Math.max(0, lo - 1); }
  const t0 = points[0].time, t1 = points[points.length - 1].time;
  const x = (t) => L + (W - L - 4) * (t - t0) / Math.max(1e-9, t1 - t0);
  const y = (v) => 4 + (H - B - 8) * (1 - (v - lo) / (hi - lo));
  for (const [v, label] of [[hi, hi], [lo, lo]]) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 2); t.setAttribute("y", y(v) + 4); t.textContent = fmt(label, 3);
    svg.appendChild(t);
  }
  const span = document.createElementNS(ns, "text");
  span.setAttribute("x", L); span.setAttribute("y", H - 3);
  span.textContent = "last " + duration(t1 - t0);
  svg.appendChild(span);
  for (const s of series) {
    let d = "";
    for (const p of points) {
      const v = s.get(p);
      if (v === null || !Number.isFinite(v)) continue;
      d += (d ? " L" : "M") + x(p.time).toFixed(1) + "," + y(v).toFixed(1);
    }
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d); path.setAttribute("fill", "none");
    path.setAttribute("stroke", s.color); path.setAttribute("stroke-width", "2");
    path.setAttribute("vector-effect", "non-scaling-stroke");
    svg.appendChild(path);
  }
}

function render(state) {
  $("run").textContent = state.run_id;
  document.title = "p2pdl · " + state.run_id;
  const st = state.status;
  if (st) {
    $("epoch").textContent = st.epoch;
    $("quorum").textContent = st.quorum_epoch;
    $("progress").textContent = fmt(st.samples_accumulated, 0) + " / " + fmt(st.target_batch_size, 0);
    $("rate").textContent = fmt(st.samples_per_second, 1);
    $("eta").textContent = duration(st.eta_seconds);
    $("peers").textContent = st.trainers + " · " + st.auxiliary + " · " + st.clients;
    $("loss").textContent = fmt(st.loss, 3);
    $("paths").textContent = state.paths.map((k) => st.paths[k]).join(" · ");
  }
  const backup = state.backup;
  $("backup").textContent = !backup ? "off" : backup.last_epoch === null ? "none yet"
    : String(backup.last_epoch);
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name);
  chart($("chart-loss"), state.points, [{get: (p) => p.loss, color: css("--a")}]);
  chart($("chart-rate"), state.points, [{get: (p) => p.samples_per_second, color: css("--c")}]);
  chart($("chart-peers"), state.points, [{get: (p) => p.trainers, color: css("--a")},
                                         {get: (p) => p.auxiliary, color: css("--b")},
                                         {get: (p) => p.paths[2], color: css("--d")}]);
  fill($("leaderboard"), state.leaderboard.map((s, i) => [
    [String(i + 1)], [s.name || "–"], [fmt(s.samples, 0)], [String(s.epochs)],
    [short(s.peer_id), "id"]]), 5, "no credits yet");
  fill($("epochs"), state.epochs.slice(0, 12).map((e) => [
    [String(e.epoch)], [duration(e.seconds)], [String(e.trainers)],
    [Object.entries(e.outcomes).map(([k, n]) => n + " " + k).join(", ") || "–"],
    [fmt(e.group, 1)], [new Date(e.time * 1000).toLocaleTimeString()]]), 6,
    "none completed yet");
  fill($("peer-table"), state.peers.map((p) => [
    [p.name || "–"], [p.role], [String(p.epoch)], [fmt(p.samples, 0)],
    [fmt(p.samples_per_second, 1)], [fmt(p.loss, 3)], [p.path || "?"],
    [duration(p.age) + " ago"], [short(p.peer_id), "id"]]), 9, "no peer in view");
}

let lastGood = 0;
async function poll() {
  try {
    const answer = await fetch("api/state", {cache: "no-store"});
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    const state = await answer.json();
    render(state);
    const root = document.documentElement;
    if (state.status && !root.dataset.firstRenderMs) {
      // When the page first showed the run's data (ms since navigation).
      root.dataset.firstRenderMs = performance.now().toFixed(1);
    }
    lastGood = Date.now();
    $("freshness").textContent = "live · updated " + new Date().toLocaleTimeString();
    $("freshness").className = "";
  } catch (err) {
    $("freshness").textContent = lastGood ? "monitor unreachable since "
      + new Date(lastGood).toLocaleTimeString() : "monitor unreachable";
    $("freshness").className = "stale";
  }
  setTimeout(poll, POLL_MS);
}
poll();

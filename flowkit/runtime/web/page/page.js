// The live page of a flowkit worker: draws /graph once, then puts /status figures on it.
// Plain JavaScript served from the package: no build step, no CDN.
"use strict";
const NS = "http://www.w3.org/2000/svg";
// Boxes sit on a grid: columns by depth, rows of one height. Edges run only in the gaps
// between columns and between rows (nothing else is there), so none passes behind a box.
const W = 220, H = 64, GAP_X = 80, GAP_Y = 36, MARGIN = 40, PAD = 8;
const HISTORY_SECONDS = 300;  // what the sparklines show
const RATE_SECONDS = 5;       // the records/s shown: over the last polls of this span
let graph = null;             // /graph, once
let polls = [];               // the /status polls of the last HISTORY_SECONDS, oldest first
const figures = {};           // node id -> its <text class="figure">
const reads = {};             // agent name -> the topics it reads (for its lag)

// The endpoint's token, when it has one: given once in the address (#token=...), which
// the page then removes from it (a fragment is never sent to a server), or typed in the
// form; kept for this tab only and sent as a header, never in a URL.
const TOKEN_KEY = "flowkit-web-token";
function takeTokenFromAddress() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("token");
  if (given) sessionStorage.setItem(TOKEN_KEY, given);
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
}

class Unauthorized extends Error {}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { "Authorization": "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) throw new Unauthorized();
  return response;
}

function askForToken() {
  const form = document.getElementById("login");
  if (!form.hidden) return;  // asked already
  form.hidden = false;
  document.getElementById("state").textContent = "needs its token";
  document.getElementById("state").className = "badge down";
  form.addEventListener("submit", event => {
    event.preventDefault();
    const field = document.getElementById("login-token");
    sessionStorage.setItem(TOKEN_KEY, field.value.trim());
    field.value = "";
    form.hidden = true;
    if (!started) start();
  }, { once: true });
}

function el(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function layout(graph) {
  // Columns by longest path from a node with no inputs (a cycle is cut where it closes);
  // within a column, rows ordered by the mean row of their inputs, to keep edges short.
  const incoming = {}, depth = {};
  graph.nodes.forEach(n => { incoming[n.id] = []; });
  graph.edges.forEach(e => { if (incoming[e.target]) incoming[e.target].push(e.source); });
  const visit = (id, seen) => {
    if (depth[id] !== undefined) return depth[id];
    if (seen.has(id)) return -1;
    seen.add(id);
    const inputs = incoming[id].filter(s => incoming[s] !== undefined);
    const d = inputs.length ? 1 + Math.max(...inputs.map(s => visit(s, seen))) : 0;
    depth[id] = d;
    return d;
  };
  graph.nodes.forEach(n => visit(n.id, new Set()));
  const columns = [];
  graph.nodes.forEach(n => { (columns[depth[n.id]] = columns[depth[n.id]] || []).push(n); });
  const pos = {};
  columns.forEach((nodes, c) => {
    if (!nodes) return;
    const mean = n => {
      const rows = incoming[n.id].filter(s => pos[s]).map(s => pos[s].row);
      return rows.length ? rows.reduce((a, b) => a + b, 0) / rows.length : Infinity;
    };
    const order = nodes.map((n, i) => [mean(n), i, n]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    order.forEach(([, , n], r) => {
      pos[n.id] = { col: c, row: r, x: MARGIN + c * (W + GAP_X), y: MARGIN + r * (H + GAP_Y) };
    });
  });
  return pos;
}

// The x of the gap right of column c (c = -1: the margin left of the first one).
function channel(c) { return c < 0 ? MARGIN / 2 : MARGIN + c * (W + GAP_X) + W + GAP_X / 2; }
// The y of the gap above row r.
function lane(r) { return r <= 0 ? MARGIN / 2 : MARGIN + r * (H + GAP_Y) - GAP_Y / 2; }

// Each edge's corners: out of its source's right side, along the gap right of the source's
// column; to the next column straight on, else along the gap between two rows to the gap
// left of the target's column; then into the target's left side. Edges sharing a gap are
// spread across it.
function route(graph, pos) {
  const uses = {};  // gap -> the edges in it
  const use = (gap, edge) => { (uses[gap] = uses[gap] || []).push(edge); };
  const plans = [];
  graph.edges.forEach(e => {
    const a = pos[e.source], b = pos[e.target];
    if (!a || !b) return;
    const plan = { edge: e, a, b, direct: b.col === a.col + 1 };
    use("x" + a.col, plan);
    if (!plan.direct) {
      plan.lane = b.row + (a.row > b.row ? 1 : 0);
      use("y" + plan.lane, plan);
      use("x" + (b.col - 1), plan);
    }
    plans.push(plan);
  });
  const offset = (gap, plan, room) => {
    const list = uses[gap], i = list.indexOf(plan);
    const step = Math.min(8, (room - 12) / Math.max(list.length, 1));
    return (i - (list.length - 1) / 2) * step;
  };
  return plans.map(plan => {
    const { a, b } = plan;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    const c1 = channel(a.col) + offset("x" + a.col, plan, GAP_X);
    if (plan.direct) return { edge: plan.edge, points: [[x1, y1], [c1, y1], [c1, y2], [x2, y2]] };
    const room = b.col - 1 < 0 ? MARGIN : GAP_X;
    const c2 = channel(b.col - 1) + offset("x" + (b.col - 1), plan, room);
    const ly = lane(plan.lane) + offset("y" + plan.lane, plan, plan.lane === 0 ? MARGIN : GAP_Y);
    return { edge: plan.edge,
      points: [[x1, y1], [c1, y1], [c1, ly], [c2, ly], [c2, y2], [x2, y2]] };
  });
}

// Shortens ``text`` (in the page) until it fits ``width``, ending it with an ellipsis.
function fit(text, full, width) {
  text.textContent = full;
  if (text.getComputedTextLength() <= width) return;
  let lo = 0, hi = full.length;
  while (lo < hi) {  // the longest prefix that fits with its ellipsis
    const mid = Math.ceil((lo + hi) / 2);
    text.textContent = full.slice(0, mid) + "\u2026";
    if (text.getComputedTextLength() <= width) lo = mid; else hi = mid - 1;
  }
  text.textContent = full.slice(0, lo) + "\u2026";
}

function draw(graph) {
  const svg = document.getElementById("graph");
  svg.replaceChildren();
  const defs = el("defs", {}, svg);
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, defs);
  el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a93a3" }, marker);
  const pos = layout(graph);
  let maxX = 0, maxY = 0;
  route(graph, pos).forEach(({ edge, points }) => {
    const d = points.map(([x, y], i) => `${i ? "L" : "M"} ${x} ${y}`).join(" ");
    const path = el("path", { class: "edge " + edge.kind, d,
      "data-source": edge.source, "data-target": edge.target }, svg);
    el("title", {}, path).textContent = `${edge.source} \u2192 ${edge.target} (${edge.kind})`;
  });
  graph.nodes.forEach(n => {
    const p = pos[n.id];
    const kind = n.dead_letter ? "dlq" : n.kind;
    const g = el("g", { class: "node " + kind, "data-id": n.id, "data-name": n.name,
      transform: `translate(${p.x},${p.y})` }, svg);
    el("title", {}, g).textContent = n.name;
    el("rect", { width: W, height: H }, g);
    fit(el("text", { x: PAD, y: 18, class: "name" }, g), n.name, W - 2 * PAD);
    el("text", { x: PAD, y: 34, class: "kind" }, g).textContent =
      n.dead_letter ? "dead letters" : n.kind.replace("_", " ");
    figures[n.id] = el("text", { x: PAD, y: 52, class: "figure" }, g);
    maxX = Math.max(maxX, p.x + W); maxY = Math.max(maxY, p.y + H);
  });
  svg.setAttribute("viewBox", `0 0 ${maxX + MARGIN} ${maxY + MARGIN}`);
  svg.style.maxWidth = `${maxX + MARGIN}px`;  // scaled down to the window, never up
  svg.setAttribute("data-rendered", String(graph.nodes.length));
  const select = document.getElementById("lookup-table");
  graph.nodes.filter(n => n.kind.endsWith("table")).forEach(n => {
    const option = document.createElement("option");
    option.value = option.textContent = n.name;
    select.appendChild(option);
  });
  graph.edges.filter(e => e.kind === "reads" && e.target.startsWith("agent:")).forEach(e => {
    (reads[e.target.slice(6)] = reads[e.target.slice(6)] || []).push(e.source);
  });
}

function fmt(n) { return n >= 1000 ? (n / 1000).toFixed(1) + "k" : String(Math.round(n)); }
function ms(seconds) { return seconds === null || seconds === undefined ? "-" :
  seconds < 1 ? `${Math.round(seconds * 1000)} ms` : `${seconds.toFixed(2)} s`; }

// The rate of a total between two polls (null without a before).
function rate(now, before) {
  if (!before || now.elapsed <= before.elapsed) return null;
  return Math.max(now.value - before.value, 0) / (now.elapsed - before.elapsed);
}

// The poll RATE_SECONDS before the newest one (or the oldest kept).
function recent() {
  const last = polls[polls.length - 1];
  for (const s of polls) if (s.elapsed >= last.elapsed - RATE_SECONDS) return s;
  return polls[0];
}

function agentRecords(s, name) { return s.agents[name] ? s.agents[name].records : 0; }
function agentLetters(s, name) { return s.agents[name] ? s.agents[name].dead_letters || 0 : 0; }
function agentLag(s, name) {
  return (reads[name] || []).reduce((sum, id) => {
    const t = id.startsWith("topic:") ? s.topics[id.slice(6)] : null;
    return sum + (t ? t.lag : 0);
  }, 0);
}

// Per poll kept, a figure of an agent: totals turned into rates between polls.
function series(name, figure, asRate) {
  const points = [];
  polls.forEach((s, i) => {
    const v = figure(s, name);
    if (!asRate) { points.push([s.elapsed, v]); return; }
    if (i === 0) return;
    const before = polls[i - 1];
    const r = rate({ elapsed: s.elapsed, value: v },
      { elapsed: before.elapsed, value: figure(before, name) });
    if (r !== null) points.push([s.elapsed, r]);
  });
  return points;
}

// The quantile q of cumulative buckets [[bound, count], ...], linear within its bucket.
function quantile(buckets, q) {
  const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const [bound, count] of buckets) {
    if (count >= rank) {
      if (!isFinite(bound)) return lower;
      return count === below ? bound : lower + (bound - lower) * (rank - below) / (count - below);
    }
    lower = bound; below = count;
  }
  return lower;
}

// An agent's latency over the polls kept: its buckets now less those of the oldest poll
// (since the worker started while only one poll is kept).
function latency(name) {
  const last = polls[polls.length - 1].latency[name];
  if (!last) return [null, null];
  const first = polls.length > 1 && polls[0].latency[name] ? polls[0].latency[name] : null;
  const buckets = last.buckets.map(([bound, count], i) =>
    [bound === "+Inf" ? Infinity : bound, count - (first ? first.buckets[i][1] : 0)]);
  return [quantile(buckets, 0.5), quantile(buckets, 0.99)];
}

const SPARK_W = 120, SPARK_H = 24;

function sparkline(points, label) {
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", SPARK_W);
  svg.setAttribute("height", SPARK_H);
  svg.setAttribute("viewBox", `0 0 ${SPARK_W} ${SPARK_H}`);
  svg.setAttribute("data-points", String(points.length));
  el("title", {}, svg).textContent = `${label}, last ${HISTORY_SECONDS / 60} min`;
  if (!points.length) return svg;
  // Across the polls kept (at least a minute's width, so the first ones do not stretch).
  const last = points[points.length - 1][0];
  const span = Math.max(last - points[0][0], 60);
  const top = Math.max(...points.map(p => p[1]), 1e-9);
  const xy = points.map(([t, v]) => {
    const x = SPARK_W - 1 - (last - t) / span * (SPARK_W - 2);
    const y = SPARK_H - 2 - v / top * (SPARK_H - 4);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  el("polyline", { points: xy.join(" ") }, svg);
  return svg;
}

function cell(row, text, attrs) {
  const td = document.createElement("td");
  td.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) td.setAttribute(k, v);
  row.appendChild(td);
  return td;
}

function showAgents(status) {
  const body = document.getElementById("agents-body");
  const rows = [];
  const last = polls[polls.length - 1], from = recent();
  for (const [name, a] of Object.entries(status.agents)) {
    const row = document.createElement("tr");
    row.dataset.agent = name;
    cell(row, name, { class: "agent-name", title: name });
    const perSecond = rate({ elapsed: last.elapsed, value: a.records },
      { elapsed: from.elapsed, value: agentRecords(from, name) });
    const td = cell(row, perSecond === null ? "-" : fmt(perSecond) + "/s",
      { class: "rate", "data-rate": String(perSecond === null ? "" : perSecond) });
    td.prepend(sparkline(series(name, agentRecords, true), "records/s"));
    const lag = agentLag(status, name);
    cell(row, fmt(lag), { class: "lag", "data-lag": String(lag) })
      .prepend(sparkline(series(name, agentLag, false), "lag (records)"));
    const letters = a.dead_letters || 0;
    cell(row, String(letters), { class: "letters", "data-letters": String(letters) })
      .prepend(sparkline(series(name, agentLetters, true), "dead letters/s"));
    const [p50, p99] = latency(name);
    cell(row, ms(p50), { class: "p50" });
    cell(row, ms(p99), { class: "p99" });
    rows.push(row);
  }
  body.replaceChildren(...rows);
}

// Control characters (an ANSI escape, a carriage return) written out, as Python would.
function visible(text) {
  return text.replace(/[\x00-\x08\x0b-\x1f\x7f]/g,
    c => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

function showLetters(letters) {
  const list = document.getElementById("letters");
  const items = letters.map(l => {
    const item = document.createElement("li");
    item.className = "letter";
    const head = document.createElement("div");
    const kind = document.createElement("strong");
    kind.className = "error";
    kind.textContent = l.error;
    head.appendChild(kind);
    const when = new Date(l.failed_at_ms).toISOString().substring(11, 19);
    head.append(` in ${l.agent || "-"} (${l.stage}) at ${when}`);
    const message = document.createElement("div");
    message.className = "message";
    message.textContent = visible(l.message);
    const where = document.createElement("div");
    where.className = "where";
    where.textContent = `${l.topic}[${l.partition}]@${l.offset} \u2192 ${l.dead_letter_topic}` +
      (l.location ? ` \u00b7 ${l.location}` : "");
    item.append(head, message, where);
    return item;
  });
  if (!items.length) {
    const none = document.createElement("li");
    none.textContent = "none sent by this worker";
    items.push(none);
  }
  list.replaceChildren(...items);
}

function show(status) {
  polls.push(status);
  while (polls.length > 2 && polls[0].elapsed < status.elapsed - HISTORY_SECONDS) {
    polls.shift();
  }
  const from = recent();
  const badge = document.getElementById("state");
  badge.textContent = !status.alive ? "failed" : status.ready ? "ready" : "starting";
  badge.className = "badge " + (!status.alive ? "down" : status.ready ? "ready" : "starting");
  document.getElementById("totals").textContent =
    `${status.records_in} records in \u00b7 ${status.dead_letters} dead letters`;
  for (const [name, a] of Object.entries(status.agents)) {
    const text = figures["agent:" + name];
    if (!text) continue;
    const r = rate({ elapsed: status.elapsed, value: a.records },
      { elapsed: from.elapsed, value: agentRecords(from, name) });
    text.textContent = `${r === null ? "-" : fmt(r)} rec/s \u00b7 ${a.records} done` +
      (a.errors ? ` \u00b7 ${a.errors} errors` : "");
    text.setAttribute("data-records", String(a.records));
  }
  for (const [name, t] of Object.entries(status.topics)) {
    const text = figures["topic:" + name];
    if (text) text.textContent = `lag ${t.lag} (${t.lag_seconds.toFixed(1)} s)`;
  }
  for (const [name, t] of Object.entries(status.tables)) {
    const text = figures["table:" + name];
    if (!text) continue;
    let line = `${t.keys} keys`;
    if (t.watermark !== undefined && t.watermark !== null) {
      line += " \u00b7 wm " + new Date(t.watermark).toISOString().substring(11, 19);
    }
    text.textContent = line;
  }
  showAgents(status);
  showLetters(status.letters || []);
  const r = status.recovery;
  document.getElementById("recovery").textContent = r.active
    ? `${r.done} read, ${r.left} left, ${Math.round(r.rate)} records/s`
    : `idle (${r.done} records read in all)`;
  const s = status.standby || { partitions: 0 };
  document.getElementById("standby").textContent = s.partitions
    ? `${s.partitions} partitions, lag ${s.lag === null ? "unknown" : s.lag} records`
    : "none";
}

async function poll() {
  try {
    const response = await api("/status");
    show(await response.json());
  } catch (err) {
    if (err instanceof Unauthorized) { askForToken(); return; }
    const badge = document.getElementById("state");
    badge.textContent = "unreachable";
    badge.className = "badge down";
  }
}

async function lookup(event) {
  event.preventDefault();
  const table = document.getElementById("lookup-table").value;
  const key = document.getElementById("lookup-key").value;
  const out = document.getElementById("lookup-result");
  try {
    const response = await api(`/tables/${encodeURIComponent(table)}/${encodeURIComponent(key)}`);
    out.textContent = JSON.stringify(await response.json(), null, 2);
  } catch (err) {
    if (err instanceof Unauthorized) askForToken();
    else throw err;
  }
}

let started = false;  // the graph is drawn and the figures polled

async function start() {
  try {
    graph = await (await api("/graph")).json();
  } catch (err) {
    if (err instanceof Unauthorized) { askForToken(); return; }
    throw err;
  }
  document.getElementById("app").textContent = graph.app;
  document.title = `${graph.app} · flowkit`;
  started = true;
  draw(graph);
  document.getElementById("lookup").addEventListener("submit", lookup);
  await poll();
  setInterval(poll, 1000);
}

takeTokenFromAddress();
window.addEventListener("hashchange", takeTokenFromAddress);
start();

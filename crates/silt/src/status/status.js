// The status page: fetches /api/status now and every 5 s, and draws it. Plain DOM, no
// libraries, no network beyond this node. Client ids, topics and group names are shown with
// textContent only: they come from clients.
"use strict";

const REFRESH_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";

function $(id) { return document.getElementById(id); }

function num(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 });
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function ms(v) { return v === null || v === undefined ? "–" : (v < 10 ? v.toFixed(2) : v.toFixed(0)) + " ms"; }

function duration(secs) {
  if (!secs) return "forever";
  const d = Math.floor(secs / 86400), h = Math.floor(secs / 3600) % 24, m = Math.floor(secs / 60) % 60;
  const s = Math.floor(secs % 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + s + "s";
}

// Replaces the rows of table `id`: each row a list of [text, class] or text.
function fill(id, rows, columns, empty) {
  const body = $(id).tBodies[0];
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = body.insertRow();
    const td = tr.insertCell();
    td.colSpan = columns;
    td.className = "empty";
    td.textContent = empty;
    return;
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const cell of row) {
      const td = tr.insertCell();
      const [text, cls] = Array.isArray(cell) ? cell : [cell, ""];
      td.textContent = text;
      if (cls) td.className = cls;
    }
  }
}

// A line chart of `series` ([{values: [[t, v]...], cls}]) into the element `id`, as inline SVG.
function chart(id, series, unit) {
  const W = 560, H = 160, L = 48, B = 18, T = 8, R = 8;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("class", "chart-svg");
  const points = series.flatMap(s => s.values);
  // The last 10 minutes, or the node's whole life when it is younger.
  const t1 = Math.max(0, ...points.map(p => p[0]));
  const t0 = Math.max(t1 - 600000, Math.min(t1 - 10000, ...points.map(p => p[0])));
  const span = t1 - t0 || 1;
  const max = Math.max(1e-9, ...points.map(p => p[1]));
  const x = t => L + (W - L - R) * Math.min(1, Math.max(0, (t - t0) / span));
  const y = v => H - B - (H - B - T) * (v / max);
  const line = (x1, y1, x2, y2) => {
    const l = document.createElementNS(SVG, "line");
    Object.entries({ x1, y1, x2, y2, class: "axis" }).forEach(([k, v]) => l.setAttribute(k, v));
    svg.appendChild(l);
  };
  const label = (tx, ty, text, anchor) => {
    const e = document.createElementNS(SVG, "text");
    e.setAttribute("x", tx);
    e.setAttribute("y", ty);
    e.setAttribute("text-anchor", anchor);
    e.textContent = text;
    svg.appendChild(e);
  };
  line(L, T, L, H - B);
  line(L, H - B, W - R, H - B);
  line(L, T, W - R, T);
  label(L - 4, T + 8, points.length ? num(max) : "", "end");
  label(L - 4, H - B, "0", "end");
  label(L, H - 4, points.length ? "−" + duration(Math.round(span / 1000)) : "", "start");
  label(W - R, H - 4, "now" + (unit ? " (" + unit + ")" : ""), "end");
  for (const s of series) {
    const p = document.createElementNS(SVG, "polyline");
    p.setAttribute("class", s.cls);
    p.setAttribute("points", s.values.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
    svg.appendChild(p);
    // A dot per sample: a single one is visible too.
    for (const [t, v] of s.values) {
      const c = document.createElementNS(SVG, "circle");
      Object.entries({ cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2, class: "dot " + s.cls })
        .forEach(([k, val]) => c.setAttribute(k, val));
      svg.appendChild(c);
    }
  }
  if (points.length === 0) label(W / 2, H / 2, "collecting samples (every 5 s)…", "middle");
  $(id).replaceChildren(svg);
}

// Rates between neighbouring samples, at the later one's time.
function rates(history, field) {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i];
    const dt = (b.unix_ms - a.unix_ms) / 1000;
    if (dt > 0) out.push([b.unix_ms, Math.max(0, b[field] - a[field]) / dt]);
  }
  return out;
}

function render(s) {
  const n = s.node;
  $("node-version").textContent = n.version;
  $("node-id").textContent = n.id;
  $("node-epoch").textContent = n.epoch;
  $("node-uptime").textContent = duration(n.uptime_secs);
  $("node-store").textContent = n.object_store;
  $("updated").textContent = new Date(n.unix_ms).toLocaleTimeString();
  const ls = $("listeners");
  ls.replaceChildren();
  for (const l of s.listeners) {
    const li = document.createElement("li");
    li.textContent = l.protocol + " " + l.address;
    ls.appendChild(li);
  }

  const totals = Object.entries(s.totals).map(([proto, t]) => [proto, [num(t.connections), "num"],
    [num(t.messages_in), "num"], [num(t.messages_out), "num"], [bytes(t.bytes_in), "num"], [bytes(t.bytes_out), "num"]]);
  fill("totals", totals, 6, "no protocol enabled");
  const names = { mqtt_ack: "MQTT PUBLISH → PUBACK", kafka_produce: "Kafka Produce → response",
    log_append: "Commitlog append", log_fsync: "Commitlog fsync" };
  fill("latency", Object.entries(s.latency).map(([k, l]) => [names[k] || k, [num(l.count), "num"],
    [ms(l.p50_ms), "num"], [ms(l.p99_ms), "num"]]), 4, "no latency figures");

  chart("chart-throughput", [
    { values: rates(s.history, "messages_in"), cls: "line-in" },
    { values: rates(s.history, "messages_out"), cls: "line-out" },
  ], "msg/s");
  chart("chart-latency", [
    { values: s.history.filter(h => h.ack_p99_ms !== null).map(h => [h.unix_ms, h.ack_p99_ms]), cls: "line-latency" },
  ], "ms");

  fill("streams", s.streams.map(st => [st.name, [num(st.partitions), "num"], st.tier, st.ack,
    duration(st.retention_ms / 1000), st.retention_bytes ? bytes(st.retention_bytes) : "no limit",
    [bytes(st.local_bytes), "num"], [bytes(st.bucket_bytes), "num"],
    st.lakehouse_table || "–"]), 9, "no streams yet");
  const other = s.streams_other || { local_bytes: 0, bucket_bytes: 0 };
  $("streams-other").textContent = `Records' bytes in uploaded segments. Not attributed to a stream: ` +
    `${bytes(other.local_bytes)} local (the tail not yet uploaded, framing), ${bytes(other.bucket_bytes)} in the bucket (framing, footers).`;

  const sessions = s.sessions || { total: 0, backlog: 0, largest: [] };
  $("sessions-summary").textContent =
    `${num(sessions.total)} sessions, ${num(sessions.backlog)} messages waiting in all (as of the last $SYS interval).`;
  fill("sessions", sessions.largest.map(x => [x.client_id, [num(x.backlog), "num backlog"]]), 2,
    "no session has a backlog");

  fill("groups", s.consumer_groups.map(g => [g.group, g.topic, [g.partition, "num"], [num(g.committed), "num"],
    [num(g.end), "num"], [num(g.lag), "num lag" + (g.lag > 0 ? " bad" : "")]]), 6, "no committed offsets");

  const t = s.tiering, st = s.storage;
  fill("tiering", [
    ["Epoch", [t.epoch, "num"]],
    ["Fenced by a newer node", t.fenced ? ["yes", "bad"] : "no"],
    ["Upload lag", [bytes(t.upload_lag_bytes) + ", " + duration(t.upload_lag_seconds), t.upload_lag_seconds > 60 ? "bad" : "num"]],
    ["Objects in the manifest", [num(t.objects), "num"]],
    ["Uploads", [num(t.uploads) + " (" + bytes(t.uploaded_bytes) + ")", "num"]],
    ["Objects deleted by retention", [num(t.deleted_objects), "num"]],
    ["Failed uploads (retried)", [num(t.upload_failures), t.upload_failures ? "bad" : "num"]],
    ["Block cache hit ratio", [(100 * t.block_cache_hit_ratio).toFixed(1) + " %", "num"]],
    ["Commitlog held", [bytes(st.log_bytes) + " in " + num(st.segments) + " local segments", "num"]],
    ["Index dispatch lag", [bytes(st.dispatch_lag_bytes), "num"]],
    ["Quarantined batches", [num(st.quarantined_batches), st.quarantined_batches ? "bad" : "num"]],
  ], 2, "");

  fill("lakehouse", s.lakehouse.map(l => [l.name, [num(l.rows), "num"], [num(l.files), "num"],
    [num(l.commits), "num"], [num(l.commit_failures), l.commit_failures ? "bad" : "num"],
    [num(l.compactions), "num"], [duration(l.lag_ms / 1000), "num"],
    l.fenced ? ["fenced", "bad"] : l.holding_retention ? "holding retention" : "writing"]), 8, "no lakehouse tables");
}

// With `[admin] token_file` set, /api/ answers 401 without the token. The page then asks for it
// and keeps it in sessionStorage (this tab only, gone when it closes); it is sent only as an
// Authorization header, never in a URL.
const TOKEN_KEY = "silt-admin-token";
let timer = null;

function authHeaders() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: "Bearer " + t } : {};
}

function askForToken(message) {
  $("login").hidden = false;
  $("login-error").textContent = message;
  $("login-error").hidden = !message;
  $("token").focus();
}

async function refresh() {
  clearTimeout(timer);
  timer = null;
  try {
    const r = await fetch("api/status", { cache: "no-store", headers: authHeaders() });
    if (r.status === 401) {
      const had = sessionStorage.getItem(TOKEN_KEY) !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      $("error").hidden = true;
      // Wait for the form rather than polling a 401 every 5 s.
      askForToken(had ? "That token was not accepted." : "");
      return;
    }
    if (!r.ok) throw new Error(r.status + " " + (await r.text()).trim());
    render(await r.json());
    $("login").hidden = true;
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = "Could not read /api/status: " + e.message;
    $("error").hidden = false;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

$("login").addEventListener("submit", ev => {
  ev.preventDefault();
  const t = $("token").value.trim();
  $("token").value = "";
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  refresh();
});

refresh();

// The ctxwarden dashboard: plain JavaScript over the HTTP API (no framework, no CDN).
"use strict";

const COLORS = ["#3d5afe", "#00a381", "#f29d00", "#d6336c", "#7c4dff", "#2196a6", "#8d6e63", "#5c6bc0"];
const FIXED = "#9aa3ba";
const $ = (selector) => document.querySelector(selector);

function svgNode(tag, attributes, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  return td;
}

function memoryLink(td, id) {
  td.textContent = "";
  const link = document.createElement("a");
  link.textContent = id;
  link.addEventListener("click", guarded(() => showMemory(id)));
  td.appendChild(link);
}

// An answer of the API that is not a success: its message is already on the page.
class ApiError extends Error {}

// An event handler that runs `work` (async): an API error is shown by `call` and ends there;
// anything else is a bug, shown too and raised again (it reaches the console).
function guarded(work) {
  return (...args) => work(...args).catch((error) => {
    if (error instanceof ApiError) return;
    $("#error").textContent = "error: " + error.message;
    $("#error").hidden = false;
    throw error;
  });
}

async function call(method, path, body) {
  $("#error").hidden = true;
  const headers = { "content-type": "application/json" };
  const key = sessionStorage.getItem("ctxwarden-key");
  if (key) headers.authorization = "Bearer " + key;
  const response = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const data = await response.json();
  if (!response.ok) {
    const message = data.error ? data.error.message : response.statusText;
    $("#error").textContent = response.status + ": " + message;
    $("#error").hidden = false;
    throw new ApiError(message);
  }
  return data;
}

function show(view) {
  document.querySelectorAll(".view").forEach((node) => { node.hidden = node.id !== "view-" + view; });
  document.querySelectorAll("nav button").forEach((node) => {
    node.classList.toggle("active", node.dataset.view === view);
  });
  if (view === "store") guarded(loadStore)();
  if (view === "health") guarded(loadHealth)();
}

// -- a context's composition: blocks as a stacked bar against the budget ---------------------

function drawComposition(context) {
  const report = context.report;
  const parts = [];
  for (const [name, tokens] of Object.entries(report.fixed)) {
    if (tokens > 0) parts.push({ name: "(" + name + ")", tokens, color: FIXED });
  }
  report.blocks.forEach((block, index) => {
    if (block.used > 0) parts.push({ name: block.name, tokens: block.used, color: COLORS[index % COLORS.length] });
  });
  const svg = $("#context-bar");
  svg.replaceChildren();
  const width = svg.clientWidth || 900;
  const scale = (width - 2) / Math.max(report.cap, context.tokens, 1);
  let x = 1;
  for (const part of parts) {
    const w = part.tokens * scale;
    const rect = svgNode("rect", { x, y: 8, width: Math.max(w, 1), height: 28, fill: part.color });
    rect.appendChild(svgNode("title", {}, part.name + ": " + part.tokens + " tokens"));
    svg.appendChild(rect);
    x += w;
  }
  const capX = 1 + report.cap * scale;
  svg.appendChild(svgNode("line", { x1: capX - 1, x2: capX - 1, y1: 2, y2: 42, stroke: "#b3261e", "stroke-width": 2 }));
  svg.appendChild(svgNode("text", { x: Math.max(capX - 160, 4), y: 52, "font-size": 11, fill: "#b3261e" }, "budget " + report.cap + " tokens"));
  const legend = $("#context-legend");
  legend.replaceChildren();
  for (const part of parts) {
    const item = document.createElement("span");
    item.style.setProperty("--c", part.color);
    item.textContent = part.name + " " + part.tokens;
    legend.appendChild(item);
  }
  $("#context-summary").textContent =
    context.tokens + " of " + report.cap + " tokens (" + report.model + ", " + report.tokenizer +
    (report.exact ? ", exact" : ", approximate") + "), " + context.included.length + " memories, " +
    context.messages.length + " messages";
  // How retrieval was sized for this context (empty without a query), then the report's notes.
  const sizes = Object.entries(report.retrieval || {}).map(([name, value]) => name + " " + value);
  $("#context-retrieval").textContent = [
    sizes.length ? "retrieval sized: " + sizes.join(", ") : "",
    ...(report.notes || []).map((note) => "note: " + note),
  ].filter(Boolean).join(" · ");
  const body = $("#candidates tbody");
  body.replaceChildren();
  for (const candidate of report.candidates || []) {
    const row = body.insertRow();
    memoryLink(cell(row, candidate.id), candidate.id);
    cell(row, candidate.block);
    cell(row, candidate.included ? "in" : "out", candidate.included ? "in" : "out");
    cell(row, candidate.reason);
    cell(row, candidate.tokens);
    cell(row, candidate.score === null || candidate.score === undefined ? "" : candidate.score.toFixed(3));
  }
}

async function assemble(event) {
  event.preventDefault();
  const form = new FormData(event.target);
  const body = { session: form.get("session") };
  for (const name of ["user", "query", "model"]) if (form.get(name)) body[name] = form.get(name);
  if (form.get("budget")) body.budget = Number(form.get("budget"));
  drawComposition(await call("POST", "/v1/assemble?report=full", body));
}

// -- the store's health ----------------------------------------------------------------------

async function loadStore() {
  const stats = await call("GET", "/v1/stats");
  $("#store-summary").textContent =
    stats.memories + " memories from " + stats.seen + " records seen: " + stats.folded +
    " folded (" + stats.exact + " exact, " + stats.near + " near, " + stats.semantic + " semantic), " +
    stats.contexts + " contexts assembled";
  const channels = Object.entries(stats.channels);
  const svg = $("#store-chart");
  svg.replaceChildren();
  const width = svg.clientWidth || 900;
  const most = Math.max(1, ...channels.map(([, row]) => row.seen));
  const series = [["memories", COLORS[0]], ["exact", COLORS[2]], ["near", COLORS[3]], ["semantic", COLORS[4]]];
  svg.setAttribute("height", String(channels.length * 30 + 40));
  let legendX = 130;
  for (const [field, color] of series) {
    const y = 14 + channels.length * 30;
    svg.appendChild(svgNode("rect", { x: legendX, y, width: 10, height: 10, fill: color }));
    const label = field === "memories" ? "kept" : field + " folds";
    svg.appendChild(svgNode("text", { x: legendX + 14, y: y + 9, "font-size": 11 }, label));
    legendX += 100;
  }
  channels.forEach(([name, row], index) => {
    const y = 8 + index * 30;
    svg.appendChild(svgNode("text", { x: 4, y: y + 15, "font-size": 12 }, name || "(no channel)"));
    let x = 130;
    for (const [field, color] of series) {
      const w = (row[field] / most) * (width - 290);
      if (w > 0) {
        const rect = svgNode("rect", { x, y, width: w, height: 20, fill: color });
        rect.appendChild(svgNode("title", {}, field + ": " + row[field]));
        svg.appendChild(rect);
      }
      x += w;
    }
    svg.appendChild(svgNode("text", { x: x + 6, y: y + 15, "font-size": 11 }, row.memories + " kept / " + row.seen + " seen"));
  });
  const body = $("#families tbody");
  body.replaceChildren();
  for (const family of stats.top_families) {
    const row = body.insertRow();
    cell(row, family.count);
    cell(row, family.channel || "-");
    cell(row, family.author || "-");
    cell(row, family.content);
  }
}

// -- the store's health over time: series per time bucket from GET /v1/stats/history ----------

const LAYER_COLORS = { exact: COLORS[2], near: COLORS[3], semantic: COLORS[4] };
const PAD = { left: 48, right: 12, top: 10, bottom: 22 };

function legendRow(svg, entries, y) {
  let x = PAD.left;
  for (const [label, color] of entries) {
    svg.appendChild(svgNode("rect", { x, y, width: 10, height: 10, fill: color }));
    svg.appendChild(svgNode("text", { x: x + 14, y: y + 9, "font-size": 11 }, label));
    x += 24 + label.length * 7;
  }
}

function axes(svg, times, top, height, most) {
  const width = svg.clientWidth || 900;
  const inner = width - PAD.left - PAD.right;
  const step = inner / Math.max(times.length, 1);
  svg.appendChild(svgNode("line", { x1: PAD.left, x2: width - PAD.right, y1: top + height, y2: top + height, stroke: "#9aa3ba" }));
  svg.appendChild(svgNode("text", { x: PAD.left - 6, y: top + 8, "text-anchor": "end", class: "axis" }, String(most)));
  svg.appendChild(svgNode("text", { x: PAD.left - 6, y: top + height, "text-anchor": "end", class: "axis" }, "0"));
  const every = Math.max(1, Math.ceil(times.length / 8));
  times.forEach((time, index) => {
    if (index % every) return;
    svg.appendChild(svgNode("text", { x: PAD.left + index * step, y: top + height + 14, class: "axis" }, time.slice(0, 10)));
  });
  return step;
}

function stackedBars(svg, times, series, colors) {
  svg.replaceChildren();
  const names = Object.keys(series);
  const totals = times.map((_, i) => names.reduce((sum, name) => sum + series[name][i], 0));
  const most = Math.max(1, ...totals);
  const height = Number(svg.getAttribute("height")) - PAD.top - PAD.bottom - 16;
  const step = axes(svg, times, PAD.top, height, most);
  times.forEach((time, i) => {
    let y = PAD.top + height;
    names.forEach((name) => {
      const value = series[name][i];
      if (!value) return;
      const h = (value / most) * height;
      y -= h;
      const rect = svgNode("rect", { x: PAD.left + i * step + 1, y, width: Math.max(step - 2, 1), height: h, fill: colors[name] });
      rect.appendChild(svgNode("title", {}, time + " " + name + ": " + value));
      svg.appendChild(rect);
    });
  });
  legendRow(svg, names.map((name) => [name || "(no channel)", colors[name]]), Number(svg.getAttribute("height")) - 12);
}

function channelColors(names) {
  const colors = {};
  names.forEach((name, index) => { colors[name] = COLORS[index % COLORS.length]; });
  return colors;
}

function drawMemories(svg, history) {
  svg.replaceChildren();
  const times = history.times;
  const alive = history.memories.alive;
  const retired = times.map((_, i) => Object.values(history.memories.retired).reduce((sum, row) => sum + row[i], 0));
  const most = Math.max(1, ...alive, ...retired);
  const height = Number(svg.getAttribute("height")) - PAD.top - PAD.bottom - 16;
  const step = axes(svg, times, PAD.top, height, most);
  retired.forEach((value, i) => {
    if (!value) return;
    const h = (value / most) * height;
    const rect = svgNode("rect", { x: PAD.left + i * step + 1, y: PAD.top + height - h, width: Math.max(step - 2, 1), height: h, fill: "#e8a29c" });
    rect.appendChild(svgNode("title", {}, times[i] + " retired: " + value));
    svg.appendChild(rect);
  });
  const points = alive.map((value, i) => (PAD.left + (i + 0.5) * step) + "," + (PAD.top + height - (value / most) * height));
  svg.appendChild(svgNode("polyline", { points: points.join(" "), fill: "none", stroke: COLORS[0], "stroke-width": 2 }));
  alive.forEach((value, i) => {
    const dot = svgNode("circle", { cx: PAD.left + (i + 0.5) * step, cy: PAD.top + height - (value / most) * height, r: 2.5, fill: COLORS[0] });
    dot.appendChild(svgNode("title", {}, times[i] + " memories: " + value));
    svg.appendChild(dot);
  });
  legendRow(svg, [["memories kept", COLORS[0]], ["retired", "#e8a29c"]], Number(svg.getAttribute("height")) - 12);
}

function drawHeat(svg, history) {
  svg.replaceChildren();
  const times = history.times;
  const rows = Object.entries(history.heat.by_channel);
  const rowHeight = 18;
  svg.setAttribute("height", String(PAD.top + rows.length * rowHeight + 40));
  const width = svg.clientWidth || 900;
  const step = (width - PAD.left - PAD.right - 40) / Math.max(times.length, 1);
  const most = Math.max(1, ...rows.flatMap(([, row]) => row));
  rows.forEach(([name, row], r) => {
    const y = PAD.top + r * rowHeight;
    svg.appendChild(svgNode("text", { x: PAD.left + 36, y: y + 12, "text-anchor": "end", class: "axis" }, name || "(none)"));
    row.forEach((value, i) => {
      const cellRect = svgNode("rect", {
        x: PAD.left + 40 + i * step, y, width: Math.max(step - 1, 1), height: rowHeight - 2,
        fill: value ? "#d6336c" : "#eceff7", "fill-opacity": value ? 0.15 + 0.85 * (value / most) : 1,
      });
      cellRect.appendChild(svgNode("title", {}, times[i] + " " + (name || "(none)") + ": " + value + " inclusions"));
      svg.appendChild(cellRect);
    });
  });
  const contexts = history.heat.contexts.reduce((a, b) => a + b, 0);
  svg.appendChild(svgNode("text", { x: PAD.left + 40, y: PAD.top + rows.length * rowHeight + 16, class: "axis" },
    contexts + " contexts assembled; darker = more of the channel's memories put into contexts (most: " + most + " in one bucket)"));
}

async function loadHealth(event) {
  if (event) event.preventDefault();
  const form = new FormData($("#health-form"));
  const query = new URLSearchParams();
  if (form.get("session")) query.set("session", form.get("session"));
  if (form.get("buckets")) query.set("buckets", form.get("buckets"));
  const search = query.toString();
  const history = await call("GET", "/v1/stats/history" + (search ? "?" + search : ""));
  const saved = history.compactions.reduce((sum, c) => sum + (c.tokens_saved || 0), 0);
  const retired = history.compactions.reduce((sum, c) => sum + c.retired, 0);
  const days = history.width >= 86400 ? history.width / 86400 + " day" : history.width / 3600 + " hour";
  $("#health-summary").textContent =
    history.memories.now + " memories now; " + history.buckets + " buckets of " + days + " from " +
    (history.start || "-") + "; " + history.compactions.length + " compactions retired " + retired +
    " memories and saved " + saved + " tokens (" + (history.tokens.tokenizer || "no tokenizer") + ")";
  drawMemories($("#health-memories"), history);
  stackedBars($("#health-folds"), history.times, history.folds, LAYER_COLORS);
  const channels = history.tokens.by_channel;
  stackedBars($("#health-tokens"), history.times, channels, channelColors(Object.keys(channels)));
  drawHeat($("#health-heat"), history);
  const compactions = $("#compactions tbody");
  compactions.replaceChildren();
  for (const compaction of history.compactions) {
    const row = compactions.insertRow();
    memoryLink(cell(row, compaction.summary_id), compaction.summary_id);
    cell(row, compaction.channel || "-");
    cell(row, compaction.retired);
    cell(row, compaction.compacted_at);
    cell(row, compaction.tokens_before === null ? "not recorded" : compaction.tokens_before);
    cell(row, compaction.tokens_after);
    cell(row, compaction.tokens_saved);
  }
  const hottest = $("#hottest tbody");
  hottest.replaceChildren();
  for (const memory of history.hottest) {
    const row = hottest.insertRow();
    memoryLink(cell(row, memory.id), memory.id);
    cell(row, memory.channel || "-");
    cell(row, memory.kind);
    cell(row, memory.access_count);
    cell(row, memory.access_score.toFixed(3));
    cell(row, memory.content);
  }
}

// -- search and a memory's history ----------------------------------------------------------

async function search(event) {
  event.preventDefault();
  const form = new FormData(event.target);
  const body = { query: form.get("query") };
  if (form.get("session")) body.session = form.get("session");
  if (form.get("scope")) body.scope = form.get("scope");
  const result = await call("POST", "/v1/search", body);
  const rows = $("#hits tbody");
  rows.replaceChildren();
  for (const hit of result.hits) {
    const row = rows.insertRow();
    cell(row, hit.score.toFixed(3));
    memoryLink(cell(row, hit.memory.id), hit.memory.id);
    cell(row, hit.memory.session);
    cell(row, hit.memory.content);
  }
}

async function showMemory(id) {
  show("memory");
  $("#memory-history").hidden = true;
  $("#memory").replaceChildren();  // no earlier memory's record under this one's error
  $("#memory-form").elements.id.value = id;
  const memory = await call("GET", "/v1/memories/" + encodeURIComponent(id));
  const list = document.createElement("dl");
  const fields = ["id", "kind", "session", "user", "channel", "author", "role", "created_at", "dup_count",
    "last_seen_at", "latest_content", "pinned", "access_count", "access_score", "source_ids", "time_range", "content"];
  for (const field of fields) {
    const value = memory[field];
    if (value === null || value === undefined || (Array.isArray(value) && value.length === 0)) continue;
    const term = document.createElement("dt");
    term.textContent = field;
    const detail = document.createElement("dd");
    if (field === "source_ids") {
      value.forEach((source, index) => {
        if (index) detail.append(", ");
        const link = document.createElement("a");
        link.textContent = source;
        link.addEventListener("click", guarded(() => showMemory(source)));
        detail.appendChild(link);
      });
    } else {
      detail.textContent = typeof value === "object" ? JSON.stringify(value) : String(value);
    }
    list.append(term, detail);
  }
  $("#memory").replaceChildren(list);
  await showHistory(id);
}

const EDITED = "#ab47bc";
const EVENT_COLORS = {
  created: COLORS[0], exact: COLORS[2], near: COLORS[3], semantic: COLORS[4], retired: "#b3261e",
  "source retired": "#b3261e", edited: EDITED, superseded: COLORS[6], supersedes: COLORS[6],
};

// A word diff of two texts (longest common subsequence of words and spaces): [kind, text] with
// kind "same", "del" or "ins". Texts too long for the table are shown whole, old then new.
function wordDiff(before, after) {
  const a = before.split(/(\s+)/);
  const b = after.split(/(\s+)/);
  if (a.length * b.length > 250000) return [["del", before], ["ins", after]];
  const common = Array.from({ length: a.length + 1 }, () => new Uint32Array(b.length + 1));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const parts = [];
  const push = (kind, text) => {
    const last = parts[parts.length - 1];
    if (last && last[0] === kind) last[1] += text; else parts.push([kind, text]);
  };
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i] === b[j]) { push("same", a[i]); i++; j++; }
    else if (common[i + 1][j] >= common[i][j + 1]) push("del", a[i++]);
    else push("ins", b[j++]);
  }
  while (i < a.length) push("del", a[i++]);
  while (j < b.length) push("ins", b[j++]);
  return parts;
}

function drawVersions(history) {
  const list = $("#history-versions");
  list.replaceChildren();
  $("#history-versions-none").hidden = history.versions.length > 0;
  for (const version of history.versions) {
    const item = document.createElement("li");
    item.className = "version";
    const when = document.createElement("div");
    when.className = "when";
    when.textContent = "version " + version.version + ": in force from " + version.valid_from +
      ", replaced " + version.valid_until;
    const diff = document.createElement("div");
    diff.className = "diff";
    for (const [kind, text] of wordDiff(version.content, version.replaced_by)) {
      const node = document.createElement(kind === "same" ? "span" : kind);
      node.textContent = text;
      diff.appendChild(node);
    }
    item.append(when, diff);
    list.appendChild(item);
  }
}

function linkItem(prefix, link, suffix) {
  const item = document.createElement("li");
  const anchor = document.createElement("a");
  anchor.textContent = link.id;
  anchor.addEventListener("click", guarded(() => showMemory(link.id)));
  item.append(prefix, anchor, suffix + " (" + link.reason + ")");
  return item;
}

function drawLinks(history) {
  const list = $("#history-links");
  list.replaceChildren();
  const newer = history.superseded_by;
  if (newer) list.appendChild(linkItem("superseded by ", newer, ", in force until " + newer.valid_until));
  for (const older of history.supersedes) {
    list.appendChild(linkItem("supersedes ", older, " (created " + older.created_at + "), in force until " + older.valid_until));
  }
  $("#history-links-none").hidden = list.children.length > 0;
}

async function showHistory(id) {
  const history = await call("GET", "/v1/memories/" + encodeURIComponent(id) + "/history");
  const how = { memory: "", folded: " (folded into " + history.memory.id + ")", retired: " (retired into " + history.memory.id + ")" };
  $("#history-summary").textContent =
    id + how[history.found_as] + ": " + history.folded.length + " repeats folded, " +
    history.inclusions.length + " contexts included it, " + history.sources.length + " sources retired" +
    (history.tombstone ? "; tombstone " + history.tombstone.deleted_at + " (" + history.tombstone.reason + ")" : "") +
    "; " + history.versions.length + " earlier versions" +
    (history.superseded_by ? "; superseded by " + history.superseded_by.id : "") +
    (history.supersedes.length ? "; supersedes " + history.supersedes.map((link) => link.id).join(", ") : "") + ".";
  drawVersions(history);
  drawLinks(history);
  $("#memory-history").hidden = false;  // shown before drawing, so the plot has its width
  const svg = $("#history-timeline");
  svg.replaceChildren();
  const events = history.events;
  const width = svg.clientWidth || 900;
  const stamps = events.map((e) => Date.parse(e.at));
  const low = Math.min(...stamps);
  const high = Math.max(...stamps, low + 1);
  const x = (t) => PAD.left + ((t - low) / (high - low)) * (width - PAD.left - PAD.right);
  svg.appendChild(svgNode("line", { x1: PAD.left, x2: width - PAD.right, y1: 40, y2: 40, stroke: "#9aa3ba" }));
  events.forEach((event, i) => {
    const kind = event.event.startsWith("included") ? "included" : event.event;
    const color = EVENT_COLORS[kind] || COLORS[1];
    const dot = svgNode("circle", { cx: x(stamps[i]), cy: 40, r: kind === "included" ? 4 : 6, fill: color });
    dot.appendChild(svgNode("title", {}, event.at + " " + event.event + " " + event.id));
    svg.appendChild(dot);
  });
  svg.appendChild(svgNode("text", { x: PAD.left, y: 70, class: "axis" }, events.length ? events[0].at : ""));
  svg.appendChild(svgNode("text", { x: width - PAD.right, y: 70, "text-anchor": "end", class: "axis" }, events.length ? events[events.length - 1].at : ""));
  legendRow(svg, [["created", COLORS[0]], ["folded repeat", COLORS[2]], ["included", COLORS[1]], ["edited", EDITED],
    ["superseded", COLORS[6]], ["retired", "#b3261e"]], 76);
  const body = $("#history-events tbody");
  body.replaceChildren();
  for (const event of events) {
    const row = body.insertRow();
    cell(row, event.at);
    cell(row, event.event);
    if (event.event.startsWith("included")) cell(row, event.id);
    else memoryLink(cell(row, event.id), event.id);
  }
}

document.querySelectorAll("nav button").forEach((node) => node.addEventListener("click", () => show(node.dataset.view)));
$("#key").value = sessionStorage.getItem("ctxwarden-key") || "";
$("#key").addEventListener("change", (event) => sessionStorage.setItem("ctxwarden-key", event.target.value));
$("#context-form").addEventListener("submit", guarded(assemble));
$("#search-form").addEventListener("submit", guarded(search));
$("#health-form").addEventListener("submit", guarded(loadHealth));
$("#memory-form").addEventListener("submit", guarded(async (event) => {
  event.preventDefault();
  await showMemory(new FormData(event.target).get("id"));
}));
const start = new URLSearchParams(location.search).get("view");
if (start) show(start);

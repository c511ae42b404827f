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
  link.addEventListener("click", () => showMemory(id));
  td.appendChild(link);
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
    throw new Error(message);
  }
  return data;
}

function show(view) {
  document.querySelectorAll(".view").forEach((node) => { node.hidden = node.id !== "view-" + view; });
  document.querySelectorAll("nav button").forEach((node) => {
    node.classList.toggle("active", node.dataset.view === view);
  });
  if (view === "store") loadStore();
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
        link.addEventListener("click", () => showMemory(source));
        detail.appendChild(link);
      });
    } else {
      detail.textContent = typeof value === "object" ? JSON.stringify(value) : String(value);
    }
    list.append(term, detail);
  }
  $("#memory").replaceChildren(list);
}

document.querySelectorAll("nav button").forEach((node) => node.addEventListener("click", () => show(node.dataset.view)));
$("#key").value = sessionStorage.getItem("ctxwarden-key") || "";
$("#key").addEventListener("change", (event) => sessionStorage.setItem("ctxwarden-key", event.target.value));
$("#context-form").addEventListener("submit", assemble);
$("#search-form").addEventListener("submit", search);
$("#memory-form").addEventListener("submit", (event) => {
  event.preventDefault();
  showMemory(new FormData(event.target).get("id"));
});
const start = new URLSearchParams(location.search).get("view");
if (start) show(start);

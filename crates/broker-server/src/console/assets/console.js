// The broker's console: a read-only view of topics, groups, dead letters and the cluster,
// drawn from the server's JSON API (/api/...). Every value from the broker is put in the page
// as text (never as markup), and the page refreshes what it shows every few seconds.
"use strict";

const REFRESH_MS = 5000;
const PALETTE = ["#2f6fdb", "#d9822b", "#2e9e6a", "#b0413e", "#7a5cc7", "#5a6b7d"];

/** Thrown by api() when the broker asks for its auth token. */
class SignInNeeded extends Error {}

/** An element: `attrs` sets attributes (and `class`), `children` are nodes or text. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An SVG element. */
function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  return node;
}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) throw new SignInNeeded();
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON: reported below */ }
  if (!response.ok) {
    const error = new Error((body && body.error) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

const number = (n) => Number(n).toLocaleString("en-US");
/** `n` and the noun it counts, singular for one. */
const counted = (n, one, many) => `${number(n)} ${Number(n) === 1 ? one : many}`;
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(n), unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}
const time = (ms) => (ms > 0 ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "—");
const topicLink = (name) => el("a", { href: `#/topic/${encodeURIComponent(name)}`, "data-topic": name }, name);
const cell = (value, attrs) => el("td", attrs, value);
const numCell = (value) => el("td", { class: "num" }, number(value));

function table(id, headings, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", h.num ? { class: "num" } : {}, h.label || h)))),
    el("tbody", {}, rows));
}

/** A search box and pager above a list; `load(search, page)` fills `body`. */
function listPage(title, searchLabel, load) {
  const search = el("input", { type: "search", id: "search", placeholder: searchLabel, "aria-label": searchLabel });
  const body = el("div", { id: "list" });
  const pager = el("span", { class: "pager" });
  let page = 1;
  let typing = null;
  let asked = 0; // Only the answer to the latest ask is shown, whatever order answers come in.
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { page = 1; update(); }, 250);
  });
  async function update() {
    const ask = ++asked;
    const answer = await load(search.value, page);
    if (ask !== asked) return;
    const pages = Math.max(1, Math.ceil(answer.total / answer.per_page));
    const previous = el("button", { type: "button", id: "previous", disabled: page <= 1 }, "‹ Previous");
    const next = el("button", { type: "button", id: "next", disabled: page >= pages }, "Next ›");
    previous.addEventListener("click", () => { page -= 1; update(); });
    next.addEventListener("click", () => { page += 1; update(); });
    pager.replaceChildren(previous, el("span", { id: "page-of" }, `page ${page} of ${pages} (${number(answer.total)} in all)`), next);
    body.replaceChildren(answer.view);
  }
  return { nodes: [el("h1", {}, title), el("div", { class: "toolbar" }, search, pager), body], update };
}

function topicsPage() {
  return listPage("Topics", "Search topics", async (search, page) => {
    const answer = await api(`/api/topics?q=${encodeURIComponent(search)}&page=${page}`);
    const rows = answer.items.map((t) => el("tr", { "data-row": t.name },
      cell(topicLink(t.name)), numCell(t.partitions), numCell(t.records), cell(bytes(t.bytes), { class: "num" }),
      numCell(t.groups), numCell(t.lag), cell(t.settings),
      cell(t.dead_letter_for.length ? el("span", { class: "badge" }, `dead-letter topic of ${t.dead_letter_for.join(", ")}`) : "")));
    const view = answer.total === 0 && !search
      ? el("p", { class: "muted", id: "empty" }, "No topics yet: create one with ", el("code", {}, "broker create TOPIC"), ".")
      : table("topics", ["Topic", { label: "Partitions", num: 1 }, { label: "Records", num: 1 }, { label: "Retained", num: 1 },
        { label: "Groups", num: 1 }, { label: "Lag", num: 1 }, "Retention", ""], rows);
    return { total: answer.total, per_page: answer.per_page, view };
  });
}

function groupsPage() {
  return listPage("Consumer groups", "Search topics and groups", async (search, page) => {
    const answer = await api(`/api/groups?q=${encodeURIComponent(search)}&page=${page}`);
    const rows = answer.items.map((g) => el("tr", { "data-row": `${g.topic}/${g.group}` },
      cell(topicLink(g.topic)), cell(g.group), numCell(g.members), numCell(g.lag), numCell(g.in_flight),
      cell(g.dead_letter ? topicLink(g.dead_letter) : "")));
    const view = table("groups", ["Topic", "Group", { label: "Members", num: 1 }, { label: "Lag", num: 1 },
      { label: "In flight", num: 1 }, "Dead-letter topic"], rows);
    return { total: answer.total, per_page: answer.per_page, view };
  });
}

function deadLettersPage() {
  const body = el("div", {});
  async function update() {
    const rows = await api("/api/dead-letters");
    body.replaceChildren(rows.length === 0
      ? el("p", { class: "muted", id: "empty" }, "No group sends records to a dead-letter topic.")
      : table("dead-letters", ["Dead-letter topic", { label: "Records", num: 1 }, { label: "Retained", num: 1 }, "Groups sending to it"],
        rows.map((d) => el("tr", { "data-row": d.topic }, cell(topicLink(d.topic)), numCell(d.records),
          cell(bytes(d.bytes), { class: "num" }), cell(d.groups.join(", "))))));
  }
  return { nodes: [el("h1", {}, "Dead-letter topics"), body], update };
}

/** A line chart of `series` ([{name, points: [[ms, value]]}]) over the last minutes. */
function lineChart(id, title, series, unit, none) {
  const width = 520, height = 170, left = 56, bottom = 22, top = 10;
  const all = series.flatMap((s) => s.points);
  const chart = el("div", { class: "chart", id });
  chart.append(el("div", {}, el("strong", {}, title)));
  if (series.length === 0) {
    chart.append(el("p", { class: "muted" }, none));
    return chart;
  }
  if (all.length < 2) {
    chart.append(el("p", { class: "muted" }, "Samples come every few seconds: the chart fills in."));
    return chart;
  }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const max = Math.max(1, ...all.map((p) => p[1]));
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (width - left - 8);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  const plot = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  plot.append(svg("line", { x1: left, y1: y(0), x2: width - 8, y2: y(0), stroke: "#dde1e8" }));
  for (const [value, label] of [[max, number(Math.round(max))], [0, "0"]]) {
    const text = svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end", "font-size": 11, fill: "#687083" });
    text.textContent = label;
    plot.append(text);
  }
  const span = svg("text", { x: left, y: height - 5, "font-size": 11, fill: "#687083" });
  span.textContent = `last ${Math.max(1, Math.round((t1 - t0) / 60000))} min · ${unit}`;
  plot.append(span);
  series.forEach((s, i) => {
    if (s.points.length < 1) return;
    plot.append(svg("polyline", {
      fill: "none", stroke: PALETTE[i % PALETTE.length], "stroke-width": 2,
      points: s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "),
    }));
  });
  chart.append(plot);
  chart.append(el("div", { class: "legend" }, series.map((s, i) => {
    // Through the style object: the page's policy refuses style attributes.
    const key = el("span", {}, `■ ${s.name} `);
    key.style.color = PALETTE[i % PALETTE.length];
    return key;
  })));
  return chart;
}

/** A series' samples with their times: the series ends with the history. */
function aligned(times, values) {
  const offset = times.length - values.length;
  return values.map((v, i) => [times[offset + i], v]);
}

/** Records per second between consecutive samples of a topic's end offsets. */
function rates(points) {
  const out = [];
  for (let i = 1; i < points.length; i += 1) {
    const seconds = (points[i][0] - points[i - 1][0]) / 1000;
    if (seconds > 0) out.push([points[i][0], Math.max(0, (points[i][1] - points[i - 1][1]) / seconds)]);
  }
  return out;
}

function topicPage(name) {
  const header = el("div", {});
  const charts = el("div", { class: "charts" });
  const partitions = el("div", {});
  const groups = el("div", {});
  const partitionChoice = el("select", { id: "partition", "aria-label": "Partition" });
  const showAs = el("select", { id: "show-as", "aria-label": "Show payloads as" },
    el("option", { value: "text" }, "as text"), el("option", { value: "hex" }, "as hex"));
  const records = el("div", { id: "records-view" });
  const recordsSection = el("section", {}, el("h2", {}, "Latest records"),
    el("div", { class: "toolbar" }, partitionChoice, showAs), records);
  const asked = 20;
  let chosen = 0;
  let known = -1;
  partitionChoice.addEventListener("change", () => { chosen = Number(partitionChoice.value); loadRecords(); });
  showAs.addEventListener("change", () => loadRecords());

  const shownBytes = (shown) => {
    if (!shown) return el("span", { class: "muted" }, "none");
    const asText = showAs.value === "text" && shown.text !== null;
    return el("div", {},
      showAs.value === "text" && !asText ? el("div", { class: "muted" }, "binary, as hex:") : null,
      el("pre", {}, asText ? shown.text : shown.hex),
      shown.cut ? el("div", { class: "muted" }, `the first 4 KiB of ${number(shown.size)} bytes`) : null);
  };

  async function loadRecords() {
    const answer = await api(`/api/records?topic=${encodeURIComponent(name)}&partition=${chosen}&limit=${asked}`);
    const rows = answer.records.slice().reverse().map((r) => el("tr", { "data-offset": r.offset },
      numCell(r.offset), cell(time(r.timestamp_ms)), cell(shownBytes(r.key)), cell(shownBytes(r.payload)),
      cell(r.headers.length ? el("pre", {}, r.headers.map((h) => `${h.name}: ${h.value ? (showAs.value === "text" && h.value.text !== null ? h.value.text : h.value.hex) : "(no value)"}`).join("\n")) : "")));
    const retained = answer.end_offset - answer.start_offset;
    const caption = retained > 0
      ? `Partition ${answer.partition} retains offsets ${number(answer.start_offset)} to ${number(answer.end_offset - 1)}; the latest ${answer.records.length}, newest first${answer.records.length < Math.min(asked, retained) ? " (as many as fit in 1 MiB)" : ""}.`
      : `Partition ${answer.partition} retains no records; the next gets offset ${number(answer.end_offset)}.`;
    records.replaceChildren(
      el("p", { class: "muted", id: "records-caption" }, caption),
      answer.records.length === 0 ? el("p", { class: "muted", id: "no-records" }, "No records retained.")
        : table("records", [{ label: "Offset", num: 1 }, "Time", "Key", "Payload", "Headers"], rows));
  }

  async function update() {
    let t;
    try {
      t = await api(`/api/topic?name=${encodeURIComponent(name)}`);
    } catch (error) {
      if (error.status !== 404) throw error;
      header.replaceChildren(el("h1", {}, `Topic ${name}`),
        el("p", { class: "error", id: "no-topic" }, "The broker has no topic of this name (it may have been deleted)."));
      charts.replaceChildren();
      partitions.replaceChildren();
      groups.replaceChildren();
      recordsSection.hidden = true;
      return;
    }
    recordsSection.hidden = false;
    header.replaceChildren(el("h1", {}, `Topic ${t.name}`),
      el("p", { id: "topic-settings" }, `${t.settings} · key hash ${t.key_hash} · ${bytes(t.retained_bytes)} retained`),
      t.dead_letter_for.length ? el("p", {}, el("span", { class: "badge" }, `dead-letter topic of ${t.dead_letter_for.join(", ")}`)) : "");
    const h = t.history;
    charts.replaceChildren(
      lineChart("throughput-chart", "Records published per second", [{ name: t.name, points: rates(aligned(h.times, h.ends)) }], "records/s"),
      lineChart("lag-chart", "Lag of each group", h.lags.map(([group, values]) => ({ name: group, points: aligned(h.times, values) })), "records",
        "No group consumes this topic."));
    partitions.replaceChildren(el("h2", {}, "Partitions"), table("partitions",
      [{ label: "Partition", num: 1 }, { label: "Earliest", num: 1 }, { label: "End", num: 1 }, { label: "Records", num: 1 }, { label: "Retained", num: 1 }, "Oldest record"],
      t.partitions.map((p) => el("tr", { "data-partition": p.partition }, numCell(p.partition), numCell(p.earliest_offset),
        numCell(p.end_offset), numCell(p.records), cell(bytes(p.retained_bytes), { class: "num" }), cell(time(p.earliest_timestamp_ms || 0))))));
    groups.replaceChildren(el("h2", {}, `Groups (${t.groups.length})`), ...t.groups.map((g) => el("section", { "data-group": g.name },
      el("h3", {}, g.name, " ", el("span", { class: "muted" }, `${g.assignor} · ${g.settings}`)),
      g.dead_letter ? el("p", {}, "Records past their last delivery go to ", topicLink(g.dead_letter), ".") : null,
      el("p", {}, g.members.length ? `Members: ${g.members.map((m) => `${m.member} (partitions ${m.partitions.join(", ") || "none"})`).join("; ")}` : "No members."),
      table(`group-${g.name}`, [{ label: "Partition", num: 1 }, "Owner", { label: "Committed", num: 1 }, { label: "Position", num: 1 },
        { label: "In flight", num: 1 }, { label: "Lag", num: 1 }, { label: "Deliveries", num: 1 }],
      g.partitions.map((p) => el("tr", { "data-partition": p.partition }, numCell(p.partition), cell(p.owner || "—"), numCell(p.committed),
        numCell(p.position), cell(p.in_flight === null ? "—" : number(p.in_flight), { class: "num" }), numCell(p.lag), numCell(p.deliveries)))))));
    if (known !== t.partitions.length) {
      known = t.partitions.length;
      partitionChoice.replaceChildren(...t.partitions.map((p) => el("option", { value: p.partition }, `partition ${p.partition}`)));
      partitionChoice.value = String(Math.min(chosen, known - 1));
    }
    await loadRecords();
  }
  return { nodes: [header, charts, partitions, groups, recordsSection], update };
}

function missingPage() {
  return {
    nodes: [el("h1", {}, "No such page"), el("p", {}, "See ", el("a", { href: "#/" }, "the topics"), ".")],
    update: async () => {},
  };
}

function clusterPage() {
  const body = el("div", {});
  async function update() {
    const c = await api("/api/cluster");
    if (!c.cluster) {
      body.replaceChildren(el("p", { id: "alone" }, `This server runs alone, not as a node of a cluster; its topics are held by ${counted(c.shards, "shard", "shards")}.`));
      return;
    }
    const s = c.cluster;
    body.replaceChildren(
      el("p", { id: "this-node" }, `Node ${s.node_id} · ${s.role} of the first group · term ${s.term} · leader ${s.leader ?? "none known"}`),
      el("h2", {}, "Nodes"),
      table("nodes", [{ label: "Node", num: 1 }, "Clients reach it at", "Peers reach it at", "Votes", "Reachable", { label: "Log index held", num: 1 }],
        s.members.map((m) => el("tr", { "data-node": m.node_id }, numCell(m.node_id), cell(m.client_addr), cell(m.peer_addr),
          cell(m.voter ? "yes" : "no (learner)"), cell(m.reachable ? "yes" : "no", m.reachable ? {} : { class: "error" }),
          cell(m.matched_index === null ? "—" : number(m.matched_index), { class: "num" })))),
      el("h2", {}, "Raft groups held by this node"),
      table("raft-groups", [{ label: "Group", num: 1 }, { label: "Leader", num: 1 }, "This node", { label: "Term", num: 1 }, "Voters", { label: "Topics", num: 1 }],
        c.groups.map((g) => el("tr", { "data-group": g.group }, numCell(g.group), cell(g.status.leader ?? "none", { class: "num" }), cell(g.status.role),
          numCell(g.status.term), cell(g.status.members.filter((m) => m.voter).map((m) => m.node_id).join(", ")), numCell(g.topics.length)))));
  }
  return { nodes: [el("h1", {}, "Cluster"), body], update };
}

let mounted = null;
let timer = null;

let updatedAt = null;

function showError(error) {
  const alert = document.getElementById("alert");
  if (error instanceof SignInNeeded) {
    document.getElementById("sign-in").hidden = false;
    document.getElementById("page").hidden = true;
    document.getElementById("status").textContent = "";
    document.getElementById("summary").textContent = "";
    document.getElementById("sign-out").hidden = true;
    alert.hidden = true;
    return;
  }
  alert.textContent = `Could not load: ${error.message.replace(/\.$/, "")}.${updatedAt ? ` What the page shows is from ${updatedAt}.` : ""}`;
  alert.hidden = false;
}

async function refresh(page) {
  try {
    await page.update();
    if (page !== mounted) return;
    updatedAt = new Date().toLocaleTimeString();
    const o = await api("/api/overview");
    document.getElementById("alert").hidden = true;
    document.getElementById("status").textContent = `Updated ${updatedAt}; refreshed every ${REFRESH_MS / 1000} s.`;
    document.getElementById("summary").textContent =
      `${counted(o.topics, "topic", "topics")} · ${counted(o.partitions, "partition", "partitions")} · ${counted(o.records, "record", "records")} · ${counted(o.groups, "group", "groups")}${o.node_id !== null ? ` · node ${o.node_id}` : ""} · v${o.version}`;
    document.getElementById("sign-out").hidden = !o.auth;
  } catch (error) {
    if (page === mounted) showError(error);
  }
}

function mount() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  let page, key;
  if (hash.startsWith("/topic/") && hash.length > "/topic/".length) { page = topicPage(hash.slice("/topic/".length)); key = "topics"; }
  else if (hash === "/groups") { page = groupsPage(); key = "groups"; }
  else if (hash === "/dead-letters") { page = deadLettersPage(); key = "dead-letters"; }
  else if (hash === "/cluster") { page = clusterPage(); key = "cluster"; }
  else if (hash === "/") { page = topicsPage(); key = "topics"; }
  else { page = missingPage(); key = ""; }
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.page === key);
  document.getElementById("sign-in").hidden = true;
  document.getElementById("alert").hidden = true;
  document.getElementById("page").hidden = false;
  document.getElementById("page").replaceChildren(...page.nodes);
  mounted = page;
  updatedAt = null;
  clearInterval(timer);
  refresh(page);
  timer = setInterval(() => refresh(page), REFRESH_MS);
}

document.getElementById("sign-in").addEventListener("submit", async (event) => {
  event.preventDefault();
  const response = await fetch("/api/login", { method: "POST", credentials: "same-origin", body: document.getElementById("token").value });
  if (response.ok) {
    document.getElementById("token").value = "";
    document.getElementById("sign-in-error").textContent = "";
    mount();
  } else {
    document.getElementById("sign-in-error").textContent = "That is not the broker's auth token.";
  }
});
document.getElementById("sign-out").addEventListener("click", async () => {
  await fetch("/api/logout", { method: "POST", credentials: "same-origin" });
  mount();
});
window.addEventListener("hashchange", mount);
mount();

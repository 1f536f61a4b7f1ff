// Pulse's console: one page of plain modules over the public HTTP API (/v1), with the
// caller's own token. It builds every element with the DOM (text is never parsed as
// HTML: a memory's content is whatever an agent wrote), keeps the token in this tab's
// sessionStorage and sends it only as an Authorization header; the page's state lives in
// the URL's hash (#/route?at=...), which no request carries.
import cytoscape from "./vendor/cytoscape-3.34.4.esm.min.js";

const TOKEN_KEY = "pulse.console.token";
const KINDS = ["Generic", "Fact", "Solution", "Difficulty", "ErrorPattern", "SuccessPattern",
  "UserPreference", "ArchitecturalDecision", "TechInsight"];
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// an event's bookkeeping, left out where the console shows what an event changed
const BOOKKEEPING = new Set(["type", "experience_id", "collective_id", "event_id",
  "instance_id", "hlc", "author_owner", "author_agent", "embedding", "content"]);

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  me: null,          // whoami: owner_id, agent_id, scope, collectives, operator
  at: null,          // ISO 8601 time every read is made as of; null: now
  earliest: null,    // the slider's left end (ms): the oldest collective seen
  renders: 0,        // the latest render's number: an older one's answer is dropped
  stops: [],         // what the page shown runs (its live stream, timers): stopped on leaving
  path: null,        // the route shown (without its query)
};
const $ = (id) => document.getElementById(id);
const main = $("main");

// -- the API --------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(name, body = {}, said = null) {
  const response = await fetch(`/v1/${name}`, {
    method: "POST",
    headers: { "Authorization": `Bearer ${state.token}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { message: text.slice(0, 200) }; }
  if (response.status === 401) {
    signOut((data && data.message) || "the token was refused");
  }
  if (!response.ok) throw new ApiError(response.status, data);
  if (said) said.headers = response.headers;  // (what a record did: Pulse-Outcome)
  return data;
}

// a getter's answer, or null when there is none the caller may see (404)
async function maybe(name, body) {
  try {
    return await api(name, body);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return null;
    throw error;
  }
}

// a read's body, as of the moment chosen (every read that takes as_of)
function past(body) {
  return state.at ? { ...body, as_of: state.at } : body;
}

// a read-only query over the SQL views (the caller's own filtered views): the rows as
// objects. Values put in the text are ids, checked against UUID's shape first.
async function sql(query, limit = 1000, { present = false } = {}) {
  const result = await api("sql", present ? { query, limit } : past({ query, limit }));
  return result.rows.map((row) => Object.fromEntries(result.columns.map((c, i) => [c, row[i]])));
}

function checkedId(id, what) {
  if (!UUID.test(id || "")) throw new ApiError(422, { message: `${what}: not an id: ${String(id).slice(0, 60)}` });
  return id.toLowerCase();
}

// write controls: for a write or admin token, in the present, in a collective it is a
// member of (its owner's, and not limited to others; an admin: any); the service checks
// every action anyway, this only keeps the page from offering what it would refuse
function mayWrite(collective) {
  const me = state.me;
  if (!me || me.scope === "read" || state.at) return false;
  if (me.scope === "admin") return true;
  return Boolean(collective) && collective.owner_id === me.owner_id &&
    (!me.collectives.length || me.collectives.includes(collective.collective_id));
}
const isAdmin = () => state.me && state.me.scope === "admin";

// -- elements -------------------------------------------------------------------------------

function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children) el.append(child instanceof Node ? child : String(child));
  return el;
}

const fixed = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : "—");
const when = (ms) => (ms == null ? "—" : new Date(ms).toLocaleString());
const tags = (list) => (list || []).map((t) => h("span", { class: "tag" }, t));
const short = (text, n = 140) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);
// a time the SQL views answer (UTC, no zone) in ms
const sqlTime = (text) => (text ? Date.parse(`${text.replace(" ", "T")}Z`) : null);

function card(title, ...body) {
  return h("section", { class: "card" }, title ? h("h2", null, title) : null, ...body);
}

function stat(label, value) {
  return h("div", { class: "stat", dataset: { stat: label } }, h("b", null, value ?? "—"), h("span", null, label));
}

function table(headers, rows, attrs) {
  return h("table", attrs,
    h("thead", null, h("tr", null, headers.map((x) => h("th", { class: /^(#|score|relevance|energy|count|experiences|relations|insights|applications|active|events)$/.test(x) ? "num" : null }, x)))),
    h("tbody", null, rows));
}

function experienceLink(e, text) {
  return h("a", { href: hashOf(`/e/${e.experience_id}`), dataset: { experience: e.experience_id } }, text ?? short(e.content));
}

function bar(value, kind) {
  const width = Math.max(1, Math.round(Math.min(1, Math.max(0, value || 0)) * 60));
  return h("span", { class: `bar ${kind || ""}`, dataset: { width } });
}

// bars are sized through the CSSOM (a style attribute in markup: the policy refuses it)
function sizeBars(root) {
  for (const el of root.querySelectorAll(".bar[data-width]")) el.style.width = `${el.dataset.width}px`;
}

// -- routes ---------------------------------------------------------------------------------

function route() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean), query: new URLSearchParams(query || "") };
}

// a link to a page, keeping the moment chosen
function hashOf(path, params) {
  const query = new URLSearchParams(params || {});
  for (const [key, value] of [...query]) if (value === "" || value == null) query.delete(key);
  if (state.at) query.set("at", state.at);
  const text = query.toString();
  return `#${path}${text ? `?${text}` : ""}`;
}

const PAGES = {
  "": ["collectives", collectivesPage],
  c: ["collective", collectivePage],
  recall: ["recall", recallPage],
  e: ["experience", experiencePage],
  hosts: ["hosts", hostsPage],
};

function stopAll(stops) {
  for (const stop of stops.splice(0)) stop();
}

async function render() {
  stopAll(state.stops);
  // what this render's page starts goes in a list of its own: a render overtaken by a
  // later one (a click while it loaded) stops its own, never another page's
  const stops = [];
  state.stops = stops;
  const { parts, query } = route();
  state.at = query.get("at") || null;
  showMoment();
  const number = ++state.renders;
  const [name, page] = PAGES[parts[0] || ""] || PAGES[""];
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.nav === name || (name === "collective" && a.dataset.nav === "collectives"));
  main.dataset.state = "loading";
  main.dataset.page = name;
  const started = performance.now();
  try {
    const shown = await page(parts[1], query, stops);
    if (number !== state.renders) { stopAll(stops); return; }
    main.replaceChildren(shown.node || shown);
    const path = parts.join("/");
    if (path !== state.path) window.scrollTo(0, 0);  // (a new page; a new moment stays put)
    state.path = path;
    sizeBars(main);
    if (shown.mounted) await shown.mounted(stops);
    if (number !== state.renders) { stopAll(stops); return; }
    main.dataset.took = (performance.now() - started).toFixed(1);
    main.dataset.state = "ready";
  } catch (error) {
    stopAll(stops);
    if (number !== state.renders || !state.me) return;  // (a refused token: signed out)
    main.replaceChildren(card("Could not show this page", h("p", { class: "error", role: "alert" }, error.message)));
    main.dataset.state = "error";
    if (!(error instanceof ApiError)) console.error(error);
  }
}

// -- time travel ----------------------------------------------------------------------------

function localInput(ms) {
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:` +
    `${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function sliderRange() {
  const now = Date.now();
  const earliest = state.earliest && state.earliest < now ? state.earliest : now - 7 * 86400e3;
  return [earliest, now];
}

function showMoment() {
  for (const a of document.querySelectorAll("a[data-route]")) a.href = hashOf(a.dataset.route);
  const [from, to] = sliderRange();
  const slider = $("at-slider");
  const at = state.at ? Date.parse(state.at) : to;
  slider.value = String(Math.round(((Math.min(Math.max(at, from), to) - from) / (to - from || 1)) * 1000));
  $("at").value = state.at ? localInput(at) : "";
  const banner = $("past");
  banner.hidden = !state.at;
  banner.replaceChildren(...(state.at ? [
    `The memory as of ${new Date(at).toLocaleString()} (${state.at}). Writes are off; activity, sessions and hosts are the present's. `,
    h("a", { href: "#", id: "back-to-now", onclick: (event) => { event.preventDefault(); moveTo(null); } }, "Back to now"),
  ] : []));
}

function moveTo(ms) {
  const { parts, query } = route();
  if (ms == null) query.delete("at");
  else query.set("at", new Date(ms).toISOString());
  const text = query.toString();
  location.hash = `#/${parts.join("/")}${text ? `?${text}` : ""}`;
}

function sliderMs() {
  const [from, to] = sliderRange();
  return Math.round(from + (Number($("at-slider").value) / 1000) * (to - from));
}

$("at-slider").addEventListener("input", () => { $("at").value = localInput(sliderMs()); });
$("at-slider").addEventListener("change", () => {
  const value = Number($("at-slider").value);
  moveTo(value >= 1000 ? null : sliderMs());
});
$("at").addEventListener("change", () => {
  const value = $("at").value;
  if (!value) { moveTo(null); return; }
  const ms = new Date(value).getTime();  // (a datetime-local value is the local time)
  if (!Number.isNaN(ms)) moveTo(ms);
});
$("at-now").addEventListener("click", () => moveTo(null));
$("when").addEventListener("submit", (event) => event.preventDefault());

// -- sign-in --------------------------------------------------------------------------------

function signOut(message) {
  stopAll(state.stops);
  state.token = null;
  state.me = null;
  sessionStorage.removeItem(TOKEN_KEY);
  for (const id of ["nav", "when", "who", "past"]) $(id).hidden = true;
  main.replaceChildren();
  main.dataset.state = "signed-out";
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
  $("token").value = "";
  $("token").focus();
}

async function signIn(token) {
  state.token = token;
  try {
    state.me = await api("whoami");
  } catch (error) {
    signOut(error.message);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $("sign-in").hidden = true;
  for (const id of ["nav", "when", "who"]) $(id).hidden = false;
  for (const el of document.querySelectorAll("[data-admin]")) el.hidden = !isAdmin();
  const me = state.me;
  $("me").textContent = `${me.operator ? "operator" : me.owner_id}${me.agent_id ? `/${me.agent_id}` : ""} · ${me.scope}`;
  document.body.dataset.scope = me.scope;
  await render();
}

$("sign-in-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";
  if (token) signIn(token);
});
$("sign-out").addEventListener("click", () => signOut(""));
window.addEventListener("hashchange", () => { if (state.me) render(); });

// -- collectives ----------------------------------------------------------------------------

async function collectivesPage() {
  const page = await api("list_collectives", past({ limit: 100 }));
  const rows = await Promise.all(page.items.map(async (c) => {
    const [stats, agents] = await Promise.all([
      api("get_collective_stats", past({ collective_id: c.collective_id })),
      state.at ? null : api("get_active_agents", { collective_id: c.collective_id, limit: 100 }),
    ]);
    return { c, stats, agents };
  }));
  const created = page.items.map((c) => c.created_ms).filter((x) => x);
  if (created.length) state.earliest = Math.min(state.earliest || Infinity, ...created);
  showMoment();
  return h("div", null,
    h("h1", null, "Collectives"),
    card(null,
      rows.length ? table(
        ["name", "owner", "embedder", "language", "experiences", "relations", "insights", "applications", "active", "created"],
        rows.map(({ c, stats, agents }) => h("tr", { dataset: { collective: c.collective_id } },
          h("td", null, h("a", { href: hashOf(`/c/${c.collective_id}`) }, c.name)),
          h("td", null, c.owner_id), h("td", null, c.embedder || "vectors given"), h("td", null, c.language),
          h("td", { class: "num" }, stats.experiences), h("td", { class: "num" }, stats.relations),
          h("td", { class: "num" }, stats.insights), h("td", { class: "num" }, stats.applications),
          h("td", { class: "num" }, agents ? agents.items.length : "—"),
          h("td", null, when(c.created_ms)))),
        { id: "collectives" },
      ) : h("p", { class: "muted" }, state.at ? "No collective this token may see existed then." : "No collective this token may see yet."),
      page.next ? h("p", { class: "muted" }, "The first 100 are shown.") : null));
}

// -- a collective ---------------------------------------------------------------------------

async function collectivePage(id, query, stops) {
  const collective_id = checkedId(id, "collective");
  const c = await maybe("get_collective", past({ collective_id }));
  if (!c) return card("No such collective", h("p", { class: "muted" }, state.at ? "It did not exist then, or this token may not see it." : "It does not exist, or this token may not see it."));
  state.earliest = Math.min(state.earliest || Infinity, c.created_ms);
  showMoment();
  const present = !state.at;
  const [stats, recent, writers, agents, sessions, tokens] = await Promise.all([
    api("get_collective_stats", past({ collective_id })),
    api("get_recent_experiences", past({ collective_id, limit: 20 })),
    sql(`SELECT source_agent, count(*) AS n FROM experiences WHERE collective_id = '${collective_id}' GROUP BY source_agent ORDER BY n DESC, source_agent LIMIT 20`, 20),
    present ? api("get_active_agents", { collective_id, limit: 50 }) : null,
    present ? api("list_sessions", { collective_id, open_only: true, limit: 50 }) : null,
    isAdmin() ? api("list_tokens", { owner_id: c.owner_id }) : null,
  ]);
  const members = tokens ? tokens.filter((t) => !t.collectives.length || t.collectives.includes(collective_id)) : null;
  const feed = h("ul", { class: "plain feed", id: "feed", dataset: { live: present ? "connecting" : "off" } });
  const agentList = h("ul", { class: "plain", id: "agents" });
  const sessionList = h("ul", { class: "plain", id: "sessions" });
  const showPresence = (a, s) => {
    agentList.replaceChildren(...(a.items.length ? a.items.map((x) => h("li", { dataset: { agent: x.agent_id } },
      h("b", null, x.agent_id), " ", x.task_description, h("div", { class: "muted" }, `since ${when(x.started_ms)}, last heard ${when(x.last_heartbeat_ms)}`), tags(x.working_on)))
      : [h("li", { class: "muted" }, "No agent is active.")]));
    sessionList.replaceChildren(...(s.items.length ? s.items.map((x) => h("li", null,
      h("b", null, x.agent_id), " ", short(x.summary || "(no summary)"), h("div", { class: "muted" }, `started ${when(x.started_ms)}`)))
      : [h("li", { class: "muted" }, "No open session.")]));
  };
  if (present) showPresence(agents, sessions);
  const node = h("div", null,
    h("h1", null, c.name, h("span", { class: "muted" }, `  ${c.owner_id}/${c.name}`)),
    h("p", null, h("a", { href: hashOf(`/recall/${collective_id}`), id: "recall-here" }, "Recall in this collective →")),
    card("Stats", h("div", { class: "stats", id: "stats" },
      stat("experiences", stats.experiences), stat("archived", stats.archived), stat("relations", stats.relations),
      stat("insights", stats.insights), stat("applications", stats.applications), stat("invalid", stats.invalid),
      stat("unstable", stats.unstable), stat("dead letters", stats.dead_letters))),
    h("div", { class: "grid" },
      card("Settings", h("dl", { class: "fields" },
        h("dt", null, "id"), h("dd", { class: "mono" }, collective_id),
        h("dt", null, "owner"), h("dd", null, c.owner_id),
        h("dt", null, "embedder"), h("dd", null, c.embedder || "vectors given by callers"),
        h("dt", null, "dimension"), h("dd", null, c.embedding_dimension),
        h("dt", null, "language"), h("dd", null, c.language === "auto" ? "auto: each text its own" : c.language),
        h("dt", null, "duplicates"), h("dd", null, c.on_duplicate === "keep" ? "kept" : `${c.on_duplicate === "reinforce" ? "reinforce" : "linked to"} the one they duplicate (cosine ≥ ${c.duplicate_similarity})`),
        h("dt", null, "created"), h("dd", null, when(c.created_ms)))),
      card("Members",
        h("p", null, "Every principal of ", h("b", null, c.owner_id), " whose token is not limited to other collectives, and every admin."),
        members ? table(["token", "agent", "scope", "expires"], members.map((t) => h("tr", null,
          h("td", { class: "mono" }, t.token_id.slice(0, 13)), h("td", null, t.agent_id || "any"), h("td", null, t.scope), h("td", null, when(t.expires_ms)))))
          : null,
        h("h2", null, "Agents that wrote here"),
        writers.length ? table(["agent", "experiences"], writers.map((w) => h("tr", null, h("td", null, w.source_agent), h("td", { class: "num" }, w.n))))
          : h("p", { class: "muted" }, "None yet."))),
    present ? h("div", { class: "grid" }, card("Active agents", agentList), card("Open sessions", sessionList)) : null,
    present ? card("Live: experiences as they arrive", h("p", { class: "muted" }, "Changes this token may see appear here as this host applies them."), feed) : null,
    mayWrite(c) ? recordForm(collective_id) : null,
    card(`Newest experiences${state.at ? " then" : ""}`, h("ul", { class: "plain", id: "recent" },
      recent.length ? recent.map((e) => h("li", null, experienceLink(e), " ", h("span", { class: "muted" }, `${e.experience_type.kind} · ${when(e.timestamp_ms)}`), " ", tags(e.domain)))
        : h("li", { class: "muted" }, "None."))));
  if (present) {
    const timer = setInterval(async () => {
      try {
        const [a, s] = await Promise.all([api("get_active_agents", { collective_id, limit: 50 }), api("list_sessions", { collective_id, open_only: true, limit: 50 })]);
        showPresence(a, s);
      } catch { /* the next tick tries again */ }
    }, 3000);
    stops.push(() => clearInterval(timer));
    watch((change) => arrived(change, collective_id, feed).catch(() => {}), feed, stops);
  }
  return node;
}

function recordForm(collective_id) {
  const result = h("p", { id: "recorded", role: "status" });
  const form = h("form", { class: "stacked", id: "record-form" },
    h("label", null, "content", h("textarea", { name: "content", rows: 3, required: true, maxlength: 102400 })),
    h("label", null, "domain tags (comma-separated)", h("input", { name: "domain" })),
    h("label", null, "importance (0..1)", h("input", { name: "importance", type: "number", min: 0, max: 1, step: 0.05, value: 0.5 })),
    h("label", null, "visible to", h("select", { name: "visibility" },
      h("option", { value: "team", selected: true }, "the collective's members (team)"),
      h("option", { value: "private" }, "its author only (private)"),
      h("option", { value: "org" }, "everyone in the deployment (org)"))),
    h("div", null, h("button", { class: "primary", type: "submit" }, "Record")), result);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const domain = String(data.get("domain") || "").split(",").map((t) => t.trim()).filter(Boolean);
    try {
      const said = {};
      const id = await api("record_experience", {
        collective_id, content: String(data.get("content")),
        ...(data.get("importance") === "" ? {} : { importance: Number(data.get("importance")) }),
        visibility: String(data.get("visibility")),
        ...(domain.length ? { domain } : {}),
      }, said);
      const outcome = (said.headers && said.headers.get("Pulse-Outcome")) || "recorded";
      const words = { recorded: "Recorded ", reinforced: "A duplicate: reinforced ", linked: "Recorded, and linked to the one it duplicates: " };
      result.className = "good";
      result.replaceChildren(words[outcome] || "Recorded ", h("a", { href: hashOf(`/e/${id}`) }, id));
      form.reset();
    } catch (error) {
      result.className = "error";
      result.textContent = error.message;
    }
  });
  return card("Record an experience", form);
}

async function arrived(change, collective_id, feed) {
  if (change.collective_id !== collective_id) return;
  const e = await maybe("get_experience", { experience_id: change.experience_id });
  if (!e && change.kind !== "deleted") return;  // (gone already, or not the caller's to see)
  const item = h("li", { dataset: { experience: change.experience_id, kind: change.kind } },
    h("span", { class: "tag" }, change.kind), " ",
    e ? experienceLink(e) : h("span", { class: "muted" }, change.experience_id),
    " ", h("span", { class: "muted" }, new Date().toLocaleTimeString()));
  feed.prepend(item);
  while (feed.children.length > 50) feed.lastChild.remove();
}

// the changes to experiences as this host applies them (server-sent events, read with
// fetch so that the token goes in a header, never in the URL as EventSource would need)
function watch(onChange, status, stops) {
  const controller = new AbortController();
  stops.push(() => controller.abort());
  const said = (text) => {
    status.prepend(h("li", { class: "error", role: "status" }, text));
  };
  (async () => {
    for (let attempt = 0; !controller.signal.aborted; attempt++) {
      let ended;
      try {
        ended = await follow(onChange, status, controller.signal);
      } catch (error) {
        if (controller.signal.aborted) return;
        ended = error.status === 503 ? "busy" : "failed";
        if (error.status === 401) ended = "unauthorized";
      }
      status.dataset.live = ended;
      if (ended === "unauthorized") { signOut("the token was refused"); return; }
      const wait = Math.min(30, 2 ** attempt) * 1000;
      said(`The live stream ${ended === "busy" ? "was refused (too many open)" : ended === "overflow" ? "fell behind" : "ended"}; reconnecting in ${wait / 1000} s. Changes meanwhile are not shown here.`);
      await new Promise((done) => { const t = setTimeout(done, wait); stops.push(() => clearTimeout(t)); });
    }
  })();
}

// one watch stream read to its end: how it ended ("overflow", "unauthorized", "ended")
async function follow(onChange, status, signal) {
  const response = await fetch("/v1/watch_experiences", {
    headers: { "Authorization": `Bearer ${state.token}`, "Accept": "text/event-stream" },
    cache: "no-store", credentials: "omit", signal,
  });
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return "ended";
    buffer += value;
    status.dataset.live = "open";
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (!data) continue;
      if (kind !== "message") return kind;
      onChange(JSON.parse(data));
    }
  }
}

// -- recall ---------------------------------------------------------------------------------

async function recallPage(id, query) {
  const page = await api("list_collectives", past({ limit: 100 }));
  const collective_id = id ? checkedId(id, "collective") : page.items[0] && page.items[0].collective_id;
  const q = query.get("q") || "";
  const chosen = page.items.find((c) => c.collective_id === collective_id);
  const mode = query.get("mode") || (chosen && !chosen.embedder ? "words" : "both");
  const form = recallForm(page.items, collective_id, q, mode, query);
  const results = h("div", { id: "results" });
  if (collective_id && q) results.append(await recall(collective_id, q, mode, query));
  return h("div", null, h("h1", null, "Recall"), card(null, form), results);
}

function recallForm(collectives, collective_id, q, mode, query) {
  const option = (value, label, chosen) => h("option", { value, selected: chosen }, label);
  const types = new Set((query.get("types") || "").split(",").filter(Boolean));
  const form = h("form", { class: "inline", id: "recall-form" },
    h("label", null, "collective", h("select", { name: "collective" },
      collectives.map((c) => option(c.collective_id, `${c.owner_id}/${c.name}`, c.collective_id === collective_id)))),
    h("label", null, "query or task", h("input", { name: "q", value: q, size: 40, required: true })),
    h("label", null, "by", h("select", { name: "mode" },
      option("both", "meaning and words", mode === "both"), option("meaning", "meaning", mode === "meaning"),
      option("words", "words", mode === "words"), option("context", "context for a task", mode === "context"))),
    h("label", null, "types", h("select", { name: "types", multiple: true, size: 3 },
      KINDS.map((k) => option(k, k, types.has(k))))),
    h("label", null, "domain tags", h("input", { name: "domains", value: query.get("domains") || "", size: 14 })),
    h("label", null, "min importance", h("input", { name: "min_importance", type: "number", min: 0, max: 1, step: 0.05, value: query.get("min_importance") || "" })),
    h("label", null, "recorded since", h("input", { name: "since", type: "datetime-local", value: query.get("since") ? localInput(Number(query.get("since"))) : "" })),
    h("label", null, "k", h("input", { name: "k", type: "number", min: 1, max: 100, value: query.get("k") || 10 })),
    h("label", null, h("span", null, "archived, invalid"), h("span", null,
      h("input", { name: "archived", type: "checkbox", checked: query.get("archived") === "1" }), " ",
      h("input", { name: "invalid", type: "checkbox", checked: query.get("invalid") === "1" }))),
    h("button", { class: "primary", type: "submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const since = data.get("since") ? String(new Date(String(data.get("since"))).getTime()) : "";
    location.hash = hashOf(`/recall/${data.get("collective")}`, {
      q: data.get("q"), mode: data.get("mode"), types: data.getAll("types").join(","),
      domains: data.get("domains"), min_importance: data.get("min_importance"), since,
      k: data.get("k"), archived: data.get("archived") ? "1" : "", invalid: data.get("invalid") ? "1" : "",
    });
  });
  return form;
}

function filterOf(query) {
  const filter = {};
  const types = (query.get("types") || "").split(",").filter(Boolean);
  const domains = (query.get("domains") || "").split(",").map((t) => t.trim()).filter(Boolean);
  if (types.length) filter.experience_types = types;
  if (domains.length) filter.domains = domains;
  if (query.get("min_importance")) filter.min_importance = Number(query.get("min_importance"));
  if (query.get("since")) filter.since_ms = Number(query.get("since"));
  if (query.get("archived") === "1") filter.include_archived = true;
  if (query.get("invalid") === "1") filter.include_invalid = true;
  return filter;
}

async function recall(collective_id, q, mode, query) {
  const k = Math.min(100, Math.max(1, Number(query.get("k")) || 10));
  const flt = filterOf(query);
  const started = performance.now();
  if (mode === "context") {
    const context = await api("get_context_candidates", past({ collective_id, text: q, k, filter: flt }));
    return contextView(context, performance.now() - started);
  }
  const calls = {
    meaning: () => api("search_similar", past({ collective_id, query: q, k, flt })),
    words: () => api("search_text", past({ collective_id, text: q, k, flt })),
    both: () => api("search_hybrid", past({ collective_id, text: q, k, flt })),
  };
  // for "both", the two rankings it fuses, to say where each hit stood in each
  const [hits, byMeaning, byWords] = await Promise.all([
    (calls[mode] || calls.both)(),
    mode === "both" ? calls.meaning() : null,
    mode === "both" ? calls.words() : null,
  ]);
  const took = performance.now() - started;
  const rank = (list, e) => {
    const at = list ? list.findIndex((x) => x.experience.experience_id === e.experience_id) : -1;
    if (at >= 0) return `#${at + 1}`;
    return list && list.length < k ? "no match" : `beyond ${k}`;
  };
  const why = (hit) => {
    const factor = hit.relevance > 0 ? hit.score / hit.relevance : 1;
    const base = mode === "both" ? `relevance ${fixed(hit.relevance, 4)} (meaning ${rank(byMeaning, hit.experience)}, words ${rank(byWords, hit.experience)})`
      : mode === "meaning" ? `similarity ${fixed(hit.relevance, 4)}` : `BM25 ${fixed(hit.relevance, 3)}`;
    return `${base} × energy factor ${fixed(factor, 3)} (energy ${fixed(hit.energy, 2)}: importance, reinforcements, age)`;
  };
  return card(`${hits.length} hits, ${took.toFixed(0)} ms`, hits.length ? table(["#", "experience", "type", "score", "relevance", "energy"],
    hits.map((hit, i) => h("tr", { dataset: { hit: hit.experience.experience_id } },
      h("td", { class: "num" }, i + 1),
      h("td", null, experienceLink(hit.experience), " ", tags(hit.experience.domain), h("div", { class: "why" }, why(hit))),
      h("td", null, hit.experience.experience_type.kind),
      h("td", { class: "num" }, fixed(hit.score, 4)),
      h("td", { class: "num" }, bar(hit.relevance / (hits[0].relevance || 1)), " ", fixed(hit.relevance, 4)),
      h("td", { class: "num" }, bar(hit.energy, "energy"), " ", fixed(hit.energy, 2)))), { id: "hits" })
    : h("p", { class: "muted" }, "Nothing matched."));
}

function contextView(context, took) {
  return h("div", { id: "context" },
    card(`Context, as an agent gets it (${took.toFixed(0)} ms)`,
      h("h2", null, "Similar"), table(["#", "experience", "score", "energy"], context.similar.map((hit, i) => h("tr", { dataset: { hit: hit.experience.experience_id } },
        h("td", { class: "num" }, i + 1), h("td", null, experienceLink(hit.experience)),
        h("td", { class: "num" }, fixed(hit.score, 4)), h("td", { class: "num" }, fixed(hit.energy, 2))))),
      h("h2", null, "Recent"), h("ul", { class: "plain" }, context.recent.map((e) => h("li", null, experienceLink(e), " ", h("span", { class: "muted" }, when(e.timestamp_ms))))),
      h("h2", null, "Insights"), h("ul", { class: "plain" }, context.insights.map((x) => h("li", null, x.insight.content, " ", h("span", { class: "muted" }, `confidence ${fixed(x.insight.confidence, 2)}`)))),
      h("h2", null, "Relations"), h("ul", { class: "plain" }, context.relations.map((r) => h("li", null,
        h("a", { href: hashOf(`/e/${r.source_id}`) }, r.source_id.slice(0, 13)), ` ${r.relation_type} `, h("a", { href: hashOf(`/e/${r.target_id}`) }, r.target_id.slice(0, 13))))),
      h("h2", null, "Active agents"), h("ul", { class: "plain" }, context.active_agents.map((a) => h("li", null, h("b", null, a.agent_id), " ", a.task_description)))));
}

// -- an experience --------------------------------------------------------------------------

async function experiencePage(id) {
  const experience_id = checkedId(id, "experience");
  const e = await maybe("get_experience", past({ experience_id }));
  if (!e) return card("No such experience", h("p", { class: "muted" }, state.at ? "It did not exist then, or this token may not see it." : "It does not exist, or this token may not see it."));
  const [related, history, insights, collective] = await Promise.all([
    api("get_related_experiences", past({ experience_id, limit: 100 })),
    sql(`SELECT seq, written_at, event_type, author_owner, author_agent, instance_id, change FROM history WHERE entity_id = '${experience_id}' ORDER BY seq`, 1000),
    sql(`SELECT i.insight_id, i.content, i.confidence, i.created_at FROM insight_sources s JOIN insights i USING (insight_id) WHERE s.experience_id = '${experience_id}' ORDER BY i.created_at`, 100),
    maybe("get_collective", past({ collective_id: e.collective_id })),
  ]);
  if (collective) { state.earliest = Math.min(state.earliest || Infinity, collective.created_ms); showMoment(); }
  const graph = h("div", { id: "graph", role: "img", "aria-label": "relations of this experience" });
  const nodes = h("ul", { class: "plain", id: "graph-nodes" });
  const typed = Object.entries(e.experience_type).filter(([k]) => k !== "kind");
  const node = h("div", null,
    h("h1", null, e.experience_type.kind, h("span", { class: "muted" }, `  ${collective ? `${collective.owner_id}/${collective.name}` : ""}`)),
    card(null, h("p", { class: "content", id: "content" }, e.content),
      h("dl", { class: "fields", id: "fields" },
        h("dt", null, "id"), h("dd", { class: "mono" }, e.experience_id),
        h("dt", null, "collective"), h("dd", null, h("a", { href: hashOf(`/c/${e.collective_id}`) }, collective ? collective.name : e.collective_id)),
        typed.map(([k, v]) => [h("dt", null, k), h("dd", null, typeof v === "object" ? JSON.stringify(v) : String(v))]),
        h("dt", null, "importance"), h("dd", { dataset: { field: "importance" } }, fixed(e.importance, 2)),
        h("dt", null, "confidence"), h("dd", { dataset: { field: "confidence" } }, fixed(e.confidence, 2)),
        h("dt", null, "domain"), h("dd", { dataset: { field: "domain" } }, tags(e.domain)),
        h("dt", null, "related files"), h("dd", null, (e.related_files || []).join(", ") || "—"),
        h("dt", null, "source"), h("dd", null, `${e.source_agent}${e.source_task ? ` · task ${short(e.source_task, 80)}` : ""}`),
        h("dt", null, "visibility"), h("dd", null, `${e.visibility} (author ${e.author_owner}${e.author_agent ? `/${e.author_agent}` : ""})`),
        h("dt", null, "recorded"), h("dd", null, when(e.timestamp_ms)),
        h("dt", null, "archived"), h("dd", { dataset: { field: "archived" } }, e.archived ? "yes" : "no"),
        h("dt", null, "valid"), h("dd", { dataset: { field: "validity" } }, validity(e)),
        h("dt", null, "applications"), h("dd", { dataset: { field: "applications" } }, `${e.applications}${e.last_reinforced_ms ? `, last ${when(e.last_reinforced_ms)}` : ""}`))),
    mayWrite(collective) ? actions(e) : null,
    h("div", { class: "grid" },
      card("Versions", versions(history)),
      card("Reinforcements over time", reinforcements(history, e))),
    card("Relations", h("p", { class: "muted" }, "Tap a node (or its button below) to bring in its own relations."), graph, nodes,
      related.next ? h("p", { class: "muted" }, "The first 100 relations are shown.") : null),
    card("Insights drawn from it", insights.length ? h("ul", { class: "plain", id: "insights" }, insights.map((x) => h("li", null, x.content, " ", h("span", { class: "muted" }, `confidence ${fixed(x.confidence, 2)}`))))
      : h("p", { class: "muted" }, "None.")));
  return { node, mounted: (stops) => drawGraph(graph, nodes, e, related.items, stops) };
}

function validity(e) {
  const from = `from ${when(e.valid_from_ms)}`;
  if (e.valid_to_ms == null) return `${from}, open-ended${e.invalidations ? ` (invalidated ${e.invalidations}×, now true again)` : ""}`;
  return [`${from} until ${when(e.valid_to_ms)}: `, h("span", { class: "warn" }, e.invalid_reason || "no reason given"), e.unstable ? h("span", { class: "error" }, " · unstable") : null];
}

function versions(history) {
  const rows = history.filter((r) => r.event_type !== "experience.reinforced");
  if (!rows.length) return h("p", { class: "muted" }, "No history is kept for it here.");
  const now = {};
  return table(["when", "what", "changed", "by"], rows.map((r) => {
    const change = typeof r.change === "string" ? JSON.parse(r.change) : r.change || {};
    const changed = Object.entries(change).filter(([k]) => !BOOKKEEPING.has(k)).map(([k, v]) => {
      const before = now[k];
      now[k] = v;
      const shown = (x) => (Array.isArray(x) ? x.join(", ") : typeof x === "object" && x ? JSON.stringify(x) : String(x));
      return h("div", { class: "diff" }, `${k}: `, before !== undefined && r.event_type !== "experience.recorded" ? [h("del", null, shown(before)), " → "] : null, h("ins", null, shown(v)));
    });
    const ms = sqlTime(r.written_at);
    return h("tr", { dataset: { seq: r.seq, event: r.event_type } },
      h("td", null, h("a", { href: "#", title: "show the memory as of this change", dataset: { moment: ms }, onclick: (event) => { event.preventDefault(); moveTo(ms); } }, when(ms))),
      h("td", null, r.event_type.replace(/^experience\./, "")),
      h("td", null, changed.length ? changed : h("span", { class: "muted" }, "—")),
      h("td", null, `${r.author_owner || ""}${r.author_agent ? `/${r.author_agent}` : ""}`, h("div", { class: "muted mono" }, `host ${String(r.instance_id).slice(0, 13)}`)));
  }), { id: "versions" });
}

function reinforcements(history, e) {
  const points = history.filter((r) => r.event_type === "experience.reinforced").map((r) => {
    const change = typeof r.change === "string" ? JSON.parse(r.change) : r.change || {};
    return [sqlTime(r.written_at), Number(change.applications) || 0];
  });
  if (!points.length) return h("p", { class: "muted", id: "reinforcements" }, `${e.applications} applications, none recorded here over time.`);
  const start = e.timestamp_ms;
  const end = Math.max(points[points.length - 1][0], start + 1);
  const top = Math.max(...points.map((p) => p[1]), 1);
  const W = 360, H = 120, P = 22;
  const x = (t) => P + ((t - start) / (end - start)) * (W - 2 * P);
  const y = (n) => H - P - (n / top) * (H - 2 * P);
  let d = `M${x(start)},${y(0)}`;
  for (const [t, n] of points) d += ` H${x(t).toFixed(1)} V${y(n).toFixed(1)}`;
  return h("div", { id: "reinforcements" },
    svg("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "applications over time" },
      svg("path", { d }), ...points.map(([t, n]) => svg("circle", { cx: x(t).toFixed(1), cy: y(n).toFixed(1), r: 2.5 })),
      svg("text", { x: P, y: H - 6 }, new Date(start).toLocaleDateString()),
      svg("text", { x: W - P - 60, y: H - 6 }, new Date(end).toLocaleDateString()),
      svg("text", { x: 2, y: P }, String(top))),
    h("p", { class: "muted" }, `${points.length} reinforcements, ${e.applications} applications in all.`));
}

function actions(e) {
  const status = h("p", { role: "status", id: "action-status" });
  const act = (name, body, label) => h("button", { type: "button", dataset: { action: name }, onclick: async () => {
    try {
      await api(name, { experience_id: e.experience_id, ...body() });
      status.className = "good";
      status.textContent = `${label}: done.`;
      await render();
    } catch (error) {
      status.className = "error";
      status.textContent = error.message;
    }
  } }, label);
  const reason = h("input", { name: "reason", placeholder: "reason", size: 30 });
  return card("Act on it", h("div", { class: "inline", id: "write-controls" },
    act("reinforce_experience", () => ({}), "Reinforce"),
    e.archived ? act("unarchive_experience", () => ({}), "Unarchive") : act("archive_experience", () => ({}), "Archive"),
    reason,
    e.valid_to_ms == null ? act("invalidate_experience", () => ({ reason: reason.value || "marked invalid in the console" }), "Invalidate")
      : act("revalidate_experience", () => ({ reason: reason.value || "marked valid in the console" }), "Revalidate")), status);
}

// the neighbourhood graph: the experience, what links to it and what it links to; a node
// tapped (or its button) brings in its own relations
function drawGraph(container, list, center, items, stops) {
  const label = (e) => short(e.content, 48);
  const cy = cytoscape({
    container,
    elements: [],
    minZoom: 0.2,
    maxZoom: 1.5,
    style: [
      { selector: "node", style: { "label": "data(label)", "font-size": 10, "text-wrap": "wrap", "text-max-width": 160, "text-valign": "bottom", "text-margin-y": 4, "background-color": "#7d93c9", "width": 18, "height": 18, "color": "#1d2430" } },
      { selector: "node.center", style: { "background-color": "#2457c5", "width": 26, "height": 26, "font-weight": "bold" } },
      { selector: "node.expanded", style: { "border-width": 2, "border-color": "#1d7a3a" } },
      { selector: "edge", style: { "label": "data(label)", "font-size": 9, "curve-style": "bezier", "target-arrow-shape": "triangle", "width": "data(width)", "line-color": "#a9b6d3", "target-arrow-color": "#a9b6d3", "color": "#5d6776" } },
    ],
  });
  const expanded = new Set();
  const rows = new Map();
  const addNode = (e) => {
    if (cy.getElementById(e.experience_id).nonempty()) return;
    cy.add({ group: "nodes", data: { id: e.experience_id, label: label(e) }, classes: e.experience_id === center.experience_id ? "center" : "" });
    const button = h("button", { type: "button", dataset: { expand: e.experience_id }, onclick: () => expand(e.experience_id) }, "expand");
    const row = h("li", { dataset: { node: e.experience_id } }, experienceLink(e), " ", button);
    rows.set(e.experience_id, row);
    list.append(row);
  };
  const addRelations = (relatedItems) => {
    for (const { relation, experience } of relatedItems) {
      addNode(experience);
      if (cy.getElementById(relation.relation_id).empty()) {
        cy.add({ group: "edges", data: { id: relation.relation_id, source: relation.source_id, target: relation.target_id, label: relation.relation_type, width: 1 + 3 * relation.strength } });
      }
    }
  };
  const layout = () => {
    // rings around the experience: its neighbours on the first, theirs on the next
    const depth = new Map();
    cy.elements().bfs({ roots: cy.getElementById(center.experience_id), directed: false, visit: (node, edge, previous, i, level) => { depth.set(node.id(), level); } });
    cy.layout({ name: "concentric", concentric: (node) => 100 - (depth.get(node.id()) ?? 99), levelWidth: () => 1, minNodeSpacing: 70, startAngle: 3.5 * Math.PI / 2, animate: false, fit: true, padding: 40 }).run();
    container.dataset.nodes = String(cy.nodes().length);
    container.dataset.edges = String(cy.edges().length);
  };
  async function expand(id) {
    if (expanded.has(id)) return;
    expanded.add(id);
    container.dataset.state = "expanding";
    const started = performance.now();
    try {
      const more = await api("get_related_experiences", past({ experience_id: id, limit: 100 }));
      addRelations(more.items);
      cy.getElementById(id).addClass("expanded");
      const button = rows.get(id) && rows.get(id).querySelector("button");
      if (button) { button.disabled = true; button.textContent = "expanded"; }
      layout();
      container.dataset.took = (performance.now() - started).toFixed(1);
    } finally {
      container.dataset.state = "ready";
    }
  }
  addNode(center);
  addRelations(items);
  expanded.add(center.experience_id);
  cy.getElementById(center.experience_id).addClass("expanded");
  const own = rows.get(center.experience_id).querySelector("button");
  own.disabled = true;
  own.textContent = "shown";
  cy.on("tap", "node", (event) => expand(event.target.id()));
  layout();
  container.dataset.state = "ready";
  stops.push(() => cy.destroy());
}

// -- hosts and health -----------------------------------------------------------------------

async function hostsPage() {
  if (!isAdmin()) return card("Hosts and health", h("p", { class: "muted" }, "For admin tokens and the operator."));
  const [status, health, dead, writers, tokens] = await Promise.all([
    api("status"),
    fetch("/health", { headers: { "Authorization": `Bearer ${state.token}` }, cache: "no-store", credentials: "omit" }).then((r) => r.json()),
    api("dead_letters", { limit: 100 }),
    sql("SELECT instance_id, count(*) AS events, max(written_at) AS last FROM history GROUP BY instance_id ORDER BY last DESC LIMIT 50", 50, { present: true }),
    api("list_tokens", { include_revoked: false }),
  ]);
  const s = status.stream || {};
  return h("div", null,
    h("h1", null, "Hosts and health"),
    card("This host", h("div", { class: "stats", id: "host" },
      stat("status", health.status), stat("lag", status.lag), stat("applied", status.applied_seq),
      stat("log head", status.last_seq), stat("dead letters", status.dead_letters),
      stat("replicating", status.replicating ? "yes" : "no")),
      h("dl", { class: "fields" },
        h("dt", null, "instance"), h("dd", { class: "mono" }, status.instance_id),
        h("dt", null, "follows"), h("dd", null, status.following == null ? "every collective" : status.collectives.map((c) => c.name || c.collective_id).join(", ") || "none"),
        h("dt", null, "snapshot"), h("dd", null, status.snapshot ? `seq ${status.snapshot.seq}, ${fixed(status.snapshot.age, 2)} s old` : "—"),
        h("dt", null, "leaf"), h("dd", null, status.leaf ? JSON.stringify(status.leaf) : "—"))),
    card("The stream", h("div", { class: "stats", id: "stream" },
      stat("messages", s.messages), stat("bytes", s.bytes), stat("replicas", s.replicas), stat("leader", s.leader)),
      h("h2", null, "Readers of the stream (hosts' consumers)"),
      table(["consumer", "filters", "delivered", "pending"], (s.consumers || []).map((c) => h("tr", null,
        h("td", { class: "mono" }, c.name), h("td", null, (c.filters || []).join(", ") || "all"), h("td", { class: "num" }, c.delivered_seq), h("td", { class: "num" }, c.pending))))),
    card("Hosts that wrote to this memory (from the log)", table(["host (instance)", "events", "last write"], writers.map((w) => h("tr", null,
      h("td", { class: "mono" }, w.instance_id), h("td", { class: "num" }, w.events), h("td", null, when(sqlTime(w.last))))), { id: "writers" })),
    card("Dead letters", dead.items.length ? table(["entity", "id", "seq", "reason"], dead.items.map((d) => h("tr", null,
      h("td", null, d.entity), h("td", { class: "mono" }, d.id || "—"), h("td", { class: "num" }, d.seq ?? "—"), h("td", null, d.reason))), { id: "dead-letters" })
      : h("p", { class: "muted", id: "dead-letters" }, "None: every event this host read was applied.")),
    tokensCard(tokens, !state.at));
}

function tokensCard(tokens, writable) {
  const shown = h("div", { id: "new-token" });
  const form = h("form", { class: "inline", id: "token-form" },
    h("label", null, "owner", h("input", { name: "owner_id", required: true, size: 12 })),
    h("label", null, "agent (optional)", h("input", { name: "agent_id", size: 12 })),
    h("label", null, "scope", h("select", { name: "scope" }, ["read", "write", "admin"].map((x) => h("option", { value: x }, x)))),
    h("label", null, "collectives (ids, optional)", h("input", { name: "collectives", size: 24 })),
    h("label", null, "expires in (s, optional)", h("input", { name: "expires_in", type: "number", min: 1 })),
    h("button", { class: "primary", type: "submit" }, "Create token"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const body = { owner_id: String(data.get("owner_id")), scope: String(data.get("scope")) };
    if (data.get("agent_id")) body.agent_id = String(data.get("agent_id"));
    const limited = String(data.get("collectives") || "").split(",").map((t) => t.trim()).filter(Boolean);
    if (limited.length) body.collectives = limited;
    if (data.get("expires_in")) body.expires_in = Number(data.get("expires_in"));
    try {
      const made = await api("create_token", body);
      form.reset();
      const listed = await api("list_tokens", { include_revoked: false });
      const fresh = tokensCard(listed, true);
      fresh.querySelector("#new-token").replaceChildren(
        h("p", null, "The token's secret, shown this once (only its hash is kept):"),
        h("div", { class: "secret mono", id: "token-secret" }, made.token));
      form.closest("section").replaceWith(fresh);
    } catch (error) {
      shown.replaceChildren(h("p", { class: "error" }, error.message));
    }
  });
  return card("Access tokens",
    table(["id", "owner", "agent", "scope", "collectives", "expires", ""], tokens.map((t) => h("tr", { dataset: { token: t.token_id } },
      h("td", { class: "mono" }, t.token_id), h("td", null, t.owner_id), h("td", null, t.agent_id || "any"), h("td", null, t.scope),
      h("td", null, t.collectives.length ? t.collectives.map((c) => c.slice(0, 8)).join(", ") : "all of the owner's"),
      h("td", null, when(t.expires_ms)),
      h("td", null, !writable ? null : h("button", { type: "button", class: "danger", dataset: { revoke: t.token_id }, onclick: async () => {
        if (!window.confirm(`Revoke token ${t.token_id} of ${t.owner_id}? Every host refuses it from now on.`)) return;
        try { await api("revoke_token", { token_id: t.token_id }); await render(); } catch (error) { shown.replaceChildren(h("p", { class: "error" }, error.message)); }
      } }, "Revoke")))), { id: "tokens" }),
    writable ? [h("h2", null, "New token"), form, shown] : null);
}

// -- start ----------------------------------------------------------------------------------

if (state.token) signIn(state.token);
else signOut("");

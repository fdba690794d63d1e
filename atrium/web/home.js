// The home: what the main area shows when no app tab is active. A grid of the apps by name (the
// id only to tell apart two apps of one name), a search over name, description and category,
// running apps marked, "Shared with me", the widgets' slot and "Updates available (N)". On a
// phone the header is a bottom bar whose actions open as a sheet (the Menu button).

import { $, api, appIcon, CHIPS, el, loudly, onEvent, quietly, shared, VERBS } from "./core.js";

/** States of an instance that is alive (has or is getting a process). */
const ALIVE = new Set(["creating", "created", "starting", "started", "resuming", "resumed", "pausing", "paused"]);

let hooks = { launch: async () => {}, details: async () => {}, home: () => {} };
let catalogue = new Map();       // app id → its catalogue entry (categories, publisher), when known

const SCOPE_WORDS = { system: "built in", global: "for everyone", user: "only for you" };

/** Start the home: ``launch(appId)``, ``details(appId)`` and ``home()`` (show the home, tabs
 * stay open) come from host.js. */
export function startHome(given) {
  hooks = { ...hooks, ...given };
  $("home-search").addEventListener("input", filter);
  $("home-search").addEventListener("keydown", (event) => {
    if (event.key === "Escape" && $("home-search").value) {
      $("home-search").value = "";
      filter();
      event.stopPropagation();
    } else if (event.key === "Enter") {
      const first = [...document.querySelectorAll("#apps .card:not([hidden]) button.app:not(:disabled)")][0];
      if (first) first.click();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
    const at = document.activeElement;
    if (at && (at.closest("input, textarea, select, [contenteditable]") || at.isContentEditable)) return;
    if (document.querySelector("dialog[open]")) return;
    event.preventDefault();
    hooks.home();
    $("home-search").focus();
  });
  $("brand").onclick = () => hooks.home();
  $("go-home").onclick = () => hooks.home();
  $("home-updates").onclick = () => openUpdates();
  menu();
  for (const topic of ["app:state", "app:crashed"]) onEvent(topic, () => setTimeout(markRunning, 0));
  for (const topic of ["app:installed", "app:removed", "dist:update.complete"]) onEvent(topic, () => checkUpdatesSoon());
  quietly(loadCatalogue());
  checkUpdatesSoon(0);
}

// ---------------------------------------------------------------- the grid
/** What the user reads for each app: its name, and when two visible apps share a name, a line in
 * small print telling them apart (publisher, else scope, else id). */
function labels(apps) {
  const byName = new Map();
  for (const app of apps) {
    const name = (app.name || app.id).trim();
    byName.set(name.toLowerCase(), [...(byName.get(name.toLowerCase()) || []), app]);
  }
  const out = new Map();
  for (const group of byName.values()) {
    const told = (fn) => new Set(group.map(fn)).size === group.length;
    const publisher = (a) => catalogue.get(a.id)?.publisher?.name || "";
    const scope = (a) => SCOPE_WORDS[a.scope] || a.scope || "";
    let tell = () => "";
    if (group.length > 1) {
      if (told(publisher) && group.every(publisher)) tell = (a) => `by ${publisher(a)}`;
      else if (told(scope)) tell = scope;
      else tell = (a) => a.id;
    }
    for (const app of group) out.set(app, { name: (app.name || app.id).trim(), tell: tell(app) });
  }
  return out;
}

/** Draw the grid from ``shared.apps`` (host.js calls this after each load of /api/apps). */
export function renderApps() {
  const apps = shared.apps;
  const named = labels(apps);
  $("apps").replaceChildren(...apps.map((app) => {
    const { name, tell } = named.get(app);
    const button = el("button", { className: "app", type: "button", disabled: app.problems.length > 0 });
    button.dataset.appId = app.id;
    const title = el("span", { className: "name", textContent: name });
    button.append(appIcon(app), title);
    if (tell) button.append(el("span", { className: "tell", textContent: tell }));
    const chips = el("span", { className: "chips" });
    const chip = CHIPS[app.themeStrategy];
    if (chip) chips.append(el("span", { className: "chip", textContent: chip[0], title: chip[1] }));
    if (app.record?.dev) {
      chips.append(el("span", { className: "chip dev", textContent: "DEV",
        title: "A dev copy: an author's folder run by `atrium dev`, reloaded on every save" }));
    }
    if (chips.childElementCount) button.append(chips);
    const running = el("span", { className: "running", textContent: "Running", hidden: true });
    button.append(running);
    for (const p of app.problems) button.append(el("span", { className: "problem", textContent: `${p.field}: ${p.message}` }));
    button.onclick = () => loudly(hooks.launch(app.id));
    const full = tell ? `${name} (${tell})` : name;
    const more = el("button", { className: "ghost more", type: "button", textContent: "⋯", title: "Details", ariaLabel: `Details of ${full}` });
    more.dataset.appId = app.id;
    more.onclick = () => loudly(hooks.details(app.id));
    const card = el("div", { className: "card" }, button, more);
    card.setAttribute("role", "listitem");
    card.dataset.appId = app.id;
    card.dataset.search = searchText(app, name, tell);
    return card;
  }));
  markRunning();
  filter();
}

function searchText(app, name, tell) {
  const entry = catalogue.get(app.id);
  const verbs = (app.manifest?.intentFilters || []).map((f) => VERBS[f.action] || "");
  return [name, tell, app.description, entry?.description, ...(entry?.categories || []), ...verbs]
    .filter(Boolean).join("\n").toLowerCase();
}

function filter() {
  const words = $("home-search").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const cards = [...document.querySelectorAll("#apps .card")];
  let shown = 0;
  for (const card of cards) {
    const hit = words.every((w) => card.dataset.search.includes(w));
    card.hidden = !hit;
    if (hit) shown += 1;
  }
  const total = cards.length;
  $("status").textContent = !words.length
    ? `${total} app${total === 1 ? "" : "s"}`
    : shown ? `${shown} of ${total} apps match “${$("home-search").value.trim()}”` : `No app matches “${$("home-search").value.trim()}”`;
}

/** Mark each app with an instance alive (host.js calls this whenever the instances change). */
export function markRunning() {
  const alive = new Set([...shared.instances.values()].filter((i) => ALIVE.has(i.state)).map((i) => i.appId));
  for (const card of document.querySelectorAll("#apps .card")) {
    const on = alive.has(card.dataset.appId);
    card.classList.toggle("is-running", on);
    const mark = card.querySelector(".running");
    if (mark) mark.hidden = !on;
  }
}

/** Categories and publishers come from the catalogue (the manifest has neither): fetched once,
 * quietly (no catalogue is fine). */
async function loadCatalogue() {
  const snapshot = await api("GET", "/api/dist/index");
  catalogue = new Map((snapshot.index?.apps || []).map((entry) => [entry.id, entry]));
  if (shared.apps.length) renderApps();
}

// ---------------------------------------------------------------- home or app
/** host.js: whether the home shows (no active tab) or an app does. */
export function showingHome(home) {
  $("home").hidden = !home;
  $("views").hidden = home;
  document.body.classList.toggle("app-open", !home);
  $("go-home").setAttribute("aria-pressed", String(home));
}

// ---------------------------------------------------------------- the phone's Menu sheet
function menu() {
  const button = $("open-menu");
  const bar = document.querySelector("header.bar");
  const set = (open) => {
    document.body.classList.toggle("menu-open", open);
    button.setAttribute("aria-expanded", String(open));
  };
  button.onclick = () => set(!document.body.classList.contains("menu-open"));
  // an action of the sheet closes it (after its own click handler ran)
  bar.addEventListener("click", (event) => {
    const hit = event.target.closest("button");
    if (hit && hit !== button && document.body.classList.contains("menu-open")) setTimeout(() => set(false), 0);
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && document.body.classList.contains("menu-open")) set(false);
  });
}

// ---------------------------------------------------------------- updates
let updates = [];
let updatesTimer = null;

function checkUpdatesSoon(delay = 1500) {
  clearTimeout(updatesTimer);
  updatesTimer = setTimeout(() => quietly(loadUpdates(false)), delay);
}

/** `GET /api/dist/updates`: the caller's installs with a newer version. */
async function loadUpdates(refresh) {
  const answer = await api("GET", `/api/dist/updates${refresh ? "?refresh=1" : ""}`);
  updates = answer.updates.filter((u) => u.available);
  const entry = $("home-updates");
  entry.hidden = updates.length === 0;
  entry.textContent = `Updates available (${updates.length})`;
  if (!$("updates").hidden) renderUpdates();
}

/** The updates panel (also the store's way to update a pinned install: by its newest tag). */
export function openUpdates() {
  $("updates").hidden = false;
  $("update-review").hidden = true;
  renderUpdates();
}

function appNamed(id) {
  return shared.apps.find((a) => a.id === id)?.name || id;
}

function renderUpdates() {
  $("updates-status").textContent = updates.length ? "" : "Everything is up to date.";
  $("update-rows").replaceChildren(...updates.map((u) => {
    const name = appNamed(u.id);
    const to = u.newerTags?.length ? u.newerTags[u.newerTags.length - 1] : null;
    const what = to ? `${u.version} → ${to}` : `${u.version} → newer`;
    const row = el("li", {},
      el("span", {}, el("strong", { textContent: name }), el("span", { className: "hint", textContent: ` ${what} · ${SCOPE_WORDS[u.scope] || u.scope}` })),
      el("button", { className: "primary", type: "button", textContent: "Update", ariaLabel: `Update ${name}`,
        onclick: () => loudly(runUpdate(u, {})) }));
    row.dataset.appId = u.id;
    return row;
  }));
}

/** The existing update route; an update asking for more shows its review and waits for the
 * user's answer (never approved on their behalf). */
async function runUpdate(u, approval) {
  const name = appNamed(u.id);
  const body = { ...approval };
  const to = u.newerTags?.length ? u.newerTags[u.newerTags.length - 1] : null;
  if (to) body.to = to;
  $("updates-status").textContent = `Updating ${name}…`;
  $("update-review").hidden = true;
  let result;
  try {
    result = await api("POST", `/api/dist/update/${encodeURIComponent(u.id)}`, body);
  } catch (err) {
    $("updates-status").textContent = `${name}: ${err.message}`;
    return;
  }
  if (result.needsApproval) {
    showReview(u, name, result);
    $("updates-status").textContent = "";
    return;
  }
  await loadUpdates(true);   // (draws the list again, then says what happened)
  $("updates-status").textContent = result.upToDate ? `${name} is already up to date.` : `Updated ${name} to ${result.record.version}.`;
}

function showReview(u, name, result) {
  const diff = result.diff || {};
  $("update-review-title").textContent = `${name} ${diff.versionFrom ? `${diff.versionFrom} → ` : ""}${diff.versionTo || ""}`;
  const asks = (result.permissions || []).map((p) => {
    const item = el("li", {}, el("strong", { textContent: p.label }));
    if (p.description) item.append(el("span", { className: "hint", textContent: ` — ${p.description}` }));
    if (p.label !== p.name) item.append(el("code", { className: "raw", textContent: p.name }));
    item.dataset.permission = p.name;
    return item;
  });
  if (diff.toolsAdded?.length) asks.push(el("li", { textContent: `Run these programs of this machine: ${diff.toolsAdded.join(", ")}` }));
  if (diff.dataProviderAdded) asks.push(el("li", { textContent: "Share its own data with other apps (a data provider)" }));
  if (diff.intentFiltersAdded?.length) asks.push(el("li", { textContent: `Handle requests to ${[...new Set(diff.intentFiltersAdded.map((f) => VERBS[f.action] || f.action))].join(", ")}` }));
  if (result.signature?.signerChanged) asks.push(el("li", { textContent: "It is signed by another key than the installed version" }));
  $("update-asks").replaceChildren(...asks);
  $("update-review").hidden = false;
  $("update-approve").onclick = () => loudly(runUpdate(u, { autoApprove: true, approvedDigest: result.resolved?.digest }));
  $("update-deny").onclick = () => { $("update-review").hidden = true; };
  $("update-approve").focus();
}

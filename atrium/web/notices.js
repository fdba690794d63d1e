// The notifications centre: what happened while you looked away (installs, updates, rollbacks,
// uninstalls, crashes, failed backups), in words with a time, behind the bell in the header with
// an unread count. Opening the panel reads them all.
//
// The list is kept per user in this browser (localStorage), with the id of the last event seen.
// The page opens a stream of its own for these topics from that id (`lastEventId`): the shell
// replays what was published while no page was open (its last 1,000 events, the same rule of
// who hears what), so a crash at night is there in the morning. The stream also takes
// `system:usage` (every few seconds, never replayed) only for its ids: the last id stays
// current when nothing else happens, so the replay starts where this page stopped listening. A
// notice replayed that way gets the time the page heard it: events carry no time of their own.

import { $, api, el, quietly, shared } from "./core.js";

const TOPICS = [
  "dist:install.complete", "dist:update.complete", "dist:rollback.complete",
  "dist:uninstall.complete", "app:crashed", "backup:failed",
];
/** Heard only for its id (see above). */
const MARK = "system:usage";
/** How many notices are kept: the oldest go first. */
const KEEP = 50;

let key = null;                   // localStorage key of the signed-in user's notices
let state = { lastId: null, items: [] };   // items newest first: {id, kind, text, detail, at, unread}
const names = new Map();          // app id → name, remembered so an uninstalled app keeps its name

function load() {
  try {
    const stored = JSON.parse(localStorage.getItem(key) || "null");
    if (stored && Array.isArray(stored.items)) state = { lastId: stored.lastId ?? null, items: stored.items };
  } catch { /* a damaged entry starts over */ }
}

function save() {
  try { localStorage.setItem(key, JSON.stringify(state)); } catch { /* full or refused: kept in memory */ }
}

function nameOf(appId) {
  for (const app of shared.apps) if (app.name) names.set(app.id, app.name);
  return names.get(appId) || appId;
}

/** The notice an event makes, or null for one that says nothing happened. */
function describe(topic, data) {
  switch (topic) {
    case "dist:install.complete":
      return { kind: "done", text: `Installed ${nameOf(data.id)}${data.record?.version ? ` ${data.record.version}` : ""}` };
    case "dist:update.complete":
      if (!data.record) return null;   // the source had not changed
      return { kind: "done", text: `Updated ${nameOf(data.id)} to ${data.record.version}` };
    case "dist:rollback.complete":
      return { kind: "done", text: `Rolled ${nameOf(data.id)} back to ${data.record?.version || "an earlier version"}` };
    case "dist:uninstall.complete":
      return { kind: "done", text: `Uninstalled ${nameOf(data.id)}` };
    case "app:crashed":
      return { kind: "problem", text: `${nameOf(data.appId)} stopped unexpectedly`,
               detail: data.reason === "oom" ? `it ran out of memory (exit code ${data.exitCode})`
                                             : `exit code ${data.exitCode}` };
    case "backup:failed":
      return { kind: "problem",
               text: `Could not back up ${nameOf(data.appId)}${data.reason && data.reason !== "manual" ? ` before the ${data.reason}` : ""}`,
               detail: data.message };
    default:
      return null;
  }
}

function take(topic, event) {
  const id = Number(event.lastEventId);
  if (Number.isFinite(id) && state.lastId != null && id <= state.lastId) return;   // heard already
  if (Number.isFinite(id)) state.lastId = id;
  if (topic === MARK) { save(); return; }
  const notice = describe(topic, JSON.parse(event.data));
  if (notice) {
    const open = !$("notices").hidden;
    state.items.unshift({ id, ...notice, at: new Date().toISOString(), unread: !open });
    state.items.length = Math.min(state.items.length, KEEP);
  }
  save();
  draw();
}

function when(iso) {
  const at = new Date(iso);
  const today = new Date().toDateString() === at.toDateString();
  return today ? at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : at.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

function draw() {
  const unread = state.items.filter((n) => n.unread).length;
  const badge = $("notices-count");
  badge.textContent = unread > 99 ? "99+" : String(unread);
  badge.hidden = unread === 0;
  $("open-notices").setAttribute("aria-label",
    unread ? `Notifications: ${unread} unread` : "Notifications");
  $("notice-rows").replaceChildren(...state.items.map((n) => {
    const time = el("time", { className: "notice-time", textContent: when(n.at) });
    time.dateTime = n.at;
    const text = el("p", { className: "notice-text" },
      el("span", { className: `notice-mark notice-${n.kind}`, textContent: n.kind === "problem" ? "!" : "✓" }),
      el("span", { textContent: n.text }));
    text.firstChild.setAttribute("aria-hidden", "true");
    const row = el("li", { className: `notice notice-${n.kind}${n.unread ? " unread" : ""}` }, text, time);
    if (n.detail) row.append(el("p", { className: "notice-detail", textContent: n.detail }));
    return row;
  }));
  $("notices-empty").hidden = state.items.length > 0;
  $("notices-clear").hidden = state.items.length === 0;
}

function openPanel() {
  const panel = $("notices");
  panel.hidden = !panel.hidden;
  $("open-notices").setAttribute("aria-expanded", String(!panel.hidden));
  if (panel.hidden) return;
  draw();   // unread ones are still marked while the panel shows them
  for (const n of state.items) n.unread = false;
  save();
  const badge = $("notices-count");
  badge.hidden = true;
  $("open-notices").setAttribute("aria-label", "Notifications");
}

function connect() {
  const params = new URLSearchParams();
  if (state.lastId != null) params.set("lastEventId", String(state.lastId));
  params.set("topics", [...TOPICS, MARK].join(","));
  const source = new EventSource(`/api/events?${params}`);
  for (const topic of [...TOPICS, MARK]) source.addEventListener(topic, (e) => take(topic, e));
}

/** Start the notifications centre once signed in (the list is the user's). */
export async function startNotices() {
  const me = shared.me || await api("GET", "/api/me").catch(() => null);
  if (!me) return;
  key = `atrium.notices.${me.id}`;
  load();
  $("open-notices").hidden = false;
  $("open-notices").onclick = openPanel;
  $("notices-clear").onclick = () => { state.items = []; save(); draw(); };
  // the panel closes by its × and Esc like the others; the bell's state follows
  new MutationObserver(() => $("open-notices").setAttribute("aria-expanded", String(!$("notices").hidden)))
    .observe($("notices"), { attributes: true, attributeFilter: ["hidden"] });
  draw();
  connect();
}

export const startNoticesQuietly = () => quietly(startNotices());

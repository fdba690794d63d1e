// The home's widgets: the machine's CPU, memory and disk, and what each running app uses, from
// GET /api/system/usage and then live from `system:usage` on the event stream (docs/api.md
// "System usage"). Each bar is decoration beside its figure in words: screen readers get the words.

import { $, api, el, onEvent, quietly, shared } from "./core.js";

let root = null;             // the widgets' section inside #home-widgets

/** Bytes in the units a person reads (1024-based, as system monitors show memory). */
export function bytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n) || n < 0) return "—";
  const units = ["bytes", "KB", "MB", "GB", "TB"];
  let value = n, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  const shown = unit === 0 ? String(value) : value >= 100 ? value.toFixed(0) : value.toFixed(1);
  return `${shown} ${units[unit]}`;
}

function percent(part, whole) {
  return whole > 0 ? Math.min(100, Math.max(0, (part / whole) * 100)) : 0;
}

function round(p) {
  return p < 10 && p > 0 ? p.toFixed(1) : p.toFixed(0);
}

/** One figure: its name, the number in words, a bar (hidden from screen readers) and a note. */
function widget(id, title) {
  const value = el("p", { className: "widget-value" });
  const fill = el("span", { className: "widget-fill" });
  const bar = el("span", { className: "widget-bar" }, fill);
  bar.setAttribute("aria-hidden", "true");
  const note = el("p", { className: "widget-note" });
  const box = el("div", { className: "widget", id }, el("h3", { textContent: title }), value, bar, note);
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", title);
  return { box, value, fill, note };
}

let cpu, memory, disk, appsList, appsNote;

function build() {
  cpu = widget("widget-cpu", "CPU");
  memory = widget("widget-memory", "Memory");
  disk = widget("widget-disk", "Disk");
  appsList = el("ul", { className: "widget-apps", id: "widget-apps" });
  appsNote = el("p", { className: "widget-note", textContent: "No app is running." });
  const apps = el("div", { className: "widget widget-wide", id: "widget-running" },
    el("h3", { textContent: "Running apps" }), appsNote, appsList);
  apps.setAttribute("role", "group");
  apps.setAttribute("aria-label", "Running apps");
  const title = el("h2", { id: "usage-title", className: "widgets-title", textContent: "This machine" });
  root = el("section", { className: "widgets", id: "usage" }, title,
    el("div", { className: "widgets-grid" }, cpu.box, memory.box, disk.box, apps));
  root.setAttribute("aria-labelledby", "usage-title");
  root.hidden = true;   // until the first figures
  $("home-widgets").append(root);
}

function setBar(w, p, text, note) {
  w.value.textContent = text;
  w.fill.style.width = `${p}%`;
  w.fill.classList.toggle("high", p >= 90);
  w.note.textContent = note;
}

/** The app's name, as the home shows it (the id only when the app is not listed any more). */
function nameOf(appId) {
  return shared.apps.find((a) => a.id === appId)?.name || appId;
}

function render(data) {
  if (!data || !data.machine) return;
  const m = data.machine;
  const cores = `${m.cores} core${m.cores === 1 ? "" : "s"}`;
  setBar(cpu, m.cpuPercent, `${round(m.cpuPercent)}% busy`, cores);
  const mem = percent(m.memoryUsedBytes, m.memoryTotalBytes);
  setBar(memory, mem, `${bytes(m.memoryUsedBytes)} of ${bytes(m.memoryTotalBytes)}`, `${round(mem)}% in use`);
  const used = percent(m.diskUsedBytes, m.diskTotalBytes);
  setBar(disk, used, `${bytes(m.diskUsedBytes)} of ${bytes(m.diskTotalBytes)}`,
    `${bytes(Math.max(0, m.diskTotalBytes - m.diskUsedBytes))} free`);
  const running = [...(data.instances || [])].sort((a, b) => b.memoryBytes - a.memoryBytes);
  const seen = new Map();
  for (const i of running) seen.set(i.appId, (seen.get(i.appId) || 0) + 1);
  const counted = new Map();
  appsList.replaceChildren(...running.map((i) => {
    let name = nameOf(i.appId);
    // two apps of one name are told apart by their ids, as the home does
    if (shared.apps.filter((a) => a.name === name).length > 1) name = `${name} · ${i.appId}`;
    if (seen.get(i.appId) > 1) {
      counted.set(i.appId, (counted.get(i.appId) || 0) + 1);
      name = `${name} #${counted.get(i.appId)}`;
    }
    const row = el("li", {},
      el("span", { className: "widget-app-name", textContent: name }),
      el("span", { className: "widget-app-figures", textContent: `${bytes(i.memoryBytes)} · ${round(i.cpuPercent)}% CPU` }));
    row.dataset.instanceId = i.instanceId;
    row.title = i.appId;
    return row;
  }));
  appsNote.hidden = running.length > 0;
  root.dataset.at = data.at || "";
  root.hidden = false;
}

/** Build the widgets into the home's slot and keep them current. */
export function startUsage() {
  if (!$("home-widgets")) return;
  build();
  onEvent("system:usage", render);
  quietly(api("GET", "/api/system/usage").then(render));
}

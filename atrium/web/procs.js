// The Processes panel: each instance by its app's name (the id in small print), its state in
// words, the memory and CPU it uses (GET /api/system/usage and the `system:usage` event), and
// stop / destroy, each asked first in words that say what happens. docs/api.md "Lifecycle and
// instances".

import { $, CHIPS, api, confirmRequest, el, errorNote, onEvent, quietly, shared } from "./core.js";
import { size } from "./detail.js";

/** Every lifecycle state (docs/api.md "States", 14 of them) in the words a person reads. */
export const STATE_WORDS = {
  installed: "ended",
  creating: "starting",
  created: "starting",
  starting: "starting",
  started: "running in the background",
  resuming: "opening",
  resumed: "running",
  pausing: "pausing",
  paused: "paused",
  stopping: "stopping",
  stopped: "stopped",
  destroying: "ending",
  destroyed: "ended",
  error: "failed",
};

/** An instance's state in words: a crash says so, a failed start says failed. */
export function stateWords(instance) {
  if (instance.state === "error" && /crash/i.test(instance.error || "")) return "crashed";
  return STATE_WORDS[instance.state] || instance.state;
}

let usage = new Map();           // instanceId → {memoryBytes, cpuPercent} of the last figures
let hooks = { share: async () => {} };

/** host.js calls this once from start(): ``share(instance)`` opens the Share dialog. */
export function startProcs(given) {
  hooks = { ...hooks, ...given };
  onEvent("system:usage", (data) => takeUsage(data));
  // after host.js's own click handler has shown or hidden the panel
  $("open-procs").addEventListener("click", () => setTimeout(() => {
    if (!$("procs").hidden) quietly(loadUsage());
  }, 0));
}

async function loadUsage() {
  takeUsage(await api("GET", "/api/system/usage"));
}

function takeUsage(data) {
  usage = new Map((data?.instances || []).map((i) => [i.instanceId, i]));
  for (const row of document.querySelectorAll("#proc-rows tr[data-instance-id]")) {
    row.querySelector("td.usage").replaceChildren(...figuresOf(row.dataset.instanceId));
  }
}

/** Memory over CPU, in one cell (two figures side by side do not fit a phone); "—" until the
 * shell has figures for the instance. */
function figuresOf(instanceId) {
  const figures = usage.get(instanceId);
  // its limit beside what it holds ("120 MiB of 512 MiB"), when it runs under one
  // (in MiB both, as the limit is set)
  const limits = shared.instances.get(instanceId)?.limits;
  const held = (bytes) => `${(bytes / 1048576).toFixed(bytes < 10 * 1048576 ? 1 : 0)}\u00a0MiB`;
  const memory = !figures ? "—" : limits?.memoryMiB ? `${held(figures.memoryBytes)} of ${limits.memoryMiB}\u00a0MiB` : size(figures.memoryBytes);
  const cores = limits?.cpuMilli ? ` (at most ${limits.cpuMilli / 1000} of a core)` : "";
  return [
    el("span", { className: "memory", textContent: memory, title: limits?.memoryMiB ? "Memory, of its limit" : "Memory" }),
    el("span", { className: "cpu", textContent: figures ? `${figures.cpuPercent.toFixed(1)}\u00a0% CPU` : "", title: `Share of the machine's CPU${cores}` }),
  ];
}

/** The id in small print: breakable only after its dots, hyphens and tildes (never mid-word). */
function idLine(id) {
  const line = el("small", { className: "id", title: id });
  for (const part of id.split(/(?<=[.\-~])/)) line.append(part, el("wbr"));
  return line;
}

function appName(appId) {
  const app = shared.apps.find((a) => a.id === appId);
  return app?.name || appId;
}

function say(message, err = null) {
  const result = $("procs-result");
  if (err) result.replaceChildren(errorNote(err));
  else result.textContent = message;
}

async function confirmed(title, text, yes, work) {
  if (!(await confirmRequest(title, text, yes))) return;
  say("");
  try {
    await work();
  } catch (err) {
    say("", err);
  }
}

let current = new Map();         // instanceId → the instance as last drawn (the buttons read it)

/** Draw the table, keeping each instance's row and buttons across redraws: an event that
 * arrives between a press and its release would otherwise replace the button under the pointer,
 * and the click would be lost. */
export function drawProcs(instances) {
  current = new Map(instances);
  const kept = new Map([...document.querySelectorAll("#proc-rows tr[data-instance-id]")]
    .map((row) => [row.dataset.instanceId, row]));
  const rows = [...instances.values()].map((i) => {
    const row = kept.get(i.instanceId) || newRow(i.instanceId);
    fillRow(row, i);
    return row;
  });
  const body = $("proc-rows");
  const wanted = rows.length ? rows
    : [el("tr", {}, el("td", { colSpan: 4, className: "status", textContent: "Nothing is running." }))];
  const same = wanted.length === body.children.length && wanted.every((row, n) => body.children[n] === row);
  if (!same) body.replaceChildren(...wanted);
}

function newRow(instanceId) {
  const row = el("tr", {}, el("td", { className: "app-cell" }), el("td", {}),
    el("td", { className: "usage" }), el("td", { className: "actions" }));
  row.dataset.instanceId = instanceId;
  return row;
}

/** The row's words, for the instance as it is now; the buttons are made once per row and look
 * the instance up when pressed. */
function fillRow(row, i) {
  const [who, state, figures, actions] = row.children;
  const name = appName(i.appId);
  const meaning = CHIPS[i.themeStrategy];
  const chip = meaning ? el("span", { className: "chip", textContent: meaning[0], title: meaning[1] }) : "";
  who.replaceChildren(el("strong", { textContent: name }), chip, idLine(i.instanceId));
  state.className = `state state-${i.state}`;
  state.textContent = stateWords(i);
  state.title = i.error || i.state;
  figures.replaceChildren(...figuresOf(i.instanceId));
  const what = `${name} (${i.instanceId})`;
  if (row.dataset.what === what) return;
  row.dataset.what = what;
  const id = i.instanceId;
  const now = () => current.get(id) || i;
  actions.replaceChildren(
    el("button", { className: "ghost", type: "button", textContent: "Stop", ariaLabel: `Stop ${what}`,
      onclick: () => quietly(confirmed(`Stop ${name}?`,
        `${what} is asked to stop and waits, stopped, with its data kept. Opening ${name} again starts it.`,
        "Stop", () => api("POST", `/api/instances/${encodeURIComponent(id)}/stop`))) }),
    el("button", { className: "ghost", type: "button", textContent: "End", ariaLabel: `End ${what}`,
      onclick: () => quietly(confirmed(`End ${name} now?`,
        `${what}'s process is killed at once, without letting it save or finish what it was doing; its views close. Its data stays: opening ${name} again starts a new process on it.`,
        "End it", () => api("DELETE", `/api/instances/${encodeURIComponent(id)}?force=1`))) }),
    el("button", { className: "ghost", type: "button", textContent: "Logs", ariaLabel: `Logs of ${what}`, onclick: () => quietly(showLogs(id)) }),
    el("button", { className: "ghost", type: "button", textContent: "Share", ariaLabel: `Share ${what}`, onclick: () => quietly(hooks.share(now())) }));
}

async function showLogs(instanceId) {
  try {
    const res = await fetch(`/api/instances/${encodeURIComponent(instanceId)}/logs?lines=200`, { credentials: "same-origin" });
    $("logs").textContent = await res.text();
    $("logs").hidden = false;
  } catch (err) {
    say("", err);
  }
}

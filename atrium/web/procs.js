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
  return [
    el("span", { className: "memory", textContent: figures ? size(figures.memoryBytes) : "—", title: "Memory" }),
    el("span", { className: "cpu", textContent: figures ? `${figures.cpuPercent.toFixed(1)}\u00a0% CPU` : "", title: "Share of the machine's CPU" }),
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

export function drawProcs(instances) {
  const rows = [...instances.values()].map((i) => {
    const name = appName(i.appId);
    const meaning = CHIPS[i.themeStrategy];
    const chip = meaning ? el("span", { className: "chip", textContent: meaning[0], title: meaning[1] }) : "";
    const who = el("td", { className: "app-cell" }, el("strong", { textContent: name }), chip, idLine(i.instanceId));
    const words = stateWords(i);
    const state = el("td", { className: `state state-${i.state}`, textContent: words, title: i.error || i.state });
    const what = `${name} (${i.instanceId})`;
    const buttons = el("td", { className: "actions" },
      el("button", { className: "ghost", type: "button", textContent: "Stop", ariaLabel: `Stop ${what}`,
        onclick: () => quietly(confirmed(`Stop ${name}?`,
          `${what} is asked to stop and waits, stopped, with its data kept. Opening ${name} again starts it.`,
          "Stop", () => api("POST", `/api/instances/${encodeURIComponent(i.instanceId)}/stop`))) }),
      el("button", { className: "ghost", type: "button", textContent: "End", ariaLabel: `End ${what}`,
        onclick: () => quietly(confirmed(`End ${name} now?`,
          `${what}'s process is killed at once, without letting it save or finish what it was doing; its views close. Its data stays: opening ${name} again starts a new process on it.`,
          "End it", () => api("DELETE", `/api/instances/${encodeURIComponent(i.instanceId)}?force=1`))) }),
      el("button", { className: "ghost", type: "button", textContent: "Logs", ariaLabel: `Logs of ${what}`, onclick: () => quietly(showLogs(i.instanceId)) }),
      el("button", { className: "ghost", type: "button", textContent: "Share", ariaLabel: `Share ${what}`, onclick: () => quietly(hooks.share(i)) }));
    const row = el("tr", {}, who, state, el("td", { className: "usage" }, ...figuresOf(i.instanceId)), buttons);
    row.dataset.instanceId = i.instanceId;
    return row;
  });
  $("proc-rows").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colSpan: 4, className: "status", textContent: "Nothing is running." }))]));
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

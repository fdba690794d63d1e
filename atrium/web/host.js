// Atrium's host page: launcher, app views on their own origins, process manager, theme picker,
// intent chooser, install dialog, and the postMessage bridge. No build step: a plain ES module.

import {
  $, CHIPS, VERBS, api, appIcon, banner, confirmRequest, el, instancesRead, loudly, quietly,
  shared, showError, skeletons, toast, useEventSource,
} from "./core.js";
import { markRunning, renderApps, showingHome, startHome } from "./home.js";
import { loadVersions, showDetail, startDetail } from "./detail.js";
import { drawProcs, startProcs } from "./procs.js";
import { setUpStore } from "./store.js";
import { startUsage } from "./usage.js";
import { startNoticesQuietly } from "./notices.js";

const clientId = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
const tabs = new Map();          // tab key → {key, instanceId, appId, viewId, iframe, el, origin, activityId}
const instances = shared.instances;   // instanceId → instance as the API reports it
let apps = [];
let active = null;               // the key of the visible tab
let themePayload = null;         // the last theme:changed payload (or the selection at start)
let nextKey = 1;

// ---------------------------------------------------------------- theme
async function loadThemeCss() {
  const res = await fetch("/api/os/theme.css", { cache: "no-cache" });
  if (res.ok) $("os-theme").textContent = await res.text();
}

function resolvedMode(payload) {
  if (!payload) return null;
  if (payload.colorMode !== "auto") return payload.colorMode;
  return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function broadcastTheme(payload) {
  if (!payload) return;
  const message = { ...payload, type: "os.theme.changed", resolvedMode: resolvedMode(payload) };
  for (const tab of tabs.values()) tab.iframe.contentWindow?.postMessage(message, tab.origin);
}

async function onThemeChanged(payload) {
  themePayload = payload;
  await loadThemeCss();
  broadcastTheme(payload);
  syncPicker();
}

matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => broadcastTheme(themePayload));

let catalogue = [];
async function loadPicker() {
  catalogue = await api("GET", "/api/os/themes");
  for (const [slot, tone] of [["light", "light"], ["dark", "dark"]]) {
    const select = $(`theme-${slot}`);
    select.replaceChildren(...catalogue.filter((t) => t.tone === tone)
      .map((t) => el("option", { value: t.id, textContent: t.name })));
    select.onchange = () => quietly(selectTheme({ [slot === "light" ? "themeIdLight" : "themeIdDark"]: select.value }));
  }
  for (const radio of document.querySelectorAll('input[name="mode"]')) {
    radio.onchange = () => quietly(selectTheme({ colorMode: radio.value }));
  }
  themePayload = { ...(await api("GET", "/api/os/theme")), ...(themePayload || {}) };
  syncPicker();
}

async function selectTheme(change) {
  await api("POST", "/api/os/themes/select", change);
}

async function preview(slot, id) {
  if (!id) return;
  const theme = await api("GET", `/api/os/themes/${encodeURIComponent(id)}`);
  const keys = ["bg", "surface", "surface2", "text", "primary", "secondary", "danger", "success"];
  $(`preview-${slot}`).replaceChildren(...keys.map((k) => {
    const swatch = el("span", { title: `${k}: ${theme.palette[k]}`, style: `background:${theme.palette[k]}` });
    swatch.setAttribute("role", "img");
    swatch.setAttribute("aria-label", `${k} ${theme.palette[k]}`);
    return swatch;
  }));
}

function syncPicker() {
  if (!themePayload || !catalogue.length) return;
  $("theme-light").value = themePayload.themeIdLight;
  $("theme-dark").value = themePayload.themeIdDark;
  for (const radio of document.querySelectorAll('input[name="mode"]')) radio.checked = radio.value === themePayload.colorMode;
  quietly(preview("light", themePayload.themeIdLight));
  quietly(preview("dark", themePayload.themeIdDark));
}

// ---------------------------------------------------------------- launcher
let appsListed = null;   // the text of the last /api/apps answer drawn
async function loadApps() {
  const listed = await api("GET", "/api/apps");
  const text = JSON.stringify(listed);
  if (text === appsListed) return;   // the same list: the grid stays as drawn
  appsListed = text;
  apps = shared.apps = listed;
  renderApps();   // the home's grid (home.js)
}

async function launch(appId) {
  // one tab per instance: the app's own view already open is brought to the front
  const open = [...tabs.values()].find((t) => t.appId === appId && !t.activityId);
  if (open) return activate(open.key);
  const instance = await api("POST", "/api/instances", { appId });
  instances.set(instance.instanceId, instance);
  await openView(instance, "/", instance.name);
}

// ---------------------------------------------------------------- views and tabs
async function openView(instance, path, title, activityId = null) {
  const view = await api("POST", `/api/instances/${instance.instanceId}/views`, { path, client: clientId });
  const key = `t${nextKey++}`;
  const origin = new URL(view.url).origin;
  const iframe = el("iframe", { src: view.url, title: title || instance.appId });
  iframe.dataset.instanceId = instance.instanceId;
  iframe.dataset.appId = instance.appId;
  iframe.setAttribute("sandbox", "allow-scripts allow-forms allow-same-origin allow-popups allow-downloads");
  const name = title || instance.appId;
  // a tablist holds tabs only: the × inside a tab is a mouse shortcut (hidden from assistive
  // technology); the keyboard closes the focused tab with Delete, or the active one with the
  // "Close tab" button beside the tablist
  const close = el("span", { className: "close", textContent: "×", title: `Close ${name}` });
  close.setAttribute("aria-hidden", "true");
  const tabEl = el("button", { className: "tab", type: "button", role: "tab", id: `tab-${key}` }, el("span", { textContent: name }), close);
  tabEl.setAttribute("aria-controls", `view-${key}`);
  tabEl.setAttribute("aria-selected", "false");
  tabEl.setAttribute("aria-keyshortcuts", "Delete");
  iframe.id = `view-${key}`;
  iframe.setAttribute("role", "tabpanel");
  iframe.setAttribute("aria-labelledby", `tab-${key}`);
  tabEl.dataset.key = key;
  const tab = { key, instanceId: instance.instanceId, appId: instance.appId, viewId: view.viewId, iframe, el: tabEl, origin, activityId, loaded: false };
  tabs.set(key, tab);
  tabEl.onclick = () => activate(key);
  close.onclick = (event) => { event.stopPropagation(); quietly(closeTab(key)); };
  tabEl.onkeydown = (event) => { if (event.key === "Delete") quietly(closeTab(key)); };
  iframe.addEventListener("load", () => {
    tab.loaded = true;
    if (active === key) quietly(markResumed(tab));
  });
  $("tabs").append(tabEl);
  $("views").append(iframe);
  await activate(key);
  return tab;
}

function tabsOf(instanceId) {
  return [...tabs.values()].filter((t) => t.instanceId === instanceId);
}

async function activate(key) {
  const previous = active ? tabs.get(active) : null;
  active = key;
  for (const tab of tabs.values()) {
    tab.iframe.hidden = tab.key !== key;
    if (tab.problem) tab.problem.hidden = tab.key !== key;
    tab.el.classList.toggle("active", tab.key === key);
    tab.el.setAttribute("aria-selected", String(tab.key === key));
  }
  syncCloseButton();
  const tab = tabs.get(key);
  if (previous && previous.instanceId !== tab?.instanceId) quietly(api("POST", `/api/instances/${previous.instanceId}/pause`));
  if (!tab) return;
  const state = instances.get(tab.instanceId)?.state;
  if (state !== "resumed" && state !== "resuming") await quietly(api("POST", `/api/instances/${tab.instanceId}/resume`));
  tab.iframe.focus();
  if (tab.loaded) await quietly(markResumed(tab));   // back to a loaded view: no new load event
}

async function markResumed(tab) {
  if (!document.hasFocus() && document.visibilityState !== "visible") return;
  const instance = await api("POST", `/api/instances/${tab.instanceId}/resumed`);
  instances.set(instance.instanceId, instance);
}

function syncCloseButton() {
  const tab = active ? tabs.get(active) : null;
  showingHome(!tab);
  const button = $("close-tab");
  button.hidden = !tab;
  if (tab) button.setAttribute("aria-label", `Close ${tab.el.textContent.replace(/×$/, "")}`);
}

/** The home instead of the active tab: the tabs stay open (their instances paused, as when
 * another tab comes to the front). */
function goHome() {
  const previous = active ? tabs.get(active) : null;
  active = null;
  for (const tab of tabs.values()) {
    tab.iframe.hidden = true;
    if (tab.problem) tab.problem.hidden = true;
    tab.el.classList.remove("active");
    tab.el.setAttribute("aria-selected", "false");
  }
  syncCloseButton();
  if (previous) quietly(api("POST", `/api/instances/${previous.instanceId}/pause`));
}

async function closeTab(key) {
  const tab = tabs.get(key);
  if (!tab) return;
  tabs.delete(key);
  tab.el.remove();
  tab.iframe.remove();
  tab.problem?.remove();
  syncCloseButton();
  if (active === key) {
    active = null;
    const next = [...tabs.keys()].pop();
    if (next) await activate(next);
  }
  await quietly(api("DELETE", `/api/instances/${tab.instanceId}/views/${tab.viewId}`));
  if (tab.activityId) quietly(api("DELETE", `/api/instances/${tab.instanceId}/activities/${tab.activityId}`));
}

// ---------------------------------------------------------------- process manager
async function loadInstances() {
  for (const instance of await api("GET", "/api/instances")) instances.set(instance.instanceId, instance);
  renderProcs();
  instancesRead();
}

let procsTimer = null;
function refreshProcsSoon() {
  clearTimeout(procsTimer);
  procsTimer = setTimeout(() => quietly(refreshProcs()), 100);
}

async function refreshProcs() {
  const listed = await api("GET", "/api/instances");
  instances.clear();
  for (const instance of listed) instances.set(instance.instanceId, instance);
  renderProcs();
  instancesRead();
  await loadShared();
}

function renderProcs() {
  drawProcs(instances);   // procs.js
  markRunning();
}

// ---------------------------------------------------------------- default apps
async function loadDefaults() {
  const defaults = await api("GET", "/api/intents/defaults");
  const rows = defaults.map((d) => {
    const app = apps.find((a) => a.id === d.appId);
    const what = `${d.action}${d.type ? ` (${d.type})` : ""}`;
    const forget = el("button", {
      className: "ghost", type: "button", textContent: "Forget", ariaLabel: `Forget ${app?.name || d.appId} for ${what}`,
      onclick: async () => {
        const query = new URLSearchParams({ action: d.action, ...(d.type ? { type: d.type } : {}) });
        await quietly(api("DELETE", `/api/intents/defaults?${query}`));
        quietly(loadDefaults());
      },
    });
    const row = el("li", {}, el("strong", { textContent: app?.name || d.appId }), el("span", { textContent: ` for ${what}` }), forget);
    row.dataset.appId = d.appId;
    return row;
  });
  $("default-rows").replaceChildren(...(rows.length ? rows : [el("li", { className: "status", textContent: "No default apps: every tie asks you." })]));
}

// ---------------------------------------------------------------- intents and the bridge
async function startIntent(intent) {
  const result = await api("POST", "/api/intents/start", intent);
  if (result.status === "chooser") {
    const choice = await choose(intent, result.candidates);
    if (choice) {
      await api("POST", "/api/intents/start", { ...intent, target: choice.appId, remember: choice.remember });
      if (choice.remember) quietly(loadDefaults());
    }
  }
  // a started activity arrives as `activity:opened` and opens its tab there
}

function choose(intent, candidates) {
  const dialog = $("chooser");
  $("chooser-what").textContent = `${intent.action}${intent.type ? ` (${intent.type})` : ""}`;
  $("chooser-remember").checked = false;
  return new Promise((resolve) => {
    $("chooser-list").replaceChildren(...candidates.map((c) => {
      const app = apps.find((a) => a.id === c.appId);
      const button = el("button", { type: "button", className: "ghost", textContent: app?.name || c.appId, title: c.appId });
      button.dataset.appId = c.appId;
      button.onclick = () => { dialog.close("chosen"); resolve({ appId: c.appId, remember: $("chooser-remember").checked }); };
      return button;
    }));
    dialog.onclose = () => { if (dialog.returnValue !== "chosen") resolve(null); };
    dialog.showModal();
  });
}

/** An app's intent in plain words: who asks, to do what, with what. */
function describeIntent(tab, intent) {
  const who = apps.find((a) => a.id === tab.appId)?.name || tab.appId;
  const verb = VERBS[intent.action] || `start "${intent.action}" with`;
  const kind = intent.type ? (intent.type.startsWith("text/") ? "some text" : `a ${intent.type} item`) : "something";
  const text = typeof intent.extras?.text === "string" ? intent.extras.text : "";
  const preview = text ? `“${text.length > 120 ? `${text.slice(0, 120)}…` : text}”` : intent.uri || "";
  return [`${who} wants to ${verb} ${kind}`, preview ? `${preview}\nYou choose the app next.` : "You choose the app next."];
}

window.addEventListener("message", async (event) => {
  const tab = [...tabs.values()].find((t) => t.iframe.contentWindow === event.source);
  if (!tab || event.origin !== tab.origin) return;   // only our iframes, each from its own origin
  const data = event.data || {};
  if (data.type === "os.intent.start" && data.intent && typeof data.intent.action === "string") {
    const [title, text] = describeIntent(tab, data.intent);
    const ok = await confirmRequest(title, text);
    if (ok) loudly(startIntent(data.intent));
  } else if (data.type === "os.activity.open" && typeof data.path === "string" && data.path.startsWith("/")) {
    const instance = instances.get(tab.instanceId) || { instanceId: tab.instanceId, appId: tab.appId };
    quietly(openView(instance, data.path, String(data.title || tab.appId)));
  }
});

// ---------------------------------------------------------------- the author loop (`atrium dev`)
const devReloading = new Set();  // app ids whose dev copy is being swapped: their tabs stay

/** A dev copy's new version runs: each of its tabs gets a fresh view of the same instance in
 * the same iframe (the tab, its place and the activity stay), and a note says so. */
async function onDevReloaded(data) {
  devReloading.delete(data.appId);
  const open = [...tabs.values()].filter((t) => t.appId === data.appId);
  for (const tab of open) {
    if (!data.instanceIds.includes(tab.instanceId)) continue;   // not restarted: left as it is
    const view = await api("POST", `/api/instances/${tab.instanceId}/views`, { path: "/", client: clientId });
    if (!tabs.has(tab.key)) continue;   // closed meanwhile
    tab.viewId = view.viewId;
    tab.origin = new URL(view.url).origin;
    tab.loaded = false;
    tab.problem?.remove();
    tab.problem = null;
    tab.iframe.src = view.url;
    if (active === tab.key) quietly(api("POST", `/api/instances/${tab.instanceId}/resume`));
  }
  if (open.length) toast(`${appName(data.appId)} ${data.version} reloaded`, "ok");
}

/** A dev copy's save made no running version: the reason over each of its tabs, whose page
 * stays the last good one. */
function onDevFailed(data) {
  devReloading.delete(data.appId);
  for (const tab of tabs.values()) {
    if (tab.appId !== data.appId) continue;
    if (!tab.problem) {
      tab.problem = el("div", { className: "dev-problem", role: "alert" });
      tab.iframe.before(tab.problem);
    }
    tab.problem.replaceChildren(
      el("strong", { textContent: `${appName(data.appId)}: not reloaded, showing the last good version` }),
      el("pre", { textContent: data.message }));
    tab.problem.hidden = active !== tab.key;
  }
}

function appName(appId) {
  return tabs && [...tabs.values()].find((t) => t.appId === appId)?.el.textContent.replace(/×$/, "") || appId;
}

// ---------------------------------------------------------------- the event stream
function connectEvents() {
  const source = new EventSource(`/api/events?client=${clientId}`);
  useEventSource(source);
  let lost = false;
  let opened = false;
  source.onerror = () => {
    lost = true;
    banner("Lost the connection to the shell: reconnecting…");
  };
  source.onopen = () => {
    // read again what the stream did not carry: at its first opening, a change made between
    // the lists' loads and its subscription; after a loss, what changed meanwhile
    if (opened && !lost) return;
    opened = true;
    if (lost) banner("");
    lost = false;
    quietly(loadApps());
    quietly(refreshProcs());
  };
  source.addEventListener("theme:changed", (e) => quietly(onThemeChanged(JSON.parse(e.data))));
  source.addEventListener("grant:added", (e) => {
    if (JSON.parse(e.data).user === me?.id) quietly(loadShared());
  });
  source.addEventListener("grant:revoked", (e) => {
    const data = JSON.parse(e.data);
    if (data.user !== me?.id) return;
    // the shell closed the views of the grant: their tabs would only show an error now
    const open = tabsOf(data.instanceId);
    for (const tab of open) quietly(closeTab(tab.key));
    if (open.length) toast(`${data.owner} stopped sharing ${data.appId} with you: its view was closed.`);
    quietly(loadShared());
  });
  for (const topic of ["app:state", "app:crashed", "app:lifecycle.error"]) {
    source.addEventListener(topic, (e) => {
      const data = JSON.parse(e.data);
      const known = instances.get(data.instanceId);
      if (known && topic === "app:state") known.state = data.to;
      // a destroyed instance's tabs go: reloading them would show the shell's error page (a
      // dev copy's reload stops and starts its instances: their tabs stay, see onDevReloaded)
      if (topic === "app:state" && data.to === "installed" && !devReloading.has(data.appId)) {
        quietly(closeTabsOfGone(data.instanceId));
      }
      if (known && topic === "app:crashed") {
        known.state = "error";
        known.error = `crashed with exit status ${data.exitCode} in state ${data.state}`;
      }
      renderProcs();
      refreshProcsSoon();
    });
  }
  for (const topic of ["app:installed", "app:removed"]) source.addEventListener(topic, () => quietly(loadApps()));
  source.addEventListener("dev:reloading", (e) => devReloading.add(JSON.parse(e.data).appId));
  source.addEventListener("dev:reloaded", (e) => quietly(onDevReloaded(JSON.parse(e.data))));
  source.addEventListener("dev:failed", (e) => onDevFailed(JSON.parse(e.data)));
  source.addEventListener("activity:opened", (e) => {
    const data = JSON.parse(e.data);
    if ([...tabs.values()].some((t) => t.activityId === data.activityId)) return;
    const instance = instances.get(data.instanceId) || { instanceId: data.instanceId, appId: data.appId };
    quietly(openView(instance, data.path, data.title, data.activityId));
  });
  return source;
}

/** The tabs of an instance that ended, once the shell says its id names no instance now. An
 * id is used again once its instance is gone (`<app>-1`), and the stream may bring the earlier
 * instance's end after this page opened a tab of the new one (a stream behind the page's own
 * answers, or resumed from an older id): that tab stays. */
async function closeTabsOfGone(instanceId) {
  if (!tabsOf(instanceId).length) return;
  try {
    const now = await api("GET", `/api/instances/${encodeURIComponent(instanceId)}`);
    if (now.state !== "installed") return;
  } catch (err) {
    if (err.status !== 404) throw err;
  }
  for (const tab of tabsOf(instanceId)) quietly(closeTab(tab.key));
}

// ---------------------------------------------------------------- users
let me = null;                   // {id, name, role} of the signed-in user

/** No session: the sign-in form (password, and a button per OIDC provider) instead of the shell. */
async function showSignIn() {
  document.querySelector("header.bar").hidden = true;
  document.querySelector("body > main:not(#signin)").hidden = true;
  $("signin").hidden = false;
  document.body.classList.add("signing-in");
  const providers = await api("GET", "/api/auth/providers").catch(() => []);
  $("signin-providers").replaceChildren(...providers.map((p) =>
    el("a", { className: "button ghost", href: p.loginUrl || `/auth/oidc/${encodeURIComponent(p.id)}/login`, textContent: `Sign in with ${p.displayName || p.id}` })));
  $("signin-form").onsubmit = (event) => { event.preventDefault(); quietly(signIn()); };
  $("signin-user").focus();
  document.body.dataset.signin = "true";
}

async function signIn() {
  const result = $("signin-result");
  result.textContent = "";
  $("signin-go").disabled = true;
  try {
    await api("POST", "/api/session", { user: $("signin-user").value.trim(), password: $("signin-password").value });
    location.reload();
  } catch (err) {
    $("signin-password").value = "";
    if (err.code === "bad_credentials" || err.status === 401) result.textContent = "Wrong user or password.";
    else if (err.status === 429) result.textContent = "Too many attempts: wait a minute, then try again.";
    else result.textContent = err.message;
    $("signin-go").disabled = false;
    $("signin-password").focus();
    throw err;
  }
}

async function loadMe() {
  me = shared.me = await api("GET", "/api/me");
  $("open-account").textContent = me.name || me.id;
  $("open-account").setAttribute("aria-label", `Account: ${me.name || me.id}`);
  $("account-who").textContent = `Signed in as ${me.name || me.id} (${me.id}, ${me.role})`;
  $("open-users").hidden = me.role !== "admin";
}

async function signOut() {
  await api("DELETE", "/api/session");
  location.assign("/");
}

/** "Chrome on Linux" from a User-Agent header: the sign-ins list names devices, not strings. */
function deviceLabel(agent) {
  if (!agent) return "";
  const browser = [["Edg/", "Edge"], ["Firefox/", "Firefox"], ["Chrome/", "Chrome"], ["Safari/", "Safari"], ["curl/", "curl"], ["python", "Python"]]
    .find(([mark]) => agent.includes(mark))?.[1];
  const system = [["Android", "Android"], ["iPhone", "iPhone"], ["iPad", "iPad"], ["Windows", "Windows"], ["Mac OS", "macOS"], ["Linux", "Linux"]]
    .find(([mark]) => agent.includes(mark))?.[1];
  if (!browser) return agent.slice(0, 40);
  return system ? `${browser} on ${system}` : browser;
}

const when = (stamp) => (stamp ? new Date(typeof stamp === "number" ? stamp * 1000 : stamp).toLocaleString() : "");

async function loadAccount() {
  const [tokens, sessions] = await Promise.all([api("GET", "/api/tokens"), api("GET", "/api/sessions")]);
  $("token-rows").replaceChildren(...tokens.map((t) => el("li", {},
    el("span", { textContent: `${t.name}${t.expiresAt ? ` · expires ${when(t.expiresAt)}` : ""}` }),
    el("button", { className: "ghost", type: "button", textContent: "revoke", ariaLabel: `Revoke token ${t.name}`,
      onclick: () => loudly(api("DELETE", `/api/tokens/${encodeURIComponent(t.id)}`).then(loadAccount)) }))));
  $("session-rows").replaceChildren(...sessions.map((s) => el("li", {},
    el("span", { title: s.device || "", textContent: `${deviceLabel(s.device) || s.kind}${s.address ? ` · ${s.address}` : ""} · last seen ${when(s.lastSeen)}${s.current ? " (this one)" : ""}` }),
    s.current ? "" : el("button", { className: "ghost", type: "button", textContent: "end", ariaLabel: `End sign-in ${deviceLabel(s.device) || s.kind} last seen ${when(s.lastSeen)}`,
      onclick: () => loudly(api("DELETE", `/api/sessions/${encodeURIComponent(s.id)}`).then(loadAccount)) }))));
}

async function createToken() {
  const body = { name: $("token-name").value.trim() };
  const days = $("token-days").value;
  if (days) body.expiresInDays = Number(days);
  const made = await api("POST", "/api/tokens", body);
  $("token-secret").value = made.token;
  $("token-new").hidden = false;
  $("token-secret").select();
  $("token-form").reset();
  await loadAccount();
}

async function loadUsers() {
  const users = await api("GET", "/api/users");
  $("user-rows").replaceChildren(...users.map((u) => {
    const role = el("select", { ariaLabel: `Role of ${u.id}` },
      ...["member", "admin"].map((r) => el("option", { value: r, textContent: r, selected: r === u.role })));
    role.onchange = () => loudly(changeUser(u.id, { role: role.value }));
    const row = el("tr", {},
      el("td", { textContent: u.name && u.name !== u.id ? `${u.name} (${u.id})` : u.id }),
      el("td", {}, role),
      el("td", { textContent: u.disabled ? "disabled" : "enabled" }),
      el("td", { className: "actions" },
        el("button", { className: "ghost", type: "button", textContent: u.disabled ? "enable" : "disable",
          ariaLabel: `${u.disabled ? "Enable" : "Disable"} ${u.id}`, onclick: () => loudly(changeUser(u.id, { disabled: !u.disabled })) }),
        el("button", { className: "ghost", type: "button", textContent: "password", ariaLabel: `Reset the password of ${u.id}`,
          onclick: () => openPassword(u.id) })));
    row.dataset.userId = u.id;
    return row;
  }));
}

async function changeUser(id, change) {
  $("users-result").textContent = "";
  try {
    await api("PATCH", `/api/users/${encodeURIComponent(id)}`, change);
  } catch (err) {
    $("users-result").textContent = err.message;
  }
  await loadUsers();
}

async function addUser() {
  const body = { id: $("user-id").value.trim(), role: $("user-role").value };
  if ($("user-name").value.trim()) body.name = $("user-name").value.trim();
  if ($("user-password").value) body.password = $("user-password").value;
  try {
    await api("POST", "/api/users", body);
    $("user-form").reset();
    $("users-result").textContent = `Added ${body.id}.`;
  } catch (err) {
    $("users-result").textContent = err.message;
  }
  await loadUsers();
}

let passwordFor = null;
function openPassword(id) {
  passwordFor = id;
  $("password-title").textContent = `Reset the password of ${id}`;
  $("password-result").textContent = "";
  $("password-form").reset();
  $("password").showModal();
}

async function resetPassword() {
  try {
    await api("PUT", `/api/users/${encodeURIComponent(passwordFor)}/password`, { password: $("password-new").value });
    $("password").close();
    $("users-result").textContent = `Password of ${passwordFor} set.`;
  } catch (err) {
    $("password-result").textContent = err.message;
  }
}

let sharing = null;              // the instance the Share dialog is about
async function openShare(instance) {
  sharing = instance;
  $("share-title").textContent = `Share ${instance.name || instance.instanceId}`;
  $("share-result").textContent = "";
  $("share-form").reset();
  await loadGrants();
  $("share").showModal();
}

async function loadGrants() {
  const grants = await api("GET", `/api/instances/${sharing.instanceId}/grants`);
  $("grant-rows").replaceChildren(...grants.map((g) => el("li", {},
    el("span", { textContent: `${g.userName || g.user} · ${g.role}` }),
    el("button", { className: "ghost", type: "button", textContent: "revoke", ariaLabel: `Stop sharing with ${g.user}`,
      onclick: () => loudly(api("DELETE", `/api/instances/${sharing.instanceId}/grants/${encodeURIComponent(g.grantId)}`).then(loadGrants)) }))));
}

async function share() {
  try {
    await api("POST", `/api/instances/${sharing.instanceId}/grants`, { user: $("share-user").value.trim(), role: $("share-role").value });
    $("share-result").textContent = `Shared with ${$("share-user").value.trim()}.`;
    $("share-user").value = "";
  } catch (err) {
    $("share-result").textContent = err.message;
  }
  await loadGrants();
}

async function loadShared() {
  const shared = await api("GET", "/api/instances?shared=1");
  $("shared-title").hidden = $("shared").hidden = shared.length === 0;
  $("shared").replaceChildren(...shared.map((i) => {
    return el("li", {}, el("button", { className: "app shared-app", type: "button",
      textContent: `${i.name || i.appId} · ${i.owner} · ${i.access}`,
      ariaLabel: `Open ${i.name || i.appId} shared by ${i.owner} (${i.access})`,
      onclick: () => loudly(openView(i, "/", i.name || i.appId)) }));
  }));
}

function userPanels() {
  $("open-account").onclick = () => {
    $("account").hidden = !$("account").hidden;
    if (!$("account").hidden) { $("token-new").hidden = true; quietly(loadAccount()); }
  };
  $("open-users").onclick = () => {
    $("users").hidden = !$("users").hidden;
    if (!$("users").hidden) quietly(loadUsers());
  };
  $("signout").onclick = () => loudly(signOut());
  $("token-form").onsubmit = (event) => { event.preventDefault(); loudly(createToken()); };
  $("user-form").onsubmit = (event) => { event.preventDefault(); loudly(addUser()); };
  $("password-form").onsubmit = (event) => { event.preventDefault(); loudly(resetPassword()); };
  $("password-close").onclick = () => $("password").close();
  $("share-form").onsubmit = (event) => { event.preventDefault(); loudly(share()); };
  $("share-close").onclick = () => $("share").close();
}

// ---------------------------------------------------------------- start
function panels() {
  userPanels();
  for (const [button, panel] of [["open-procs", "procs"], ["open-theme", "theme"], ["open-defaults", "defaults"], ["open-versions", "versions"]]) {
    $(button).onclick = () => {
      $(panel).hidden = !$(panel).hidden;
      if (panel === "defaults" && !$(panel).hidden) quietly(loadDefaults());
      if (panel === "versions" && !$(panel).hidden) quietly(loadVersions());
    };
  }
  for (const close of document.querySelectorAll("[data-close]")) close.onclick = () => { $(close.dataset.close).hidden = true; };
  setUpStore({ launch });   // the store, its header button and the install review
}

function escCloses() {
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;   // dialogs close themselves on Esc
    const open = [...document.querySelectorAll("aside.panel")].filter((p) => !p.hidden);
    if (open.length) {
      open[open.length - 1].hidden = true;
      event.preventDefault();
    }
  });
}

function trackBarHeight() {
  // panels open below the header, which wraps to two lines on a phone
  const bar = document.querySelector("header.bar");
  const set = () => document.documentElement.style.setProperty("--bar-height", `${bar.offsetHeight}px`);
  new ResizeObserver(set).observe(bar);
  set();
}

async function start() {
  startHome({ launch, details: showDetail, home: goHome });
  startDetail({ launch });
  startProcs({ share: openShare });
  $("status").textContent = "";
  $("apps").replaceChildren(...skeletons(6));   // until the apps are listed
  startUsage();
  syncCloseButton();
  trackBarHeight();
  panels();
  escCloses();
  $("close-tab").onclick = () => { if (active) quietly(closeTab(active)); };
  await loadThemeCss();
  try {
    await loadApps();
  } catch (err) {
    if (err.status === 401) {
      await showSignIn();
      return;
    }
    throw err;
  }
  connectEvents();
  await Promise.all([quietly(loadMe()), quietly(loadInstances()), quietly(loadPicker()), quietly(loadShared())]);
  startNoticesQuietly();
  document.body.dataset.ready = "true";
  openFromAddress();
  window.addEventListener("hashchange", openFromAddress);
}

/** `#app=<id>` (what `atrium dev` prints) opens that app once the page is ready. */
function openFromAddress() {
  const wanted = new URLSearchParams(location.hash.slice(1)).get("app");
  if (!wanted) return;
  history.replaceState(null, "", location.pathname + location.search);
  loudly(launch(wanted));
}

window.atrium = { launch, startIntent, tabs, instances, refreshProcs };   // for the e2e tests and the console
start().catch(showError);

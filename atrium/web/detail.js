// The app detail (an app's ⋯) and the Versions panel: what the app is and who signed it, the
// storage its data takes, its updates (a pinned install's newer tags, "Update to v2"), its
// versions with rollback, its data kept (Back up now, Restore, Export, Import) and uninstall
// with a confirmation that says what happens to the data. docs/api.md "Distribution".

import {
  $, ApiError, VERBS, api, confirmRequest, el, errorNote, onEvent, onInstances, quietly, shared,
  skeletons,
} from "./core.js";

let launchApp = async () => {};
let current = null;              // the app the detail shows (GET /api/apps/{id})

/** host.js calls this once from start(): ``launch(appId)`` opens an app. */
export function startDetail({ launch }) {
  launchApp = launch;
  $("detail-import-file").onchange = () => {
    const file = $("detail-import-file").files[0];
    $("detail-import-file").value = "";
    if (file && current) quietly(importArchive(current, file, false));
  };
  $("detail-import").onclick = () => $("detail-import-file").click();
  $("versions-app").onchange = () => quietly(loadHistory());
  // a revoke or grant (here, in another tab, by another admin): the open detail says it
  onEvent("app:egress", (e) => { if ($("detail").open && current?.id === e.appId) quietly(showDetail(e.appId)); });
  // an instance started or stopped while the detail is open: its network row follows
  onInstances(() => {
    const cell = document.querySelector('#detail-facts tr[data-fact="Network"] td');
    if (cell && $("detail").open && current) cell.textContent = networkWords(current.id);
  });
}

// ---------------------------------------------------------------- words
/** 1234567 → "1.2 MB": sizes in the units people read (powers of 1000, as file managers do). */
export function size(bytes) {
  if (bytes == null) return "—";
  if (bytes < 1000) return `${bytes} byte${bytes === 1 ? "" : "s"}`;
  const units = ["kB", "MB", "GB", "TB"];
  let value = bytes;
  let unit = -1;
  while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit += 1; }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

const stamp = (iso) => (iso ? iso.replace("T", " ").slice(0, 16) : "—");
const SCOPE_WORDS = { system: "built into Atrium", global: "for everyone on this machine", user: "only for you" };

/** What an uninstall does to the data, exactly as docs/api.md says (Backups, Export and import). */
function uninstallWords(app) {
  const record = app.record || {};
  const words = [`Its code is removed from the ${app.scope} scope.`];
  if (app.dataWithApp) {
    words.push(`The data of your instances is deleted with it (${size(app.dataBytes)} today).`);
  } else {
    words.push(`The data of your instances stays in your own folder (${size(app.dataBytes)}): a reinstall finds it.`);
  }
  if (app.scope === "global") words.push("Every other user's own data of it stays in their folder.");
  words.push(record.dev
    ? "This is a dev copy: its backups are deleted too."
    : "Its backups are kept: a reinstall finds them, and Restore brings the data back.");
  return words.join("\n");
}

/** The isolation of an instance's network (the instances' ``network``, docs/api.md "Network"). */
const NETWORK_WORDS = {
  own: "Own network: reaches only Atrium",
  loopback: "Own network: reaches nothing",
  slirp4netns: "Own network: reaches nothing",
  host: "Shared network: the computer's own",
  cluster: "The cluster's network",
};

/** The networks the caller's running instances of ``appId`` have, in words ("—": none runs). */
function networkWords(appId) {
  const kinds = [...shared.instances.values()]
    .filter((i) => i.appId === appId && i.network)
    .map((i) => NETWORK_WORDS[i.network] || i.network);
  return [...new Set(kinds)].join("; ") || "—";
}

// ---------------------------------------------------------------- the detail
export async function showDetail(appId) {
  const app = await api("GET", `/api/apps/${encodeURIComponent(appId)}`);
  current = app;
  const record = app.record;
  const manifest = app.manifest || {};
  const name = app.name || app.id;
  $("detail-title").textContent = `${name} ${app.version || ""}`.trim();
  $("detail-title").title = app.id;
  $("detail-id").textContent = app.id;
  const signed = !record ? "—"
    : record.signedBy ? `${record.signedBy} (a key this scope trusts)`
      : "No trusted signature recorded";
  const facts = [
    ["App id", app.id],
    ["For", `${SCOPE_WORDS[app.scope] || app.scope} (${app.scope})${app.masks?.length ? `, hides the ${app.masks.join(", ")} copy` : ""}`],
    ["Source", record ? `${record.ref} (${record.source})` : app.scope === "system" ? "bundled with Atrium" : "placed by hand"],
    ["Signed by", signed],
    ["Installed", record ? stamp(record.installedAt) + " UTC" : "—"],
    ["Storage", app.dataBytes == null ? "—" : `${size(app.dataBytes)} of data (yours)`],
    ["Shares data as", manifest.dataProvider ? `“${manifest.dataProvider.authority}”` : "—"],
    ["Handles", [...new Set((manifest.intentFilters || []).map((f) => VERBS[f.action] || f.action))].join(", ") || "—"],
    ["Network", networkWords(app.id)],
  ];
  $("detail-facts").replaceChildren(...facts.map(([k, v]) => {
    const row = el("tr", {}, el("th", { scope: "row", textContent: k }), el("td", { textContent: v }));
    row.dataset.fact = k;
    return row;
  }));
  const perms = (app.permissions || []).map((p) => el("li", {}, el("strong", { textContent: p.label }), p.description ? el("span", { className: "hint", textContent: ` — ${p.description}` }) : "", p.label !== p.name ? el("code", { className: "raw", textContent: p.name }) : ""));
  if (app.network?.egress?.words) perms.push(egressItem(app));
  $("detail-permissions").replaceChildren(...(perms.length ? perms : [el("li", { className: "status", textContent: "Nothing: it asks for no permission." })]));

  // a global app's tree is an admin's: a member keeps (backs up, restores) only their own data
  const changeable = Boolean(record) && app.scope !== "system"
    && !(app.scope === "global" && shared.me && shared.me.role !== "admin");
  const keepsData = app.scope !== "system";
  $("detail-open").onclick = () => { $("detail").close(); quietly(launchApp(app.id)); };
  $("detail-updates").hidden = !changeable;
  $("detail-data").hidden = !keepsData;
  $("detail-history-box").hidden = !changeable;
  $("detail-uninstall").hidden = !changeable;
  $("detail-export").hidden = !changeable;
  $("detail-import").hidden = !keepsData;
  $("detail-review").hidden = true;
  $("detail-newer").replaceChildren();
  $("detail-pin").textContent = record?.pinned
    ? `Pinned to ${record.pinned}: it gets no newer version by itself.`
    : record ? `Follows ${record.channel ? `the ${record.channel} channel` : "its source"}: Update takes its newest version.` : "";
  $("detail-update").textContent = record?.pinned ? "Check for newer versions" : "Update";
  $("detail-update").onclick = () => quietly(update(app, {}));
  $("detail-backup").onclick = () => quietly(backUpNow(app));
  $("detail-export").href = `/api/dist/export/${encodeURIComponent(app.id)}?scope=${encodeURIComponent(app.scope)}`;
  $("detail-export").download = `${app.id}.tar.zst`;
  $("detail-uninstall").onclick = () => quietly(uninstall(app));
  say("");
  if (!$("detail").open) $("detail").showModal();
  if (keepsData) await loadKept(app);
}

/** "Can reach the internet" (what the manifest asks, granted at install), with Revoke (or, once
 * revoked, Allow again) for whoever may manage it: an admin for a shared copy, the user for
 * their own scope's (docs/api.md "Network"). */
function egressItem(app) {
  const egress = app.network.egress;
  const item = el("li", {}, el("strong", { textContent: egress.words }));
  item.dataset.egress = egress.revoked ? "revoked" : "granted";
  if (egress.revoked) item.append(el("span", { className: "hint", textContent: " — revoked: it reaches only Atrium" }));
  const manages = app.scope === "user" || shared.me?.role === "admin";
  if (manages) {
    const path = `/api/apps/${encodeURIComponent(app.id)}/egress`;
    const button = el("button", {
      type: "button",
      className: "ghost",
      textContent: egress.revoked ? "Allow again" : "Revoke",
      onclick: () => quietly(act(
        () => api(egress.revoked ? "PUT" : "DELETE", path),
        () => (egress.revoked ? `${app.name || app.id} may reach it again.` : `${app.name || app.id} no longer reaches the network.`),
      ).then((ok) => (ok ? showDetail(app.id) : null))),
    });
    button.dataset.action = "egress";
    item.append(" ", button);
  }
  return item;
}

/** The result line of the detail: words, or a styled alert for an error. */
function say(message, err = null) {
  const result = $("detail-result");
  if (err) {
    result.replaceChildren(errorNote(err));
    result.scrollIntoView({ block: "nearest" });
  } else {
    result.textContent = message;
  }
}

async function act(work, done) {
  say("Working…");
  try {
    say(done(await work()));
    return true;
  } catch (err) {
    say("", err);
    return false;
  }
}

/** Versions and backups of the app (one history call): both lists of the detail. */
async function loadKept(app) {
  const rows = $("detail-history");
  const list = $("detail-backups");
  rows.replaceChildren(...skeletons(2, "tr"));
  list.replaceChildren(...skeletons(2, "li"));
  const target = { id: app.id, scope: app.scope };
  let history;
  try {
    history = await api("GET", `/api/dist/history/${encodeURIComponent(app.id)}?scope=${encodeURIComponent(app.scope)}`);
  } catch (err) {
    rows.replaceChildren();
    if (err.status !== 404) { list.replaceChildren(el("li", {}, errorNote(err))); return; }
    history = { entries: [], backups: [], current: app.version };
  }
  const after = () => { quietly(reloadDetail(app.id)); };
  rows.replaceChildren(...historyRows(target, history, say, after));
  list.replaceChildren(...backupRows(target, history.backups, say, after));
  $("detail-storage").textContent = "A backup copies your own data of it; Export packs the app with that data into one file, Import puts such a file back.";
}

async function reloadDetail(appId) {
  if (!$("detail").open || current?.id !== appId) return;
  const app = await api("GET", `/api/apps/${encodeURIComponent(appId)}`);
  current = app;
  const storage = document.querySelector('#detail-facts tr[data-fact="Storage"] td');
  if (storage) storage.textContent = app.dataBytes == null ? "—" : `${size(app.dataBytes)} of data (yours)`;
  await loadKept(app);
}

async function backUpNow(app) {
  await act(() => api("POST", `/api/dist/backups/${encodeURIComponent(app.id)}`, { scope: app.scope }),
    (b) => `Backed up ${b.files} file${b.files === 1 ? "" : "s"} (${size(b.bytes)}).`);
  await reloadDetail(app.id);
}

async function uninstall(app) {
  const name = app.name || app.id;
  if (!(await confirmRequest(`Uninstall ${name}?`, uninstallWords(app), "Uninstall"))) return;
  const ok = await act(() => api("DELETE", `/api/dist/uninstall/${encodeURIComponent(app.id)}?scope=${encodeURIComponent(app.scope)}`),
    () => "Uninstalled.");
  if (ok) $("detail").close();
}

// ---------------------------------------------------------------- updates
/** Update (or check a pinned install): an update that asks for more shows its review here and
 * goes on only with "Allow and update" (the digest the user saw is sent back). */
async function update(app, body) {
  $("detail-review").hidden = true;
  say(body.to ? `Updating to ${body.to}…` : "Looking for a newer version…");
  let result;
  try {
    result = await api("POST", `/api/dist/update/${encodeURIComponent(app.id)}`, body);
  } catch (err) {
    say("", err);
    return;
  }
  if (result.needsApproval) {
    say("");
    review(app, body, result);
    return;
  }
  if (result.upToDate) {
    const newer = result.newerTags || [];
    say(result.pinned
      ? `Pinned to ${result.pinned}: ${newer.length ? `newer version${newer.length > 1 ? "s" : ""} ${newer.join(", ")} ${newer.length > 1 ? "are" : "is"} out.` : "no newer version is out."}`
      : "Already up to date.");
    $("detail-newer").replaceChildren(...[...newer].reverse().map((tag) => el("button", {
      type: "button", className: "ghost", textContent: `Update to ${tag}`,
      onclick: () => quietly(update(app, { to: tag })),
    })));
    return;
  }
  const note = `Updated to ${result.record.version}${result.record.pinned ? ` (pinned to ${result.record.pinned})` : ""}.`;
  if ($("detail").open && current?.id === app.id) await quietly(showDetail(app.id));
  say(note);
}

function review(app, body, result) {
  const diff = result.diff || {};
  $("detail-review-title").textContent = `${app.name || app.id} ${diff.versionFrom ? `${diff.versionFrom} → ` : ""}${diff.versionTo || ""}`;
  const asks = (result.permissions || []).map((p) => el("li", {}, el("strong", { textContent: p.label }),
    p.description ? el("span", { className: "hint", textContent: ` — ${p.description}` }) : "",
    p.label !== p.name ? el("code", { className: "raw", textContent: p.name }) : ""));
  if (diff.toolsAdded?.length) asks.push(el("li", { textContent: `Run these programs of this machine: ${diff.toolsAdded.join(", ")}` }));
  if (diff.dataProviderAdded) asks.push(el("li", { textContent: "Share its own data with other apps (a data provider)" }));
  if (diff.egressAdded != null && result.egress?.words) asks.push(el("li", { className: "egress", textContent: result.egress.words }));
  if (diff.intentFiltersAdded?.length) asks.push(el("li", { textContent: `Handle requests to ${[...new Set(diff.intentFiltersAdded.map((f) => VERBS[f.action] || f.action))].join(", ")}` }));
  const signature = result.signature;
  if (signature?.signerChanged) asks.push(el("li", { textContent: `It is signed by ${signature.signer || "no trusted key"}, not by ${app.record?.signedBy || "the key"} that signed the installed version` }));
  // what the new version may use, in words (its manifest's resources, else the admin's default)
  if (result.resources?.words) asks.push(el("li", { className: "resources", textContent: `It ${result.resources.words}.` }));
  $("detail-asks").replaceChildren(...asks);
  $("detail-review").hidden = false;
  $("detail-approve").onclick = () => quietly(update(app, { ...body, autoApprove: true, approvedDigest: result.resolved?.digest }));
  $("detail-deny").onclick = () => { $("detail-review").hidden = true; say("Not updated."); };
  $("detail-approve").focus();
}

// ---------------------------------------------------------------- import
/** The archive ``file`` (an export) into the app's scope; an import that needs approval shows
 * the review and is sent again only with "Allow and import". */
async function importArchive(app, file, approved) {
  const name = app.name || app.id;
  if (!approved && !(await confirmRequest(`Import ${file.name} into ${name}?`,
    "The app and its data in the archive replace what is installed; the data you have now is backed up first.",
    "Import"))) return;
  say(`Importing ${file.name}…`);
  const query = new URLSearchParams({ scope: app.scope, appId: app.id });   // another app's archive is refused
  if (approved) query.set("autoApprove", "1");
  let result;
  try {
    const response = await fetch(`/api/dist/import?${query}`, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/zstd", Accept: "application/json" }, body: file,
    });
    result = await response.json().catch(() => null);
    if (!response.ok) throw new ApiError(response.status, result);
  } catch (err) {
    say("", err);
    return;
  }
  if (result.needsApproval) {
    say("");
    review(app, {}, result);
    $("detail-approve").textContent = "Allow and import";
    $("detail-approve").onclick = () => { $("detail-review").hidden = true; $("detail-approve").textContent = "Allow and update"; quietly(importArchive(app, file, true)); };
    return;
  }
  const note = result.dataOnly
    ? `Imported the data (${result.folders?.length ?? 0} folder${result.folders?.length === 1 ? "" : "s"}).`
    : `Imported ${name} ${result.record?.version || ""}.`.replace(" .", ".");
  say(note);
  await reloadDetail(app.id);
  say(note);
}

// ---------------------------------------------------------------- versions and backups lists
/** The history's rows: each earlier version offers "Roll back to this" (after a confirmation). */
function historyRows(target, history, report, after) {
  return history.entries.map((e) => {
    const back = e.version && e.version !== history.current && e.operation !== "uninstall"
      ? el("button", {
        className: "ghost", type: "button", textContent: "Roll back to this",
        ariaLabel: `Roll back ${target.id} to ${e.version}`,
        onclick: () => quietly(confirmed(`Roll ${target.id} back to ${e.version}?`,
          "Its running instances restart on that version, with the data it had then (today's is backed up first).",
          () => api("POST", `/api/dist/rollback/${encodeURIComponent(target.id)}`, { scope: target.scope, to: e.commit }),
          (r) => `Rolled back to ${r.record.version}${r.dataRestored ? " with its data" : ""}.`, report, after, "Roll back")),
      })
      : "";
    const row = el("tr", {}, el("td", { textContent: stamp(e.when) }),
      el("td", { textContent: e.rollbackOf ? `rollback from ${e.rollbackOf}` : e.operation }),
      el("td", { textContent: e.version || "—" }), el("td", {}, back));
    row.dataset.version = e.version || "";
    return row;
  });
}

function backupRows(target, backups, report, after) {
  const rows = backups.map((b) => {
    const restore = el("button", {
      className: "ghost", type: "button", textContent: "Restore", ariaLabel: `Restore backup ${b.id}`,
      onclick: () => quietly(confirmed(`Restore ${target.id}'s data from ${stamp(b.createdAt)}?`,
        "Its running instances stop for the restore; today's data is backed up first, then replaced by this backup's.",
        () => api("POST", `/api/dist/restore/${encodeURIComponent(target.id)}`, { scope: target.scope, backup: b.id }),
        (r) => `Restored the data of ${r.restored.createdAt.slice(0, 19)}.`, report, after, "Restore")),
    });
    const row = el("li", {}, el("span", { textContent: `${stamp(b.createdAt)} · ${b.version} · ${b.reason} · ${b.files} file${b.files === 1 ? "" : "s"} · ${size(b.bytes)}` }), restore);
    row.dataset.backupId = b.id;
    return row;
  });
  return rows.length ? rows : [el("li", { className: "status", textContent: "No backups yet: one is taken before every update and rollback, and Back up now takes one." })];
}

async function confirmed(title, text, work, done, report, after, yes) {
  if (!(await confirmRequest(title, text, yes))) return;
  report("Working…");
  try {
    report(done(await work()));
  } catch (err) {
    report("", err);
  }
  await after();
}

// ---------------------------------------------------------------- the Versions panel
let versionsOf = [];   // the install records, {id, scope, version}

function versionsSay(message, err = null) {
  const result = $("versions-result");
  if (err) result.replaceChildren(errorNote(err));
  else result.textContent = message;
}

export async function loadVersions() {
  versionsOf = (await api("GET", "/api/dist/installed")).filter((r) => !r.damaged);
  const select = $("versions-app");
  const keep = select.value;
  select.replaceChildren(...versionsOf.map((r, n) => {
    const option = el("option", { value: String(n), textContent: `${r.id} (${r.scope}, ${r.version})` });
    option.dataset.appId = r.id;
    return option;
  }));
  if (keep && Number(keep) < versionsOf.length) select.value = keep;
  await loadHistory();
}

export function selectVersionsOf(appId) {
  const index = versionsOf.findIndex((r) => r.id === appId);
  if (index >= 0) {
    $("versions-app").value = String(index);
    quietly(loadHistory());
  }
}

async function loadHistory() {
  const record = versionsOf[Number($("versions-app").value)];
  if (!record) {
    $("history-rows").replaceChildren();
    $("backup-rows").replaceChildren(el("li", { className: "status", textContent: "Nothing installed from a source yet." }));
    return;
  }
  $("history-rows").replaceChildren(...skeletons(3, "tr"));
  $("backup-rows").replaceChildren(...skeletons(2, "li"));
  const history = await api("GET", `/api/dist/history/${encodeURIComponent(record.id)}?scope=${encodeURIComponent(record.scope)}`);
  const after = () => loadVersions();
  $("history-rows").replaceChildren(...historyRows(record, history, versionsSay, after));
  $("backup-rows").replaceChildren(...backupRows(record, history.backups, versionsSay, after));
}

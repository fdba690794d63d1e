// The store: the catalogue as cards people can search and filter, the "add a catalogue" step of a
// first run, and the install review in plain words (what the app is, who publishes it, whether a
// trusted key signed it, what it asks for and offers, and the scope, chosen on the review itself).

import { $, VERBS, api, appIcon, el, loudly, monogram, quietly, shared, skeletons, sse } from "./core.js";
import { openUpdates } from "./home.js";

let launchApp = () => {};
let cards = [];            // [{entry, node, hay, categories}] of the catalogue shown
let category = "";         // the category chip pressed ("" is every category)
let entries = new Map();   // id → index entry (the review names the publisher and size from it)
/** Cards shown at once: a search over a thousand entries lays out this many at most (each
 * "Show more" adds as many), so a keystroke's cost does not grow with the catalogue. */
const PAGE = 30;
let limit = PAGE;

/** host.js calls this once from start(): ``launch(appId)`` opens an installed app. */
export function setUpStore({ launch }) {
  launchApp = launch;
  $("open-catalogue").onclick = () => {
    const panel = $("catalogue");
    panel.hidden = !panel.hidden;
    if (!panel.hidden) {
      loudly(loadStore());
      $("store-search").focus();
    }
  };
  $("store-search").oninput = () => filterCards();
  $("store-more").onclick = () => filterCards(true);
  $("store-setup-form").onsubmit = (event) => { event.preventDefault(); loudly(addCatalogue()); };
  $("store-change").onclick = () => showSetup(true, null);
  $("shot-close").onclick = () => $("shot").close();
  $("open-install").onclick = () => openInstall("");
  $("install-close").onclick = () => $("install").close();
  $("install-form").onsubmit = (event) => { event.preventDefault(); loudly(preview()); };
  for (const radio of document.querySelectorAll('input[name="install-scope"]')) {
    radio.onchange = () => loudly(preview());
  }
}

// ---------------------------------------------------------------- the catalogue
/** Bytes in the units people read: 12 KB, 3.4 MB. */
export function humanSize(bytes) {
  if (typeof bytes !== "number" || bytes < 0) return "";
  const units = ["bytes", "KB", "MB", "GB", "TB"];
  let value = bytes, unit = 0;
  while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit += 1; }
  // a no-break space: "4.2 MB" never wraps between the figure and its unit
  return unit === 0 ? `${value}\u00a0bytes` : `${value < 10 ? value.toFixed(1) : Math.round(value)}\u00a0${units[unit]}`;
}

/** The version an entry names: its own ``version``, else its stable channel's tag read as one. */
function versionOf(entry) {
  if (typeof entry.version === "string") return entry.version;
  const stable = entry.channels?.stable || {};
  const tag = stable["oci-tag"] || stable["git-tag"] || "";
  return /^v?\d+(\.\d+){0,2}([-+].*)?$/.test(tag) ? tag.replace(/^v/, "") : "";
}

/** Numeric comparison of dotted versions (a pre-release suffix counts as older). */
function newer(a, b) {
  const parts = (v) => v.split(/[-+]/)[0].split(".").map((n) => Number(n) || 0);
  const [x, y] = [parts(a), parts(b)];
  for (let i = 0; i < 3; i += 1) {
    if ((x[i] || 0) !== (y[i] || 0)) return (x[i] || 0) > (y[i] || 0);
  }
  return !a.includes("-") && b.includes("-");
}

async function updatesById() {
  // the home's update check, when the shell has it; else the index's versions decide
  try {
    const answer = await api("GET", "/api/dist/updates");
    return new Map((answer.updates || []).filter((u) => u.available).map((u) => [u.id || u.appId, u]));
  } catch {
    return null;
  }
}

export async function loadStore() {
  $("catalogue-status").textContent = "Loading the catalogue…";
  const rows = $("catalogue-rows");
  if (!rows.children.length || rows.querySelector(".skeleton")) rows.replaceChildren(...skeletons(4, rows.tagName === "UL" ? "li" : "div"));
  $("catalogue").setAttribute("aria-busy", "true");
  let snapshot;
  try {
    snapshot = await api("GET", "/api/dist/index");
  } catch (err) {
    $("catalogue").removeAttribute("aria-busy");
    $("catalogue-status").replaceChildren(alertOf(err.message, err.code));
    renderCards([], null);
    return;
  }
  $("catalogue").removeAttribute("aria-busy");
  if (snapshot.configured === false) {
    renderCards([], null);
    $("catalogue-status").textContent = "";
    showSetup(true, snapshot.message);
    return;
  }
  showSetup(false, null);
  $("store-change").hidden = shared.me?.role !== "admin" || snapshot.urlFrom === "environment";
  const listed = snapshot.index?.apps || [];
  const updates = listed.length ? await updatesById() : null;
  renderCards(listed, updates);
  const refused = snapshot.refused || [];
  if (!listed.length) {
    $("catalogue-status").replaceChildren(el("span", { textContent: snapshot.message || `The catalogue at ${snapshot.url} lists no app.` }));
    if (refused.length) {
      $("catalogue-status").append(el("ul", { className: "refused" },
        ...refused.map((r) => el("li", {}, el("strong", { textContent: r.id || "(no id)" }), ` — ${r.reason}`))));
    }
    return;
  }
  const from = `from ${snapshot.url}${snapshot.stale ? " (an offline copy)" : ""}`;
  $("catalogue-status").textContent = `${listed.length} app${listed.length > 1 ? "s" : ""} ${from}`
    + (refused.length ? `. ${snapshot.message}` : "");
}

function renderCards(listed, updates) {
  entries = new Map(listed.map((e) => [e.id, e]));
  const installed = new Map(shared.apps.map((a) => [a.id, a]));
  cards = listed.map((entry) => {
    const node = card(entry, installed.get(entry.id), updates);
    const categories = entry.categories || [];
    const hay = [entry.name, entry.description, entry.id, entry.publisher?.name, ...categories]
      .filter(Boolean).join("\n").toLowerCase();
    return { entry, node, hay, categories };
  });
  const all = [...new Set(cards.flatMap((c) => c.categories))].sort();
  if (category && !all.includes(category)) category = "";
  $("store-categories").replaceChildren(...["", ...all].map((name) => {
    const chip = el("button", { type: "button", className: "filter", textContent: name || "All" });
    chip.setAttribute("aria-pressed", String(name === category));
    chip.dataset.category = name;
    chip.onclick = () => {
      category = name;
      for (const other of $("store-categories").children) other.setAttribute("aria-pressed", String(other === chip));
      filterCards();
    };
    return chip;
  }));
  $("store-tools").hidden = cards.length === 0;
  filterCards();
}

/** Shows the cards matching the search words (each word in the name, description, id, publisher
 * or a category) and the category chip, ``PAGE`` at a time; the cards stay built, a search only
 * chooses which of them are in the list. */
export function filterCards(more = false) {
  const words = $("store-search").value.toLowerCase().split(/\s+/).filter(Boolean);
  limit = more ? limit + PAGE : PAGE;
  let matching = 0;
  const shown = [];
  for (const c of cards) {
    if ((!category || c.categories.includes(category)) && words.every((w) => c.hay.includes(w))) {
      matching += 1;
      if (matching <= limit) shown.push(c.node);
    }
  }
  // only the cards shown are in the document: the others cost no style or layout work
  const rows = $("catalogue-rows");
  const same = rows.children.length === shown.length && shown.every((node, i) => rows.children[i] === node);
  if (!same) rows.replaceChildren(...shown);
  const none = $("store-none");
  none.hidden = matching > 0 || cards.length === 0;
  none.textContent = none.hidden ? "" : "No app in the catalogue matches.";
  const rest = matching - limit;
  $("store-more").hidden = rest <= 0;
  $("store-more").textContent = rest > 0 ? `Show ${Math.min(rest, PAGE)} more (${matching} match)` : "";
}

/** An entry's icon: a glyph, or an image entry's data:image URL (the shell checked its type). */
function entryIcon(entry, name) {
  if (typeof entry.icon === "string" && DATA_ICON.test(entry.icon)) {
    const img = el("img", { className: "icon", src: entry.icon, alt: "" });
    img.onerror = () => img.replaceWith(monogram({ id: entry.id, name }));
    return img;
  }
  const glyph = typeof entry.icon === "string" && [...entry.icon].length <= 3 ? entry.icon : undefined;
  return appIcon({ id: entry.id, name, icon: glyph });
}
const DATA_ICON = /^data:image\/(png|svg\+xml|webp|jpeg|gif);base64,/;

function card(entry, app, updates) {
  const name = entry.name || entry.id;
  const icon = app ? appIcon(app) : entryIcon(entry, name);
  const title = el("h3", { textContent: name });
  const facts = el("p", { className: "facts-line" });
  const version = versionOf(entry);
  const bits = [
    entry.publisher?.name ? `by ${entry.publisher.name}` : "",
    version ? `version ${version}` : "",
    humanSize(entry.size),
  ].filter(Boolean);
  facts.textContent = bits.join(" · ");
  const cats = el("p", { className: "cats" }, ...(entry.categories || []).map((c) => el("span", { className: "cat", textContent: c })));
  const body = el("div", { className: "store-body" }, title, facts,
    el("p", { className: "description", textContent: entry.description || "" }), cats);
  // the app's and its publisher's pages; only http(s) (the shell checks the index, and so does this)
  const links = [[entry.homepage, `Website of ${name}`, "Website"], [entry.publisher?.url, `Website of ${entry.publisher?.name}`, "Publisher"]]
    .filter(([href]) => typeof href === "string" && /^https?:\/\//i.test(href))
    .map(([href, label, text]) => el("a", { href, textContent: text, ariaLabel: label, target: "_blank", rel: "noopener noreferrer", referrerPolicy: "no-referrer" }));
  if (links.length) body.append(el("p", { className: "links" }, ...links));
  const update = updates ? updates.get(entry.id) : app && version && app.version && newer(version, app.version) ? { latest: version } : null;
  let action;
  if (app && update) {
    action = el("button", { className: "primary", type: "button", textContent: "Update", ariaLabel: `Update ${name}` });
    // a pinned install updates to its source's newest tag (the updates panel does that); a
    // reinstall by the catalogue's id would quietly switch it to following the channel
    action.onclick = update.pinned ? () => { $("catalogue").hidden = true; openUpdates(); } : () => openInstall(entry.id, { update: app });
  } else if (app) {
    action = el("span", { className: "chip ok", textContent: "INSTALLED", title: `${name} ${app.version || ""} is installed` });
  } else {
    action = el("button", { className: "primary", type: "button", textContent: "Install", ariaLabel: `Install ${name}` });
    action.onclick = () => openInstall(entry.id);
  }
  const head = el("div", { className: "store-head" }, icon, body, el("div", { className: "store-action" }, action));
  const node = el("li", { className: "store-card" }, head);
  node.dataset.appId = entry.id;
  node.dataset.state = app ? (update ? "update" : "installed") : "available";
  const shots = (entry.screenshots || []).filter((s) => /^https?:\/\//.test(s));
  if (shots.length) {
    node.append(el("div", { className: "shots" }, ...shots.map((src, n) => {
      const open = el("button", { type: "button", className: "shot", ariaLabel: `Screenshot ${n + 1} of ${name}, enlarge` });
      const img = el("img", { src, alt: "", loading: "lazy", referrerPolicy: "no-referrer" });
      img.onerror = () => open.remove();   // a screenshot that does not load leaves no broken image
      open.append(img);
      open.onclick = () => {
        $("shot-img").src = src;
        $("shot-img").alt = `Screenshot ${n + 1} of ${name}`;
        $("shot").showModal();
      };
      return open;
    })));
  }
  return node;
}

// ---------------------------------------------------------------- add a catalogue
function showSetup(show, message) {
  const setup = $("store-setup");
  setup.hidden = !show;
  if (!show) return;
  const admin = shared.me?.role === "admin";
  $("store-setup-text").textContent = admin
    ? "A catalogue is a list of apps published somewhere: paste its address (https://…/index.json, or file:///… on this machine)."
    : "There is no catalogue yet. Ask an admin of this Atrium to add one: the store shows its apps once they have.";
  if (message && !admin) $("store-setup-text").textContent += ` (${message})`;
  $("store-setup-form").hidden = !admin;
  $("store-setup-result").replaceChildren();
  if (admin) $("store-url").focus();
}

const CATALOGUE_ERRORS = {
  bad_request: "That is not an address the store can read (it takes https://, http:// or file://).",
  fetch_failed: "The catalogue could not be read at that address.",
  index_url_fixed: "This shell's catalogue is set by its configuration (ATRIUM_INDEX_URL), so it cannot be changed here.",
  permission_denied: "Only an admin can add a catalogue.",
};

async function addCatalogue() {
  const url = $("store-url").value.trim();
  $("store-setup-result").textContent = "Reading the catalogue…";
  try {
    await api("PUT", "/api/dist/index", { url });
  } catch (err) {
    $("store-setup-result").replaceChildren(alertOf(CATALOGUE_ERRORS[err.code] || "The catalogue was not added.", err.code, err.message));
    return;
  }
  $("store-url").value = "";
  await loadStore();
}

/** An error in words, the shell's own message under it and its code in small print. */
function alertOf(words, code, detail) {
  const box = el("div", { className: "alert", role: "alert" }, el("strong", { textContent: words }));
  if (detail && detail !== words) box.append(el("span", { className: "detail", textContent: ` ${detail}` }));
  if (code) box.append(el("small", { className: "code", textContent: ` (${code})` }));
  return box;
}

// ---------------------------------------------------------------- install review
let reviewing = null;   // {ref, digest, appId, update} of the review on screen
let previewRun = 0;     // a scope change starts a new preview: an older one's answer is dropped
let scopeTried = false;  // a preview was refused for the chosen scope (its trust policy)

function installStep(step) {
  for (const item of document.querySelectorAll("#install .steps li")) {
    if (item.dataset.step === step) item.setAttribute("aria-current", "step");
    else item.removeAttribute("aria-current");
  }
  $("install-source").hidden = step !== "source";
  $("install-go").hidden = step !== "source";
  $("install-bar").hidden = step !== "fetch";
  $("install-open").hidden = step !== "done";
  const review = step === "review";
  $("install-diff").hidden = !review;
  $("install-approve").hidden = !review;
  $("install-deny").hidden = !review;
  // the scope is chosen on the review; after a refused preview too, so another scope can be tried
  $("install-scope-choice").hidden = !(review || (step === "source" && scopeTried));
  if (step !== "fetch") $("install-stage").textContent = "";
}

/** Opens the install dialog; with a ``ref`` the review is fetched at once. ``update``: the
 * installed app a store card's Update button replaces. */
export function openInstall(ref, { update = null } = {}) {
  $("catalogue").hidden = true;
  reviewing = null;
  scopeTried = false;
  $("install-ref").value = ref;
  $("install-result").replaceChildren();
  installStep("source");
  const member = shared.me?.role !== "admin" && shared.me !== null;
  const global = document.querySelector('input[name="install-scope"][value="global"]');
  global.disabled = member;
  $("install-scope-hint").hidden = !member;
  const scope = update?.scope === "user" || member ? "user" : "global";
  document.querySelector(`input[name="install-scope"][value="${scope}"]`).checked = true;
  $("install").showModal();
  if (ref) loudly(preview());
}

function chosenScope() {
  return document.querySelector('input[name="install-scope"]:checked')?.value || "global";
}

const STAGES = {
  "resolve.start": "Finding the app…", "resolve.done": "Found it.", "fetch.start": "Downloading…",
  "fetch.done": "Downloaded.", "validate.done": "Checked.", "check.start": "Trying the new version…",
  "install.start": "Installing…", "permission.approved": "Approved.",
};

async function* streamed(path, body) {
  const response = await fetch(path, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(body),
  });
  if (!response.ok) {
    const error = await response.json().catch(() => null);
    yield { type: "error", code: error?.error?.code, message: error?.error?.message || `HTTP ${response.status}`, ...(error?.error || {}) };
    return;
  }
  const bar = $("install-bar");
  for await (const event of sse(response)) {
    if (event.type === "fetch.progress" && event.total) {
      bar.max = event.total;
      bar.value = event.done ?? 0;
    } else if (STAGES[event.type]) {
      $("install-stage").textContent = STAGES[event.type];
    }
    yield event;
  }
}

/** Fetches and checks the app (nothing installed) and shows the review for the chosen scope. */
async function preview() {
  const ref = $("install-ref").value.trim();
  if (!ref) return;
  const run = ++previewRun;
  $("install-result").replaceChildren();
  installStep("fetch");
  $("install-bar").removeAttribute("value");
  $("install-stage").textContent = "Finding the app…";
  for await (const event of streamed("/api/dist/install/preview", { ref, scope: chosenScope() })) {
    if (run !== previewRun) return;
    if (event.type === "error") {
      // a review of another scope no longer holds: back to the source, the scope still choosable
      scopeTried = reviewing !== null || event.code === "untrusted_artifact";
      reviewing = null;
      installStep("source");
      $("install-result").replaceChildren(failure(event));
    } else if (event.type === "result") {
      showReview(ref, event);
    }
  }
}

const SIGNATURES = {
  signed: (s) => [`Signed by “${s.signer}”, a key this scope trusts.`, "ok"],
  unsigned: () => ["Not signed: nothing shows that it comes from who publishes it.", "warn"],
  unknown_signer: () => ["Signed, but by no key this scope trusts.", "warn"],
  invalid: () => ["Its signature does not match what was downloaded.", "bad"],
};

function signatureWords(signature) {
  if (!signature) return ["Signatures are not checked in this scope (its trust policy is off).", "off"];
  const words = SIGNATURES[signature.status];
  const [text, tone] = words ? words(signature) : [`Signature: ${signature.status}.`, "warn"];
  return [signature.signerChanged ? `${text} It was signed by another key before.` : text, tone];
}

const SOURCES = { oci: "an OCI registry", git: "a git repository", local: "a folder on this machine", index: "the store's catalogue" };

function showReview(ref, result) {
  const app = result.app || { id: result.diff.appId, name: result.diff.appId, version: result.diff.versionTo };
  const entry = entries.get(app.id) || entries.get(ref.split("@")[0]);
  const installed = shared.apps.find((a) => a.id === app.id);
  reviewing = { ref, digest: result.resolved?.digest, appId: app.id };
  installStep("review");
  const glyph = typeof app.icon === "string" && [...app.icon].length <= 3 ? app.icon : undefined;
  const icon = installed ? appIcon(installed)
    : glyph ? appIcon({ id: app.id, name: app.name, icon: glyph })
    : entry?.id === app.id && DATA_ICON.test(entry.icon || "") ? entryIcon(entry, app.name) : monogram(app);
  $("install-icon").replaceChildren(icon);
  $("install-app").textContent = app.name;
  $("install-app").title = app.id;
  const diff = result.diff;
  $("install-version").textContent = diff.versionFrom
    ? `Version ${diff.versionTo}, replacing ${diff.versionFrom}`
    : `Version ${diff.versionTo}`;
  // the catalogue's one line, else the manifest's description (the page shows its first lines)
  $("install-about").textContent = entry?.description || app.description || "";
  const publisher = entry?.publisher?.name;
  $("install-publisher").textContent = publisher ? `Published by ${publisher}` : "The publisher is not stated (it was not installed from the catalogue).";
  const [trust, tone] = signatureWords(result.signature);
  $("install-trust").textContent = trust;
  $("install-trust").dataset.tone = tone;
  const resolved = result.resolved || {};
  const where = `${SOURCES[resolved.source] || resolved.source}: ${resolved.address || ref}`;
  const size = entry?.size ?? app.size;
  // an image app: what it is (a container image, whose), its unpacked size, its data, its network
  const image = result.image;
  const facts = [
    ["Comes from", entry ? `the catalogue, ${where}` : where],
    ...(image ? [["What it is", `${image.words[0]}.`]] : []),
    ["Size", image ? image.words[1] : humanSize(size) || "not stated"],
    ...(image ? [["Its data", `${image.words[2]}.`], ["Network", `${image.words[3]}.`]] : []),
    ["App id", app.id],
  ];
  // the limits its instances will run under, in words (the manifest's, else the admin's default)
  if (result.resources?.words) facts.splice(2, 0, ["Resources", `It ${result.resources.words}.`]);
  $("install-facts").replaceChildren(...facts.map(([k, v]) => el("tr", {}, el("th", { scope: "row", textContent: k }), el("td", { textContent: v }))));
  const asks = (result.permissions || []).map((p) => {
    const item = el("li", {}, el("strong", { textContent: p.label }));
    if (p.description) item.append(el("span", { className: "hint", textContent: ` — ${p.description}` }));
    if (p.label !== p.name) item.append(el("code", { className: "raw", textContent: p.name }));
    item.dataset.permission = p.name;
    return item;
  });
  if (diff.toolsAdded?.length) asks.push(el("li", { textContent: `Run these programs of this machine: ${diff.toolsAdded.join(", ")}` }));
  // what it may reach beyond Atrium, granted by this approval ("Can reach the internet")
  if (result.egress?.words) asks.push(el("li", { className: "egress" }, el("strong", { textContent: result.egress.words })));
  if (!asks.length) {
    asks.push(el("li", { className: "nothing", textContent: diff.versionFrom ? "Nothing new: it asks for no permission it did not have." : "Nothing: it asks for no permissions." }));
  }
  $("install-asks").replaceChildren(...asks);
  const offers = [];
  if (diff.dataProviderAdded) {
    const as = app.authority ? `, as “${app.authority}”` : "";
    offers.push(el("li", { textContent: `Its own data to the other apps you allow${as} (a data provider)` }));
  }
  const verbs = [...new Set((diff.intentFiltersAdded || []).map((f) => VERBS[f.action] || f.action))];
  if (verbs.length) offers.push(el("li", { textContent: `To ${verbs.join(", ")} things for other apps` }));
  if (!offers.length) offers.push(el("li", { className: "nothing", textContent: "Nothing to other apps." }));
  $("install-offers").replaceChildren(...offers);
  $("install-result").replaceChildren(...(result.note ? [el("p", { className: "hint", textContent: `Note: ${result.note}` })] : []));
  $("install-approve").textContent = diff.versionFrom ? "Update" : "Install";
  $("install-approve").onclick = () => loudly(install({ autoApprove: true, approvedDigest: reviewing.digest }));
  $("install-deny").onclick = () => loudly(install({ approve: false }));
}

const CODES = {
  untrusted_artifact: (e) => `Not installed: this scope takes only apps signed by a key it trusts, and this one is ${signatureWords(e.signature)[0].toLowerCase().replace(/\.$/, "")}.`,
  approval_denied: () => "Not installed: you declined.",
  approval_stale: () => "Not installed: the app changed at its source since you reviewed it. Review it again.",
  busy: () => "Another change to this app is under way: try again in a moment.",
  permission_denied: (e) => `Not allowed: ${e.message}`,
  fetch_failed: () => "The app could not be downloaded.",
  fetch_host_refused: () => "That address is not one this shell lets you download from.",
  bad_ref: () => "That is not an address an app can be installed from.",
  not_found: () => "No such app was found.",
  install_failed: () => "The install failed; nothing was changed.",
  storage_full: () => "The disk is full; nothing was installed.",
};

function failure(event) {
  const words = CODES[event.code]?.(event);
  return alertOf(words || event.message, event.code, words ? event.message : undefined);
}

async function install(extra) {
  const { ref } = reviewing;
  const body = { ref, scope: chosenScope(), ...extra };
  $("install-result").replaceChildren();
  installStep("fetch");
  $("install-bar").removeAttribute("value");
  for await (const event of streamed("/api/dist/install", body)) {
    if (event.type === "error") {
      installStep(extra.approve === false ? "source" : "review");
      $("install-result").replaceChildren(failure(event));
    } else if (event.type === "result" && event.needsApproval) {
      showReview(ref, { ...event, app: null });   // the source changed what it asks for
    } else if (event.type === "result" && event.ok) {
      const record = event.record;
      const app = shared.apps.find((a) => a.id === record.id);
      installStep("done");
      const name = app?.name || $("install-app").textContent || record.id;
      const where = record.scope === "user" ? "for you" : "for everyone on this machine";
      $("install-result").replaceChildren(el("p", { className: "done", textContent: `Installed ${name} ${record.version} ${where}.` + (event.note ? ` Note: ${event.note}` : "") }));
      $("install-open").onclick = () => { $("install").close(); loudly(launchApp(record.id)); };
      quietly(loadStoreIfOpen());
    }
  }
}

async function loadStoreIfOpen() {
  if (!$("catalogue").hidden) await loadStore();
}

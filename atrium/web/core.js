// What every part of the host page shares: the API client, element building, messages to the
// user, app icons, the event stream's topics and the state the parts read. The parts (host.js and
// the modules beside it) import from here; nothing here imports them.

export const $ = (id) => document.getElementById(id);

/** State read by several parts. host.js owns the writes: `apps` after each load of /api/apps,
 * `instances` as the API reports them, `me` once signed in. */
export const shared = {
  apps: [],                  // GET /api/apps
  instances: new Map(),      // instanceId → instance as GET /api/instances reports it
  me: null,                  // {id, name, role} of the signed-in user
};

/** Who follows `shared.instances`: each is called after the list is read again. */
const instanceFollowers = [];
export function onInstances(fn) { instanceFollowers.push(fn); }
export function instancesRead() {
  for (const fn of instanceFollowers) {
    try { fn(); } catch (err) { console.error(err); }
  }
}

// ---------------------------------------------------------------- the event stream's topics
const handlers = new Map();  // topic → [fn(data)]
let stream = null;

/** Call ``fn(data)`` for each event of ``topic`` on the shell's event stream (parsed JSON). May
 * be called before the stream is open: the handler is attached when it opens. */
export function onEvent(topic, fn) {
  if (!handlers.has(topic)) {
    handlers.set(topic, []);
    if (stream) attach(stream, topic);
  }
  handlers.get(topic).push(fn);
}

function attach(source, topic) {
  source.addEventListener(topic, (e) => {
    const data = JSON.parse(e.data);
    for (const fn of handlers.get(topic)) {
      try { fn(data, e.lastEventId); } catch (err) { console.error(err); }
    }
  });
}

/** host.js hands its EventSource over once: every topic registered so far is attached. */
export function useEventSource(source) {
  stream = source;
  for (const topic of handlers.keys()) attach(source, topic);
}

// ---------------------------------------------------------------- API, elements, messages
export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
    this.body = body;
  }
}

export async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  const data = text ? JSON.parse(text) : null;
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export const quietly = (promise) => promise.catch((err) => console.debug("ignored:", err.message));

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props);
  for (const child of children) node.append(child);
  return node;
}


/** What the theme strategy means for the user, as a chip and its explanation. */
export const CHIPS = {
  themed: ["OWN PALETTE", "Uses its own colours; follows light and dark mode"],
  override: ["OWN LOOK", "Ignores the shell's theme"],
};

/** The app's icon: its image file, its glyph when the fonts can draw it, else a monogram. */
export function appIcon(app) {
  if (app.icon && app.icon.length > 3) {
    const img = el("img", { className: "icon", src: `/api/apps/${encodeURIComponent(app.id)}/icon`, alt: "" });
    img.onerror = () => img.replaceWith(monogram(app));
    return img;
  }
  if (app.icon && glyphDraws(app.icon)) {
    const glyph = el("span", { className: "icon", textContent: app.icon });
    glyph.setAttribute("aria-hidden", "true");
    return glyph;
  }
  return monogram(app);
}

export function monogram(app) {
  const words = (app.name || app.id).split(/[\s._-]+/).filter(Boolean);
  const letters = words.slice(0, 2).map((w) => w[0].toUpperCase()).join("");
  let hash = 0;
  for (const c of app.id) hash = (hash * 31 + c.charCodeAt(0)) % 360;
  const mark = el("span", { className: "icon monogram", textContent: letters });
  mark.style.background = `hsl(${hash} 50% 30%)`;   // dark enough for white text (WCAG AA) at every hue
  mark.setAttribute("aria-hidden", "true");
  return mark;
}

const drawn = new Map();
/** Whether the browser's fonts draw ``glyph``: compared with a code point no font has (which
 * draws the "missing glyph" box), pixel for pixel. */
function glyphDraws(glyph) {
  if (drawn.has(glyph)) return drawn.get(glyph);
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 32;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const pixels = (text) => {
    ctx.clearRect(0, 0, 32, 32);
    ctx.font = "24px sans-serif";
    ctx.textBaseline = "top";
    ctx.fillStyle = "#000";
    ctx.fillText(text, 2, 2);
    return ctx.getImageData(0, 0, 32, 32).data.join(",");
  };
  const missing = pixels("\u{10FFFD}");
  const mine = pixels(glyph);
  const ok = mine !== missing && /[1-9]/.test(mine);
  drawn.set(glyph, ok);
  return ok;
}

export function showError(err) {
  if (err.status === 401) {
    banner("Your session has ended: sign in again (reload the page).");
  } else {
    const note = errorNote(err);
    note.classList.add("toast");
    const close = el("button", { type: "button", className: "ghost alert-close", textContent: "×", ariaLabel: "Dismiss" });
    close.onclick = () => note.remove();
    note.append(close);
    $("toasts").append(note);
    setTimeout(() => note.remove(), 12000);
  }
  console.error(err);
}

/** What went wrong, by the answer's status, in the words of the one who asked. */
const TROUBLE = {
  400: "That request was not accepted",
  403: "Not allowed",
  404: "Not found",
  409: "Not possible right now",
  413: "Too large",
  422: "Not possible",
  429: "Too many attempts: wait a moment",
  502: "The source could not be reached",
  503: "The shell cannot do that right now",
  507: "The disk is full",
};

/** An error as a styled alert: the reason in words (the shell's message), the kind of trouble
 * as its title, and the error code (and HTTP status) in small print. */
export function errorNote(err) {
  const offline = !err.status && err instanceof TypeError;
  const title = offline ? "The shell cannot be reached"
    : TROUBLE[err.status] || (err.status >= 500 ? "Something went wrong in the shell" : "That did not work");
  const note = el("div", { className: "alert error", role: "alert" },
    el("span", { className: "alert-mark", textContent: "!", ariaHidden: "true" }),
    el("div", { className: "alert-body" },
      el("strong", { className: "alert-title", textContent: title }),
      el("span", { className: "alert-reason", textContent: offline ? "Check that it is running, then try again." : err.message })));
  const code = [err.code, err.status ? `HTTP ${err.status}` : ""].filter(Boolean).join(" · ");
  if (code) note.querySelector(".alert-body").append(el("small", { className: "alert-code", textContent: code }));
  if (err.code) note.dataset.code = err.code;
  return note;
}

/** Placeholders drawn while a list loads (instead of "Loading…"): ``n`` grey bars as ``tag``
 * (`li`, `tr` or `div`), hidden from assistive technology. */
export function skeletons(n, tag = "div") {
  return Array.from({ length: n }, () => {
    const bar = el("span", { className: "skeleton-bar" });
    const node = tag === "tr" ? el("tr", {}, el("td", { colSpan: 6 }, bar)) : el(tag, {}, bar);
    node.className = "skeleton";
    node.setAttribute("aria-hidden", "true");
    return node;
  });
}

export function toast(message, kind = "") {
  const note = el("div", { className: `toast ${kind}`.trim(), role: "status", textContent: message });
  $("toasts").append(note);
  setTimeout(() => note.remove(), 8000);
}

export function banner(message) {
  $("banner").textContent = message || "";
  $("banner").hidden = !message;
}

// failures of actions the user asked for are shown, not swallowed
export const loudly = (promise) => promise.catch(showError);


export const VERBS = {
  "os.intent.action.SEND": "share",
  "os.intent.action.VIEW": "open",
  "os.intent.action.EDIT": "edit",
  "os.intent.action.CREATE_NOTE": "make a note of",
};


/** Ask first: ``title`` and ``text`` say what happens; ``yes`` names the action on its button
 * (an app's request keeps "Allow", an action the user asked for names itself, with "Cancel"). */
export function confirmRequest(title, text, yes = null) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  const [no, ok] = dialog.querySelectorAll("menu button");
  no.textContent = yes ? "Cancel" : "Refuse";
  ok.textContent = yes || "Allow";
  ok.classList.toggle("danger", Boolean(yes));
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === "yes");
    dialog.showModal();
  });
}


export async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let type = "message", data = "";
      for (const line of frame.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) yield { type, ...JSON.parse(data) };
    }
  }
}


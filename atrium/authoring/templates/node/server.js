// {{APP_NAME}}: an Atrium app on Node's own http module (`atrium new --template node`).
//
// It meets the whole contract of docs/authoring.md by hand: refuse any request without the
// shell's secret, answer /health with the instance's identity, answer every lifecycle hook, name
// the app on every answer, keep data in OS_DATA_DIR.
//
// The page at / lists items. The content provider {{APP_ID}} serves them to other apps:
// GET /api/data/{{APP_ID}}/items needs {{APP_ID}}.read, POST with {"text": "..."} needs
// {{APP_ID}}.write (the shell checks both before the request arrives here). The intent
// {{APP_ID}}.action.ADD_ITEM with extras {"text": ...} adds an item and opens the page; since
// adding is a write, its filter in the manifest names {{APP_ID}}.write too, and the shell starts
// it only for the user and apps holding that.
"use strict";

const crypto = require("node:crypto");
const fs = require("node:fs");
const http = require("node:http");
const path = require("node:path");

const APP_ID = process.env.OS_APP_ID || "{{APP_ID}}";
const INSTANCE_ID = process.env.OS_INSTANCE_ID || "";
// OS_APP_TOKEN / OS_SHELL_SECRET: the environment, else the file $OS_SECRETS_DIR/<name>
// (on Kubernetes the secrets are files of the pod, never its environment).
function appSecret(name) {
  if (process.env[name]) return process.env[name];
  if (!process.env.OS_SECRETS_DIR) return "";
  try {
    return fs.readFileSync(path.join(process.env.OS_SECRETS_DIR, name), "utf8").trim();
  } catch {
    return "";
  }
}
const SECRET = Buffer.from(appSecret("OS_SHELL_SECRET"));
const DATA_DIR = process.env.OS_DATA_DIR || ".";
const PAGE = fs.readFileSync(path.join(__dirname, "index.html"));
const PROVIDER = "/api/data/items";
const SHELL_ROUTES = ["/health", "/api/lifecycle", "/api/data"];
const HOOKS = ["onCreate", "onStart", "onResume", "onPause", "onStop", "onDestroy", "onActivityCreate"];
const MAX_BODY = 1024 * 1024;

function trusted(req) {
  const given = req.headers["x-os-shell-secret"];
  if (!SECRET.length || typeof given !== "string") return false;
  const bytes = Buffer.from(given);
  return bytes.length === SECRET.length && crypto.timingSafeEqual(bytes, SECRET);
}

function send(res, status, body, type = "application/json") {
  const data = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
  res.writeHead(status, {"Content-Type": type, "Content-Length": data.length, "X-Os-App-Id": APP_ID});
  res.end(res.req.method === "HEAD" ? undefined : data);
}

function error(res, status, code, message) {
  send(res, status, {error: {code, message}});
}

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
}

// The page, greeting who is looking: the shell names them on every page request (X-Os-User-Id,
// X-Os-User-Name percent-encoded UTF-8, X-Os-User-Role: owner, or viewer/editor for a user the
// instance was shared with).
function pageFor(req) {
  const id = req.headers["x-os-user-id"];
  if (!id) return PAGE;
  let name = req.headers["x-os-user-name"] || id;
  try { name = decodeURIComponent(name); } catch { /* kept as sent */ }
  const who = `<p class="status" id="who">Hello, ${escapeHtml(name)}</p>`;
  return Buffer.from(PAGE.toString().replace("<!--os-user-->", () => who));
}

function load() {
  try {
    const items = JSON.parse(fs.readFileSync(path.join(DATA_DIR, "items.json"), "utf8"));
    return Array.isArray(items) ? items : [];
  } catch {
    return [];
  }
}

// One event loop: nothing else of this process writes between the read and the rename. The
// temporary file and the rename keep the file whole whatever happens midway.
function add(text) {
  fs.mkdirSync(DATA_DIR, {recursive: true});
  const items = load();
  const item = {id: crypto.randomBytes(6).toString("hex"), text};
  items.push(item);
  const tmp = path.join(DATA_DIR, `.items.json.${process.pid}.tmp`);
  const fd = fs.openSync(tmp, "w");
  fs.writeSync(fd, JSON.stringify(items));
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  fs.renameSync(tmp, path.join(DATA_DIR, "items.json"));
  notifyChange("/items");
  return item;
}

// Tell the shell that a path of this app's authority changed; a lost notice must not fail the write.
function notifyChange(changed) {
  fetch((process.env.OS_SHELL_URL || "").replace(/\/$/, "") + "/api/data-changes", {
    method: "POST",
    headers: {"Authorization": "Bearer " + appSecret("OS_APP_TOKEN"), "Content-Type": "application/json"},
    body: JSON.stringify({path: changed}),
  }).catch((err) => console.error(`notifyChange ${changed} failed: ${err}`));
}

function parse(raw) {
  try { return JSON.parse(raw.toString() || "{}"); } catch { return null; }
}

function hook(res, name, body) {
  if (name.startsWith("onActivityDestroy/")) return send(res, 200, {ok: true});
  if (name === "onActivityCreate") {
    // extras come from whoever started the intent (body.intent.callerAppId, null for the user):
    // this adds an item only because the filter's permission let that caller in
    const extras = body && body.extras;
    if (extras && typeof extras.text === "string" && extras.text.trim()) add(extras.text);
    return send(res, 200, {path: "/", title: "{{APP_NAME}}"});
  }
  if (HOOKS.includes(name)) return send(res, 200, {ok: true});
  return error(res, 404, "not_found", `no lifecycle hook ${name}`);
}

function items(req, res, raw) {
  if (req.method === "GET" || req.method === "HEAD") return send(res, 200, load());
  if (req.method !== "POST") return error(res, 405, "bad_request", `${req.method} /items: use GET or POST`);
  const body = parse(raw);
  const text = body && body.text;
  if (typeof text !== "string" || !text.trim()) {
    return error(res, 400, "bad_request", 'the body must be a JSON object {"text": "..."}');
  }
  return send(res, 201, add(text));
}

function route(req, res, raw) {
  const url = req.url.split("?")[0];
  const page = req.headers["x-os-request-kind"] === "page";
  if (page && SHELL_ROUTES.some((r) => url === r || url.startsWith(r + "/"))) {
    return error(res, 404, "not_found", `${url} is for the shell`);
  }
  if (url === "/health" && (req.method === "GET" || req.method === "HEAD")) {
    return send(res, 200, {appId: APP_ID, instanceId: INSTANCE_ID, ok: true});
  }
  if (url.startsWith("/api/lifecycle/") && req.method === "POST") {
    return hook(res, url.slice("/api/lifecycle/".length), parse(raw));
  }
  if (url === PROVIDER) return items(req, res, raw);
  if (url === "/" && (req.method === "GET" || req.method === "HEAD")) {
    return send(res, 200, pageFor(req), "text/html; charset=utf-8");
  }
  return error(res, 404, "not_found", `no route for ${req.method} ${url}`);
}

const server = http.createServer((req, res) => {
  if (!trusted(req)) {
    res.setHeader("Connection", "close"); // the body is left unread
    return error(res, 403, "permission_denied", "this app only answers the Atrium shell");
  }
  const chunks = [];
  let size = 0;
  req.on("data", (chunk) => {
    size += chunk.length;
    if (size > MAX_BODY) {
      error(res, 413, "bad_request", `the body exceeds ${MAX_BODY} bytes`);
      req.destroy();
    } else {
      chunks.push(chunk);
    }
  });
  req.on("end", () => {
    if (res.headersSent) return;
    try {
      route(req, res, Buffer.concat(chunks));
    } catch (err) {
      console.error(err);
      if (!res.headersSent) error(res, 500, "internal", `${req.method} ${req.url} failed; see the app's log`);
    }
  });
});
server.keepAliveTimeout = 300000; // the shell keeps connections open between requests
server.listen(Number(process.env.OS_PORT || process.env.PORT || 0), process.env.OS_HOST || "127.0.0.1");
// every write above is synchronous and atomic: leaving at once on SIGTERM loses nothing
process.on("SIGTERM", () => process.exit(0));

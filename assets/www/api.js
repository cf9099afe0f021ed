// This server's API from the page: keys, JSON calls, server-sent event streams and the
// admin forms' calls.
import { $ } from "./dom.js";
import { store } from "./store.js";

// Admin routes use the admin key, the others the API key; each is asked for once, when a
// route first answers 401/403, and kept in localStorage.
function keyName(path) { return path.startsWith("/admin/") ? "adminKey" : "apiKey"; }

function authHeaders(path) {
  const key = store.get(keyName(path), "");
  return key ? { Authorization: "Bearer " + key } : {};
}

// A 401, or a 403 about the key (not one refusing, say, a path).
async function isKeyRefusal(response) {
  if (response.status === 401) return true;
  if (response.status !== 403) return false;
  try { const j = await response.clone().json(); return !!j.error && j.error.code === "invalid_api_key"; }
  catch { return false; }
}

export async function api(path, { method = "GET", body, signal } = {}, retried = false) {
  const used = store.get(keyName(path), "");
  const init = { method, signal, headers: { ...authHeaders(path) } };
  if (body !== undefined) {
    // A form (files with their names) goes as multipart, which the browser labels itself;
    // anything else as JSON.
    const form = body instanceof FormData;
    init.method = method === "GET" ? "POST" : method;
    init.body = form ? body : JSON.stringify(body);
    if (!form) init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  const refusedKey = await isKeyRefusal(response);
  if (refusedKey && !retried) {
    // Another request may have asked for the key meanwhile: use it rather than ask again.
    if (store.get(keyName(path), "") !== used) return api(path, { method, body, signal }, true);
    const which = keyName(path) === "adminKey" ? "admin key ([listen] admin_key)" : "API key ([listen] api_keys)";
    const given = window.prompt(`This server needs its ${which}:`, "");
    if (given) { store.set(keyName(path), given.trim()); return api(path, { method, body, signal }, true); }
  } else if (refusedKey && store.get(keyName(path), "") === used && used) {
    // The key just given was refused: forget it, so the next request asks again.
    store.set(keyName(path), "");
  }
  return response;
}

// The server's own words (the OpenAI error envelope's message), with the status code.
export async function errorText(response) {
  let text;
  try { const j = await response.json(); text = (j.error && j.error.message) || JSON.stringify(j); }
  catch { text = response.statusText; }
  return `HTTP ${response.status}: ${text}`;
}

export async function getJSON(path) {
  const r = await api(path);
  if (!r.ok) throw new Error(await errorText(r));
  return r.json();
}

// Reads a server-sent event stream from a fetch response; calls onEvent(parsed JSON) per
// event and stops at [DONE]. Accepts "data:" with or without the space; skips ": ping".
export async function readSSE(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (!data) continue;
      if (data === "[DONE]") { reader.cancel().catch(() => {}); return; }
      onEvent(JSON.parse(data));
    }
  }
}

// One admin call made from a form: `pending` shows in `result` (and `button` is disabled)
// until the answer; then the line `done(answer)` returns, or `failed` and the server's words.
export async function callInto({ result, button, pending, failed }, path, body, done) {
  const out = $(result);
  out.className = "note"; out.textContent = pending;
  if (button) $(button).disabled = true;
  try {
    const r = await api(path, { method: "POST", body });
    if (!r.ok) throw new Error(await errorText(r));
    out.textContent = await done(await r.json());
  } catch (e) {
    out.className = "note error"; out.textContent = failed + e.message;
  } finally {
    if (button) $(button).disabled = false;
  }
}

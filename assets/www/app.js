// ai00-like web page: chat, continuation, models and status, talking to this server's API.
// Plain JS, no build step. Everything the page keeps (conversations, settings, keys) is in
// localStorage under "ai00like.*".
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const store = {
  get(key, fallback) {
    try { const v = localStorage.getItem("ai00like." + key); return v === null ? fallback : JSON.parse(v); }
    catch { return fallback; }
  },
  set(key, value) { localStorage.setItem("ai00like." + key, JSON.stringify(value)); },
};

// ------------------------------------------------------------------ HTTP, keys and SSE

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

async function api(path, { method = "GET", body, signal } = {}, retried = false) {
  const used = store.get(keyName(path), "");
  const init = { method, signal, headers: { ...authHeaders(path) } };
  if (body !== undefined) { init.method = method === "GET" ? "POST" : method; init.body = JSON.stringify(body); init.headers["Content-Type"] = "application/json"; }
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
async function errorText(response) {
  let text;
  try { const j = await response.json(); text = (j.error && j.error.message) || JSON.stringify(j); }
  catch { text = response.statusText; }
  return `HTTP ${response.status}: ${text}`;
}

async function getJSON(path) {
  const r = await api(path);
  if (!r.ok) throw new Error(await errorText(r));
  return r.json();
}

// Reads a server-sent event stream from a fetch response; calls onEvent(parsed JSON) per
// event and stops at [DONE]. Accepts "data:" with or without the space; skips ": ping".
async function readSSE(response, onEvent) {
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

// ------------------------------------------------------------------ Markdown (safe)

function escapeHTML(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function inline(s) { // s is already escaped
  return s
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
}

// HTML is escaped first, so nothing the model writes can become markup of its own.
function renderMarkdown(text) {
  const parts = escapeHTML(text).split(/```/);
  let html = "";
  parts.forEach((part, i) => {
    if (i % 2 === 1) { html += "<pre><code>" + part.replace(/^[\w+-]*\n/, "") + "</code></pre>"; return; }
    let list = null;
    for (const para of part.split(/\n{2,}/)) {
      const lines = para.split("\n").filter((l) => l.trim() !== "");
      if (!lines.length) continue;
      if (lines.every((l) => /^\s*([-*]|\d+\.)\s+/.test(l))) {
        list = /^\s*\d+\./.test(lines[0]) ? "ol" : "ul";
        html += `<${list}>` + lines.map((l) => "<li>" + inline(l.replace(/^\s*([-*]|\d+\.)\s+/, "")) + "</li>").join("") + `</${list}>`;
      } else if (/^#{1,6}\s/.test(lines[0]) && lines.length === 1) {
        const level = Math.min(6, lines[0].match(/^#+/)[0].length + 2);
        html += `<h${level}>` + inline(lines[0].replace(/^#+\s/, "")) + `</h${level}>`;
      } else {
        html += "<p>" + lines.map(inline).join("<br>") + "</p>";
      }
    }
  });
  return html;
}

// ------------------------------------------------------------------ sampler settings

const SAMPLER_FIELDS = {
  Nucleus: { top_p: 0.5, top_k: 128, temperature: 1, presence_penalty: 0.3, frequency_penalty: 0.3, penalty_decay: 0.99654026 },
  Typical: { tau: 0.5, top_k: 128, temperature: 1, presence_penalty: 0.3, frequency_penalty: 0.3, penalty_decay: 0.99654026 },
  Mirostat: { tau: 3, rate: 0.1 },
};

function defaultSettings() {
  return { type: "Nucleus", values: JSON.parse(JSON.stringify(SAMPLER_FIELDS)), max_tokens: 500, stop: "", state: "",
    format: "text", schema: "", grammar: "" };
}

const settings = { chat: store.get("settings.chat", defaultSettings()), continue: store.get("settings.continue", defaultSettings()) };
let knownStates = [];

function renderSettings(which) {
  const box = $(`[data-settings="${which}"]`);
  const s = settings[which];
  const save = () => store.set("settings." + which, s);
  box.innerHTML = "<h3>Settings</h3>";
  const add = (label, input) => { const l = document.createElement("label"); l.textContent = label; l.appendChild(input); box.appendChild(l); return input; };
  const type = add("Sampler", document.createElement("select"));
  type.name = "sampler";
  for (const t of Object.keys(SAMPLER_FIELDS)) type.add(new Option(t, t, false, t === s.type));
  type.onchange = () => { s.type = type.value; save(); renderSettings(which); };
  for (const [field, def] of Object.entries(SAMPLER_FIELDS[s.type])) {
    const input = document.createElement("input");
    input.type = "number"; input.step = "any"; input.name = field;
    input.value = s.values[s.type][field] ?? def;
    input.onchange = () => { s.values[s.type][field] = Number(input.value); save(); };
    add(field.replace(/_/g, " "), input);
  }
  const max = document.createElement("input");
  max.type = "number"; max.min = 1; max.name = "max_tokens"; max.value = s.max_tokens;
  max.onchange = () => { s.max_tokens = Number(max.value); save(); };
  add("max tokens", max);
  const stop = document.createElement("textarea");
  stop.rows = 3; stop.name = "stop"; stop.placeholder = "one per line (empty: the server's)"; stop.value = s.stop;
  stop.onchange = () => { s.stop = stop.value; save(); };
  add("stop words", stop);
  const state = document.createElement("select");
  state.name = "state";
  state.add(new Option("(none)", ""));
  for (const st of knownStates) state.add(new Option(st.name + (st.default ? " (default)" : ""), st.id, false, st.id === s.state));
  // A choice the loaded model does not have is still sent: show it as it is, not as "(none)".
  if (s.state && !knownStates.some((st) => st.id === s.state)) state.add(new Option(s.state + " (not loaded)", s.state, false, true));
  state.onchange = () => { s.state = state.value; save(); };
  add("initial state", state);
  const format = document.createElement("select");
  format.name = "response_format";
  for (const f of ["text", "json_object", "json_schema"]) format.add(new Option(f, f, false, f === (s.format || "text")));
  format.onchange = () => { s.format = format.value; save(); renderSettings(which); };
  add("response format", format);
  if (s.format === "json_schema") {
    const schema = document.createElement("textarea");
    schema.rows = 5; schema.name = "json_schema"; schema.spellcheck = false; schema.value = s.schema || "";
    schema.placeholder = '{"type": "object", "properties": {…}}';
    schema.onchange = () => { s.schema = schema.value; save(); };
    add("JSON schema", schema);
  }
  const grammar = document.createElement("textarea");
  grammar.rows = 4; grammar.name = "bnf_schema"; grammar.spellcheck = false; grammar.value = s.grammar || "";
  grammar.placeholder = "KBNF grammar (Ai00's bnf_schema), e.g.\nstart::=\"yes\"|\"no\";";
  grammar.onchange = () => { s.grammar = grammar.value; save(); };
  add("grammar (KBNF)", grammar);
  const reset = document.createElement("button");
  reset.type = "button"; reset.className = "plain"; reset.textContent = "Defaults";
  reset.onclick = () => { settings[which] = defaultSettings(); store.set("settings." + which, settings[which]); renderSettings(which); };
  box.appendChild(reset);
}

function samplingBody(which) {
  const s = settings[which];
  const body = { stream: true, max_tokens: s.max_tokens, sampler_override: { type: s.type, ...s.values[s.type] } };
  const stops = s.stop.split("\n").map((x) => x.replace(/\\n/g, "\n")).filter((x) => x !== "");
  if (stops.length) body.stop = stops;
  if (s.state) body.state = s.state;
  if (s.grammar && s.grammar.trim()) body.bnf_schema = s.grammar;
  if (s.format === "json_object") body.response_format = { type: "json_object" };
  if (s.format === "json_schema") {
    let schema;
    try { schema = JSON.parse(s.schema || ""); } catch (e) { throw new Error("The JSON schema in the settings is not JSON: " + e.message); }
    body.response_format = { type: "json_schema", json_schema: { name: "schema", schema, strict: true } };
  }
  return body;
}

// ------------------------------------------------------------------ tokens/s, measured here

// The last reply's rate as this page saw it (the server's own rates are in the status).
// Each streamed piece counts as one token (the server sends one token per event).
const rate = { last: null };
function countTokens(n, started) {
  if (n) rate.last = { tokens: n, seconds: (performance.now() - started) / 1000 };
  if (lastStatus) renderStatus(lastStatus);
}

// ------------------------------------------------------------------ chat

let conversations = store.get("conversations", []);
let current = store.get("current", null);
let chatAbort = null;

function saveConversations() { store.set("conversations", conversations); store.set("current", current); }
function conversation() { return conversations.find((c) => c.id === current); }

function newConversation() {
  const c = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New conversation", messages: [] };
  conversations.unshift(c); current = c.id; saveConversations(); renderChat();
}

function renderConversations() {
  const ul = $("#conversations");
  ul.innerHTML = "";
  for (const c of conversations) {
    const li = document.createElement("li");
    li.className = c.id === current ? "active" : "";
    const title = document.createElement("span");
    title.textContent = c.title;
    const del = document.createElement("button");
    del.textContent = "×"; del.title = "Delete";
    del.onclick = (e) => {
      e.stopPropagation();
      conversations = conversations.filter((x) => x.id !== c.id);
      if (current === c.id) current = conversations.length ? conversations[0].id : null;
      saveConversations(); renderChat();
    };
    li.onclick = () => { if (!chatAbort) { current = c.id; saveConversations(); renderChat(); } };
    li.append(title, del);
    ul.appendChild(li);
  }
}

function messageElement(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  if (m.role === "assistant") div.innerHTML = renderMarkdown(m.content); else div.textContent = m.content;
  if (m.error) { const e = document.createElement("div"); e.className = "error"; e.textContent = m.error; div.appendChild(e); }
  return div;
}

function renderChat() {
  if (!conversation()) { if (conversations.length) current = conversations[0].id; else return newConversation(); }
  renderConversations();
  const box = $("#chat-messages");
  box.innerHTML = "";
  for (const m of conversation().messages) box.appendChild(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

function setChatBusy(busy) {
  $("#chat-send").disabled = busy; $("#chat-regenerate").disabled = busy; $("#chat-stop").disabled = !busy;
}

async function reply() {
  const c = conversation();
  const history = c.messages.map(({ role, content }) => ({ role, content }));
  const answer = { role: "assistant", content: "" };
  c.messages.push(answer);
  const div = messageElement(answer);
  div.classList.add("streaming");
  $("#chat-messages").appendChild(div);
  chatAbort = new AbortController();
  setChatBusy(true);
  const started = performance.now();
  let tokens = 0;
  try {
    const r = await api("/v1/chat/completions", { method: "POST", body: { ...samplingBody("chat"), messages: history }, signal: chatAbort.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readSSE(r, (event) => {
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (delta && delta.content) {
        tokens += 1;
        answer.content += delta.content;
        div.innerHTML = renderMarkdown(answer.content);
        $("#chat-messages").scrollTop = $("#chat-messages").scrollHeight;
      }
    });
  } catch (e) {
    if (e.name !== "AbortError") answer.error = e.message;
  } finally {
    countTokens(tokens, started);
    chatAbort = null;
    setChatBusy(false);
    div.classList.remove("streaming");
    div.classList.add(answer.error ? "failed" : "done");
    if (answer.error) { const er = document.createElement("div"); er.className = "error"; er.textContent = answer.error; div.appendChild(er); }
    saveConversations();
  }
}

async function send(text) {
  const c = conversation();
  c.messages.push({ role: "user", content: text });
  if (c.title === "New conversation") c.title = text.slice(0, 40);
  saveConversations();
  renderChat();
  await reply();
}

// ------------------------------------------------------------------ continuation

let continueAbort = null;
async function continueText() {
  const box = $("#continue-text");
  continueAbort = new AbortController();
  $("#continue-go").disabled = true; $("#continue-stop").disabled = false;
  $("#continue-error").textContent = "";
  const started = performance.now();
  let tokens = 0;
  try {
    const r = await api("/v1/completions", { method: "POST", body: { ...samplingBody("continue"), prompt: box.value }, signal: continueAbort.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readSSE(r, (event) => {
      const text = event.choices && event.choices[0] && event.choices[0].text;
      if (text) { tokens += 1; box.value += text; box.scrollTop = box.scrollHeight; }
    });
  } catch (e) {
    if (e.name !== "AbortError") $("#continue-error").textContent = e.message;
  } finally {
    countTokens(tokens, started);
    continueAbort = null;
    $("#continue-go").disabled = false; $("#continue-stop").disabled = true;
    store.set("continue.text", box.value);
  }
}

// ------------------------------------------------------------------ models

function humanSize(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

let loadedStatus = null;

function describeModel(info) {
  return info ? `${info.version} · ${info.num_layer} layers · ${info.num_emb} wide · vocab ${info.num_vocab}` : "";
}

function renderLoaded(status) {
  loadedStatus = status;
  const box = $("#loaded-info");
  const badge = $("#model-badge");
  if (!status.loaded) {
    box.textContent = status.loading ? `Loading ${status.loading}…` : "No model is loaded." + (status.last_error ? " Last error: " + status.last_error : "");
    badge.textContent = status.loading ? "loading…" : "no model";
  } else {
    const r = status.reload;
    box.innerHTML = "";
    const line = (label, value) => { const p = document.createElement("div"); p.innerHTML = `<b>${escapeHTML(label)}:</b> `; p.append(String(value)); box.appendChild(p); };
    line("Model", `${status.id} (${r.model_path})`);
    line("Architecture", describeModel(status.model));
    line("Device", r.device); line("Max batch", r.max_batch); line("Token chunk size", r.token_chunk_size);
    if (r.lora.length) line("LoRAs", r.lora.map((l) => `${l.path} ×${l.alpha}`).join(", "));
    if (status.states.length) line("States", status.states.map((s) => s.name + (s.default ? " (default)" : "")).join(", "));
    if (r.quant) line("Quantisation", `${r.quant_type}, first ${r.quant} layers`);
    if (r.precision) line("Precision", r.precision);
    box.dataset.model = r.model_path;
    badge.textContent = status.id;
    const save = $("#save-path");
    if (!save.value || save.dataset.auto === save.value) save.value = save.dataset.auto = prefabName(r);
  }
  knownStates = status.states || [];
  for (const t of document.querySelectorAll("#models-table tbody tr")) {
    t.classList.toggle("loaded", !!(status.loaded && status.reload.model_path === t.dataset.path));
    t.querySelector(".state").textContent = t.classList.contains("loaded") ? "loaded" : "";
  }
}

// Ai00's web page names an export <model>-<quant_type>_<quant>-<timestamp>.prefab; ours
// is safetensors.
function prefabName(r) {
  const stem = r.model_path.replace(/^.*\//, "").replace(/\.[^.]*$/, "");
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "-");
  return `${stem}-${r.quant_type || "None"}_${r.quant || 0}-${stamp}.st`;
}

// GPUs from /api/adapters (entry 0 is the CPU; the others are wgpu's adapters in order,
// which the load request's `device` takes as an index).
let adaptersListed = false;
async function listAdapters() {
  if (adaptersListed) return;
  adaptersListed = true;
  const select = $("#load-device");
  try {
    const adapters = await getJSON("/api/adapters");
    adapters.slice(1).forEach((name, i) => select.add(new Option(`${i}: ${name}`, String(i))));
  } catch { adaptersListed = false; }
}

// One admin call made from a form: `pending` shows in `result` (and `button` is disabled)
// until the answer; then the line `done(answer)` returns, or `failed` and the server's words.
async function callInto({ result, button, pending, failed }, path, body, done) {
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

function saveModel(event) {
  event.preventDefault();
  const data = new FormData($("#save-form"));
  return callInto({ result: "#save-result", button: "#save-button", pending: "Saving…", failed: "Save failed: " },
    "/admin/models/save", { path: data.get("path"), dtype: data.get("dtype") }, async (saved) => {
      await refreshModels();
      return `Saved ${saved.path} (${humanSize(saved.bytes)}).`;
    });
}

async function refreshModels() {
  const [files, status] = await Promise.all([getJSON("/api/models/list"), getJSON("/api/models/info")]);
  const tbody = $("#models-table tbody");
  tbody.innerHTML = "";
  const select = $("#load-model");
  const chosen = select.value;
  select.innerHTML = "";
  const loras = $("#load-loras"), states = $("#load-states");
  loras.innerHTML = ""; states.innerHTML = "";
  for (const f of files) {
    const tr = document.createElement("tr");
    tr.dataset.path = f.path;
    for (const text of [f.name, humanSize(f.size), f.info ? describeModel(f.info) : (f.error ? "unreadable: " + f.error : "")]) {
      const td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
    }
    const st = document.createElement("td"); st.className = "state"; tr.appendChild(st);
    tbody.appendChild(tr);
    const name = f.name.toLowerCase();
    if (f.info) {
      const option = new Option(f.name, f.path, false, f.path === chosen);
      option.dataset.layers = f.info.num_layer;
      select.add(option);
    }
    else if (name.endsWith(".lora") || (name.endsWith(".st") && !f.info)) {
      const l = document.createElement("label");
      l.innerHTML = `<input type="checkbox" value="${escapeHTML(f.path)}"> <span></span> <input type="number" step="any" value="1" title="alpha">`;
      l.querySelector("span").textContent = f.name;
      loras.appendChild(l);
    }
    if (name.endsWith(".state")) {
      const l = document.createElement("label");
      l.innerHTML = `<input type="checkbox" value="${escapeHTML(f.path)}"> <span></span> <input type="radio" name="default-state" title="default">`;
      l.querySelector("span").textContent = f.name;
      states.appendChild(l);
    }
  }
  limitQuantLayers();
  if (!loras.children.length) loras.textContent = "none in the models folder";
  if (!states.children.length) states.textContent = "none in the models folder";
  renderLoaded(status);
}

// Quantisation applies to the first n layers: at most the chosen model's count.
function limitQuantLayers() {
  const option = $("#load-model").selectedOptions[0];
  const quant = $('#load-form [name="quant"]');
  if (option) quant.max = option.dataset.layers; else quant.removeAttribute("max");
}

async function loadModel(event) {
  event.preventDefault();
  const form = $("#load-form");
  const data = new FormData(form);
  const body = { model_path: data.get("model_path") };
  for (const k of ["device", "precision", "quant_type", "served_name", "tokenizer_path"]) if (data.get(k)) body[k] = data.get(k);
  for (const k of ["quant", "max_batch", "token_chunk_size"]) if (data.get(k) !== "") body[k] = Number(data.get(k));
  body.lora = [...$("#load-loras").querySelectorAll("label")].filter((l) => l.querySelector("input[type=checkbox]").checked)
    .map((l) => ({ path: l.querySelector("input[type=checkbox]").value, alpha: Number(l.querySelector("input[type=number]").value) }));
  body.state = [...$("#load-states").querySelectorAll("label")].filter((l) => l.querySelector("input[type=checkbox]").checked)
    .map((l) => ({ path: l.querySelector("input[type=checkbox]").value, default: l.querySelector("input[type=radio]").checked }));
  return callInto({ result: "#load-result", button: "#load-button", pending: `Loading ${body.model_path}…`, failed: "Load failed: " },
    "/admin/models/load", body, (status) => {
      renderLoaded(status);
      renderSettings("chat"); renderSettings("continue");
      const r = status.reload;
      return `Loaded ${status.id}: device ${r.device}, ${r.precision}, quantisation ${r.quant_type}`
        + (r.quant ? ` (first ${r.quant} layers)` : "") + `, max batch ${r.max_batch}.`;
    });
}

function unloadModel() {
  return callInto({ result: "#load-result", pending: "Unloading…", failed: "Unload failed: " },
    "/admin/models/unload", undefined, (status) => { renderLoaded(status); return "Unloaded."; });
}

// ------------------------------------------------------------------ files

// The folders the file routes take (GET /admin/files/roots), asked for once.
let roots = null;
async function loadRoots() {
  if (roots) return roots;
  roots = await getJSON("/admin/files/roots");
  const select = $("#files-root");
  select.innerHTML = "";
  for (const r of roots.read) select.add(new Option(r, r));
  const output = $("#unzip-output");
  if (!output.value && roots.write.length) output.placeholder = roots.write[0] + "/<name>";
  return roots;
}

function joinPath(...parts) {
  return parts.map((p) => p.replace(/^\/+|\/+$/g, "")).filter((p) => p && p !== ".").join("/") || ".";
}

function showFilesError(message) { $("#files-error").textContent = message; }

async function listFiles(event) {
  if (event) event.preventDefault();
  showFilesError("");
  const tbody = $("#files-table tbody");
  try {
    await loadRoots();
    const path = joinPath($("#files-root").value, $("#files-sub").value.trim());
    const r = await api("/admin/files/dir", { method: "POST", body: { path, is_sha: $("#files-sha").checked } });
    if (!r.ok) throw new Error(await errorText(r));
    const files = await r.json();
    tbody.innerHTML = "";
    for (const f of files) {
      const tr = document.createElement("tr");
      tr.dataset.path = f.path;
      const detail = f.info ? describeModel(f.info) : (f.error ? "unreadable: " + f.error : "");
      for (const text of [f.name, humanSize(f.size), [detail, f.sha].filter(Boolean).join(" · ")]) {
        const td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
      }
      const actions = document.createElement("td");
      const lower = f.name.toLowerCase();
      if (lower.endsWith(".zip")) actions.appendChild(button("Unzip…", () => pickArchive(f)));
      if (lower.endsWith(".toml")) actions.appendChild(button("Edit", () => { $("#config-path").value = f.path; loadConfig(); }));
      tr.appendChild(actions);
      tbody.appendChild(tr);
    }
    if (!files.length) tbody.innerHTML = '<tr><td colspan="4" class="note">no files here</td></tr>';
  } catch (e) {
    tbody.innerHTML = "";
    showFilesError(e.message);
  }
}

function button(text, onclick) {
  const b = document.createElement("button");
  b.type = "button"; b.className = "plain small"; b.textContent = text; b.onclick = onclick;
  return b;
}

function pickArchive(f) {
  $("#unzip-zip").value = f.path;
  $("#unzip-result").textContent = "";
  const into = (roots && roots.write[0]) || "assets/unzip";
  $("#unzip-output").value = joinPath(into, f.name.replace(/\.zip$/i, ""));
  $("#unzip-output").focus();
}

function unzipArchive(event) {
  event.preventDefault();
  return callInto({ result: "#unzip-result", button: "#unzip-button", pending: "Unpacking…", failed: "Not unpacked: " },
    "/admin/files/unzip", { zip_path: $("#unzip-zip").value.trim(), output: $("#unzip-output").value.trim() },
    (done) => `Unpacked ${done.files} files (${humanSize(done.bytes)}) into ${done.output}.`);
}

function loadConfig() {
  return callInto({ result: "#config-result", pending: "Loading…", failed: "Not loaded: " },
    "/admin/files/config/load", { path: $("#config-path").value.trim() }, (file) => {
      $("#config-text").value = file.text;
      return `Loaded ${file.path}: a valid config.`;
    });
}

// The server validates the text before it writes anything; a refused config is left in
// the editor with the reason, and the file stays as it was.
function saveConfig(event) {
  event.preventDefault();
  return callInto({ result: "#config-result", button: "#config-save", pending: "Saving…", failed: "Not saved: " },
    "/admin/files/config/save", { path: $("#config-path").value.trim(), config: $("#config-text").value },
    (file) => `Saved ${file.path}.`);
}

// ------------------------------------------------------------------ status stream

let statusStarted = false;
async function followStatus() {
  if (statusStarted) return;
  statusStarted = true;
  for (;;) {
    try {
      const r = await api("/api/models/state");
      if (!r.ok) throw new Error(await errorText(r));
      $("#status-live").textContent = "live";
      await readSSE(r, (status) => { renderStatus(status); renderLoaded(status); });
    } catch (e) {
      $("#status-live").textContent = "disconnected: " + e.message;
    }
    await new Promise((ok) => setTimeout(ok, 2000)); // reconnect
  }
}

let lastStatus = null;
const fixed1 = (x) => (x || 0).toFixed(1);
const count = (n) => (n || 0).toLocaleString("en");

function renderStatus(s) {
  lastStatus = s;
  const view = $("#status-view");
  const hitRate = s.cache_queries ? ` (${Math.round(100 * s.cache_hits / s.cache_queries)}%)` : "";
  // [key (for tests and styling), label, value]
  const items = [
    ["model", "Model", s.loaded ? s.id : (s.loading ? "loading " + s.loading : "none")],
    ["generated_rate", "Generated tokens/s", fixed1(s.generated_tokens_per_second)],
    ["prompt_rate", "Prompt tokens/s", fixed1(s.prompt_tokens_per_second)],
    ["slots", "Active slots", `${s.running} / ${s.slots}`],
    ["queue", "Waiting in the queue", s.waiting],
    ["cache_hits", "Cache hits / lookups", `${count(s.cache_hits)} / ${count(s.cache_queries)}${hitRate}`],
    ["cache_hit_tokens", "Prompt tokens from the cache", count(s.cache_hit_tokens)],
    ["cache", "Cached states", `${s.cache_entries} · ${humanSize(s.cache_bytes)}`],
    ["generated", "Tokens generated", count(s.generated_tokens)],
    ["prompt", "Prompt tokens read", count(s.prompt_tokens)],
    ["last_reply", "Tokens/s of the last reply here", rate.last && rate.last.seconds > 0 ? (rate.last.tokens / rate.last.seconds).toFixed(1) : "–"],
  ];
  if (s.last_error) items.push(["last_error", "Last error", s.last_error]);
  view.innerHTML = "";
  for (const [key, label, value] of items) {
    const d = document.createElement("div"); d.className = "stat"; d.dataset.key = key;
    const b = document.createElement("b"); b.textContent = String(value);
    d.append(b, label);
    view.appendChild(d);
  }
}

// One point a second of the server's generated tokens/s, the last minute, as a line.
const chart = [];
function sampleChart() {
  chart.push(lastStatus ? lastStatus.generated_tokens_per_second || 0 : 0);
  if (chart.length > 60) chart.shift();
  if (!$("#page-status").classList.contains("active")) return;
  const peak = Math.max(...chart);
  const top = Math.max(1, peak);
  const x = (i) => (600 * (i + 60 - chart.length) / 59).toFixed(1);
  const points = chart.map((v, i) => `${x(i)},${(78 - 74 * v / top).toFixed(1)}`).join(" ");
  $("#status-chart").innerHTML = `<polygon points="${x(0)},80 ${points} 600,80"/><polyline points="${points}"/>`;
  $("#status-peak").textContent = peak.toFixed(1);
}

// ------------------------------------------------------------------ pages

function showPage() {
  const name = (location.hash || "#chat").slice(1);
  const page = $("#page-" + name) ? name : "chat";
  for (const p of document.querySelectorAll(".page")) p.classList.toggle("active", p.id === "page-" + page);
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "tab-" + page);
  if (page === "models") { listAdapters(); refreshModels().catch((e) => { $("#loaded-info").textContent = e.message; }); }
  if (page === "files" && !roots) listFiles();
}

function init() {
  renderSettings("chat");
  renderSettings("continue");
  renderChat();
  $("#continue-text").value = store.get("continue.text", "");
  $("#chat-new").onclick = () => { if (!chatAbort) newConversation(); };
  $("#chat-form").onsubmit = (e) => {
    e.preventDefault();
    const input = $("#chat-input");
    const text = input.value.trim();
    if (!text || chatAbort) return;
    input.value = "";
    send(text);
  };
  $("#chat-input").onkeydown = (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#chat-form").requestSubmit(); } };
  $("#chat-stop").onclick = () => chatAbort && chatAbort.abort();
  $("#chat-regenerate").onclick = () => {
    const c = conversation();
    if (chatAbort || !c.messages.length) return;
    if (c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
    renderChat();
    if (c.messages.length) reply();
  };
  setChatBusy(false);
  $("#continue-go").onclick = continueText;
  $("#continue-stop").onclick = () => continueAbort && continueAbort.abort();
  $("#models-refresh").onclick = () => refreshModels();
  $("#load-form").onsubmit = loadModel;
  $("#load-model").onchange = limitQuantLayers;
  $("#unload-button").onclick = unloadModel;
  $("#save-form").onsubmit = saveModel;
  $("#files-form").onsubmit = listFiles;
  $("#files-root").onchange = () => { $("#files-sub").value = ""; listFiles(); };
  $("#unzip-form").onsubmit = unzipArchive;
  $("#config-load").onclick = loadConfig;
  $("#config-form").onsubmit = saveConfig;
  window.addEventListener("hashchange", showPage);
  showPage();
  getJSON("/api/models/info").then((s) => { renderLoaded(s); renderSettings("chat"); renderSettings("continue"); }).catch(() => {});
  followStatus();
  setInterval(sampleChart, 1000);
}

init();

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

async function api(path, { method = "GET", body, signal } = {}, retried = false) {
  const used = store.get(keyName(path), "");
  const init = { method, signal, headers: { ...authHeaders(path) } };
  if (body !== undefined) { init.method = method === "GET" ? "POST" : method; init.body = JSON.stringify(body); init.headers["Content-Type"] = "application/json"; }
  const response = await fetch(path, init);
  if ((response.status === 401 || response.status === 403) && !retried) {
    // Another request may have asked for the key meanwhile: use it rather than ask again.
    if (store.get(keyName(path), "") !== used) return api(path, { method, body, signal }, true);
    const which = keyName(path) === "adminKey" ? "admin key ([listen] admin_key)" : "API key ([listen] api_keys)";
    const given = window.prompt(`This server needs its ${which}:`, "");
    if (given) { store.set(keyName(path), given.trim()); return api(path, { method, body, signal }, true); }
  }
  return response;
}

async function errorText(response) {
  try { const j = await response.json(); return (j.error && j.error.message) || JSON.stringify(j); }
  catch { return `HTTP ${response.status}`; }
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
  return { type: "Nucleus", values: JSON.parse(JSON.stringify(SAMPLER_FIELDS)), max_tokens: 500, stop: "", state: "" };
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
  state.onchange = () => { s.state = state.value; save(); };
  add("initial state", state);
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
  return body;
}

// ------------------------------------------------------------------ tokens/s, measured here

// Each streamed piece counts as one token (the server sends one token per event).
const rate = { last: null, times: [] };
function tick() { rate.times.push(performance.now()); }
function countTokens(n, started) {
  if (n) rate.last = { tokens: n, seconds: (performance.now() - started) / 1000 };
  if (lastStatus) renderStatus(lastStatus);
}
function recentRate() {
  const now = performance.now();
  rate.times = rate.times.filter((t) => now - t < 5000);
  return rate.times.length / 5;
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
        tokens += 1; tick();
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
  const started = performance.now();
  let tokens = 0;
  try {
    const r = await api("/v1/completions", { method: "POST", body: { ...samplingBody("continue"), prompt: box.value }, signal: continueAbort.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readSSE(r, (event) => {
      const text = event.choices && event.choices[0] && event.choices[0].text;
      if (text) { tokens += 1; tick(); box.value += text; box.scrollTop = box.scrollHeight; }
    });
  } catch (e) {
    if (e.name !== "AbortError") window.alert(e.message);
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
    box.dataset.model = r.model_path;
    badge.textContent = status.id;
  }
  knownStates = status.states || [];
  for (const t of document.querySelectorAll("#models-table tbody tr")) {
    t.classList.toggle("loaded", !!(status.loaded && status.reload.model_path === t.dataset.path));
    t.querySelector(".state").textContent = t.classList.contains("loaded") ? "loaded" : "";
  }
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
    if (f.info) select.add(new Option(f.name, f.path, false, f.path === chosen));
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
  if (!loras.children.length) loras.textContent = "none in the models folder";
  if (!states.children.length) states.textContent = "none in the models folder";
  renderLoaded(status);
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
  const result = $("#load-result");
  result.className = "note"; result.textContent = `Loading ${body.model_path}…`;
  $("#load-button").disabled = true;
  try {
    const r = await api("/admin/models/load", { method: "POST", body });
    if (!r.ok) throw new Error(await errorText(r));
    const status = await r.json();
    result.textContent = `Loaded ${status.id}.`;
    renderLoaded(status);
    renderSettings("chat"); renderSettings("continue");
  } catch (e) {
    result.className = "note error"; result.textContent = "Load failed: " + e.message;
  } finally {
    $("#load-button").disabled = false;
  }
}

async function unloadModel() {
  const result = $("#load-result");
  const r = await api("/admin/models/unload", { method: "POST" });
  if (!r.ok) { result.className = "note error"; result.textContent = "Unload failed: " + await errorText(r); return; }
  result.className = "note"; result.textContent = "Unloaded.";
  renderLoaded(await r.json());
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
function renderStatus(s) {
  lastStatus = s;
  const view = $("#status-view");
  const items = [
    ["Model", s.loaded ? s.id : (s.loading ? "loading " + s.loading : "none")],
    ["Active slots", `${s.running} / ${s.slots}`],
    ["Queue", s.waiting],
    ["Cache entries", s.cache_entries],
    ["Cache size", humanSize(s.cache_bytes)],
    ["Tokens/s now (this page, last 5 s)", recentRate().toFixed(1)],
    ["Tokens/s (last reply)", rate.last && rate.last.seconds > 0 ? (rate.last.tokens / rate.last.seconds).toFixed(1) : "–"],
  ];
  if (s.last_error) items.push(["Last error", s.last_error]);
  view.innerHTML = "";
  for (const [label, value] of items) {
    const d = document.createElement("div"); d.className = "stat";
    const b = document.createElement("b"); b.textContent = String(value);
    d.append(b, label);
    view.appendChild(d);
  }
}

// ------------------------------------------------------------------ pages

function showPage() {
  const name = (location.hash || "#chat").slice(1);
  const page = $("#page-" + name) ? name : "chat";
  for (const p of document.querySelectorAll(".page")) p.classList.toggle("active", p.id === "page-" + page);
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "tab-" + page);
  if (page === "models") refreshModels().catch((e) => { $("#loaded-info").textContent = e.message; });
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
  $("#unload-button").onclick = unloadModel;
  window.addEventListener("hashchange", showPage);
  showPage();
  getJSON("/api/models/info").then((s) => { renderLoaded(s); renderSettings("chat"); renderSettings("continue"); }).catch(() => {});
  followStatus();
  setInterval(() => { if (lastStatus && $("#page-status").classList.contains("active")) renderStatus(lastStatus); }, 1000);
}

init();

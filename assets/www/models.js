// The Models tab: every model the server serves (loaded or not, with the memory budget;
// load, unload, pin), the model files in the models folder, loading one (with LoRAs, states
// and load options), unloading, and saving the loaded model as a file.
import { $, button, describeModel, escapeHTML, humanSize } from "./dom.js";
import { api, callInto, errorText, getJSON, readSSE } from "./api.js";
import { refreshDownloads } from "./download.js";
import { renderLoaded } from "./loaded-model.js";
import { renderSettings } from "./settings.js";

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
  renderServed(status);
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
  body.quant_head = data.get("quant_head") === "on";
  body.lora = [...$("#load-loras").querySelectorAll("label")].filter((l) => l.querySelector("input[type=checkbox]").checked)
    .map((l) => ({ path: l.querySelector("input[type=checkbox]").value, alpha: Number(l.querySelector("input[type=number]").value) }));
  body.state = [...$("#load-states").querySelectorAll("label")].filter((l) => l.querySelector("input[type=checkbox]").checked)
    .map((l) => ({ path: l.querySelector("input[type=checkbox]").value, default: l.querySelector("input[type=radio]").checked }));
  return callInto({ result: "#load-result", button: "#load-button", pending: `Loading ${body.model_path}…`, failed: "Load failed: " },
    "/admin/models/load", body, (status) => {
      renderLoaded(status);
      renderServed(status);
      renderSettings("chat"); renderSettings("continue");
      const r = status.reload;
      return `Loaded ${status.id}: device ${r.device}, ${r.precision}, quantisation ${r.quant_type}`
        + (r.quant ? ` (first ${r.quant} layers)` : "") + (r.quant_head ? ", head int8" : "") + `, max batch ${r.max_batch}.`;
    });
}

function unloadModel() {
  return callInto({ result: "#load-result", pending: "Unloading…", failed: "Unload failed: " },
    "/admin/models/unload", undefined, (status) => { renderLoaded(status); renderServed(status); return "Unloaded."; });
}

// ------------------------------------------------------------------ served models

// The latest `models` and `budget` of a status (the stream's, /api/models/info's or an admin
// call's answer), kept to count idle times up between events.
let served = null;
const busy = new Set(); // models with an admin call under way: their buttons are disabled
const UNPINNED_KEEP_ALIVE = 300; // s: what Unpin sets (the server's default keep_alive)

const mib = (n) => `${Math.round(n / 2 ** 20).toLocaleString("en")} MiB`;

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min` + (s % 60 ? ` ${s % 60} s` : "");
  return `${Math.floor(s / 3600)} h` + (s % 3600 >= 60 ? ` ${Math.floor((s % 3600) / 60)} min` : "");
}

function idleText(m) {
  if (m.users > 0) return "in use";
  if (m.status !== "loaded" || m.idle_since == null) return "–";
  return duration(Date.now() / 1000 - m.idle_since);
}

function memoryText(m) {
  if (!m.memory_bytes) return "–";
  return m.status === "loaded" ? mib(m.memory_bytes) : "≈ " + mib(m.memory_bytes); // an estimate until loaded
}

function renderBudget(b) {
  const text = $("#budget-text"), bar = $("#budget-bar");
  if (!b) { text.textContent = ""; bar.classList.add("uncapped"); return; }
  const models = b.max_loaded_models ? `${b.loaded_models} of ${b.max_loaded_models} models loaded`
    : `${b.loaded_models} model${b.loaded_models === 1 ? "" : "s"} loaded`;
  const capped = b.memory_bytes != null;
  text.textContent = `Memory: ${mib(b.used_bytes)}` + (capped ? ` of ${mib(b.memory_bytes)}` : " used (no memory cap)") + ` · ${models}`;
  const share = capped ? (b.memory_bytes ? Math.min(1, b.used_bytes / b.memory_bytes) : 1) : 0;
  bar.classList.toggle("uncapped", !capped);
  bar.classList.toggle("full", capped && share >= 0.9);
  bar.setAttribute("aria-valuemax", String(capped ? b.memory_bytes : 0));
  bar.setAttribute("aria-valuenow", String(b.used_bytes));
  bar.querySelector("span").style.width = (100 * share).toFixed(1) + "%";
}

// The row's buttons: Load or Unload, and Pin or Unpin; none of them while a call on it runs.
function rowButtons(m) {
  const pinned = m.keep_alive < 0;
  const buttons = [];
  if (m.status === "unloaded") buttons.push(button("Load", () => loadServed(m.id)));
  if (m.status === "loaded") buttons.push(button("Unload", () => unloadServed(m.id)));
  const pin = button(pinned ? "Unpin" : "Pin", () => pinServed(m.id, !pinned));
  pin.title = pinned ? `Unload it after ${duration(UNPINNED_KEEP_ALIVE)} idle (loads it if it is not loaded)`
    : "Keep it loaded (loads it if it is not loaded)";
  buttons.push(pin);
  for (const b of buttons) { b.dataset.action = b.textContent.toLowerCase(); b.disabled = busy.has(m.id) || m.status === "loading"; }
  return buttons;
}

function renderServed(status) {
  if (!status || !Array.isArray(status.models)) return;
  served = { models: status.models, budget: status.budget };
  renderBudget(status.budget);
  const tbody = $("#served-table tbody");
  const rows = new Map([...tbody.children].map((tr) => [tr.dataset.model, tr]));
  for (const m of status.models) {
    let tr = rows.get(m.id);
    rows.delete(m.id);
    if (!tr) {
      tr = document.createElement("tr"); tr.dataset.model = m.id;
      for (const key of ["id", "status", "memory", "slots", "idle", "pinned", "actions"]) {
        const td = document.createElement("td"); td.className = key; tr.appendChild(td);
      }
    }
    tbody.appendChild(tr); // in the server's order
    const cell = (key) => tr.querySelector("td." + key);
    cell("id").textContent = m.id; cell("id").title = m.file;
    const st = cell("status");
    st.dataset.status = m.status; st.textContent = m.status;
    if (m.last_error) { const e = document.createElement("span"); e.className = "error"; e.textContent = m.last_error; st.appendChild(e); }
    cell("memory").textContent = memoryText(m);
    cell("slots").textContent = m.status === "loaded" ? `${m.running} / ${m.slots}` + (m.waiting ? ` (+${m.waiting} waiting)` : "") : "–";
    cell("idle").textContent = idleText(m);
    const pinned = m.keep_alive < 0;
    tr.classList.toggle("pinned", pinned);
    tr.classList.toggle("loaded", m.status === "loaded");
    cell("pinned").textContent = pinned ? "never (pinned)" : `after ${duration(m.keep_alive)} idle`;
    const buttons = rowButtons(m);
    const key = buttons.map((b) => b.dataset.action + (b.disabled ? "-" : "")).join(" ");
    // Redrawn only when they change, so that a click never lands on a button being replaced.
    if (cell("actions").dataset.key !== key) { cell("actions").replaceChildren(...buttons); cell("actions").dataset.key = key; }
  }
  for (const tr of rows.values()) tr.remove(); // no longer served (a file gone)
}

// Idle times count up between the server's events.
function tickIdle() {
  if (!served || !$("#page-models").classList.contains("active")) return;
  for (const m of served.models) {
    const td = document.querySelector(`#served-table tr[data-model="${CSS.escape(m.id)}"] td.idle`);
    if (td) td.textContent = idleText(m);
  }
}

// While the tab is shown it follows the status stream (/api/models/state) for every model's state.
let following = null; // the AbortController of that stream
async function followServed() {
  if (following) return;
  const control = following = new AbortController();
  while (following === control) {
    try {
      const r = await api("/api/models/state", { signal: control.signal });
      if (!r.ok) throw new Error(await errorText(r));
      await readSSE(r, renderServed);
    } catch (e) {
      if (control.signal.aborted) return;
    }
    await new Promise((ok) => setTimeout(ok, 2000)); // reconnect
  }
}

function stopFollowing() {
  if (following) following.abort();
  following = null;
}

// One admin call on a served model; its answer has every model's state. A load's answer
// describes the loaded model at the top level, so the card of the default model is drawn
// from /api/models/info (an unload's answer describes it already).
async function servedCall(id, pending, failed, path, body, done) {
  busy.add(id);
  if (served) renderServed(served);
  try {
    await callInto({ result: "#served-result", pending, failed }, path, body, (status) => {
      busy.delete(id);
      renderServed(status);
      if (path.endsWith("/unload")) renderLoaded(status);
      else getJSON("/api/models/info").then(renderLoaded).catch(() => {});
      return done(status.models.find((m) => m.id === id));
    });
  } finally {
    busy.delete(id);
    if (served) renderServed(served);
  }
}

function loadServed(id) {
  return servedCall(id, `Loading ${id}…`, `Loading ${id} failed: `, "/admin/models/load", { model: id },
    (m) => `Loaded ${id}` + (m && m.memory_bytes ? ` (${mib(m.memory_bytes)}).` : "."));
}

function unloadServed(id) {
  return servedCall(id, `Unloading ${id}…`, `Unloading ${id} failed: `, "/admin/models/unload", { model: id },
    () => `Unloaded ${id}.`);
}

function pinServed(id, pin) {
  const keepAlive = pin ? -1 : UNPINNED_KEEP_ALIVE;
  return servedCall(id, `${pin ? "Pinning" : "Unpinning"} ${id}…`, `${pin ? "Pinning" : "Unpinning"} ${id} failed: `,
    "/admin/models/load", { model: id, keep_alive: keepAlive },
    () => pin ? `Pinned ${id}: it stays loaded.` : `Unpinned ${id}: it unloads after ${duration(keepAlive)} idle.`);
}

export function setupModels() {
  $("#models-refresh").onclick = () => refreshModels();
  $("#load-form").onsubmit = loadModel;
  $("#load-model").onchange = limitQuantLayers;
  $("#unload-button").onclick = unloadModel;
  $("#save-form").onsubmit = saveModel;
  setInterval(tickIdle, 1000);
  // Leaving the tab closes its stream (the Status tab keeps its own).
  window.addEventListener("hashchange", () => { if (location.hash !== "#models") stopFollowing(); });
}

export function showModelsTab() {
  listAdapters();
  followServed();
  refreshModels().catch((e) => { $("#loaded-info").textContent = e.message; });
  refreshDownloads(() => refreshModels()).catch((e) => { $("#download-result").textContent = e.message; });
}

// The Models tab: the model files in the models folder, loading one (with LoRAs, states
// and load options), unloading, and saving the loaded model as a file.
import { $, describeModel, escapeHTML, humanSize } from "./dom.js";
import { callInto, getJSON } from "./api.js";
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
      renderSettings("chat"); renderSettings("continue");
      const r = status.reload;
      return `Loaded ${status.id}: device ${r.device}, ${r.precision}, quantisation ${r.quant_type}`
        + (r.quant ? ` (first ${r.quant} layers)` : "") + (r.quant_head ? ", head int8" : "") + `, max batch ${r.max_batch}.`;
    });
}

function unloadModel() {
  return callInto({ result: "#load-result", pending: "Unloading…", failed: "Unload failed: " },
    "/admin/models/unload", undefined, (status) => { renderLoaded(status); return "Unloaded."; });
}

export function setupModels() {
  $("#models-refresh").onclick = () => refreshModels();
  $("#load-form").onsubmit = loadModel;
  $("#load-model").onchange = limitQuantLayers;
  $("#unload-button").onclick = unloadModel;
  $("#save-form").onsubmit = saveModel;
}

export function showModelsTab() {
  listAdapters();
  refreshModels().catch((e) => { $("#loaded-info").textContent = e.message; });
  refreshDownloads(() => refreshModels()).catch((e) => { $("#download-result").textContent = e.message; });
}

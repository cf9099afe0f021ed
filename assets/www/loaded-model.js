// The loaded model as the page shows it: the header's badge, the Models tab's card and
// table marks, and the states the settings offer. The status stream, the Models tab and
// the first look at /api/models/info all report it here.
import { $, describeModel, escapeHTML } from "./dom.js";
import { setKnownStates } from "./settings.js";

export function renderLoaded(status) {
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
    if (r.quant_head) line("Head", "int8");
    if (r.precision) line("Precision", r.precision);
    box.dataset.model = r.model_path;
    badge.textContent = status.id;
    const save = $("#save-path");
    if (!save.value || save.dataset.auto === save.value) save.value = save.dataset.auto = prefabName(r);
  }
  setKnownStates(status.states || []);
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

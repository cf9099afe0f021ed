// The Models tab's Download panel: released models from the hub (/api/models/catalogue),
// with what fits this machine's memory; a download runs in the server (/admin/models/pull)
// with a live bar, and a downloaded model loads with one click in the precision that fits.
import { $, humanSize } from "./dom.js";
import { api, callInto, errorText, getJSON } from "./api.js";
import { renderLoaded } from "./loaded-model.js";

let polling = null;
let running = false;
let afterDownload = () => {};  // the Models tab's file list, refreshed when a download ends

function loadBody(model) {
  const body = { model_path: model.file, thinking: model.thinking };
  if (model.fits === "int8" || model.fits === "nf4") Object.assign(body, { quant: 1000, quant_type: model.fits });
  else body.precision = "auto";
  return body;
}

function actionCell(model, job, onChange) {
  const td = document.createElement("td");
  if (job && job.status === "running") {
    const bar = document.createElement("progress");
    bar.max = job.total || model.size; bar.value = job.bytes;
    td.append(bar, ` ${humanSize(job.bytes)}`);
  } else if (model.downloaded) {
    const load = document.createElement("button");
    load.type = "button"; load.textContent = "Load"; load.className = "load-downloaded";
    load.onclick = () => callInto({ result: "#download-result", pending: `Loading ${model.file}…`, failed: "Load failed: " },
      "/admin/models/load", loadBody(model), (status) => { renderLoaded(status); return `Loaded ${status.id}.`; });
    td.append(load);
  } else {
    const get = document.createElement("button");
    get.type = "button"; get.textContent = "Download"; get.className = "download";
    get.disabled = !model.fits;
    get.onclick = async () => {
      const r = await api("/admin/models/pull", { method: "POST", body: { name: model.alias } });
      $("#download-result").textContent = r.ok ? `Downloading ${model.file}…` : await errorText(r);
      onChange();
    };
    td.append(get);
    if (job && job.status === "failed") td.append(` ${job.error}`);
  }
  return td;
}

export async function refreshDownloads(whenDownloaded) {
  if (whenDownloaded) afterDownload = whenDownloaded;
  clearTimeout(polling);
  const [models, jobs] = await Promise.all([getJSON("/api/models/catalogue"), getJSON("/admin/models/pull")]);
  const latest = new Map(jobs.map((j) => [j.file, j]));
  const tbody = $("#download-table tbody");
  tbody.innerHTML = "";
  for (const m of models) {
    const tr = document.createElement("tr");
    tr.dataset.alias = m.alias;
    for (const text of [m.alias, m.params, humanSize(m.size), m.fits || "too large"]) {
      const td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
    }
    tr.appendChild(actionCell(m, latest.get(m.file), () => refreshDownloads()));
    tbody.appendChild(tr);
  }
  const wasRunning = running;
  running = jobs.some((j) => j.status === "running");
  if (running) polling = setTimeout(() => refreshDownloads().catch(() => {}), 500);
  else if (wasRunning) afterDownload();
}

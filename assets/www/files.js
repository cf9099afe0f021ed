// The Files tab: the server's folders (/admin/files/*) listed, archives unpacked, and a
// config file edited with the server validating it before it writes.
import { $, button, describeModel, humanSize } from "./dom.js";
import { api, callInto, errorText, getJSON } from "./api.js";

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

export function setupFiles() {
  $("#files-form").onsubmit = listFiles;
  $("#files-root").onchange = () => { $("#files-sub").value = ""; listFiles(); };
  $("#unzip-form").onsubmit = unzipArchive;
  $("#config-load").onclick = loadConfig;
  $("#config-form").onsubmit = saveConfig;
}

// The first visit lists the first folder; later ones keep what was listed.
export function showFilesTab() {
  if (!roots) listFiles();
}

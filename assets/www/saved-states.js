// The server's saved states (/v1/saved_states): the calls the States tab and the chat share.
// Each throws the server's own words when it is refused.
import { api, errorText, getJSON } from "./api.js";

const ROOT = "/v1/saved_states";

async function answer(r) {
  if (!r.ok) throw new Error(await errorText(r));
  return r.json();
}

export async function listSavedStates() { return (await getJSON(ROOT)).data; }

// `body`: { input: text } or { messages }, with `name` and `state` (what to start from).
export async function saveState(body) { return answer(await api(ROOT, { method: "POST", body })); }

// Sent as the form field `file`, so that the server knows a .pth file by its name.
export async function importState(file, name) {
  const query = name ? "?name=" + encodeURIComponent(name) : "";
  const form = new FormData();
  form.append("file", file, file.name);
  return answer(await api(`${ROOT}/import${query}`, { method: "POST", body: form }));
}

export async function deleteState(id) { return answer(await api(`${ROOT}/${encodeURIComponent(id)}`, { method: "DELETE" })); }

// The state as a .st file, saved by the browser. Fetched rather than linked, so that the
// request carries the API key as every other does.
export async function downloadState(saved) {
  const r = await api(`${ROOT}/${encodeURIComponent(saved.id)}/content`);
  if (!r.ok) throw new Error(await errorText(r));
  const named = /filename="([^"]+)"/.exec(r.headers.get("Content-Disposition") || "");
  const url = URL.createObjectURL(await r.blob());
  const a = document.createElement("a");
  a.href = url; a.download = named ? named[1] : saved.id + ".st";
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

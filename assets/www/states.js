// The States tab: the caller's saved states (name, model, tokens, size, when made and last
// used), each to start a chat from, download as a .st file or delete; and a state file
// uploaded as a new one.
import { $, button, humanSize } from "./dom.js";
import { deleteState, downloadState, importState, listSavedStates } from "./saved-states.js";

// Given by main.js: opens a new conversation tied to a saved state (false while a reply streams).
let startChat = () => false;

function showStatesError(message) { $("#states-error").textContent = message; }

function when(seconds) { return seconds ? new Date(seconds * 1000).toLocaleString() : ""; }

// Runs an action of the tab; a refusal shows in the tab's error box.
async function act(work) {
  showStatesError("");
  try { await work(); } catch (e) { showStatesError(e.message); }
}

function stateRow(s) {
  const tr = document.createElement("tr");
  tr.dataset.id = s.id;
  for (const text of [s.name || s.id, s.model, String(s.tokens), humanSize(s.bytes), when(s.created_at), when(s.last_used_at)]) {
    const td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
  }
  tr.cells[0].title = s.id;
  const actions = document.createElement("td");
  actions.append(
    button("Start a chat", () => {
      if (startChat(s)) location.hash = "#chat";
      else showStatesError("A reply is streaming in the chat: stop it or wait for it first.");
    }),
    button("Download", () => act(() => downloadState(s))),
    button("Delete", () => act(async () => { await deleteState(s.id); await refreshStates(); })),
  );
  tr.appendChild(actions);
  return tr;
}

export async function refreshStates() {
  const tbody = $("#states-table tbody");
  const states = await listSavedStates();
  tbody.innerHTML = "";
  for (const s of states) tbody.appendChild(stateRow(s));
  if (!states.length) tbody.innerHTML = '<tr><td colspan="7" class="note">no saved states yet</td></tr>';
}

async function upload(event) {
  event.preventDefault();
  const file = $("#states-file").files[0];
  if (!file) { showStatesError("Pick a state file (.st or .pth) to upload."); return; }
  const name = $("#states-name").value.trim() || file.name.replace(/\.(st|pth|state)$/i, "");
  $("#states-upload").disabled = true;
  await act(async () => {
    await importState(file, name);
    $("#states-form").reset();
    await refreshStates();
  });
  $("#states-upload").disabled = false;
}

export function showStatesTab() { act(refreshStates); }

export function setupStates(start) {
  startChat = start;
  $("#states-form").onsubmit = upload;
  $("#states-refresh").onclick = showStatesTab;
}

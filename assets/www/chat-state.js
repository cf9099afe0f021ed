// The Chat tab's saved states: the open conversation saved as one; a document read once into
// one that the conversation then chats from (its requests send `state`, and the server reads
// only their messages after it); and the line above the messages that says so, with Detach.
import { $ } from "./dom.js";
import { currentConversation, saveConversations } from "./conversations.js";
import { saveState } from "./saved-states.js";
import { chosenState } from "./settings.js";

// Given by chat.js: draws the open conversation again; whether a reply is streaming.
let chat = { render: () => {}, busy: () => false };

function report(text, failed = false) {
  const out = $("#chat-state-result");
  out.className = failed ? "note error" : "note";
  out.textContent = text;
}

// What the conversation's requests start from: its saved state, else the settings' initial one.
function startingState(c) { return (c.state && c.state.id) || chosenState("chat") || undefined; }

// The conversation last drawn: the last save's or attachment's note is about it alone.
let shown = null;

// The state the open conversation chats from (or none), as the line above its messages.
export function renderAttachment(c) {
  if (shown !== c.id) report("");
  shown = c.id;
  const line = $("#chat-attached");
  line.hidden = !c.state;
  if (!c.state) return;
  $("#chat-attached-text").textContent = c.state.document
    ? `Attached: ${c.state.document}. This conversation chats from the saved state it was read into.`
    : `This conversation chats from the saved state "${c.state.name}".`;
  line.title = c.state.id;
}

async function saveConversation() {
  const c = currentConversation();
  if (chat.busy()) return;
  if (!c.messages.length) { report("The conversation is empty: there is nothing to save yet.", true); return; }
  report("Saving…");
  try {
    const messages = c.messages.map(({ role, content }) => ({ role, content }));
    const saved = await saveState({ messages, name: c.title, state: startingState(c) });
    report(`Saved as the state "${saved.name}" (${saved.tokens} tokens); it is in the States tab.`);
  } catch (e) {
    report("Save failed: " + e.message, true);
  }
}

async function pickDocument() {
  const file = $("#chat-attach-file").files[0];
  if (!file) return;
  $("#chat-attach-text").value = await file.text();
  $("#chat-attach-name").value = file.name;
}

async function attachDocument(event) {
  event.preventDefault();
  const c = currentConversation();
  const text = $("#chat-attach-text").value;
  const name = $("#chat-attach-name").value.trim() || "pasted text";
  if (chat.busy()) return;
  if (!text.trim()) { report("Pick a text file or paste the document first.", true); return; }
  report(`Reading ${name}…`);
  $("#chat-attach-go").disabled = true;
  try {
    const saved = await saveState({ input: text, name, state: chosenState("chat") || undefined });
    c.state = { id: saved.id, name: saved.name, document: name };
    saveConversations();
    $("#chat-attach-form").reset();
    $("#chat-attach").hidden = true;
    report(`${name} is read (${saved.tokens} tokens).`);
    chat.render();
  } catch (e) {
    report("Attaching failed: " + e.message, true);
  } finally {
    $("#chat-attach-go").disabled = false;
  }
}

function detach() {
  const c = currentConversation();
  if (chat.busy() || !c.state) return;
  delete c.state;
  saveConversations();
  report("");
  chat.render();
}

export function setStateButtonsBusy(busy) {
  $("#chat-save-state").disabled = busy; $("#chat-attach-open").disabled = busy; $("#chat-detach").disabled = busy;
}

export function setupChatState(render, busy) {
  chat = { render, busy };
  $("#chat-save-state").onclick = saveConversation;
  $("#chat-attach-open").onclick = () => { $("#chat-attach").hidden = !$("#chat-attach").hidden; };
  $("#chat-attach-cancel").onclick = () => { $("#chat-attach-form").reset(); $("#chat-attach").hidden = true; };
  $("#chat-attach-file").onchange = pickDocument;
  $("#chat-attach-form").onsubmit = attachDocument;
  $("#chat-detach").onclick = detach;
}

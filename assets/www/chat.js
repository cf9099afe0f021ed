// The Chat tab: the conversations beside, the open one's messages, and the reply streamed
// from /v1/chat/completions into it (from the conversation's saved state, if it has one).
import { $ } from "./dom.js";
import { api, errorText, readSSE } from "./api.js";
import {
  addConversation, currentConversation, deleteConversation, ensureOpenConversation, isOpen,
  listConversations, openConversation, saveConversations,
} from "./conversations.js";
import { renderAttachment, setStateButtonsBusy, setupChatState } from "./chat-state.js";
import { renderMarkdown } from "./markdown.js";
import { samplingBody } from "./settings.js";
import { countTokens } from "./status.js";

// Set while a reply streams: the Stop button's handle, and the sign that the chat is busy
// (no switching conversations or sending meanwhile).
let chatAbort = null;

function renderConversations() {
  const ul = $("#conversations");
  ul.innerHTML = "";
  for (const c of listConversations()) {
    const li = document.createElement("li");
    li.classList.toggle("active", isOpen(c));
    li.classList.toggle("from-state", !!c.state);  // marked: it chats from a saved state
    const title = document.createElement("span");
    title.textContent = c.title;
    const del = document.createElement("button");
    del.textContent = "×"; del.title = "Delete";
    del.onclick = (e) => {
      e.stopPropagation();
      deleteConversation(c.id);
      renderChat();
    };
    li.onclick = () => { if (!chatAbort) { openConversation(c.id); renderChat(); } };
    li.append(title, del);
    ul.appendChild(li);
  }
}

// A reply's text, and its thinking (a reasoning model's reasoning_content) folded away under it.
function fillReply(div, m) {
  div.innerHTML = renderMarkdown(m.content);
  if (m.reasoning) {
    const fold = document.createElement("details");
    fold.className = "thinking";
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    text.textContent = m.reasoning;
    fold.append(summary, text);
    div.appendChild(fold);
  }
}

function messageElement(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  if (m.role === "assistant") fillReply(div, m); else div.textContent = m.content;
  if (m.error) { const e = document.createElement("div"); e.className = "error"; e.textContent = m.error; div.appendChild(e); }
  return div;
}

function renderChat() {
  ensureOpenConversation();
  renderConversations();
  renderAttachment(currentConversation());
  const box = $("#chat-messages");
  box.innerHTML = "";
  for (const m of currentConversation().messages) box.appendChild(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

function setChatBusy(busy) {
  $("#chat-send").disabled = busy; $("#chat-regenerate").disabled = busy; $("#chat-stop").disabled = !busy;
  setStateButtonsBusy(busy);
}

async function reply() {
  const c = currentConversation();
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
    const body = { ...samplingBody("chat"), messages: history };
    if (c.state) body.state = c.state.id;  // the messages are read after the saved state
    const r = await api("/v1/chat/completions", { method: "POST", body, signal: chatAbort.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readSSE(r, (event) => {
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (delta && (delta.content || delta.reasoning_content)) {
        tokens += 1;
        answer.content += delta.content || "";
        if (delta.reasoning_content) answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
        fillReply(div, answer);
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
  const c = currentConversation();
  c.messages.push({ role: "user", content: text });
  if (c.title === "New conversation") c.title = text.slice(0, 40);
  saveConversations();
  renderChat();
  await reply();
}

// A new conversation tied to a saved state (the States tab's "Start a chat"); refused while a
// reply streams, as switching conversations is.
export function startChatFrom(saved) {
  if (chatAbort) return false;
  addConversation({ title: saved.name || saved.id, state: { id: saved.id, name: saved.name || saved.id } });
  renderChat();
  return true;
}

export function setupChat() {
  setupChatState(renderChat, () => !!chatAbort);
  renderChat();
  $("#chat-new").onclick = () => { if (!chatAbort) { addConversation(); renderChat(); } };
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
    const c = currentConversation();
    if (chatAbort || !c.messages.length) return;
    if (c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
    renderChat();
    if (c.messages.length) reply();
  };
  setChatBusy(false);
}

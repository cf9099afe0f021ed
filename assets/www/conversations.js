// The chat's conversations, kept in the browser across reloads: the list, newest first,
// and which one is open.
import { store } from "./store.js";

let conversations = store.get("conversations", []);
let current = store.get("current", null);

export function listConversations() { return conversations; }
export function currentConversation() { return conversations.find((c) => c.id === current); }
export function isOpen(c) { return c.id === current; }

// Replies stream into the message objects themselves: save after each one ends.
export function saveConversations() { store.set("conversations", conversations); store.set("current", current); }

export function openConversation(id) { current = id; saveConversations(); }

// `fields` may tie it to a saved state ({ title, state: { id, name } }): kept with it, so a
// reload still chats from that state.
export function addConversation(fields = {}) {
  const c = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New conversation", messages: [], ...fields };
  conversations.unshift(c); current = c.id; saveConversations();
  return c;
}

export function deleteConversation(id) {
  conversations = conversations.filter((x) => x.id !== id);
  if (current === id) current = conversations.length ? conversations[0].id : null;
  saveConversations();
}

// The open one may have been deleted, or there may be none yet (a first visit).
export function ensureOpenConversation() {
  if (currentConversation()) return;
  if (conversations.length) current = conversations[0].id; else addConversation();
}

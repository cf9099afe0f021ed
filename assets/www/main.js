// ai00-like web page: chat, continuation, saved states, models, files and status, talking to this
// server's API. ES modules loaded as they are, no build step; this one wires the tabs up.
import { $ } from "./dom.js";
import { getJSON } from "./api.js";
import { setupChat, startChatFrom } from "./chat.js";
import { setupContinuation } from "./continuation.js";
import { setupFiles, showFilesTab } from "./files.js";
import { renderLoaded } from "./loaded-model.js";
import { setupModels, showModelsTab } from "./models.js";
import { renderSettings } from "./settings.js";
import { setupStates, showStatesTab } from "./states.js";
import { startStatus } from "./status.js";

// The tab is the address's #fragment, so a reload or a link opens the same one.
function showPage() {
  const name = (location.hash || "#chat").slice(1);
  const page = $("#page-" + name) ? name : "chat";
  for (const p of document.querySelectorAll(".page")) p.classList.toggle("active", p.id === "page-" + page);
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "tab-" + page);
  if (page === "models") showModelsTab();
  if (page === "files") showFilesTab();
  if (page === "states") showStatesTab();
}

renderSettings("chat");
renderSettings("continue");
setupChat();
setupContinuation();
setupModels();
setupFiles();
setupStates(startChatFrom);
window.addEventListener("hashchange", showPage);
showPage();
// The settings offer the loaded model's states: draw them again once those are known.
getJSON("/api/models/info").then((s) => { renderLoaded(s); renderSettings("chat"); renderSettings("continue"); }).catch(() => {});
startStatus();

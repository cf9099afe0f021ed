// The Status tab: the server's status stream (/api/models/state), kept open and reopened,
// a chart of its generated tokens/s, and the last reply's rate as this page measured it.
import { $, humanSize } from "./dom.js";
import { api, errorText, readSSE } from "./api.js";
import { renderLoaded } from "./loaded-model.js";

// The last reply's rate as this page saw it (the server's own rates are in the status).
// Each streamed piece counts as one token (the server sends one token per event).
const rate = { last: null };
// The stream's latest status, kept to draw again when a reply's rate changes and for the chart.
let lastStatus = null;

export function countTokens(n, started) {
  if (n) rate.last = { tokens: n, seconds: (performance.now() - started) / 1000 };
  if (lastStatus) renderStatus(lastStatus);
}

async function followStatus() {
  for (;;) {
    try {
      const r = await api("/api/models/state");
      if (!r.ok) throw new Error(await errorText(r));
      $("#status-live").textContent = "live";
      await readSSE(r, (status) => { renderStatus(status); renderLoaded(status); });
    } catch (e) {
      $("#status-live").textContent = "disconnected: " + e.message;
    }
    await new Promise((ok) => setTimeout(ok, 2000)); // reconnect
  }
}

const fixed1 = (x) => (x || 0).toFixed(1);
const count = (n) => (n || 0).toLocaleString("en");

function renderStatus(s) {
  lastStatus = s;
  const view = $("#status-view");
  const hitRate = s.cache_queries ? ` (${Math.round(100 * s.cache_hits / s.cache_queries)}%)` : "";
  // [key (for tests and styling), label, value]
  const items = [
    ["model", "Model", s.loaded ? s.id : (s.loading ? "loading " + s.loading : "none")],
    ["generated_rate", "Generated tokens/s", fixed1(s.generated_tokens_per_second)],
    ["prompt_rate", "Prompt tokens/s", fixed1(s.prompt_tokens_per_second)],
    ["slots", "Active slots", `${s.running} / ${s.slots}`],
    ["queue", "Waiting in the queue", s.waiting],
    ["cache_hits", "Cache hits / lookups", `${count(s.cache_hits)} / ${count(s.cache_queries)}${hitRate}`],
    ["cache_hit_tokens", "Prompt tokens from the cache", count(s.cache_hit_tokens)],
    ["cache", "Cached states", `${s.cache_entries} · ${humanSize(s.cache_bytes)}`],
    ["generated", "Tokens generated", count(s.generated_tokens)],
    ["prompt", "Prompt tokens read", count(s.prompt_tokens)],
    ["last_reply", "Tokens/s of the last reply here", rate.last && rate.last.seconds > 0 ? (rate.last.tokens / rate.last.seconds).toFixed(1) : "–"],
  ];
  if (s.last_error) items.push(["last_error", "Last error", s.last_error]);
  view.innerHTML = "";
  for (const [key, label, value] of items) {
    const d = document.createElement("div"); d.className = "stat"; d.dataset.key = key;
    const b = document.createElement("b"); b.textContent = String(value);
    d.append(b, label);
    view.appendChild(d);
  }
}

// One point a second of the server's generated tokens/s, the last minute, as a line.
const chart = [];
function sampleChart() {
  chart.push(lastStatus ? lastStatus.generated_tokens_per_second || 0 : 0);
  if (chart.length > 60) chart.shift();
  if (!$("#page-status").classList.contains("active")) return;
  const peak = Math.max(...chart);
  const top = Math.max(1, peak);
  const x = (i) => (600 * (i + 60 - chart.length) / 59).toFixed(1);
  const points = chart.map((v, i) => `${x(i)},${(78 - 74 * v / top).toFixed(1)}`).join(" ");
  $("#status-chart").innerHTML = `<polygon points="${x(0)},80 ${points} 600,80"/><polyline points="${points}"/>`;
  $("#status-peak").textContent = peak.toFixed(1);
}

export function startStatus() {
  followStatus();
  setInterval(sampleChart, 1000);
}

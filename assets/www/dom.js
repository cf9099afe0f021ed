// Small helpers for building the page's elements by hand (there is no framework).

export const $ = (sel, root = document) => root.querySelector(sel);

export function escapeHTML(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

export function button(text, onclick) {
  const b = document.createElement("button");
  b.type = "button"; b.className = "plain small"; b.textContent = text; b.onclick = onclick;
  return b;
}

export function humanSize(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

export function describeModel(info) {
  return info ? `${info.version} · ${info.num_layer} layers · ${info.num_emb} wide · vocab ${info.num_vocab}` : "";
}

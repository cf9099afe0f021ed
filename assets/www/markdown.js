// The model's replies as Markdown: a small safe subset (paragraphs, lists, headings, code,
// emphasis, http(s) links).
import { escapeHTML } from "./dom.js";

function inline(s) { // s is already escaped
  return s
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
}

// HTML is escaped first, so nothing the model writes can become markup of its own.
export function renderMarkdown(text) {
  const parts = escapeHTML(text).split(/```/);
  let html = "";
  parts.forEach((part, i) => {
    if (i % 2 === 1) { html += "<pre><code>" + part.replace(/^[\w+-]*\n/, "") + "</code></pre>"; return; }
    let list = null;
    for (const para of part.split(/\n{2,}/)) {
      const lines = para.split("\n").filter((l) => l.trim() !== "");
      if (!lines.length) continue;
      if (lines.every((l) => /^\s*([-*]|\d+\.)\s+/.test(l))) {
        list = /^\s*\d+\./.test(lines[0]) ? "ol" : "ul";
        html += `<${list}>` + lines.map((l) => "<li>" + inline(l.replace(/^\s*([-*]|\d+\.)\s+/, "")) + "</li>").join("") + `</${list}>`;
      } else if (/^#{1,6}\s/.test(lines[0]) && lines.length === 1) {
        const level = Math.min(6, lines[0].match(/^#+/)[0].length + 2);
        html += `<h${level}>` + inline(lines[0].replace(/^#+\s/, "")) + `</h${level}>`;
      } else {
        html += "<p>" + lines.map(inline).join("<br>") + "</p>";
      }
    }
  });
  return html;
}

// The Continuation tab: the text box is the prompt of /v1/completions and the completion
// streams onto its end, so the next Continue goes on from there.
import { $ } from "./dom.js";
import { api, errorText, readSSE } from "./api.js";
import { samplingBody } from "./settings.js";
import { store } from "./store.js";
import { countTokens } from "./status.js";

let continueAbort = null;
async function continueText() {
  const box = $("#continue-text");
  continueAbort = new AbortController();
  $("#continue-go").disabled = true; $("#continue-stop").disabled = false;
  $("#continue-error").textContent = "";
  const started = performance.now();
  let tokens = 0;
  try {
    const r = await api("/v1/completions", { method: "POST", body: { ...samplingBody("continue"), prompt: box.value }, signal: continueAbort.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readSSE(r, (event) => {
      const text = event.choices && event.choices[0] && event.choices[0].text;
      if (text) { tokens += 1; box.value += text; box.scrollTop = box.scrollHeight; }
    });
  } catch (e) {
    if (e.name !== "AbortError") $("#continue-error").textContent = e.message;
  } finally {
    countTokens(tokens, started);
    continueAbort = null;
    $("#continue-go").disabled = false; $("#continue-stop").disabled = true;
    store.set("continue.text", box.value);
  }
}

export function setupContinuation() {
  $("#continue-text").value = store.get("continue.text", "");
  $("#continue-go").onclick = continueText;
  $("#continue-stop").onclick = () => continueAbort && continueAbort.abort();
}

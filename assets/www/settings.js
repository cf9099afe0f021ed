// The sampler settings beside the chat and the continuation, one set for each, kept in the
// browser; and the request fields they make.
import { $ } from "./dom.js";
import { store } from "./store.js";

const SAMPLER_FIELDS = {
  Nucleus: { top_p: 0.5, top_k: 128, temperature: 1, presence_penalty: 0.3, frequency_penalty: 0.3, penalty_decay: 0.99654026 },
  Typical: { tau: 0.5, top_k: 128, temperature: 1, presence_penalty: 0.3, frequency_penalty: 0.3, penalty_decay: 0.99654026 },
  Mirostat: { tau: 3, rate: 0.1 },
};

function defaultSettings() {
  return { type: "Nucleus", values: JSON.parse(JSON.stringify(SAMPLER_FIELDS)), max_tokens: 500, stop: "", state: "",
    format: "text", schema: "", grammar: "", think: "" };
}

const settings = { chat: store.get("settings.chat", defaultSettings()), continue: store.get("settings.continue", defaultSettings()) };

// The loaded model's states, offered as the initial state (set as the model's status comes).
let knownStates = [];
export function setKnownStates(states) { knownStates = states; }

export function renderSettings(which) {
  const box = $(`[data-settings="${which}"]`);
  const s = settings[which];
  const save = () => store.set("settings." + which, s);
  box.innerHTML = "<h3>Settings</h3>";
  const add = (label, input) => { const l = document.createElement("label"); l.textContent = label; l.appendChild(input); box.appendChild(l); return input; };
  const type = add("Sampler", document.createElement("select"));
  type.name = "sampler";
  for (const t of Object.keys(SAMPLER_FIELDS)) type.add(new Option(t, t, false, t === s.type));
  type.onchange = () => { s.type = type.value; save(); renderSettings(which); };
  for (const [field, def] of Object.entries(SAMPLER_FIELDS[s.type])) {
    const input = document.createElement("input");
    input.type = "number"; input.step = "any"; input.name = field;
    input.value = s.values[s.type][field] ?? def;
    input.onchange = () => { s.values[s.type][field] = Number(input.value); save(); };
    add(field.replace(/_/g, " "), input);
  }
  const max = document.createElement("input");
  max.type = "number"; max.min = 1; max.name = "max_tokens"; max.value = s.max_tokens;
  max.onchange = () => { s.max_tokens = Number(max.value); save(); };
  add("max tokens", max);
  const stop = document.createElement("textarea");
  stop.rows = 3; stop.name = "stop"; stop.placeholder = "one per line (empty: the server's)"; stop.value = s.stop;
  stop.onchange = () => { s.stop = stop.value; save(); };
  add("stop words", stop);
  const state = document.createElement("select");
  state.name = "state";
  state.add(new Option("(none)", ""));
  for (const st of knownStates) state.add(new Option(st.name + (st.default ? " (default)" : ""), st.id, false, st.id === s.state));
  // A choice the loaded model does not have is still sent: show it as it is, not as "(none)".
  if (s.state && !knownStates.some((st) => st.id === s.state)) state.add(new Option(s.state + " (not loaded)", s.state, false, true));
  state.onchange = () => { s.state = state.value; save(); };
  add("initial state", state);
  if (which === "chat") {
    // A reasoning model's effort (reasoning_effort); models that do not think ignore it.
    const think = document.createElement("select");
    think.name = "think";
    for (const [value, label] of [["", "model's default"], ["none", "off"], ["low", "a bit"], ["medium", "on"], ["high", "a lot"]])
      think.add(new Option(label, value, false, value === (s.think || "")));
    think.onchange = () => { s.think = think.value; save(); };
    add("think", think);
  }
  const format = document.createElement("select");
  format.name = "response_format";
  for (const f of ["text", "json_object", "json_schema"]) format.add(new Option(f, f, false, f === (s.format || "text")));
  format.onchange = () => { s.format = format.value; save(); renderSettings(which); };
  add("response format", format);
  if (s.format === "json_schema") {
    const schema = document.createElement("textarea");
    schema.rows = 5; schema.name = "json_schema"; schema.spellcheck = false; schema.value = s.schema || "";
    schema.placeholder = '{"type": "object", "properties": {…}}';
    schema.onchange = () => { s.schema = schema.value; save(); };
    add("JSON schema", schema);
  }
  const grammar = document.createElement("textarea");
  grammar.rows = 4; grammar.name = "bnf_schema"; grammar.spellcheck = false; grammar.value = s.grammar || "";
  grammar.placeholder = "KBNF grammar (Ai00's bnf_schema), e.g.\nstart::=\"yes\"|\"no\";";
  grammar.onchange = () => { s.grammar = grammar.value; save(); };
  add("grammar (KBNF)", grammar);
  const reset = document.createElement("button");
  reset.type = "button"; reset.className = "plain"; reset.textContent = "Defaults";
  reset.onclick = () => { settings[which] = defaultSettings(); store.set("settings." + which, settings[which]); renderSettings(which); };
  box.appendChild(reset);
}

// The initial state chosen in the settings ("" for the model's own).
export function chosenState(which) { return settings[which].state; }

export function samplingBody(which) {
  const s = settings[which];
  const body = { stream: true, max_tokens: s.max_tokens, sampler_override: { type: s.type, ...s.values[s.type] } };
  const stops = s.stop.split("\n").map((x) => x.replace(/\\n/g, "\n")).filter((x) => x !== "");
  if (stops.length) body.stop = stops;
  if (s.state) body.state = s.state;
  if (which === "chat" && s.think) body.reasoning_effort = s.think;
  if (s.grammar && s.grammar.trim()) body.bnf_schema = s.grammar;
  if (s.format === "json_object") body.response_format = { type: "json_object" };
  if (s.format === "json_schema") {
    let schema;
    try { schema = JSON.parse(s.schema || ""); } catch (e) { throw new Error("The JSON schema in the settings is not JSON: " + e.message); }
    body.response_format = { type: "json_schema", json_schema: { name: "schema", schema, strict: true } };
  }
  return body;
}

// Everything the page keeps (conversations, settings, keys) is in localStorage under
// "ai00like.*", as JSON; an unreadable entry counts as absent.

export const store = {
  get(key, fallback) {
    try { const v = localStorage.getItem("ai00like." + key); return v === null ? fallback : JSON.parse(v); }
    catch { return fallback; }
  },
  set(key, value) { localStorage.setItem("ai00like." + key, JSON.stringify(value)); },
};

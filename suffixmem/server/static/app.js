// suffixmem web chat: plain JavaScript, no build step, no CDN. Each chat is a server-side
// session named by the body's prompt_cache_key (a header carries Latin-1 only, and fetch
// refused any other id); the page sends only the new message (the server
// keeps the history), streams the reply over SSE and shows each turn's prompt tokens, cached
// tokens and time to first token, plus a small SVG chart of TTFT by turn.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { session: null, turns: [], busy: false };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, options = {}) {
  const r = await fetch(path, { ...options, headers: headers() });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.error && body.error.message) || r.statusText);
  return body;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.appendChild(body);
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function showStats(div, t) {
  let s = div.querySelector(".stats");
  if (!s) { s = document.createElement("small"); s.className = "stats"; div.appendChild(s); }
  s.dataset.prompt = t.prompt_tokens;
  s.dataset.cached = t.cached_tokens;
  s.dataset.ttftMs = Math.round(t.ttft_s * 1000);
  s.textContent = `prompt ${t.prompt_tokens} · cached ${t.cached_tokens} · TTFT ${Math.round(t.ttft_s * 1000)} ms`;
}

function drawChart() {
  const svg = $("ttft-chart"), w = 260, h = 70, pad = 6;
  svg.replaceChildren();
  const ms = state.turns.map((t) => t.ttft_s * 1000);
  if (!ms.length) return;
  const max = Math.max(...ms, 1), step = (w - 2 * pad) / Math.max(ms.length, 1);
  const ns = "http://www.w3.org/2000/svg";
  ms.forEach((v, i) => {
    const bh = Math.max(1, (v / max) * (h - 2 * pad));
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", pad + i * step + 1);
    r.setAttribute("y", h - pad - bh);
    r.setAttribute("width", Math.max(2, step - 2));
    r.setAttribute("height", bh);
    r.setAttribute("fill", i === 0 ? "#9aa9c7" : "#2d6cdf");
    const tip = document.createElementNS(ns, "title");
    tip.textContent = `turn ${i + 1}: ${Math.round(v)} ms`;
    r.appendChild(tip);
    svg.appendChild(r);
  });
}

async function refreshSessions() {
  const list = $("sessions");
  let data = [];
  try { data = (await api("/v1/sessions")).data; } catch (e) {
    list.replaceChildren();  // a wrong key: no list, and say why
    addMessage("error", String(e.message || e));
    return;
  }
  list.replaceChildren();
  for (const s of data) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = s.title || s.id;
    b.title = `${s.id} · ${s.messages} messages`;
    b.setAttribute("aria-current", String(s.id === state.session));
    b.addEventListener("click", () => openSession(s.id));
    li.appendChild(b);
    list.appendChild(li);
  }
}

async function openSession(id) {
  state.session = id;
  state.turns = [];
  $("log").replaceChildren();
  $("session-label").textContent = "session " + id;
  try {
    const s = await api("/v1/sessions/" + encodeURIComponent(id));
    // a turn names its reply (message_index); turns an edit abandoned name none. Turns stored
    // before the server recorded it name none at all: pair those with the replies in order.
    const byIndex = new Map();
    const legacy = s.turns.every((t) => t.message_index == null);
    let next = 0;
    s.messages.forEach((m, i) => {
      if (legacy && m.role === "assistant" && next < s.turns.length) byIndex.set(i, s.turns[next++]);
    });
    for (const t of s.turns) if (t.message_index != null) byIndex.set(t.message_index, t);
    s.messages.forEach((m, i) => {
      if (m.role === "system") return;
      const div = addMessage(m.role, m.content);
      const t = byIndex.get(i);
      if (t) { showStats(div, t); state.turns.push(t); }
    });
  } catch (e) { addMessage("error", String(e.message || e)); }
  drawChart();
  refreshSessions();
  $("input").focus();
}

function newSession() {
  state.session = (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()));
  state.turns = [];
  $("log").replaceChildren();
  $("session-label").textContent = "session " + state.session + " (new)";
  drawChart();
  $("input").focus();
}

async function send(text) {
  if (state.busy || !text.trim()) return;
  if (!state.session) newSession();
  state.busy = true;
  $("send").disabled = true;
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.setAttribute("aria-busy", "true");
  const body = div.querySelector(".text");
  const turn = {};
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(),
      body: JSON.stringify({ messages: [{ role: "user", content: text }], stream: true,
                             stream_options: { include_usage: true },
                             prompt_cache_key: state.session }),
    });
    if (!r.ok) {
      const e = await r.json().catch(() => ({}));
      throw new Error((e.error && e.error.message) || r.statusText);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, cut).trim();
        buf = buf.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const ev = JSON.parse(line.slice(6));
        if (ev.error) throw new Error(ev.error.message);
        for (const c of ev.choices || []) {
          if (c.delta && c.delta.content) {
            body.textContent += c.delta.content;
            div.dataset.chunks = Number(div.dataset.chunks || 0) + 1;  // how many deltas came
          }
        }
        if (ev.suffixmem) turn.ttft_s = ev.suffixmem.ttft_s;
        if (ev.usage) {
          turn.prompt_tokens = ev.usage.prompt_tokens;
          turn.cached_tokens = ev.usage.prompt_tokens_details.cached_tokens;
        }
        $("log").scrollTop = $("log").scrollHeight;
      }
    }
    if (turn.prompt_tokens !== undefined) {
      showStats(div, turn);
      state.turns.push(turn);
      drawChart();
    }
    $("session-label").textContent = "session " + state.session;
    refreshSessions();
  } catch (e) {
    div.remove();
    addMessage("error", String(e.message || e));
  } finally {
    div.removeAttribute("aria-busy");
    state.busy = false;
    $("send").disabled = false;
    $("input").focus();
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("new-session").addEventListener("click", newSession);
document.addEventListener("keydown", (e) => { if (e.altKey && (e.key === "n" || e.key === "N")) { e.preventDefault(); newSession(); } });
$("api-key").value = localStorage.getItem("suffixmem-api-key") || "";
// another key is another namespace: the conversation on screen is not one of its sessions
$("api-key").addEventListener("change", () => {
  const key = $("api-key").value;
  if (key === localStorage.getItem("suffixmem-api-key")) return;  // the same key again
  localStorage.setItem("suffixmem-api-key", key);
  newSession();
  refreshSessions();
});
refreshSessions();

// The case browser of `batchrun report`: a sortable, filterable, paged case table and, per case,
// its transcript (one run, or two side by side). Data: the JSON in #report-data (evals/browse_data.py).
// Transcripts are built only when opened, and the table shows one page of rows, so a 10,000-case
// report opens in seconds. The address's #case=ID&epoch=N opens a case, and q, status, verdict,
// sort, dir and page set the table (links and tests use them).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const compare = D.mode === "compare";
  const PAGE = 100;
  const state = { q: "", status: "", verdict: "", sort: "line", dir: 1, page: 0 };
  const $ = (sel) => document.querySelector(sel);
  const esc = (v) => String(v == null ? "" : v).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const num = (v, d) => (v == null ? "–" : Number.isInteger(v) ? String(v) : Number(v).toFixed(d == null ? 2 : d));
  const pct = (v) => (v == null ? "–" : Math.round(100 * v) + "%");
  const verdict = (c) => (!c || c.pass_mean == null ? "ungraded" : c.pass_mean === 1 ? "pass" : c.pass_mean === 0 ? "fail" : "partial");
  const side = (row, key) => (row[key] ? row[key] : null);
  const val = (row, key) => {
    if (key === "line") return (row.a || row.b).line_no;
    if (key === "id") return row.id;
    if (key === "change") return row.change;
    const [s, k] = key.split(".");
    const c = side(row, s);
    return c ? c[k] : null;
  };
  // [key, header, cell(row)]
  const oneCols = [
    ["id", "case", (r) => esc(r.id)],
    ["a.status", "status", (r) => `<span class="st st-${esc(r.a.status)}">${esc(r.a.status)}</span>`],
    ["a.pass_mean", "passed", (r) => `<span class="v-${verdict(r.a)}">${pct(r.a.pass_mean)}</span>`],
    ["a.score", "score", (r) => num(r.a.score)],
    ["a.input_tokens", "in tok", (r) => num(r.a.input_tokens, 1)],
    ["a.output_tokens", "out tok", (r) => num(r.a.output_tokens, 1)],
    ["a.reasoning_tokens", "reasoning tok", (r) => num(r.a.reasoning_tokens, 1)],
    ["a.latency_s", "latency s", (r) => num(r.a.latency_s, 3)],
    ["a.n_tool_calls", "tool calls", (r) => num(r.a.n_tool_calls, 1)],
    ["a.n_tool_errors", "tool errors", (r) => num(r.a.n_tool_errors)],
    ["a.n_epochs", "epochs", (r) => num(r.a.n_epochs)],
  ];
  const pair = (r, k, f) => {
    const x = r.a ? f(r.a[k]) : "–", y = r.b ? f(r.b[k]) : "–";
    return x === y ? x : `${x} <span class="arrow">→</span> <b>${y}</b>`;
  };
  const twoCols = [
    ["id", "case", (r) => esc(r.id)],
    ["change", "change", (r) => `<span class="ch ch-${r.change}">${r.change}</span>`],
    ["a.pass_mean", "passed A", (r) => (r.a ? `<span class="v-${verdict(r.a)}">${pct(r.a.pass_mean)}</span>` : "–")],
    ["b.pass_mean", "passed B", (r) => (r.b ? `<span class="v-${verdict(r.b)}">${pct(r.b.pass_mean)}</span>` : "–")],
    ["b.status", "status", (r) => pair(r, "status", esc)],
    ["b.output_tokens", "out tok", (r) => pair(r, "output_tokens", (v) => num(v, 1))],
    ["b.latency_s", "latency s", (r) => pair(r, "latency_s", (v) => num(v, 3))],
    ["b.n_tool_calls", "tool calls", (r) => pair(r, "n_tool_calls", (v) => num(v, 1))],
  ];
  const cols = compare ? twoCols : oneCols;

  function rows() {
    const q = state.q.toLowerCase();
    let out = D.cases.filter((r) => {
      const c = r.b || r.a;
      if (q && !r.id.toLowerCase().includes(q)) return false;
      if (state.status && !((r.a && r.a.status === state.status) || (r.b && r.b.status === state.status))) return false;
      if (state.verdict && (compare ? r.change !== state.verdict : verdict(c) !== state.verdict)) return false;
      return true;
    });
    const k = state.sort, d = state.dir;
    out = out.slice().sort((x, y) => {
      const a = val(x, k), b = val(y, k);
      if (a == null && b == null) return 0;
      if (a == null) return 1;
      if (b == null) return -1;
      return (a < b ? -1 : a > b ? 1 : 0) * d;
    });
    return out;
  }

  function renderTable() {
    const all = rows();
    const pages = Math.max(1, Math.ceil(all.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const shown = all.slice(state.page * PAGE, (state.page + 1) * PAGE);
    $("#case-head").innerHTML = "<tr>" + cols.map(([k, h]) => {
      const mark = state.sort === k ? (state.dir > 0 ? " ▲" : " ▼") : "";
      return `<th data-sort="${k}">${h}${mark}</th>`;
    }).join("") + "</tr>";
    $("#case-body").innerHTML = shown.map((r) =>
      `<tr class="case-row${r.change ? " ch-row-" + r.change : ""}" data-id="${esc(r.id)}">` +
      cols.map(([, , f]) => `<td>${f(r)}</td>`).join("") + "</tr>").join("");
    $("#pager-text").textContent = `${all.length} of ${D.cases.length} cases · page ${state.page + 1} of ${pages}`;
    $("#prev").disabled = state.page === 0;
    $("#next").disabled = state.page >= pages - 1;
  }

  function table(items, keys, heads) {
    if (!items.length) return '<p class="muted">none</p>';
    return "<table class=\"inner\"><tr>" + heads.map((h) => `<th>${h}</th>`).join("") + "</tr>" +
      items.map((it) => "<tr>" + keys.map((k) => `<td>${typeof k === "function" ? k(it) : esc(it[k] == null ? "–" : it[k])}</td>`).join("") + "</tr>").join("") + "</table>";
  }

  function transcript(s, other, label, types) {
    if (!s) return `<div class="transcript"><h3>${label}</h3><p class="muted">no such sample in this run</p></div>`;
    const otherGrades = {};
    ((other && other.grades) || []).forEach((g) => { otherGrades[g.grader] = g.passed; });
    const outText = (x) => (x ? x.output.map((i) => i.text).join("\n") : null);
    const differs = other && outText(s) !== outText(other);
    const grades = table(s.grades, [(g) => esc(g.grader),
      (g) => `<span class="v-${g.passed ? "pass" : "fail"}${other && g.grader in otherGrades && otherGrades[g.grader] !== g.passed ? " flip" : ""}">${g.passed ? "pass" : "fail"}</span>`,
      (g) => num(g.score), (g) => `<span class="expl">${esc(g.explanation)}</span>`], ["grader", "passed", "score", "explanation"]);
    const input = s.input.map((m) => `<div class="msg msg-${esc(m.role)}"><div class="role">${esc(m.role)}</div><pre>${esc(m.text)}</pre></div>`).join("");
    const output = s.output.length ? s.output.map((i) => `<div class="msg out-${esc(i.kind)}"><div class="role">${esc(i.kind)}${i.name ? " · " + esc(i.name) : ""}</div><pre>${esc(i.text)}</pre></div>`).join("") : '<p class="muted">no output items</p>';
    const calls = table(s.tool_calls, ["name", "tool_type", "status", (c) => num(c.duration_s, 3),
      (c) => `<pre>${esc(c.arguments)}</pre>`, (c) => `<pre>${esc(c.output)}</pre>`, (c) => esc(c.error || "")],
      ["tool", "type", "status", "seconds", "arguments", "output", "error"]);
    const turns = table(s.turns, ["turn", "prompt_tokens", "cached_tokens", "output_tokens", "tool_output_tokens",
      (t) => num(t.prefill_s, 3), (t) => num(t.decode_s, 3), "finish_reason"],
      ["turn", "prompt", "cached", "output", "tool output", "prefill s", "decode s", "finish"]);
    const events = table(s.events.map((e) => ({ seq: e[0], type: types[e[1]], n: e[2], turn: e[3], ms: e[4] == null ? "–" : e[4] === e[5] ? num(e[4], 1) : `${num(e[4], 1)}–${num(e[5], 1)}` })),
      ["seq", "type", (e) => (e.n > 1 ? "×" + e.n : ""), "turn", "ms"], ["seq", "type", "count", "turn", "t ms"]);
    return `<div class="transcript"><h3>${label}</h3>
      <p class="facts"><span class="st st-${esc(s.status)}">${esc(s.status)}</span> · epoch ${s.epoch} ·
      ${num(s.input_tokens)} in (${num(s.cached_tokens)} cached) · ${num(s.output_tokens)} out (${num(s.reasoning_tokens)} reasoning) ·
      ${num(s.num_turns)} turns · latency ${num(s.latency_s, 3)}s · first token ${num(s.ttft_s, 3)}s</p>
      ${s.error ? `<p class="error">${esc(s.error)}</p>` : ""}
      <h4>Grades</h4>${grades}
      <h4>Input</h4>${input || '<p class="muted">no input</p>'}
      <h4 class="${differs ? "differs" : ""}">Output${differs ? " (differs)" : ""}</h4><div class="${differs ? "differs-box" : ""}">${output}</div>
      <h4>Tool calls</h4>${calls}
      <h4>Turns: usage and timing</h4>${turns}
      <details><summary>Event sequence (${s.events.reduce((n, e) => n + e[2], 0)} events)</summary>${events}</details></div>`;
  }

  function renderDetail() {
    const params = new URLSearchParams(location.hash.slice(1));
    const id = params.get("case");
    const box = $("#detail");
    if (!id) { box.innerHTML = '<p class="muted">Click a case to open its transcript.</p>'; return; }
    const row = D.cases.find((r) => r.id === id);
    if (!row) { box.innerHTML = `<p class="error">no case ${esc(id)}</p>`; return; }
    const epoch = Number(params.get("epoch") || 0);
    const samples = D.runs.map((run) => (run.samples[id] || []));
    const epochs = Math.max(...samples.map((s) => s.length));
    const tabs = epochs > 1 ? '<p class="epochs">' + Array.from({ length: epochs }, (_, e) =>
      `<a href="#case=${encodeURIComponent(id)}&epoch=${e}" class="${e === epoch ? "on" : ""}">epoch ${e}</a>`).join(" ") + "</p>" : "";
    const pick = (list) => list.find((s) => s.epoch === epoch) || null;
    const panes = compare
      ? `<div class="side-by-side">${transcript(pick(samples[0]), pick(samples[1]), "A: " + esc(D.runs[0].run_id), D.runs[0].event_types)}${transcript(pick(samples[1]), pick(samples[0]), "B: " + esc(D.runs[1].run_id), D.runs[1].event_types)}</div>`
      : transcript(pick(samples[0]), null, esc(D.runs[0].run_id), D.runs[0].event_types);
    box.innerHTML = `<h2 id="detail-title">${esc(id)}${row.change ? ` <span class="ch ch-${row.change}">${row.change}</span>` : ""}</h2>${tabs}${panes}`;
    document.querySelectorAll(".case-row").forEach((tr) => tr.classList.toggle("open", tr.dataset.id === id));
  }

  function fromHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    for (const key of ["q", "status", "verdict", "sort"]) if (p.has(key)) state[key] = p.get(key);
    if (p.has("dir")) state.dir = Number(p.get("dir")) < 0 ? -1 : 1;
    if (p.has("page")) state.page = Math.max(0, Number(p.get("page")) - 1 || 0);
  }

  function init() {
    fromHash();
    const statuses = [...new Set(D.cases.flatMap((r) => [r.a && r.a.status, r.b && r.b.status]).filter(Boolean))].sort();
    $("#f-status").innerHTML = '<option value="">any status</option>' + statuses.map((s) => `<option>${esc(s)}</option>`).join("");
    const kinds = compare ? ["regression", "missing", "improvement", "changed", "new", "same"] : ["pass", "partial", "fail", "ungraded"];
    $("#f-verdict").innerHTML = `<option value="">${compare ? "any change" : "any result"}</option>` + kinds.map((k) => `<option>${k}</option>`).join("");
    $("#f-q").value = state.q;
    $("#f-status").value = state.status;
    $("#f-verdict").value = state.verdict;
    $("#f-q").addEventListener("input", (e) => { state.q = e.target.value; state.page = 0; renderTable(); });
    $("#f-status").addEventListener("change", (e) => { state.status = e.target.value; state.page = 0; renderTable(); });
    $("#f-verdict").addEventListener("change", (e) => { state.verdict = e.target.value; state.page = 0; renderTable(); });
    $("#prev").addEventListener("click", () => { state.page -= 1; renderTable(); });
    $("#next").addEventListener("click", () => { state.page += 1; renderTable(); });
    $("#case-head").addEventListener("click", (e) => {
      const th = e.target.closest("th");
      if (!th) return;
      state.dir = state.sort === th.dataset.sort ? -state.dir : 1;
      state.sort = th.dataset.sort;
      renderTable();
    });
    $("#case-body").addEventListener("click", (e) => {
      const tr = e.target.closest("tr");
      if (tr) location.hash = "case=" + encodeURIComponent(tr.dataset.id);
    });
    window.addEventListener("hashchange", () => { renderDetail(); $("#detail").scrollIntoView(); });
    renderTable();
    renderDetail();
  }
  init();
  // When the first page was ready, in ms since navigation began (large-run checks read it).
  document.documentElement.dataset.readyMs = String(Math.round(performance.now()));
  // A link to a case opens at its transcript (when the window does not show it already).
  if (location.hash.includes("case=") && $("#detail").getBoundingClientRect().top > innerHeight - 200) {
    $("#detail").scrollIntoView();
  }
})();

// statusbench sample browser (analysis/browser.py embeds this with its data). Record text is only
// ever set through textContent, never parsed as HTML.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("sb-data").textContent);
  const root = document.getElementById("sb-root");
  const byId = new Map(data.samples.map((s) => [s.id, s]));
  const ROW_CAP = 500; // rows drawn at once; the count says how many match
  const FILTERS = ["run", "model", "condition", "label", "cell"];

  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else if (k === "style") e.style.cssText = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const kid of kids) if (kid != null) e.append(kid);
    return e;
  }
  const unknown = (x, fmt) => (x == null ? "unknown" : fmt ? fmt(x) : String(x));
  const int = (x) => String(Math.round(x));
  const color = (name) => data.region_colors[name] || "#999999";

  // summary: how much of the run this page holds
  const embedded = data.samples.length;
  let summary = `${embedded} of ${data.total} samples embedded.`;
  if (data.left_out > 0) {
    summary += ` ${data.left_out} left out (limit ${data.limit}): episodes with an error come first, then a ` +
      "stratified sample (by label and grid cell) of the rest; `python -m analysis.view RUN_DIR --limit 0` opens them all.";
    if (data.errors_left_out > 0) summary += ` More errors than the limit: ${data.errors_left_out} of them are among those left out.`;
  }
  root.append(el("p", { id: "sb-summary", text: summary }));
  if (!embedded) return;

  // filters
  const bar = el("div", { class: "sb-filters" });
  const selects = {};
  for (const key of FILTERS) {
    const values = (data.filters || {})[key] || [];
    if (key === "run" && values.length < 2) continue;
    const sel = el("select", { id: `sb-f-${key}`, onchange: draw }, el("option", { value: "", text: `all` }));
    for (const v of values) sel.append(el("option", { value: v, text: v }));
    selects[key] = sel;
    bar.append(el("label", {}, `${key} `, sel));
  }
  const count = el("span", { id: "sb-count" });
  bar.append(count);
  root.append(bar);

  const cols = [["sample", (s) => s.id], ["model", (s) => s.model], ["condition", (s) => s.condition],
    ["cell", (s) => s.cell], ["label", (s) => s.label], ["expected", (s) => s.expected],
    ["prompt tok", (s) => unknown(s.prompt_tokens, int)], ["completion tok", (s) => unknown(s.completion_tokens, int)],
    ["US$", (s) => unknown(s.cost_usd, (x) => x.toPrecision(3))]];
  if (selects.run) cols.splice(1, 0, ["run", (s) => s.run]);
  const tbody = el("tbody");
  root.append(el("div", { class: "sb-tablewrap" },
    el("table", { id: "sb-table" }, el("thead", {}, el("tr", {}, ...cols.map(([h]) => el("th", { text: h })))), tbody)));
  const detail = el("div", { id: "sb-detail" });
  root.append(detail);

  function draw() {
    const want = Object.fromEntries(Object.entries(selects).map(([k, s]) => [k, s.value]));
    const rows = data.samples.filter((s) => Object.entries(want).every(([k, v]) => !v || String(s[k]) === v));
    tbody.replaceChildren(...rows.slice(0, ROW_CAP).map((s) => {
      const tr = el("tr", { "data-id": s.id, class: `sb-row sb-l-${s.label}`, onclick: () => open(s.id) },
        ...cols.map(([, f]) => el("td", { text: f(s) })));
      return tr;
    }));
    count.textContent = `${rows.length} match` + (rows.length > ROW_CAP ? ` (first ${ROW_CAP} shown)` : "");
  }

  // one prompt as coloured, marked text: regions from the probe's tokens when it tokenized this
  // very text, else the regions the condition pipeline annotated (`spans`); `marks` are spans that
  // differ from the other arm
  function promptView(s, text, marks, spans) {
    const n = text.length;
    const region = new Array(n).fill(null);
    const att = s.attention;
    if (att && att.offsets && (att.text == null || att.text === text)) {
      for (let t = 0; t < att.token_regions.length; t++) {
        const name = att.regions[att.token_regions[t]];
        for (let c = att.offsets[2 * t]; c < att.offsets[2 * t + 1]; c++) region[c] = name;
      }
    } else {
      for (const [a, b, name] of spans || []) region.fill(name, a, b);
    }
    const diff = new Uint8Array(n);
    for (const [a, b] of marks || []) diff.fill(1, a, b);
    const pre = el("pre", { class: "sb-prompt" });
    let start = 0;
    for (let c = 1; c <= n; c++) {
      if (c < n && region[c] === region[start] && diff[c] === diff[start]) continue;
      const name = region[start];
      const cls = ["sb-seg"];
      if (name) cls.push(`sb-r-${name}`);
      if (diff[start]) cls.push("sb-diff");
      const span = el("span", { class: cls.join(" "), text: text.slice(start, c) });
      if (name) {
        span.style.background = color(name) + (name === "template" ? "30" : "40");
        span.title = name;
      }
      pre.append(span);
      start = c;
    }
    return pre;
  }

  function legend(names) {
    return el("div", { class: "sb-legend" }, ...names.map((n) =>
      el("span", { class: "sb-key", style: `background:${color(n)}40`, text: n })),
      el("span", { class: "sb-key sb-diff", text: "differs from the other arm" }));
  }

  function column(s, marks, isThis) {
    const p = s.prompt ? data.prompts[s.prompt] : null;
    const head = el("div", { class: "sb-colhead" },
      el("b", { text: s.condition }), ` · ${s.label} · `,
      isThis ? el("i", { text: "this sample" }) : el("a", { href: "#", text: "open", onclick: (e) => { e.preventDefault(); open(s.id); } }));
    if (!p) return el("div", { class: "sb-col" }, head, el("p", { text: "prompt not stored (prompts.jsonl has no entry for it)" }));
    const how = p.rendered ? "rendered text, exactly as sent" : "messages (the backend rendered them itself)";
    const tools = p.tools.length ? ` · tools: ${p.tools.join(", ")}` : "";
    return el("div", { class: "sb-col", "data-id": s.id }, head, el("div", { class: "sb-note", text: how + tools }),
      promptView(s, p.text, marks, p.regions));
  }

  function attentionView(s) {
    const a = s.attention;
    const box = el("div", { id: "sb-attn" }, el("h4", { text: `Attention at layer ${a.layer} (mean over heads and all generated tokens), per prompt token` }));
    const strip = el("pre", { class: "sb-prompt sb-strip" });
    const source = a.text == null && s.prompt ? data.prompts[s.prompt].text : a.text;
    for (let t = 0; t < a.shade.length; t++) {
      const name = a.regions[a.token_regions[t]];
      const text = a.offsets ? source.slice(a.offsets[2 * t], a.offsets[2 * t + 1]) || "\u00b7" : "\u2003";
      strip.append(el("span", {
        class: "sb-tok", title: `token ${t} · ${name} · shade ${a.shade[t]}/255`,
        style: `background: rgba(213,94,0,${(a.shade[t] / 255).toFixed(3)}); border-bottom: 3px solid ${color(name)}`, text,
      }));
    }
    if (!a.offsets) box.append(el("p", { class: "sb-note", text: "This run's probe stored no token offsets: tokens are shown as cells." }));
    box.append(el("p", { class: "sb-note", text: "Shade: log attention between its 1st percentile and its maximum (attention sinks dwarf the rest); underline: the token's region." }), strip);
    const phases = Object.keys(a.phases);
    if (phases.length) {
      const t = el("table", { class: "sb-phases" }, el("tr", {}, el("th", { text: "region" }), el("th", { text: "tokens" }),
        ...phases.map((p) => el("th", { text: `${p} (${a.phases[p].tokens} tok): share (per token)` }))));
      for (const r of a.regions) {
        t.append(el("tr", {}, el("td", { text: r }), el("td", { text: unknown(a.region_tokens?.[r], String) }),
          ...phases.map((p) => el("td", {
            text: `${unknown(a.phases[p].share[r], (x) => x.toFixed(3))} (${unknown(a.phases[p].per_token?.[r], (x) => x.toPrecision(2))})`,
          }))));
      }
      box.append(el("h4", { text: "Share of attention per generated token, thinking vs answer (mean over layers and heads), and per token of the region" }), t);
    }
    return box;
  }

  function completion(s) {
    const thinking = s.thinking, answer = s.answer;
    const box = el("div", { class: "sb-completion" });
    if (thinking) {
      box.append(el("details", { class: "sb-thinking" },
        el("summary", { text: `thinking (${unknown(s.thinking_tokens, int)} tokens)` }), el("pre", { text: thinking })));
    }
    box.append(el("pre", { class: "sb-answer", text: answer || "(empty answer)" }));
    box.append(el("h4", { text: "Parsed tool calls" }),
      s.tool_calls.length ? el("pre", { class: "sb-calls", text: JSON.stringify(s.tool_calls, null, 2) }) : el("p", { class: "sb-calls", text: "none" }));
    return box;
  }

  function facts(s) {
    const why = s.reason != null ? s.reason :
      `the grader gave no reason: label ${s.label}, expected ${s.expected}, ${s.correct ? "correct" : "not correct"}`;
    const rows = [["run", s.run], ["model", s.model], ["episode", `${s.episode} · replicate ${s.replicate}`],
      ["condition", s.condition], ["cell", s.cell], ["label", s.label], ["expected", s.expected],
      ["correct", s.correct ? "yes" : "no"], ["why", why],
      ["tokens", `prompt ${unknown(s.prompt_tokens, int)} · completion ${unknown(s.completion_tokens, int)} · thinking ${unknown(s.thinking_tokens, int)} · answer ${unknown(s.answer_tokens, int)}`],
      ["cost US$", unknown(s.cost_usd, (x) => x.toPrecision(3))], ["latency s", unknown(s.latency_s, (x) => x.toFixed(2))],
      ["finish", unknown(s.finish_reason)]];
    if (s.error) rows.push(["error", s.error]);
    if (s.scripted) rows.push(["scripted", "replayed, not generated"]);
    return el("table", { class: "sb-facts" }, ...rows.map(([k, v]) =>
      el("tr", {}, el("th", { text: k }), el("td", { class: `sb-v-${k.split(" ")[0]}`, text: v }))));
  }

  function open(id) {
    const s = byId.get(id);
    for (const tr of tbody.querySelectorAll("tr.sb-open")) tr.classList.remove("sb-open");
    const row = tbody.querySelector(`tr[data-id="${CSS.escape(id)}"]`);
    if (row) row.classList.add("sb-open");
    detail.replaceChildren(el("h3", { text: `Sample ${s.id}` }), facts(s), el("h4", { text: "Completion" }), completion(s));
    const peers = s.peers.map((p) => byId.get(p)).filter(Boolean);
    const pair = el("div", { class: "sb-pair" });
    const names = new Set(["status", "added"]);
    if (s.attention && s.attention.offsets) for (const r of s.attention.regions) names.add(r);
    const show = (peer) => {
      if (!peer) { pair.replaceChildren(column(s, null, true)); return; }
      // the baseline arm on the left
      const left = peer.condition === data.baseline ? peer : s, right = left === s ? peer : s;
      pair.replaceChildren(column(left, left.diff[right.id], left === s), column(right, right.diff[left.id], right === s));
    };
    const head = el("h4", { text: peers.length ? "Prompt, beside the same episode's other arm" : "Prompt" });
    detail.append(head);
    if (peers.length > 1) {
      const sel = el("select", { id: "sb-peer", onchange: () => show(byId.get(sel.value)) },
        ...peers.map((p) => el("option", { value: p.id, text: p.condition })));
      detail.append(el("label", {}, "compare with ", sel));
    }
    detail.append(legend([...names]), pair);
    show(peers[0]);
    // each prompt opens at its first differing text (the condition's status bar, usually near the end)
    for (const pre of pair.querySelectorAll("pre.sb-prompt")) {
      const mark = pre.querySelector(".sb-diff");
      if (mark) pre.scrollTop = Math.max(0, mark.offsetTop - 60);
    }
    if (s.attention) detail.append(attentionView(s));
    if (s.attention_error) detail.append(el("p", { id: "sb-attn-error", text: `attention not shown: ${s.attention_error}` }));
    detail.scrollIntoView({ block: "start" });
  }

  draw();
})();

"use strict";
(function () {
  const data = JSON.parse(document.getElementById("data").textContent);
  const el = (tag, attrs, text) => {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const signed = (x, n) => (x === null || x === undefined ? "–" : (x >= 0 ? "+" : "−") + Math.abs(x).toFixed(n));
  // The terminal's diverging scale (render/terminal/patching.py effect_colour): white at 0,
  // RdBu's blue at +1, its red at −1, clipped beyond.
  const POS = [33, 102, 172], NEG = [178, 24, 43], WHITE = [247, 247, 247];
  function colour(v) {
    const x = Math.min(Math.abs(v), 1), end = v >= 0 ? POS : NEG;
    const c = WHITE.map((w, i) => Math.round(w + x * (end[i] - w)));
    return "#" + c.map((n) => n.toString(16).padStart(2, "0")).join("");
  }
  function paint(td, v) {
    if (v === null || v === undefined) { td.classList.add("none"); td.textContent = "–"; return; }
    td.style.background = colour(v);
    td.style.color = Math.abs(v) > 0.55 ? "#fff" : "#000";
    td.textContent = signed(v, Math.abs(v) < 10 ? 2 : 0);
  }
  document.title = data.title;
  document.getElementById("title").textContent = "attnviz patch";
  document.getElementById("meta").textContent = `${data.model} · engine ${data.engine}`;
  document.getElementById("label").textContent = data.label;
  document.getElementById("scores").textContent =
    `clean ${data.metric_label} = ${Number(data.clean_score).toPrecision(4)}; corrupted = ` +
    `${Number(data.corrupted_score).toPrecision(4)}; effect 0 = the corrupted run, 1 = the clean run`;
  document.getElementById("partial").hidden = !data.partial;

  // The pair.
  const body = document.querySelector("#alignment tbody");
  [["clean", "clean"], ["corrupted", "corrupted"]].forEach(([key, name]) => {
    const tr = el("tr");
    tr.appendChild(el("th", {}, name));
    data.alignment.forEach((col) => {
      const td = el("td", { title: col.span ? "the differing span (not matched)" : `position ${col.position}` },
        col[key] || "∅");
      if (col.differs) td.classList.add("differs");
      if (col.scored) td.classList.add("scored");
      tr.appendChild(td);
    });
    body.appendChild(tr);
  });
  document.getElementById("differing").textContent = `differing: ${data.differing}`;

  // The heatmaps: layers down, units across.
  const grids = document.getElementById("grids");
  data.grids.forEach((g) => {
    const table = el("table", { class: "grid", id: `grid-${g.name}` });
    const what = g.name === "exact" ? "exact patching" : "attribution-patching estimate";
    table.appendChild(el("caption", {}, `${what}: ${g.what}`));
    const head = el("tr");
    head.appendChild(el("th"));
    g.columns.forEach((c) => head.appendChild(el("th", {}, c)));
    table.appendChild(head);
    g.cells.forEach((line, i) => {
      const tr = el("tr");
      tr.appendChild(el("th", {}, g.rows[i]));
      (Array.isArray(line) ? line : [line]).forEach((v, j) => {
        const td = el("td", { title: `${g.rows[i]} ${g.columns[j]}: ${signed(v, 4)}` });
        paint(td, v);
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    grids.appendChild(table);
  });
  const legend = document.getElementById("legend");
  legend.appendChild(el("span", { class: "dim", style: "width:auto" }, "scale:"));
  [-1, -0.5, 0, 0.5, 1].forEach((v) => { const s = el("span"); paint(s, v); legend.appendChild(s); });

  // The ranked table.
  const both = data.method === "both";
  const thead = document.querySelector("#ranked thead"), tbody = document.querySelector("#ranked tbody");
  const cols = both ? ["rank", "unit", "exact", "estimate", "est − exact", "flag"]
    : ["rank", "unit", "effect", data.metric_label];
  const hr = el("tr");
  cols.forEach((c) => hr.appendChild(el("th", {}, c)));
  thead.appendChild(hr);
  document.getElementById("ranked-title").textContent =
    `top ${data.ranked.length} by |${both ? "exact effect" : "effect"}|`;
  const row = (r, rank, extra) => {
    const tr = el("tr", { class: extra || "" });
    tr.appendChild(el("td", {}, rank));
    tr.appendChild(el("td", { class: "unit" }, r.unit));
    if (both) {
      const a = el("td"), b = el("td");
      paint(a, r.exact); paint(b, r.estimate);
      tr.append(a, b, el("td", {}, signed(r.estimate - r.exact, 3)), el("td", {}, r.flag ? `✗ ${r.flag}` : ""));
      if (r.flag) tr.classList.add("flagged");
    } else {
      const a = el("td");
      paint(a, r.effect);
      tr.append(a, el("td", {}, Number(r.raw).toPrecision(4)));
    }
    return tr;
  };
  data.ranked.forEach((r, k) => tbody.appendChild(row(r, String(k + 1))));
  (data.flagged_beyond || []).forEach((r) => tbody.appendChild(row(r, "·", "beyond")));
  if (both) {
    const c = data.comparison, p = document.getElementById("comparison");
    p.hidden = false;
    p.textContent = `${data.estimate_label}. Pearson r (exact, estimate) = ` +
      `${c.correlation === null ? "undefined" : c.correlation.toFixed(3)}; ${c.flagged} flagged: ` +
      `|exact − estimate| > ${c.threshold} (gap) or opposite signs both ≥ ${c.sign_floor} (sign).`;
  }
  const notes = document.getElementById("notes");
  data.notes.forEach((n) => notes.appendChild(el("li", {}, n)));
  window.attnvizPatch = { data: data, colour: colour };
})();

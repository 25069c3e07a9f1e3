"use strict";
(function () {
  const data = JSON.parse(document.getElementById("data").textContent);
  const tokens = data.tokens;
  const fmt = (x, n) => (x === null || x === undefined ? "" : Number(x).toFixed(n));
  const el = (tag, attrs, text) => {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  document.getElementById("title").textContent =
    `layer ${data.layer} · head ${data.head} · query “${data.query_token}” (token ${data.query_index})`;
  document.getElementById("meta").textContent =
    `${data.model} · engine ${data.engine} · d_k = ${data.head_dim} · scale ${fmt(data.scale, 4)}`;
  const steps = document.getElementById("steps");
  [
    "project: q = x·W^Q + b^Q for the query, k_j = x_j·W^K + b^K for each key",
    `score: q·k_j × ${fmt(data.scale, 4)}` + (data.bias ? " + the position bias" : ""),
    "normalise: α_j = softmax over the keys" + (data.sink !== undefined ? " and the sink logit" : ""),
    "mix: Σ_j α_j·f(x_j), f(x) = (x·W^V + b^V)·W^O of the head; ‖α·f(x)‖ = α·‖f(x)‖ (Kobayashi et al. 2020)",
  ].concat(data.steps).forEach((s) => steps.appendChild(el("li", {}, s)));
  const body = document.querySelector("#keys tbody");
  const maxW = Math.max(...data.weights, 1e-12), maxC = Math.max(...data.contribution, 1e-12);
  const rows = [];
  tokens.forEach((label, j) => {
    const tr = el("tr", { "data-key": String(j) });
    if (j === data.query_index) tr.classList.add("query");
    if (!data.mask[j]) tr.classList.add("masked");
    const key = el("td", { class: "key" }, label);
    tr.appendChild(key);
    tr.appendChild(el("td", {}, fmt(data.scores[j], 2)));
    tr.appendChild(el("td", {}, data.mask[j] ? fmt(data.logits[j], 2) : "masked"));
    tr.appendChild(el("td", {}, fmt(data.weights[j], 3)));
    const wb = el("td", { style: "text-align:left" });
    wb.appendChild(el("span", { class: "bar w", style: `width:${(120 * data.weights[j]) / maxW}px` }));
    tr.appendChild(wb);
    tr.appendChild(el("td", {}, fmt(data.value_norms[j], 2)));
    tr.appendChild(el("td", {}, fmt(data.contribution[j], 3)));
    const nb = el("td", { style: "text-align:left" });
    nb.appendChild(el("span", { class: "bar n", style: `width:${(120 * data.contribution[j]) / maxC}px` }));
    tr.appendChild(nb);
    key.addEventListener("click", () => show(j));
    body.appendChild(tr);
    rows.push(tr);
  });
  const total = data.contribution.reduce((a, b) => a + b, 0);
  let best = 0;
  data.contribution.forEach((c, j) => { if (c > data.contribution[best]) best = j; });
  document.getElementById("summary").textContent =
    `largest norm contribution: “${tokens[best]}”, weight ${fmt(data.weights[best], 2)} → norm share ` +
    `${fmt(total > 0 ? data.contribution[best] / total : 0, 2)} · the head's share of the layer's attention output ${fmt(data.share, 3)}`;
  function show(j) {
    rows.forEach((r) => r.classList.toggle("selected", Number(r.dataset.key) === j));
    const q = data.query, k = data.keys[j];
    const products = q.map((x, d) => x * k[d]);
    const top = Math.max(...products.map(Math.abs), 1e-12);
    const sum = products.reduce((a, b) => a + b, 0);
    const order = products.map((p, d) => d);
    const pos = order.filter((d) => products[d] > 0).sort((a, b) => products[b] - products[a]).slice(0, 8);
    const neg = order.filter((d) => products[d] < 0).sort((a, b) => products[a] - products[b]).slice(0, 8);
    document.getElementById("neuron-title").textContent =
      `q ⊙ k for key “${tokens[j]}” (token ${j}): Σ_d q_d·k_d = ${fmt(sum, 2)}`;
    const bars = document.getElementById("bars");
    bars.replaceChildren();
    products.forEach((p, d) => {
      const col = el("div", { class: "col", title: `dim ${d}: q ${fmt(q[d], 3)} × k ${fmt(k[d], 3)} = ${fmt(p, 3)}` });
      const h = (50 * Math.abs(p)) / top;
      const bar = el("div", { class: p >= 0 ? "pos" : "neg", style: `height:${h}%` });
      col.appendChild(bar);
      if (pos.includes(d) || neg.includes(d)) {
        col.appendChild(el("div", { class: "lab", style: p >= 0 ? `bottom:${50 + h}%` : `top:${50 + h}%` }, String(d)));
      }
      bars.appendChild(col);
    });
    document.getElementById("neuron").hidden = false;
  }
  const first = data.neuron ? data.neuron.key_index : best;
  show(first);
})();

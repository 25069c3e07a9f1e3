// attnviz interactive view. Self-contained: reads the JSON in #attnviz-data, draws on
// canvases, requests nothing from any network.
//
// Shape legend: N kept layers, H heads, S tokens, U units shown (tokens or words, special
// tokens possibly hidden).
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("attnviz-data").textContent);
  var N = DATA.weights.shape[0], H = DATA.weights.shape[1], S = DATA.weights.shape[2];

  // --- weights: uint16 little-endian, base64, w = q / scale -------------------------------
  function decode(w) {
    var bin = atob(w.base64), n = bin.length >> 1, out = new Float32Array(n);
    for (var i = 0; i < n; i++) {
      out[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / w.scale;
    }
    return out;
  }
  var W = decode(DATA.weights); // (N, H, S, S), row-major
  // The norm measure (Kobayashi et al. 2020), when the page carries it: ‖α·f(x)‖ over the
  // page's largest norm (so it fits the same uint16 encoding); shown as each row's shares.
  var WN = DATA.norms ? decode(DATA.norms) : null;
  if (WN) { // each row was stored over its own largest norm: multiply the scales back
    var rb = atob(DATA.norm_rows.base64), bytes = new Uint8Array(rb.length);
    for (var ri = 0; ri < rb.length; ri++) bytes[ri] = rb.charCodeAt(ri);
    var scales = new Float32Array(bytes.buffer);
    for (var wi = 0; wi < WN.length; wi++) WN[wi] *= scales[Math.floor(wi / S)];
  }

  // Attention rollout (Abnar & Zuidema 2020), when the page carries it: computed in Python by
  // attnviz.transforms.rollout from every layer from 0 (the numbers of `show --rollout`),
  // (N, S, S) in the weights' encoding; read here through rules 1-2 like one more head.
  var WR = DATA.rollout ? decode(DATA.rollout) : null;

  function tokenMatrix(slot, head) { // (S, S): one head's per-token weights (or norms)
    var size = S * S, at = (slot * H + head) * size;
    return (state.measure !== MS.first && WN ? WN : W).subarray(at, at + size);
  }

  // --- units: what the rows and columns are after the options ------------------------------
  // Each unit is a group of token positions: one token, or a word's pieces.
  function units(opts) {
    var out = [], i;
    if (opts.words) {
      for (i = 0; i < DATA.words.length; i++) {
        var g = DATA.words[i];
        out.push({ label: DATA.word_labels[i], tokens: g, special: g.length === 1 && DATA.special[g[0]] });
      }
    } else {
      for (i = 0; i < S; i++) out.push({ label: DATA.labels[i], tokens: [i], special: DATA.special[i] });
    }
    if (opts.hideSpecial) out = out.filter(function (u) { return !u.special; });
    return out;
  }

  // The rules of attnviz.transforms, in its order (the footer of the page says them in words):
  //   1. special tokens set aside: as keys they get weight 0 and each token's row is divided
  //      by what remains; their own rows are left out of the view. A row with less than
  //      MIN_LEFT (1%) left is shown empty (0): the stored weights are rounded to 1/65535,
  //      and scaling a few such steps up to 1 would draw rounding noise as a pattern.
  //   2. words (Clark et al. 2019): M[a][b] = mean over the query pieces q of word a of
  //      (sum over the key pieces k of word b of A[q][k]).
  //   3. head mean: the mean over the layer's H heads of the rows that 1-2 produced.
  // Returns a Float32Array (U, U) for the units units(opts).
  //   4. the norm measure: each row of 1-3 (raw norms) divided by its sum, its shares.
  function headMatrix(slot, head, opts) {
    var M = rawMatrix(slot, head, opts);
    if (!MS.shares(state.measure)) return M;
    var key = "shares/" + slot + "/" + head + "/" + (opts.words ? 1 : 0) + (opts.hideSpecial ? 1 : 0);
    if (cache.has(key)) return cache.get(key);
    var U = Math.round(Math.sqrt(M.length)), out = new Float32Array(M.length);
    for (var a = 0; a < U; a++) {
      var total = 0, b;
      for (b = 0; b < U; b++) total += M[a * U + b];
      for (b = 0; b < U; b++) out[a * U + b] = total > 0 ? M[a * U + b] / total : 0;
    }
    cache.set(key, out);
    return out;
  }
  function rawMatrix(slot, head, opts) {
    var key = state.measure + "/" + slot + "/" + head + "/" + (opts.words ? 1 : 0) + (opts.hideSpecial ? 1 : 0);
    if (cache.has(key)) return cache.get(key);
    var M;
    if (head === "rollout") {
      M = reduce(WR.subarray(slot * S * S, (slot + 1) * S * S), opts);
    } else if (head === "mean") {
      var us = units(opts), U = us.length;
      M = new Float32Array(U * U);
      for (var h = 0; h < H; h++) {
        var Mh = rawMatrix(slot, h, opts);
        for (var i = 0; i < U * U; i++) M[i] += Mh[i] / H;
      }
    } else {
      M = reduce(tokenMatrix(slot, head), opts);
    }
    cache.set(key, M);
    return M;
  }
  var cache = new Map();
  var MIN_LEFT = 0.01;

  function reduce(A, opts) { // A: (S, S) -> (U, U) by rules 1 and 2
    var B = A, q, k, a, b, i, j;
    if (opts.hideSpecial) { // 1. specials set aside, each token's row renormalised
      B = new Float64Array(S * S);
      for (q = 0; q < S; q++) {
        var total = 0;
        for (k = 0; k < S; k++) if (!DATA.special[k]) total += A[q * S + k];
        // Norms are magnitudes: set aside, not renormalised (rule 4 makes the shares).
        var scale = MS.shares(state.measure) ? 1 : total >= MIN_LEFT ? 1 / total : 0;
        for (k = 0; k < S; k++) B[q * S + k] = DATA.special[k] ? 0 : A[q * S + k] * scale;
      }
    }
    var all = units({ words: opts.words, hideSpecial: false });
    var V = all.length, keep = [];
    for (a = 0; a < V; a++) if (!(opts.hideSpecial && all[a].special)) keep.push(a);
    var U = keep.length, M = new Float32Array(U * U);
    for (a = 0; a < U; a++) { // 2. words (or tokens: one piece each), special units left out
      var qs = all[keep[a]].tokens;
      for (b = 0; b < U; b++) {
        var ks = all[keep[b]].tokens, sum = 0;
        for (i = 0; i < qs.length; i++) for (j = 0; j < ks.length; j++) sum += B[qs[i] * S + ks[j]];
        M[a * U + b] = sum / qs.length;
      }
    }
    return M;
  }

  function emptyRow(M, U, a) {
    for (var b = 0; b < U; b++) if (M[a * U + b] > 0) return false;
    return true;
  }

  // causal models: unit b is masked for query unit a when all of b comes after all of a.
  function masked(us, a, b) {
    if (!DATA.causal) return false;
    var qa = us[a].tokens, kb = us[b].tokens;
    return kb[0] > qa[qa.length - 1];
  }

  // Shared helpers (common.js, inlined before this script): colour, canvas, tooltip, header, chips.
  var C = attnvizCommon, $ = C.$, headColour = C.headColour;
  var MS = C.pageMeasures(DATA); // the page's measures: their properties, never their names
  var FONT = C.FONT, sized = C.sized, textWidth = C.textWidth, heatmap = C.heatmap;
  var showTip = C.showTip, hideTip = C.hideTip, fmt = C.fmt;
  function headName(h) { return h === "mean" || h === "rollout" ? h : DATA.heads[h]; }
  function firstLayer() { return DATA.rollout ? DATA.rollout.first : 0; }
  function aggregateTitle(h) { // how the matrix view names an aggregate
    if (h === "mean") return "mean of the " + H + " heads";
    return "rollout through layers " + firstLayer() + ".." + DATA.layers[state.slot] + " (Abnar & Zuidema 2020)";
  }

  // --- state ---------------------------------------------------------------------------
  var state = {
    view: DATA.initial.view,
    slot: DATA.initial.slot,
    head: DATA.initial.head || 0, // the matrix view's head
    shown: [], // heads drawn in the head view
    words: !!DATA.initial.words, // the reading options the page opens with (all off by default)
    hideSpecial: !!DATA.initial.hideSpecial,
    mean: !!DATA.initial.mean,
    rollout: !!(DATA.initial.rollout && WR),
    measure: MS.second !== null && DATA.initial.measure === MS.second && DATA.norms ? MS.second : MS.first,
    pinned: DATA.initial.query, // token position of the pinned query (a piece of its unit)
    hover: null, // unit index under the pointer, head view
  };
  // The heads drawn at first: all, or those the export named (--heads 1,11).
  for (var h0 = 0; h0 < H; h0++) state.shown.push(!DATA.initial.shown || DATA.initial.shown.indexOf(h0) >= 0);

  function opts() { return { words: state.words, hideSpecial: state.hideSpecial }; }
  function currentUnits() { return units(opts()); }
  function unitOf(us, token) {
    if (token === null) return null;
    for (var i = 0; i < us.length; i++) if (us[i].tokens.indexOf(token) >= 0) return i;
    return null;
  }
  function focusUnit(us) { return state.hover !== null ? state.hover : unitOf(us, state.pinned); }
  function layerName(slot) { return "layer " + DATA.layers[slot]; }

  // --- header, controls ----------------------------------------------------------------
  function header() {
    // A long text is clamped to two lines; a click (or Enter) shows it whole.
    C.sentence(DATA.text.trim(), DATA.text.length > 160, "click to show the whole text");
    C.provenance(DATA, N, S + " tokens");
    $("notes").textContent = DATA.notes.join(" · ");
    $("scale").textContent = "q = round(w × " + DATA.weights.scale + ")";
    $("rollout-rule").hidden = !WR;
    if (WR && DATA.layers[0] !== DATA.rollout.first) {
      $("rollout-rule").textContent += " This page starts at layer " + DATA.layers[0] + "; its rollout still runs from layer " +
        DATA.rollout.first + ", through layers the page does not show (as attnviz show --rollout --layer does).";
    }
    C.legend(DATA.causal);
  }

  function controls() {
    var layer = $("layer"), head = $("head"), i;
    for (i = 0; i < N; i++) layer.add(new Option(String(DATA.layers[i]), String(i)));
    for (i = 0; i < H; i++) head.add(new Option(DATA.heads[i], String(i)));
    layer.addEventListener("change", function () { state.slot = +layer.value; render(); });
    head.addEventListener("change", function () { state.head = +head.value; render(); });
    $("opt-words").addEventListener("change", function (e) { state.words = e.target.checked; state.hover = null; render(); });
    $("opt-special").addEventListener("change", function (e) {
      state.hideSpecial = e.target.checked; state.hover = null;
      if (state.hideSpecial && state.pinned !== null && DATA.special[state.pinned]) state.pinned = null;
      render();
    });
    $("opt-mean").addEventListener("change", function (e) { state.mean = e.target.checked; render(); });
    $("opt-rollout-field").hidden = !WR;
    $("opt-rollout").addEventListener("change", function (e) { state.rollout = e.target.checked && !!WR; render(); });
    $("opt-norm-field").hidden = !WN;
    $("opt-norm").addEventListener("change", function (e) {
      state.measure = e.target.checked && WN ? MS.second : MS.first;
      $("legend-label").textContent = MS.legend(state.measure);
      render();
    });
    C.viewTabs(setView);
    C.headChips(DATA.heads, state, render);
    document.addEventListener("keydown", keys);
  }

  function setView(view) {
    state.view = view;
    state.hover = null;
    hideTip();
    render();
  }

  function keys(ev) {
    if (!C.ownKey(ev)) return;
    var us = currentUnits(), u = unitOf(us, state.pinned), k = ev.key;
    if (k === "1" || k === "2" || k === "3") { setView(["head", "model", "matrix"][+k - 1]); }
    else if (k === "[" || k === "]") {
      state.slot = Math.max(0, Math.min(N - 1, state.slot + (k === "]" ? 1 : -1))); render();
    } else if (k === "ArrowLeft" || k === "ArrowUp" || k === "ArrowRight" || k === "ArrowDown") {
      var step = k === "ArrowLeft" || k === "ArrowUp" ? -1 : 1;
      u = u === null ? (step > 0 ? 0 : us.length - 1) : Math.max(0, Math.min(us.length - 1, u + step));
      pin(us, u);
      var btn = document.querySelector('#hv-left [data-unit="' + u + '"]');
      if (btn && state.view === "head") btn.focus();
    } else if (k === "Escape") { state.pinned = null; state.hover = null; render(); }
    else return;
    ev.preventDefault();
  }

  function pin(us, u) { // keyboard: pin this unit
    state.pinned = us[u].tokens[0];
    state.hover = null;
    render();
  }
  function togglePin(us, u) {
    var token = us[u].tokens[0];
    state.pinned = unitOf(us, state.pinned) === u ? null : token;
    state.hover = null;
    render();
  }

  // --- head view -----------------------------------------------------------------------
  var ROW = 22; // px per token row
  var MAX_FAINT = 1500; // with no token focused: the strongest links drawn
  var ALPHA_STEPS = 32;
  function aggregates() { // the aggregate rows asked, after the heads
    var out = [];
    if (state.mean) out.push("mean");
    if (state.rollout) out.push("rollout");
    return out;
  }
  function headsShown() {
    if (state.mean || state.rollout) return aggregates();
    var out = [];
    for (var h = 0; h < H; h++) if (state.shown[h]) out.push(h);
    return out;
  }

  function renderHead() {
    var us = currentUnits(), U = us.length, f = focusUnit(us), heads = headsShown();
    document.querySelectorAll(".head-chip").forEach(function (b) {
      var h = +b.getAttribute("data-head");
      b.setAttribute("aria-pressed", String(state.shown[h]));
      b.disabled = state.mean || state.rollout;
    });
    $("head-help").textContent = state.mean || state.rollout
      ? heads.map(function (h) {
        return h === "mean" ? "Head mean: one dark line per link, its opacity the mean weight of the layer's " + H + " heads."
          : "Rollout: one purple line per link, its opacity the rollout through layers " + firstLayer() + ".." +
            DATA.layers[state.slot] + " (per layer the head mean A, (A + I)/2 with rows renormalised, multiplied through the layers).";
      }).join(" ")
      : "Hover a token on the left to see where it attends (one colour per head, opacity = weight); click to pin it. " +
        heads.length + " of " + H + " heads shown; key labels are shaded by their mean weight.";
    var left = $("hv-left"), right = $("hv-right");
    left.textContent = ""; right.textContent = "";
    for (var i = 0; i < U; i++) {
      (function (u) {
        var b = document.createElement("button");
        b.type = "button";
        b.className = "tok" + (us[u].special ? " special" : "") + (u === f ? " focus" : "") +
          (unitOf(us, state.pinned) === u ? " pinned" : "");
        b.textContent = us[u].label;
        b.setAttribute("data-unit", String(u));
        b.setAttribute("role", "option");
        b.setAttribute("aria-selected", String(unitOf(us, state.pinned) === u));
        b.addEventListener("mouseenter", function () { if (state.hover !== u) { state.hover = u; drawSoon(); } });
        b.addEventListener("mouseleave", function () { state.hover = null; drawSoon(); });
        b.addEventListener("click", function () { togglePin(us, u); });
        left.appendChild(b);
        var r = document.createElement("span");
        r.className = "tok" + (us[u].special ? " special" : "");
        r.textContent = us[u].label;
        r.setAttribute("data-unit", String(u));
        right.appendChild(r);
      })(i);
    }
    drawHead();
  }

  // Moving from one token to the next fires leave + enter: draw once, on the next frame.
  var drawPending = false;
  function drawSoon() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(function () { drawPending = false; if (state.view === "head") drawHead(); });
  }

  function drawHead() { // the lines and the detail heatmap: cheap enough to redo on hover
    var us = currentUnits(), U = us.length, f = focusUnit(us), heads = headsShown();
    var canvas = $("hv-canvas"), width = 260, ctx = sized(canvas, width, U * ROW);
    canvas.setAttribute("data-focus", f === null ? "" : us[f].label);
    document.querySelectorAll("#hv-left .tok").forEach(function (b) {
      b.classList.toggle("focus", +b.getAttribute("data-unit") === f);
    });
    var rightTok = document.querySelectorAll("#hv-right .tok");
    ctx.clearRect(0, 0, width, U * ROW);
    // Several heads: each gets a slice of the gap so their lines stay apart (as bertviz).
    var n = Math.max(heads.length, 1);
    // Links to draw: the focused row's (at least 1%), or with nothing focused every row's,
    // faintly, but only the MAX_FAINT strongest: all links of a long sentence (218 tokens,
    // 12 heads) took 9.5 s to rasterise on a software canvas on a busy 2-core machine.
    // Lines are batched into one path per head and opacity step, not one stroke each.
    var links = [];
    for (var hi = 0; hi < heads.length; hi++) {
      var M = headMatrix(state.slot, heads[hi], opts());
      for (var a = 0; a < U; a++) {
        if (f !== null && a !== f) continue;
        for (var b = 0; b < U; b++) {
          var w = M[a * U + b];
          if (w >= 0.01) links.push([hi, a, b, Math.min(1, w)]);
        }
      }
    }
    if (f === null && links.length > MAX_FAINT) {
      links.sort(function (p, q) { return q[3] - p[3]; });
      links.length = MAX_FAINT;
    }
    var paths = heads.map(function () { return []; });
    for (var li = 0; li < links.length; li++) {
      var L = links[li], step = Math.max(1, Math.round(L[3] * (f === null ? 0.35 : 1) * ALPHA_STEPS));
      var x0 = 4 + L[0] * 3 * Math.min(1, 6 / n), x1 = width - 4, ya = L[1] * ROW + ROW / 2, yb = L[2] * ROW + ROW / 2;
      var path = paths[L[0]][step] || (paths[L[0]][step] = new Path2D());
      path.moveTo(x0, ya);
      path.bezierCurveTo(width * 0.45, ya, width * 0.55, yb, x1, yb);
    }
    ctx.lineWidth = f === null ? 1 : 2;
    paths.forEach(function (byStep, hi) {
      ctx.strokeStyle = headColour(heads[hi]);
      for (var st = 1; st < byStep.length; st++) {
        if (!byStep[st]) continue;
        ctx.globalAlpha = st / ALPHA_STEPS;
        ctx.stroke(byStep[st]);
      }
    });
    ctx.globalAlpha = 1;
    // Key labels tinted by the focused token's weight (mean over the heads drawn).
    for (var k = 0; k < rightTok.length; k++) {
      var t = rightTok[k], shade = 0;
      if (f !== null && heads.length) {
        for (var hj = 0; hj < heads.length; hj++) shade += headMatrix(state.slot, heads[hj], opts())[f * U + k];
        shade /= heads.length;
      }
      t.style.background = shade > 0 ? "rgba(255, 160, 0, " + Math.min(1, shade).toFixed(3) + ")" : "";
      t.title = f === null ? "" : us[f].label + " → " + us[k].label + ": " + fmt(shade) + (heads.length > 1 ? " (mean of the heads drawn)" : "");
    }
    drawDetail(us, f);
  }

  // The focused token: one row per head (+ the mean), one column per unit.
  var RH = 18; // px per head row
  function drawDetail(us, f) {
    var canvas = $("detail-canvas"), U = us.length;
    var rows = [];
    for (var h = 0; h < H; h++) rows.push(h);
    rows = rows.concat(aggregates());
    drawAblation(us, f);
    if (f === null) {
      $("detail-title").textContent = "Hover or click a token to see its attention in each head of " + layerName(state.slot) + ".";
      sized(canvas, 1, 1);
      canvas.setAttribute("data-focus", "");
      $("detail-best").textContent = "";
      return;
    }
    $("detail-title").textContent = "“" + us[f].label + "” → each " + (state.words ? "word" : "token") + ", " +
      layerName(state.slot) + ", per head" + (state.hideSpecial ? " (special tokens hidden, rows renormalised)" : "");
    canvas.setAttribute("data-focus", us[f].label);
    var ctx0 = canvas.getContext("2d");
    ctx0.font = FONT;
    var labels = us.map(function (u) { return u.label; });
    var left = Math.ceil(textWidth(ctx0, rows.map(headName))) + 10;
    var avail = ($("detail").clientWidth || 720) - left - 8;
    var cell = Math.max(12, Math.min(34, Math.floor(avail / U)));
    var bottom = Math.ceil(textWidth(ctx0, labels)) + 10;
    var width = left + U * cell + 8, height = rows.length * RH + bottom + 4;
    var ctx = sized(canvas, width, height);
    ctx.font = FONT;
    var values = new Float32Array(rows.length * U);
    rows.forEach(function (h, r) {
      var M = headMatrix(state.slot, h, opts());
      for (var c = 0; c < U; c++) values[r * U + c] = M[f * U + c];
    });
    heatmap(ctx, values, rows.length, U, left, 0, cell, RH, function (r, c) { return masked(us, f, c); });
    ctx.fillStyle = "#333";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    rows.forEach(function (h, r) {
      ctx.fillStyle = h === "mean" ? "#000" : headColour(h);
      if (h === "rollout") ctx.fillStyle = headColour(h);
      ctx.fillText(headName(h), left - 6, r * RH + RH / 2);
    });
    verticalLabels(ctx, us, left, rows.length * RH + 4, cell, f);
    canvas.onmousemove = function (ev) {
      var b = canvas.getBoundingClientRect(), x = ev.clientX - b.left - left, y = ev.clientY - b.top;
      var c = Math.floor(x / cell), r = Math.floor(y / RH);
      if (c < 0 || c >= U || r < 0 || r >= rows.length) return hideTip();
      var empty = emptyRow(headMatrix(state.slot, rows[r], opts()).subarray(f * U, (f + 1) * U), U, 0);
      showTip(ev, headName(rows[r]) + ": “" + us[f].label + "” → “" + us[c].label + "” " +
        (masked(us, f, c) ? "masked" : fmt(values[r * U + c])) + (empty ? " (row empty: over 99% of it was on special tokens)" : ""));
    };
    canvas.onmouseleave = hideTip;
    // The strongest link to another word that is not a special token: the finding, in words.
    var best = null;
    rows.forEach(function (h, r) {
      for (var c = 0; c < U; c++) {
        if (c === f || us[c].special || masked(us, f, c)) continue;
        if (best === null || values[r * U + c] > best[2]) best = [h, c, values[r * U + c]];
      }
    });
    $("detail-best").textContent = best === null ? "" : "Strongest link to another " + (state.words ? "word" : "token") +
      " (special tokens aside): " + headName(best[0]) + " → “" + us[best[1]].label + "” " + fmt(best[2]) + ".";
  }

  // --- ablation effects (export --ablate): a bar beside each head ------------------------
  // DATA.ablation.effects: (N, H, S) float32, 1 − cos of the final hidden state at each token
  // with the head's output removed before W^O (NaN: not ablated). A unit of several pieces
  // (words) takes the mean of its pieces, as `show --ablate` does for a split query word.
  var EFF = (function () {
    if (!DATA.ablation) return null;
    var raw = atob(DATA.ablation.effects.base64), bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  })();
  function effectAt(slot, head, tokens) { // the effect at a unit: the mean over its tokens
    var sum = 0;
    for (var i = 0; i < tokens.length; i++) sum += EFF[(slot * H + head) * S + tokens[i]];
    return sum / tokens.length;
  }
  function drawAblation(us, f) {
    var box = $("ablation");
    if (!EFF) return;
    box.hidden = false;
    box.textContent = "";
    var title = document.createElement("p");
    title.className = "ablation-title";
    box.appendChild(title);
    if (f === null) {
      title.textContent = "Ablation: focus a token to see what removing each head of " + layerName(state.slot) +
        " does to it (" + DATA.ablation.effect + ").";
      return;
    }
    // One scale for the token's bars over every kept layer: [ and ] compare layers.
    var top = 0, best = null, slot, h, e;
    for (slot = 0; slot < N; slot++) {
      for (h = 0; h < H; h++) {
        e = effectAt(slot, h, us[f].tokens);
        if (e === e && (best === null || e > best[2])) best = [slot, h, e];
        if (e === e && e > top) top = e;
      }
    }
    title.textContent = "Ablation effect at “" + us[f].label + "”, " + layerName(state.slot) + " (head " +
      (DATA.ablation["with"] === "mean" ? "replaced by its mean" : "zeroed") + "): " + DATA.ablation.effect + "." +
      (best === null ? "" : " Largest: " + layerName(best[0]) + " " + DATA.heads[best[1]] + " " + fmt(best[2]) + ".");
    for (h = 0; h < H; h++) {
      e = effectAt(state.slot, h, us[f].tokens);
      var row = document.createElement("div");
      row.className = "ab-row";
      row.setAttribute("data-head", String(h));
      row.setAttribute("data-effect", e === e ? String(e) : "");
      var name = document.createElement("span");
      name.className = "ab-name";
      name.style.color = headColour(h);
      name.textContent = DATA.heads[h];
      var track = document.createElement("span");
      track.className = "ab-track";
      var bar = document.createElement("span");
      bar.className = "ab-bar";
      bar.style.width = (e === e && top > 0 ? 100 * Math.max(0, e) / top : 0).toFixed(2) + "%";
      bar.style.background = headColour(h);
      track.appendChild(bar);
      var value = document.createElement("span");
      value.className = "ab-value";
      value.textContent = e === e ? fmt(e) : "–";
      row.title = DATA.heads[h] + " removed: " + (e === e ? fmt(e) : "not ablated") + " at “" + us[f].label + "”";
      row.appendChild(name); row.appendChild(track); row.appendChild(value);
      box.appendChild(row);
    }
  }

  function verticalLabels(ctx, us, x, y, cell, bold) {
    ctx.save();
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (var c = 0; c < us.length; c++) {
      ctx.save();
      ctx.translate(x + c * cell + cell / 2, y);
      ctx.rotate(-Math.PI / 2);
      ctx.fillStyle = c === bold ? "#c00000" : us[c].special ? "#888" : "#222";
      ctx.font = (c === bold ? "bold " : "") + FONT;
      ctx.fillText(us[c].label, 0, 0);
      ctx.restore();
    }
    ctx.restore();
  }

  // --- model view ----------------------------------------------------------------------
  function renderModel() {
    var grid = $("model-grid"), us = currentUnits(), U = us.length, f = unitOf(us, state.pinned);
    var heads = [];
    for (var h = 0; h < H; h++) heads.push(h);
    heads = heads.concat(aggregates());
    // Thumbnails as large as the width allows (24..96 px), whole pixels per cell.
    var target = Math.max(24, Math.min(96, Math.floor(((grid.clientWidth || 1200) - 40) / heads.length) - 10));
    // Whole pixels per cell while they fit; past that, the matrix is scaled down to fit.
    var px = U <= target ? Math.floor(target / U) : target / U, side = Math.round(px * U);
    grid.textContent = "";
    grid.style.gridTemplateColumns = "max-content repeat(" + heads.length + ", " + (side + 6) + "px)";
    grid.appendChild(document.createElement("span"));
    heads.forEach(function (h) {
      var s = document.createElement("span");
      s.className = "col-head"; s.textContent = headName(h);
      grid.appendChild(s);
    });
    for (var slot = 0; slot < N; slot++) {
      var l = document.createElement("span");
      l.className = "row-head" + (slot === state.slot ? " current" : "");
      l.textContent = "L" + DATA.layers[slot];
      grid.appendChild(l);
      heads.forEach(function (hh) {
        (function (sl, h) {
          var b = document.createElement("button");
          b.type = "button";
          b.className = "thumb" + (sl === state.slot && h === matrixHead() ? " current" : "");
          b.title = layerName(sl) + ", " + headName(h) + ": click to open its matrix";
          b.setAttribute("aria-label", layerName(sl) + " " + headName(h));
          b.setAttribute("data-layer", String(sl));
          b.setAttribute("data-head", String(h));
          var c = document.createElement("canvas");
          var ctx = sized(c, side, side);
          heatmap(ctx, headMatrix(sl, h, opts()), U, U, 0, 0, px, px, function (r, k) { return masked(us, r, k); });
          if (f !== null) { // the pinned token's row: a tick at each edge
            var tick = Math.max(2, Math.round(side / 16));
            ctx.fillStyle = "#ff3030";
            ctx.fillRect(0, f * px, tick, Math.max(px, 2));
            ctx.fillRect(side - tick, f * px, tick, Math.max(px, 2));
          }
          b.appendChild(c);
          b.addEventListener("click", function () {
            state.slot = sl;
            if (h === "rollout") state.rollout = true;
            else if (h === "mean") { state.mean = true; state.rollout = false; }
            else { state.head = h; state.mean = false; state.rollout = false; }
            setView("matrix");
          });
          grid.appendChild(b);
        })(slot, hh);
      });
    }
  }

  // --- matrix view ---------------------------------------------------------------------
  function matrixHead() { return state.rollout ? "rollout" : state.mean ? "mean" : state.head; }
  function renderMatrix() {
    var us = currentUnits(), U = us.length, f = unitOf(us, state.pinned), h = matrixHead();
    var M = headMatrix(state.slot, h, opts());
    $("matrix-title").textContent = layerName(state.slot) + ", " + (typeof h === "string" ? aggregateTitle(h) : headName(h)) +
      ": each row is a query " + (state.words ? "word" : "token") + ", each column a key; click a row to pick the query." +
      (state.hideSpecial ? " Special tokens hidden, rows renormalised." : "") +
      (DATA.causal ? " Grey: masked (a later token)." : "");
    var canvas = $("matrix-canvas"), ctx0 = canvas.getContext("2d");
    ctx0.font = FONT;
    var labels = us.map(function (u) { return u.label; }), lw = Math.ceil(textWidth(ctx0, labels)) + 10;
    // Cells fill the width (up to 30 px), down to 3 px; the labels thin out below 14 px.
    var avail = Math.max(320, ($("view-matrix").clientWidth || 960) - lw - 16);
    var cell = Math.max(3, Math.min(30, Math.floor(avail / U))), top = 8;
    var ctx = sized(canvas, lw + U * cell + 8, top + lw + U * cell + 8);
    ctx.font = FONT;
    ctx.translate(0, top); // room for the first row's label
    heatmap(ctx, M, U, U, lw, 0, cell, cell, function (r, k) { return masked(us, r, k); });
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    var every = Math.max(1, Math.ceil(14 / cell)); // thin the labels when cells are small
    for (var r = 0; r < U; r++) {
      if (r % every && r !== f) continue;
      ctx.fillStyle = r === f ? "#c00000" : us[r].special ? "#888" : "#222";
      ctx.font = (r === f ? "bold " : "") + FONT;
      ctx.fillText(us[r].label, lw - 6, r * cell + cell / 2);
    }
    verticalLabels(ctx, us.map(function (u, i) { return i % every && i !== f ? { label: "", special: u.special } : u; }), lw, U * cell + 4, cell, f);
    if (f !== null) {
      ctx.strokeStyle = "#ff3030"; ctx.lineWidth = 2;
      ctx.strokeRect(lw + 1, f * cell + 1, U * cell - 2, cell - 2);
    }
    canvas.setAttribute("data-focus", f === null ? "" : us[f].label);
    canvas.setAttribute("data-left", String(lw)); // where the cells start, for tests
    canvas.setAttribute("data-top", String(top));
    canvas.setAttribute("data-cell", String(cell));
    function at(ev) {
      var b = canvas.getBoundingClientRect();
      return [Math.floor((ev.clientY - b.top - top) / cell), Math.floor((ev.clientX - b.left - lw) / cell)];
    }
    canvas.onmousemove = function (ev) {
      var p = at(ev), r = p[0], k = p[1];
      if (r < 0 || r >= U || k < 0 || k >= U) return hideTip();
      showTip(ev, "“" + us[r].label + "” → “" + us[k].label + "”: " + (masked(us, r, k) ? "masked" : fmt(M[r * U + k])) +
        (emptyRow(M, U, r) ? " (row empty: over 99% of it was on special tokens)" : ""));
    };
    canvas.onmouseleave = hideTip;
    canvas.onclick = function (ev) {
      var r = at(ev)[0];
      if (r >= 0 && r < U) togglePin(us, r);
    };
  }

  // --- render --------------------------------------------------------------------------
  function render() {
    C.showView(state.view);
    C.syncControls(state, state.mean || state.rollout, MS);
    $("opt-rollout").checked = state.rollout;
    if (state.view === "head") renderHead();
    else if (state.view === "model") renderModel();
    else renderMatrix();
  }

  header();
  controls();
  render();

  // For tests and the curious (browser console): the computed matrices and the state.
  window.attnviz = {
    data: DATA,
    state: state,
    effects: function (slot, o) { // the ablation bars' values: (U,) per head of a kept layer, or null
      if (!EFF) return null;
      var us = units(o || opts()), out = [];
      for (var h = 0; h < H; h++) out.push(us.map(function (u) { return effectAt(slot, h, u.tokens); }));
      return out;
    },
    render: render,
    units: function (o) { return units(o || opts()).map(function (u) { return u.label; }); },
    matrix: function (slot, head, o) {
      var M = headMatrix(slot, head, o || opts()), U = units(o || opts()).length, out = [];
      for (var a = 0; a < U; a++) out.push(Array.prototype.slice.call(M.subarray(a * U, (a + 1) * U)));
      return out;
    },
  };
})();
